provider "gpukit" {
  backend = "local"
}

# The persistent bucket (rclone serve s3 on loopback). Reading it starts the server when needed;
# destroying the cluster never touches it.
data "gpukit_bucket" "this" {}

resource "gpukit_vm" "node" {
  for_each = toset([for i in range(var.vm_count) : "${var.name_prefix}-${i + 1}"])

  name           = each.key
  gpu_type       = var.gpu_type
  gpu_count      = 0
  disk_gb        = 10
  ssh_public_key = var.ssh_public_key
}
