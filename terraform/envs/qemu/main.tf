# The qemu backend: full VMs with their own kernel on this machine (qemu TCG, booted from the baked
# gpukit image); the bucket is the local backend's rclone serve s3 on loopback, which the VMs reach
# through qemu's guestfwd (reading it starts it; destroying the cluster never touches it).
provider "gpukit" {
  backend = "qemu"
}

module "cluster" {
  source = "../../modules/cluster"

  vm_count       = var.vm_count
  spare_count    = var.spare_count
  name_prefix    = var.name_prefix
  gpu_type       = var.gpu_type
  gpu_count      = 0
  disk_gb        = 10
  ssh_public_key = var.ssh_public_key
  config_seed    = var.config_seed
}
