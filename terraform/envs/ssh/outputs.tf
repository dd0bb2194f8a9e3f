# The contract every env emits, defined once in terraform/modules/cluster/outputs.tf.
output "vms" {
  description = "The cluster's VMs: name => connection and hardware facts (see modules/cluster)."
  value       = module.cluster.vms
}

output "bucket" {
  description = "The persistent bucket: endpoint, name and region. Never credentials."
  value       = module.cluster.bucket
}
