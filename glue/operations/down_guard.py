"""What must be true before `glue down` destroys VMs: no run on the cluster is still running or failed in a
way a recovery repairs with its required outputs missing from the bucket (a run the user stopped, or one
whose recovery needs --force, does not count), and no upload is pending (a trainer still flushing, or files in the
rclone VFS write-back queue of a VM's /mnt/s3 mount). The bucket itself is never touched."""

from __future__ import annotations

import shlex
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from glue.cloud import get_backend
from glue.cluster import current
from glue.errors import GlueError
from glue.infra import ssh
from glue.infra.inventory import Host
from glue.runs import monitor, records
from glue.runs.class_policy import POLICIES, STOPPED_ON_REQUEST
from glue.runs.classify import AttemptClass
from glue.runs.store import RunStore, run_ids

# bucket_mount_cache_dir in ansible/roles/bucket_mount/defaults/main.yml
VFS_META = "/var/cache/gpukit-rclone/vfsMeta"


def blockers(home: Path, only: set[str] | None = None) -> list[str]:
    """Human-readable reasons not to destroy the cluster now (empty: safe); with `only` (VM ids), the
    reasons not to destroy those VMs."""
    hosts = {h.id: h for h in current.hosts(home) if only is None or h.id in only}
    if not hosts:
        return []
    cfg = current.ClusterConfig.load(home)
    info = current.bucket_info(home)
    creds = get_backend(cfg.backend, home).bucket_credentials()
    found: list[str] = []
    for run in run_ids(info, creds):
        store = RunStore(info, creds, run)
        latest = store.latest_attempt()
        on = {str(nd.vm_id) for nd in records.nodes_of(latest)} if latest else set()
        if not on & hosts.keys():
            continue  # not on these VMs (anymore)
        rep = monitor.check(home, store)
        out = rep.diagnosis.outcome
        if out is AttemptClass.RUNNING:
            vms = ", ".join(hosts[i].name for i in sorted(on & hosts.keys(), key=lambda i: hosts[i].name))
            found.append(f"run {run} is still running on {vms} (step {rep.evidence.heartbeat_step})")
        elif _awaits_recovery(out, rep.attempt.reason):
            missing = monitor.missing_outputs(store, store.read_manifest())
            if missing:
                found.append(f"run {run} ({out}) is missing required outputs in the bucket: {', '.join(missing)}; "
                             f"recover it first (`glue recover --run {run}`), or stop it (`glue stop --run {run}`)")
    # One SSH round trip per VM, all VMs at once: the guard is on the path of every `glue down`.
    with ThreadPoolExecutor(max_workers=min(8, len(hosts))) as pool:
        for pending in pool.map(lambda h: _pending_uploads(home, h), sorted(hosts.values(), key=lambda h: h.name)):
            found += pending
    return found


def _awaits_recovery(outcome: AttemptClass, reason: str | None) -> bool:
    """A failed run whose outputs a recovery would still produce: a failure `glue recover` repairs on its own.
    Not one it refuses without --force (the user's own error, a repeatable OOM, a wrong resume: nothing
    comes of waiting), nor one the user ended with `glue stop`: those never hold the cluster up."""
    if outcome in (AttemptClass.RUNNING, AttemptClass.COMPLETED) or reason == STOPPED_ON_REQUEST:
        return False
    policy = POLICIES[outcome]
    return policy.refuse_always is None and policy.refuse_without_force is None


def _pending_uploads(home: Path, host: Host) -> list[str]:
    """Files of the VM's /mnt/s3 write cache not uploaded yet; none from a VM that does not answer."""
    with ssh.session():  # one connection for both commands (a pool thread has no session of its own)
        if not ssh.reachable(home, host):
            return []
        res = ssh.run(home, host, f"grep -rl '\"Dirty\": true' {shlex.quote(VFS_META)} 2>/dev/null | head -5",
                      timeout=30)
    return [f"{host.name}: {path.split('vfsMeta/', 1)[-1]} is still waiting to be uploaded from the /mnt/s3 write "
            "cache" for path in res.stdout.split()]


def check(home: Path, force: bool, only: set[str] | None = None, what: str = "destroy the cluster",
          alternative: str = "") -> list[str]:
    """Raise with the list of blockers unless `force` (which skips the checks). `only`/`what`: the VMs
    about to go, and what is about to remove them; `alternative`: another way out, for the message."""
    if force:
        return ["not checking runs or pending uploads"]
    found = blockers(home, only)
    hint = " (`make down FORCE=1`)" if what == "destroy the cluster" else ""
    if found:
        raise GlueError(f"refusing to {what}: " + "; ".join(found) + f". Wait, export the outputs or recover the "
                        f"runs{alternative}, or pass --force{hint} (the bucket is kept)")
    return found
