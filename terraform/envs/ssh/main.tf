# The ssh backend: machines the user already has, listed in a hosts file (`glue up --backend ssh --hosts
# FILE`). A gpukit_vm here is a host taken from the file into the cluster (create), checked to answer SSH
# (read), and released (destroy: gpukit's units, mount and files removed; the machine keeps running). The
# bucket is the local backend's rclone serve s3 on this machine's loopback (reading it starts it).
provider "gpukit" {
  backend = "ssh"
}

module "cluster" {
  source = "../../modules/cluster"

  vm_count       = var.vm_count
  spare_count    = var.spare_count
  name_prefix    = var.name_prefix
  gpu_type       = null # each host's GPUs as `glue up`'s checks found them (or its labels say)
  gpu_count      = null
  disk_gb        = 10
  ssh_public_key = var.ssh_public_key
}
