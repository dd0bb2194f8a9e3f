"""The example project's own package: shipped in the workdir, importable on the VM from the workdir."""
