# Your module's outputs, passed through as they are: glue checks them against the contract
# (terraform/modules/cluster/outputs.tf; glue/cloud/terraform/contract.py) and names the first field
# that breaks it.
output "vms" {
  description = "Your module's VMs: name => id, ssh_host, ssh_port, ssh_user, host_key (\"\": trusted on first use), gpu_type, gpu_count."
  value       = module.user.vms
}

output "bucket" {
  description = "Your module's bucket: endpoint, name and region. Never credentials."
  value       = module.user.bucket
}
