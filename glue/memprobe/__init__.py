"""memprobe: out-of-memory investigation for a training step (`glue memprobe`, docs/memprobe.md).

Modules: search (boundary bisection), limits (a memory limit per trial process), worker (one trial,
a fresh process), measure (in-trial measurements and the profiler breakdown), runner (start a trial,
classify fit / oom / error), remedies, probe (the whole investigation), report (tables, JSON),
source (the config from run.yaml or a run's manifest).
"""
