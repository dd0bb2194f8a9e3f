# Validated in the cluster module; the hosts themselves are checked by `glue up` before terraform runs.
variable "vm_count" {
  description = "Hosts of the hosts file the cluster takes (1-16); the others stay free for replacements."
  type        = number
  default     = 2
}

variable "spare_count" {
  description = "Warm spares (0-8): hosts of the file taken, configured like the others and kept idle for recoveries, <prefix>-spare-1..K, from the file's end."
  type        = number
  default     = 0
}

variable "name_prefix" {
  description = "Prefix of VM names; the hosts taken serve as <prefix>-1 ... <prefix>-N."
  type        = string
  default     = "gpukit"
}

variable "ssh_public_key" {
  description = "The kit's public key, authorised for each host's user while the cluster holds it."
  type        = string
}
