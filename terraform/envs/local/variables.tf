variable "vm_count" {
  description = "Number of VMs in the cluster."
  type        = number
  default     = 2

  validation {
    condition     = var.vm_count >= 1 && var.vm_count <= 16 && floor(var.vm_count) == var.vm_count
    error_message = "vm_count must be a whole number from 1 to 16 (the local backend runs every VM on this machine)."
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

  validation {
    condition     = can(regex("^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp256) [A-Za-z0-9+/=]+", var.ssh_public_key))
    error_message = "ssh_public_key must be an OpenSSH public key line (ssh-ed25519 AAAA...)."
  }
}
