"""Runs on the VM: checkpoints, state, heartbeat. Imports nothing from glue.infra / glue.cloud."""
