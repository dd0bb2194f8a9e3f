"""Operations on a cluster and its runs, above glue.runs: bring the cluster up and down (lifecycle,
with the down guard that refuses to destroy a VM a run still needs) and recover a run (recovery/)."""
