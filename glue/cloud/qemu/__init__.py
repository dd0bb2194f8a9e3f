"""Backend `qemu`: full VMs with their own kernel, booted from the baked gpukit image under qemu (TCG)."""
