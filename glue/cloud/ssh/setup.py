"""`glue up --backend ssh --hosts FILE`, before terraform runs: every host of the file checked (its key
pinned at first contact, SSH, sudo, OS, Python, disk, GPUs), one line each; any problem refuses the whole
`glue up` before anything is configured. A lost host that answers again is released of what gpukit left on
it and returns to the pool."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from glue.cloud import jumps
from glue.cloud.jumps import Jump
from glue.cloud.ssh import claim, hosts, probe, remote, state
from glue.cloud.ssh.hosts import HostEntry
from glue.errors import GlueError


@dataclass(frozen=True)
class Asking:
    """How to treat a host key seen for the first time: pin it (--accept-new-host-keys), ask, or refuse."""

    accept_new: bool
    confirm: Callable[[str], bool] | None  # None: no terminal to ask on


def _trust(home: Path, pin_id: str, label: str, now: str, asking: Asking) -> str:
    """`now` pinned under `pin_id` if new and accepted (asked, or --accept-new-host-keys); a refused one is an
    error. The caller has compared a key already pinned."""
    what = f"{label}: new host key {now.split()[0]} {remote.fingerprint(now)}"
    if not asking.accept_new:
        if asking.confirm is None:
            raise GlueError(f"{what} is not pinned yet; compare the fingerprint with the machine's "
                            "(`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` there) and run again with "
                            "--accept-new-host-keys")
        if not asking.confirm(f"{what}: trust and pin it?"):
            raise GlueError(f"{what}: not trusted; nothing was configured")
    with state.changing(home) as st:
        st.pins[pin_id] = now
    return now


def _pin_jump(home: Path, host: HostEntry, asking: Asking) -> Jump | None:
    """The host's jump with its key pinned (first contact: as a host's); None without one."""
    jump, pin_id = host.jump(), host.jump_id
    if jump is None or pin_id is None:
        return None
    bare = HostEntry(address=jump.address, port=jump.port, user=jump.user, identity_file=jump.identity_file)
    now = remote.server_key(bare)
    pinned = state.read(home).pins.get(pin_id)
    if pinned is not None and pinned.split()[:2] != now.split()[:2]:
        raise remote.HostKeyChanged(f"{host.id}: the key of its jump host {jump.where} CHANGED since it was pinned "
                                    f"({remote.fingerprint(pinned)}, now {remote.fingerprint(now)}); refusing. If it "
                                    f"was reinstalled on purpose, remove \"{pin_id}\" under \"pins\" in <kit "
                                    "home>/ssh-hosts/state.json and run `glue up` again")
    key = pinned or _trust(home, pin_id, f"jump host {jump.where} (for {host.id})", now, asking)
    return host.jump(key)


def _pin(home: Path, host: HostEntry, asking: Asking) -> str:
    """The host's pinned key (through its jump, pinned first): pinned now if new and accepted; a changed key
    or a refused one is an error."""
    via = _pin_jump(home, host, asking)
    now = remote.server_key(host, via=via)
    pinned = state.read(home).pins.get(host.id)
    if pinned is not None:
        if pinned.split()[:2] != now.split()[:2]:
            raise remote.changed_key(host, pinned, now)
        return pinned
    return _trust(home, host.id, f"{host.id} ({host.where}{f' via {via.where}' if via else ''})", now, asking)


def _report(home: Path, host: HostEntry, asking: Asking) -> probe.HostReport:
    try:
        key = _pin(home, host, asking)
    except GlueError as exc:
        return probe.HostReport(host.id, False, str(exc), fatal=isinstance(exc, remote.HostKeyChanged))
    return probe.check(host, key, state.via(state.read(home), host))


def _back_in_pool(home: Path, host: HostEntry, echo: Callable[[str], None]) -> None:
    """A lost host that passed the checks: what gpukit left on it released, then usable again."""
    st = state.read(home)
    if host.id in st.dirty:
        left = claim.release(host, st.pins[host.id], st.before.get(host.id, []), via=state.via(st, host))
        echo(f"{host.id}: answers again; released what gpukit left on it" + (f" (in use, left: {', '.join(left)})"
                                                                              if left else ""))
    with state.changing(home) as st:
        st.lost.pop(host.id, None)
        st.dirty = [i for i in st.dirty if i != host.id]


def prepare(home: Path, path: Path, wanted: tuple[int, int], asking: Asking,
            echo: Callable[[str], None]) -> list[HostEntry]:
    """Check every host of the file (in parallel; keys asked one at a time), print one line each, and write
    the hosts the provider takes from. Refuses (one GlueError line) when a host fails or fewer pass than
    `wanted` (VMs, warm spares) asks."""
    entries = hosts.load(path)
    st = state.read(home)
    missing = [f"{i} (serving as {name})" for i, name in st.taken.items() if i not in {h.id for h in entries}]
    if missing:
        raise GlueError(f"hosts file {path}: {', '.join(missing)} left the file while the cluster holds it; put it "
                        "back, or `glue down` first (a host is released, never dropped, by gpukit)")
    # Keys first and in order (a prompt at a time), then the checks in parallel.
    for h in entries:
        if h.id not in st.pins or (h.jump_id is not None and h.jump_id not in st.pins):
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
    usable, (vms, spares) = sum(1 for h, r in zip(entries, reports, strict=True) if r.ok), wanted
    if usable < vms + spares:
        asked = f"--vms {vms}" + (f" --spares {spares}" if spares else "")
        raise GlueError(f"{asked}: only {usable} host(s) of {path} pass the checks; add hosts or ask for fewer")
    with state.changing(home) as st:  # what each host has, for its VM record (a lost one's stays as it was)
        st.gpus.update({h.id: [r.gpu_type, r.gpu_count] for h, r in zip(entries, reports, strict=True) if r.ok})
        # every connection glue and Ansible make to a host behind a jump goes through it
        routes = {h.id: j for h in entries if (j := state.via(st, h)) is not None}
    hosts.write_snapshot(home, entries)
    jumps.write(home, routes)
    return entries
