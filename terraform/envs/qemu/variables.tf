# Validated in the cluster module; only what is particular to the qemu backend is checked here.
variable "vm_count" {
  description = "Number of VMs in the cluster (1-16; each is a qemu process with 1 GB of memory on this machine)."
  type        = number
  default     = 2
}

variable "spare_count" {
  description = "Warm spares (0-8): VMs configured like the others and kept idle for recoveries."
  type        = number
  default     = 0
}

variable "config_seed" {
  description = "The cluster's configuration seed a new VM applies at first boot, on its seed disk (glue sets it; null: none)."
  type        = string
  default     = null
}

variable "name_prefix" {
  description = "Prefix of VM names; VMs are named <prefix>-1 ... <prefix>-N."
  type        = string
  default     = "gpukit"
}

variable "gpu_type" {
  description = "GPU model on each VM. qemu VMs have no GPUs, so only \"none\" is valid here."
  type        = string
  default     = "none"

  validation {
    condition     = var.gpu_type == "none"
    error_message = "gpu_type must be \"none\" on the qemu backend (emulated VMs without GPUs)."
  }
}

variable "ssh_public_key" {
  description = "Public key authorised for root on every VM (glue passes its own key from .gpukit/ssh/)."
  type        = string
}
