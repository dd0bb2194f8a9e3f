"""Slurm on the cluster (ansible/roles/slurm sets it up): slurmctld on the head, the first VM
(<prefix>-1), slurmd on every VM, one partition `gpu`. glue talks to it over SSH on the head."""

from glue.cluster.slurm_vars import PARTITION, SPARE_REASON

__all__ = ["PARTITION", "SPARE_REASON"]
