variable "vm_count" {
  description = "Number of VMs in the cluster (each one is billed from the moment it runs)."
  type        = number
  default     = 1

  validation {
    condition     = var.vm_count >= 1 && var.vm_count <= 16 && floor(var.vm_count) == var.vm_count
    error_message = "vm_count must be a whole number from 1 to 16."
  }
}

variable "name_prefix" {
  description = "Prefix of VM names; VMs are named <prefix>-1 ... <prefix>-N."
  type        = string
  default     = "gpukit"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,30}[a-z0-9]$", var.name_prefix))
    error_message = "name_prefix must be 2-32 characters: lowercase letters, digits and dashes, starting with a letter and not ending with a dash."
  }
}

variable "hardware_profile" {
  description = "Lyceum hardware profile of every VM: cpu, a100 or h100 (see `python -m glue.cloud.lyceum availability`)."
  type        = string
  default     = "a100"

  validation {
    condition     = contains(["cpu", "a100", "h100"], var.hardware_profile)
    error_message = "hardware_profile must be one of: cpu, a100, h100."
  }
}

variable "gpu_count" {
  description = "GPUs per VM: 0 on the cpu profile, 1-8 on a100/h100."
  type        = number
  default     = 1

  validation {
    condition = floor(var.gpu_count) == var.gpu_count && (
      var.hardware_profile == "cpu" ? var.gpu_count == 0 : var.gpu_count >= 1 && var.gpu_count <= 8
    )
    error_message = "gpu_count must be 0 on the cpu profile and a whole number from 1 to 8 on a100/h100."
  }
}

variable "disk_gb" {
  description = "Local disk per VM in GB (at least 100 on Lyceum; wiped when the VM terminates)."
  type        = number
  default     = 100

  validation {
    condition     = var.disk_gb >= 100 && var.disk_gb <= 65536 && floor(var.disk_gb) == var.disk_gb
    error_message = "disk_gb must be a whole number from 100 to 65536 (Lyceum VMs have at least 100 GB)."
  }
}

variable "cpu" {
  description = "vCPUs per VM; null uses the hardware profile's default."
  type        = number
  default     = null

  validation {
    condition     = var.cpu == null ? true : var.cpu >= 1 && var.cpu <= 256 && floor(var.cpu) == var.cpu
    error_message = "cpu must be null (the profile's default) or a whole number from 1 to 256."
  }
}

variable "memory_gb" {
  description = "Memory per VM in GB; null uses the hardware profile's default."
  type        = number
  default     = null

  validation {
    condition     = var.memory_gb == null ? true : var.memory_gb >= 1 && var.memory_gb <= 4096 && floor(var.memory_gb) == var.memory_gb
    error_message = "memory_gb must be null (the profile's default) or a whole number from 1 to 4096."
  }
}

variable "ssh_public_key" {
  description = "Public key authorised for root on every VM (glue passes its own key from .gpukit/ssh/)."
  type        = string

  validation {
    condition     = can(regex("^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp256) [A-Za-z0-9+/=]+", var.ssh_public_key))
    error_message = "ssh_public_key must be an OpenSSH public key line (ssh-ed25519 AAAA...)."
  }
}
