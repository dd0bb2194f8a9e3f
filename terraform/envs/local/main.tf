# The local backend: VMs are namespaced process trees on this machine, the bucket is rclone serve s3
# on loopback (started on demand by reading it; destroying the cluster never touches it).
provider "gpukit" {
  backend = "local"
}

module "cluster" {
  source = "../../modules/cluster"

  vm_count       = var.vm_count
  spare_count    = var.spare_count
  config_seed    = var.config_seed
  name_prefix    = var.name_prefix
  gpu_type       = var.gpu_type
  gpu_count      = 0
  disk_gb        = 10
  ssh_public_key = var.ssh_public_key
  cpu            = var.cpu
  memory_gb      = var.memory_gb
}
