# What gpukit passes to your module (it must declare these three variables).
variable "vm_count" {
  description = "Number of VMs (1-16); your module names them <name_prefix>-1 ... <name_prefix>-N."
  type        = number
  default     = 2
}

variable "name_prefix" {
  description = "Prefix of VM names: the keys of your module's `vms` output."
  type        = string
  default     = "gpukit"
}

variable "ssh_public_key" {
  description = "The kit's public key: your module authorises it for each VM's ssh_user."
  type        = string
}

variable "module_digest" {
  description = "A hash of your module's files, unused here: a change to them makes `glue up` apply."
  type        = string
  default     = ""
}
