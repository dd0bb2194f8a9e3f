# Validated in the cluster module; only what is particular to Lyceum is checked here.
variable "vm_count" {
  description = "Number of VMs in the cluster (1-16; each one is billed from the moment it runs)."
  type        = number
  default     = 1
}

variable "spare_count" {
  description = "Warm spares (0-8): VMs configured like the others and kept idle for recoveries."
  type        = number
  default     = 0
}

variable "name_prefix" {
  description = "Prefix of VM names; VMs are named <prefix>-1 ... <prefix>-N."
  type        = string
  default     = "gpukit"
}

variable "hardware_profile" {
  description = "Lyceum hardware profile of every VM: cpu, a100, b200, b300, h100, h200 or l40s (see `python -m glue.cloud.lyceum availability`)."
  type        = string
  default     = "a100"
  nullable    = false
}

variable "gpu_count" {
  description = "GPUs per VM: 0 on the cpu profile, 1, 2, 4 or 8 on a GPU profile."
  type        = number
  default     = 1

  validation {
    condition = floor(var.gpu_count) == var.gpu_count && (
      var.hardware_profile == "cpu" ? var.gpu_count == 0 : contains([1, 2, 4, 8], var.gpu_count)
    )
    error_message = "gpu_count must be 0 on the cpu profile and 1, 2, 4 or 8 on a GPU profile."
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
}

variable "memory_gb" {
  description = "Memory per VM in GB; null uses the hardware profile's default."
  type        = number
  default     = null
}

variable "ssh_public_key" {
  description = "Public key authorised for root on every VM (glue passes its own key from .gpukit/ssh/)."
  type        = string
}

variable "ssh_user" {
  description = "User to log in as (LYCEUM_SSH_USER); null: root if the VM accepts it, else the image's default user (e.g. ubuntu), which must have passwordless sudo."
  type        = string
  default     = null
}

variable "market" {
  description = "Capacity pool (LYCEUM_MARKET): on-demand, or spot (about 40-50% of the price; a reclaimed spot VM is recovered as preempted). Sent explicitly with every create."
  type        = string
  default     = "on-demand"
  nullable    = false
}
