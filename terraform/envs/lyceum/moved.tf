# Until the cluster module, the VMs were resources of this root config: an existing state moves
# them into the module instead of destroying and re-creating them. (The bucket is a data source;
# it is simply read again at its new address.)
moved {
  from = gpukit_vm.node
  to   = module.cluster.gpukit_vm.node
}
