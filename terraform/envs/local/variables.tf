# Validated in the cluster module; only what is particular to the local backend is checked here.
variable "vm_count" {
  description = "Number of VMs in the cluster (1-16; every VM runs on this machine)."
  type        = number
  default     = 2
}

variable "spare_count" {
  description = "Warm spares (0-8): VMs configured like the others and kept idle for recoveries."
  type        = number
  default     = 0
}

variable "config_seed" {
  description = "The cluster's configuration seed a new VM applies at first boot (glue sets it; null: none)."
  type        = string
  default     = null
}

variable "name_prefix" {
  description = "Prefix of VM names; VMs are named <prefix>-1 ... <prefix>-N."
  type        = string
  default     = "gpukit"
}

variable "gpu_type" {
  description = "GPU model on each VM. The local backend has no GPUs, so only \"none\" is valid here."
  type        = string
  default     = "none"

  validation {
    condition     = var.gpu_type == "none"
    error_message = "gpu_type must be \"none\" on the local backend (VMs are processes on this machine, without GPUs)."
  }
}

variable "ssh_public_key" {
  description = "Public key authorised for root on every VM (glue passes its own key from .gpukit/ssh/)."
  type        = string
}

variable "cpu" {
  description = "vCPUs per VM (a CPU quota on the VM's cgroup; image machines only); null: unlimited."
  type        = number
  default     = null
}

variable "memory_gb" {
  description = "Memory per VM in GB (the VM's memory cgroup limit; image machines only); null: unlimited."
  type        = number
  default     = null
}
