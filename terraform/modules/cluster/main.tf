# The cluster: N VMs named <name_prefix>-1 ... <name_prefix>-N, K warm spares named
# <name_prefix>-spare-1 ... <name_prefix>-spare-K (configured and idle; a recovery takes one), and
# the persistent bucket they mount.
# The caller configures the gpukit provider (its backend); this module only uses it.

# The persistent bucket. A data source: reading it starts or asks for the bucket when needed, and
# destroying the cluster never touches it or its data.
data "gpukit_bucket" "this" {}

resource "gpukit_vm" "node" {
  for_each = toset([for i in range(var.vm_count) : "${var.name_prefix}-${i + 1}"])

  name             = each.key
  hardware_profile = var.hardware_profile
  gpu_type         = var.gpu_type
  gpu_count        = var.gpu_count
  disk_gb          = var.disk_gb
  cpu              = var.cpu
  memory_gb        = var.memory_gb
  ssh_public_key   = var.ssh_public_key
  ssh_user         = var.ssh_user
  market           = var.market
  config_seed      = var.config_seed
}

# Warm spares: the same VMs, idle until a recovery takes one. glue then moves the spare's state to the
# lost VM's address (`terraform state mv`), and the next apply renames it in place and makes a new spare.
resource "gpukit_vm" "spare" {
  for_each = toset([for i in range(var.spare_count) : "${var.name_prefix}-spare-${i + 1}"])

  name             = each.key
  hardware_profile = var.hardware_profile
  gpu_type         = var.gpu_type
  gpu_count        = var.gpu_count
  disk_gb          = var.disk_gb
  cpu              = var.cpu
  memory_gb        = var.memory_gb
  ssh_public_key   = var.ssh_public_key
  ssh_user         = var.ssh_user
  market           = var.market
  config_seed      = var.config_seed
}
