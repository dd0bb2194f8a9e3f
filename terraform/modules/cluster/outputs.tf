# The contract every env emits (its outputs pass these through) and glue reads: the Python side of
# it is glue/infra/inventory.py (Host, VM_FIELDS, BUCKET_FIELDS); tests/unit/test_inventory.py
# keeps the two the same.

output "vms" {
  description = "The cluster's VMs, its spares (<prefix>-spare-K) included: name => connection and hardware facts (id, ssh_host, ssh_port, ssh_user, host_key, gpu_type, gpu_count, backend, market: spot, on-demand or \"\" where the backend has none)."
  value = {
    for name, vm in merge(gpukit_vm.node, gpukit_vm.spare) : name => {
      id        = vm.id
      ssh_host  = vm.ssh_host
      ssh_port  = vm.ssh_port
      ssh_user  = vm.ssh_user
      host_key  = vm.host_key
      gpu_type  = vm.gpu_type
      gpu_count = vm.gpu_count
      backend   = vm.backend
      market    = vm.market
    }
  }
}

output "bucket" {
  description = "The persistent bucket: endpoint, name and region. Never credentials."
  value = {
    endpoint = data.gpukit_bucket.this.endpoint
    name     = data.gpukit_bucket.this.name
    region   = data.gpukit_bucket.this.region
  }
}
