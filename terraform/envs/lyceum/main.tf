# Real GPU VMs on Lyceum. The API key comes from LYCEUM_API_KEY in the environment terraform
# runs in (the provider reads it there); it is never a variable, an attribute or part of the state.
provider "gpukit" {
  backend = "lyceum"
}

# The account's S3 bucket is read inside the module: reading it asks POST /storage/credentials; the
# expiring credentials go to the 0600 file <kit home>/bucket/credentials.json, never into the state.
module "cluster" {
  source = "../../modules/cluster"

  vm_count         = var.vm_count
  spare_count      = var.spare_count
  name_prefix      = var.name_prefix
  hardware_profile = var.hardware_profile
  gpu_type         = var.hardware_profile == "cpu" ? "none" : var.hardware_profile
  gpu_count        = var.gpu_count
  disk_gb          = var.disk_gb
  cpu              = var.cpu
  memory_gb        = var.memory_gb
  ssh_public_key   = var.ssh_public_key
  ssh_user         = var.ssh_user
  market           = var.market
}
