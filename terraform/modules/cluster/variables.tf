variable "vm_count" {
  description = "Number of VMs in the cluster."
  type        = number
  nullable    = false

  validation {
    condition     = var.vm_count >= 1 && var.vm_count <= 16 && floor(var.vm_count) == var.vm_count
    error_message = "vm_count must be a whole number from 1 to 16."
  }
}

variable "spare_count" {
  description = "Warm spares: VMs configured like the others and kept idle for recoveries (0: none)."
  type        = number
  default     = 0
  nullable    = false

  validation {
    condition     = var.spare_count >= 0 && var.spare_count <= 8 && floor(var.spare_count) == var.spare_count
    error_message = "spare_count must be a whole number from 0 to 8."
  }
}

variable "name_prefix" {
  description = "Prefix of VM names; VMs are named <prefix>-1 ... <prefix>-N."
  type        = string
  nullable    = false

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,30}[a-z0-9]$", var.name_prefix))
    error_message = "name_prefix must be 2-32 characters: lowercase letters, digits and dashes, starting with a letter and not ending with a dash."
  }
}

variable "ssh_public_key" {
  description = "Public key authorised for root on every VM."
  type        = string
  nullable    = false

  validation {
    condition     = can(regex("^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp256) [A-Za-z0-9+/=]+", var.ssh_public_key))
    error_message = "ssh_public_key must be an OpenSSH public key line (ssh-ed25519 AAAA...)."
  }
}

variable "gpu_type" {
  description = "GPU model on each VM (e.g. a100, h100), or \"none\"; null: as the backend finds each machine (the ssh backend's host checks)."
  type        = string
  default     = "none"
  nullable    = true

  validation {
    condition     = var.gpu_type == null ? true : can(regex("^[a-z0-9][a-z0-9_-]*$", var.gpu_type))
    error_message = "gpu_type must be a GPU model in lowercase letters, digits, dashes and underscores, or \"none\"."
  }
}

variable "gpu_count" {
  description = "GPUs per VM (0 without GPUs); null: as the backend finds each machine (the ssh backend's host checks)."
  type        = number
  default     = 0
  nullable    = true

  validation {
    condition     = var.gpu_count == null ? true : (var.gpu_count >= 0 && var.gpu_count <= 16 && floor(var.gpu_count) == var.gpu_count)
    error_message = "gpu_count must be a whole number from 0 to 16."
  }
}

variable "disk_gb" {
  description = "Local (ephemeral) disk per VM in GB; wiped when the VM terminates."
  type        = number
  default     = 100
  nullable    = false

  validation {
    condition     = var.disk_gb >= 1 && var.disk_gb <= 65536 && floor(var.disk_gb) == var.disk_gb
    error_message = "disk_gb must be a whole number from 1 to 65536."
  }
}

variable "hardware_profile" {
  description = "Lyceum hardware profile of every VM (cpu, a100, b200, b300, h100, h200, l40s); null where the backend has none."
  type        = string
  default     = null

  validation {
    condition     = var.hardware_profile == null ? true : contains(["cpu", "a100", "b200", "b300", "h100", "h200", "l40s"], var.hardware_profile)
    error_message = "hardware_profile must be null or one of: cpu, a100, b200, b300, h100, h200, l40s."
  }
}

variable "cpu" {
  description = "vCPUs per VM; null uses the backend's (or hardware profile's) default."
  type        = number
  default     = null

  validation {
    condition     = var.cpu == null ? true : var.cpu >= 1 && var.cpu <= 256 && floor(var.cpu) == var.cpu
    error_message = "cpu must be null (the default) or a whole number from 1 to 256."
  }
}

variable "memory_gb" {
  description = "Memory per VM in GB; null uses the backend's (or hardware profile's) default."
  type        = number
  default     = null

  validation {
    condition     = var.memory_gb == null ? true : var.memory_gb >= 1 && var.memory_gb <= 4096 && floor(var.memory_gb) == var.memory_gb
    error_message = "memory_gb must be null (the default) or a whole number from 1 to 4096."
  }
}

variable "ssh_user" {
  description = "User glue logs in as; null lets the backend find the one the VM accepts (root first, then the image's default) and report it in the vms output."
  type        = string
  default     = null

  validation {
    condition     = var.ssh_user == null ? true : can(regex("^[a-z_][a-z0-9_-]{0,31}$", var.ssh_user))
    error_message = "ssh_user must be null (detect) or a user name: lowercase letters, digits, '_' and '-'."
  }
}

variable "market" {
  description = "Capacity pool of every VM: on-demand, or spot (cheaper, reclaimable without notice; Lyceum); null where the backend has no choice."
  type        = string
  default     = null

  validation {
    condition     = var.market == null ? true : contains(["on-demand", "spot"], var.market)
    error_message = "market must be null, \"on-demand\" or \"spot\"."
  }
}

variable "config_seed" {
  description = "Path of the cluster's configuration seed (user-data) a new VM applies at first boot; null: none. A path only: the file holds credentials and never enters the state."
  type        = string
  default     = null

  validation {
    condition     = var.config_seed == null ? true : startswith(var.config_seed, "/")
    error_message = "config_seed must be null or an absolute path."
  }
}
