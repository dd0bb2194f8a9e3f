"""`glue up --backend ssh --hosts FILE`, before terraform runs: every host of the file checked (its key
pinned at first contact, SSH, sudo, OS, Python, disk, GPUs), one line each; any problem refuses the whole
`glue up` before anything is configured. A lost host that answers again is released of what gpukit left on
it and returns to the pool."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from glue.cloud.ssh import claim, hosts, probe, remote, state
from glue.cloud.ssh.hosts import HostEntry
from glue.errors import GlueError


@dataclass(frozen=True)
class Asking:
    """How to treat a host key seen for the first time: pin it (--accept-new-host-keys), ask, or refuse."""

    accept_new: bool
    confirm: Callable[[str], bool] | None  # None: no terminal to ask on


def _pin(home: Path, host: HostEntry, asking: Asking) -> str:
    """The host's pinned key: pinned now if new and accepted; a changed key or a refused one is an error."""
    now = remote.server_key(host)
    pinned = state.read(home).pins.get(host.id)
    if pinned is not None:
        if pinned.split()[:2] != now.split()[:2]:
            raise remote.changed_key(host, pinned, now)
        return pinned
    what = f"{host.id} ({host.where}): new host key {now.split()[0]} {remote.fingerprint(now)}"
    if not asking.accept_new:
        if asking.confirm is None:
            raise GlueError(f"{what} is not pinned yet; compare the fingerprint with the machine's "
                            "(`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` there) and run again with "
                            "--accept-new-host-keys")
        if not asking.confirm(f"{what}: trust and pin it?"):
            raise GlueError(f"{what}: not trusted; nothing was configured")
    with state.changing(home) as st:
        st.pins[host.id] = now
    return now


def _report(home: Path, host: HostEntry, asking: Asking) -> probe.HostReport:
    try:
        key = _pin(home, host, asking)
    except GlueError as exc:
        return probe.HostReport(host.id, False, str(exc), fatal=isinstance(exc, remote.HostKeyChanged))
    return probe.check(host, key)


def _back_in_pool(home: Path, host: HostEntry, echo: Callable[[str], None]) -> None:
    """A lost host that passed the checks: what gpukit left on it released, then usable again."""
    st = state.read(home)
    if host.id in st.dirty:
        left = claim.release(host, st.pins[host.id], st.before.get(host.id, []))
        echo(f"{host.id}: answers again; released what gpukit left on it" + (f" (in use, left: {', '.join(left)})"
                                                                              if left else ""))
    with state.changing(home) as st:
        st.lost.pop(host.id, None)
        st.dirty = [i for i in st.dirty if i != host.id]


def prepare(home: Path, path: Path, vms: int, asking: Asking, echo: Callable[[str], None]) -> list[HostEntry]:
    """Check every host of the file (in parallel; keys asked one at a time), print one line each, and write
    the hosts the provider takes from. Refuses (one GlueError line) when a host fails or too few pass."""
    entries = hosts.load(path)
    st = state.read(home)
    missing = [f"{i} (serving as {name})" for i, name in st.taken.items() if i not in {h.id for h in entries}]
    if missing:
        raise GlueError(f"hosts file {path}: {', '.join(missing)} left the file while the cluster holds it; put it "
                        "back, or `glue down` first (a host is released, never dropped, by gpukit)")
    # Keys first and in order (a prompt at a time), then the checks in parallel.
    for h in entries:
        if h.id not in st.pins and not h.proxy_jump:
            try:
                _pin(home, h, asking)
            except GlueError:
                pass  # said in its report line below
    with ThreadPoolExecutor(max_workers=8) as pool:
        reports = list(pool.map(lambda h: _report(home, h, Asking(False, None)), entries))
    bad = []
    for h, rep in zip(entries, reports, strict=True):
        kept_out = h.id in st.lost or h.id in st.taken
        echo(("ok   " if rep.ok else ("lost " if kept_out else "FAIL ")) + rep.line)
        if rep.ok and h.id in st.lost:
            _back_in_pool(home, h, echo)
        elif not rep.ok and (rep.fatal or not kept_out):
            bad.append(h.id)
    if bad:
        raise GlueError(f"hosts file {path}: {', '.join(bad)} failed the checks (the lines above say why); fix them "
                        "or take them out of the file; nothing was configured")
    usable = sum(1 for h, r in zip(entries, reports, strict=True) if r.ok)
    if usable < vms:
        raise GlueError(f"--vms {vms}: only {usable} host(s) of {path} pass the checks; add hosts or ask for fewer")
    with state.changing(home) as st:  # what each host has, for its VM record (a lost one's stays as it was)
        st.gpus.update({h.id: [r.gpu_type, r.gpu_count] for h, r in zip(entries, reports, strict=True) if r.ok})
    hosts.write_snapshot(home, entries)
    return entries
