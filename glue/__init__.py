"""gpukit: keep GPU training jobs running on rented GPU VMs."""
