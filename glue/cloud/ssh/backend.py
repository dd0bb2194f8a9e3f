"""Backend `ssh`: machines the user already has, listed in a hosts file (glue.cloud.ssh.hosts).

A "VM" is a host of the file taken into the cluster: create = take a free host (pinned key, checked by
`glue up`), read = the host still answers SSH (else it is lost: kept out of the pool until `glue up` finds it
healthy again), delete = release it (glue.cloud.ssh.claim); the machine itself is never created or
destroyed. Hosts the cluster does not hold are the spares a replacement takes. The bucket is the local
backend's (`rclone serve s3` on this machine's loopback): the hosts must reach 127.0.0.1 of this machine,
which holds for machines sharing its network (the tests' machines); a remote host needs the bucket
reachable from it: a tunnel, or the user's own bucket (`glue up --bucket-endpoint --bucket`, which
get_backend puts in place of this one: glue.cloud.own_bucket)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from glue.bucket_access import BucketCredentials, BucketInfo
from glue.cloud.base import SPARE_MARK, VMRecord, VMSpec
from glue.cloud.checks import Readiness, host_readiness
from glue.cloud.local.bucket import LocalBucket
from glue.cloud.ssh import claim, hosts, remote, state
from glue.cloud.ssh.hosts import HostEntry
from glue.errors import GlueError, NoCapacity

READ_TRIES = 2  # a host that does not answer twice in a row is lost (one dropped packet is not)
_bucket_lock = threading.Lock()


class SshBackend:
    """Backend `ssh`: hosts the user reaches over SSH (`glue up --backend ssh --hosts FILE`)."""

    name = "ssh"
    credentials_expire = False
    bucket_on_host = True
    baked_image: str | None = None
    multi_node: str | None = None
    takes_config_seed = False
    deletes_vms = True

    def __init__(self, home: Path) -> None:
        self.home = home
        self.bucket_server = LocalBucket(home)

    def _hosts(self) -> dict[str, HostEntry]:
        return {h.id: h for h in hosts.read_snapshot(self.home)}

    def check_host(self) -> None:
        if not self._hosts():
            raise GlueError("the ssh backend has no hosts yet: run `glue up --backend ssh --hosts FILE` "
                            "(docs/guides/ssh-hosts.md)")

    def readiness(self) -> Readiness:
        return host_readiness("SSH hosts", self.check_host, f"{len(self._hosts())} host(s) checked by `glue up`")

    def spares_problem(self) -> str | None:
        return None  # hosts of the file beyond --vms, configured and kept idle (glue.cloud.ssh.setup counts them)

    def tf_vars(self, vm_count: int, name_prefix: str, ssh_public_key: str) -> dict[str, Any]:
        # How many hosts pass is `glue up`'s check (glue.cloud.ssh.setup); a replacement finding none is NoCapacity.
        return {"vm_count": vm_count, "name_prefix": name_prefix, "ssh_public_key": ssh_public_key}

    # -- hosts as VMs -------------------------------------------------------------------------
    def _record(self, host: HostEntry, name: str, key: str) -> VMRecord:
        """The host as a VM: its GPUs as `glue up`'s checks found them (or its labels said), which the
        inventory hands the driver role and Slurm's GRES."""
        gpu_type, gpu_count = state.read(self.home).gpus.get(host.id) or ("none", 0)
        return VMRecord(id=host.id, name=name, ssh_host=host.address, ssh_port=host.port, ssh_user=host.user,
                        host_key=key, gpu_type=str(gpu_type), gpu_count=int(gpu_count), backend="ssh",
                        status="running")

    def _reserve(self, name: str) -> tuple[HostEntry, str] | None:
        """A free, pinned, healthy host, marked taken as `name`: the one released longest ago (never: first),
        then <prefix>-N's own, the N-th of the file (VMs created together land where the file says), then
        in the file's order; a warm spare (<prefix>-spare-K) from the file's end, so that the cluster's VMs
        and its spares, created together, each take the hosts the file's order gives them."""
        pool = self._hosts()
        index = name.rpartition("-")[2]
        own = int(index) - 1 if index.isdigit() else -1
        order = -1 if SPARE_MARK in name else 1
        with state.changing(self.home) as st:
            free = [(k, h) for k, (i, h) in enumerate(pool.items())
                    if i not in st.taken and i not in st.lost and i in st.pins]
            if not free:
                return None
            _, host = min(free, key=lambda kh: (st.released_at.get(kh[1].id, 0.0), order == 1 and kh[0] != own,
                                                order * kh[0]))
            st.taken[host.id] = name
            return host, st.pins[host.id]

    def create_vm(self, spec: VMSpec) -> VMRecord:
        failed: list[str] = []
        while (picked := self._reserve(spec.name)) is not None:
            host, key = picked
            try:
                before = claim.take(host, key, spec.ssh_public_key, via=state.via(state.read(self.home), host))
            except GlueError as exc:
                failed.append(str(exc))
                with state.changing(self.home) as st:
                    st.taken.pop(host.id, None)
                    st.lost[host.id] = f"taking it failed at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
                continue
            with state.changing(self.home) as st:
                st.before[host.id] = before
            return self._record(host, spec.name, key)
        st = state.read(self.home)
        raise NoCapacity(f"no capacity: no free host in the hosts file for {spec.name} ({len(st.taken)} taken, "
                         f"{len(st.lost)} lost{': ' + '; '.join(failed) if failed else ''}); add a host to the file "
                         "or bring a lost one back, then `glue up`")

    def read_vm(self, vm_id: str) -> VMRecord | None:
        st = state.read(self.home)
        host = self._hosts().get(vm_id)
        if host is None or vm_id not in st.taken:
            return None
        key, via = st.pins.get(vm_id, ""), state.via(st, host)
        for attempt in range(READ_TRIES):
            try:
                now = remote.server_key(host, timeout=5.0, via=via)
            except GlueError as exc:
                if attempt + 1 < READ_TRIES:
                    time.sleep(1.0)
                    continue
                self._lost(vm_id, str(exc))
                return None
            if now.split()[:2] != key.split()[:2]:
                raise remote.changed_key(host, key, now)
            return self._record(host, st.taken[vm_id], key)
        return None

    def relabel_vm(self, vm_id: str, name: str) -> None:
        """A warm spare renamed in place (it took a lost VM's place): the host now serves as `name`."""
        with state.changing(self.home) as st:
            if vm_id in st.taken:
                st.taken[vm_id] = name

    def _lost(self, vm_id: str, why: str) -> None:
        """Out of the cluster and out of the pool, its gpukit files to be released when it answers again."""
        with state.changing(self.home) as st:
            if st.taken.pop(vm_id, None) is not None and vm_id not in st.dirty:
                st.dirty.append(vm_id)
            st.lost[vm_id] = f"{why} (at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())})"

    def owned_vm_ids(self) -> list[str]:
        return sorted(state.read(self.home).taken)

    def delete_vm(self, vm_id: str) -> None:
        """Release the host (never destroy it); one that does not answer is released when it answers again."""
        st = state.read(self.home)
        host = self._hosts().get(vm_id)
        if vm_id not in st.taken:
            return
        if host is not None:
            try:
                claim.release(host, st.pins.get(vm_id, ""), st.before.get(vm_id, []), via=state.via(st, host))
            except GlueError as exc:
                self._lost(vm_id, str(exc))
                return
        with state.changing(self.home) as st:
            st.taken.pop(vm_id, None)
            st.released_at[vm_id] = time.time()

    # -- bucket ------------------------------------------------------------------------------
    def bucket(self) -> BucketInfo:
        with _bucket_lock:
            return self.bucket_server.ensure_running()

    def bucket_credentials(self) -> BucketCredentials:
        return self.bucket_server.credentials()
