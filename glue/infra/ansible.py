"""The Ansible driver's public face: run ansible/site.yml and ansible/verify.yml with ansible-runner.

`converge` prepares the VMs (NVIDIA driver, container runtime, the bucket at /mnt/s3, the trainer
runtime); `verify` asserts that state and returns one summary per host, `last_verify` reads the
last of them back; `converge_and_verify` is both in one run (`glue up`). The work lives in three
modules, re-exported here for callers:

- `ansible_run`: the ansible-runner invocation (environment, fact cache, artifacts) and its result
- `ansible_progress`: the live host x stage table (rich) fed from the runner's events
- `ansible_verify`: verify.yml's summaries and the `<home>/ansible/verify.json` record
"""

from __future__ import annotations

from glue.infra.ansible_run import PlaybookResult, converge, run_playbook, runner_dir
from glue.infra.ansible_verify import converge_and_verify, last_verify, verify

__all__ = ["PlaybookResult", "converge", "converge_and_verify", "last_verify", "run_playbook", "runner_dir",
           "verify"]
