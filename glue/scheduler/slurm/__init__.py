"""Slurm on the cluster (ansible/roles/slurm sets it up): slurmctld on the head, the first VM
(<prefix>-1), slurmd on every VM, one partition `gpu`. glue talks to it over SSH on the head."""

PARTITION = "gpu"
SPARE_REASON = "gpukit spare"  # the reason a warm spare is drained with until a lost node's place needs it
