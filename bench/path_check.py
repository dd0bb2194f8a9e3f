"""Which path a measured recovery or `glue up` really took, so that a bench fails loudly when it measured
another path than the one it names (issue 50: bench/recovery.py's "seeded" recovery ran the playbook and was
reported as seeded).

Paths of a recovery's new VM:
  spare      a warm spare took the lost VM's place (spares.for_recovery handed it over); terraform made no VM
  seed       terraform made the VM, which configured itself at first boot from the seed: no playbook on it
  playbook   terraform made the VM and the configure phase ran the playbook on it
The recovery record (recoveries/<k>.json) says which nodes a spare serves, not how a new VM was configured:
`watching()` wraps phases.provision, phases.configure and spares.for_recovery for the recoveries run inside
it and keeps what they returned (recover.py calls them through their modules, so the wrappers are seen).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass
class Seen:
    """What the deciding functions returned during one recovery; None where one was not called."""

    spares: list[str] | None = None  # the VM names warm spares serve (for_recovery's second item)
    provisioned: list[str] | None = None  # the VMs terraform made (provision's second item)
    playbook: list[str] | None = None  # the VMs the configure phase converged with the playbook


@contextmanager
def watching() -> Iterator[Seen]:
    """Seen, filled in by the recoveries run inside."""
    from glue.operations import spares  # here: up_path alone needs no recovery modules
    from glue.operations.recovery import phases

    seen = Seen()

    def took(out: Any) -> None:
        seen.spares = list(out[1]) if out is not None else seen.spares

    def made(out: Any) -> None:
        seen.provisioned = [*(seen.provisioned or []), *out[1]]

    def converged(out: Any) -> None:
        seen.playbook = [*(seen.playbook or []), *out.names]

    def spy(original: Callable[..., Any], keep: Callable[[Any], None]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            keep(out)
            return out
        return call

    spied = {(spares, "for_recovery"): took, (phases, "provision"): made, (phases, "configure"): converged}
    originals = {where: getattr(*where) for where in spied}
    for (module, name), keep in spied.items():
        setattr(module, name, spy(originals[module, name], keep))
    try:
        yield seen
    finally:
        for (module, name), original in originals.items():
            setattr(module, name, original)


def vm_path(seen: Seen, vm: str) -> str:
    """The path one new VM of the recovery came by."""
    if vm in (seen.spares or []):
        return "spare" if seen.provisioned is None else "spare, and terraform provisioned"
    if vm not in (seen.provisioned or []):
        return "no new VM"
    if vm in (seen.playbook or []):
        return "playbook"
    return "seed" if seen.playbook is not None else "no configure phase"


def recovery_path(seen: Seen, result: dict[str, Any]) -> str:
    """The path the recovery's new VMs came by: one name when they agree, else each VM's. The record must
    agree where it can tell: the nodes a spare serves are those spares.for_recovery handed over."""
    new = [str(n["vm"]) for n in result.get("nodes") or [] if n.get("replaced")]
    by_spare = sorted(str(n["vm"]) for n in result.get("nodes") or [] if n.get("spare"))
    if by_spare != sorted(seen.spares or []):
        return f"record and run disagree: spares serve {by_spare} in the record, {seen.spares or []} in the run"
    paths = {vm: vm_path(seen, vm) for vm in new}
    if len(set(paths.values())) == 1:
        return next(iter(paths.values()))
    return ", ".join(f"{vm}: {p}" for vm, p in paths.items()) or "no new VM"


def up_path(said: str, vms: list[str]) -> str:
    """The path a `glue up` of `vms` took, from what it said on stderr: playbook (it converged every VM),
    seed (every VM configured itself at first boot), nothing (no apply, nothing to converge); else each VM's."""
    text = " ".join(said.split())  # rich wraps long lines where the output is no terminal

    def of(vm: str) -> str:
        if f"converging {vm}:" in text:
            return "playbook"
        return "seed" if f"{vm}: configured itself at first boot from the cluster's seed" in text else "unchanged"

    paths = {vm: of(vm) for vm in vms}
    if set(paths.values()) == {"unchanged"}:
        nothing = "terraform: nothing to change" in text and "configuration: nothing changed" in text
        return "nothing" if nothing else "unchanged VMs after an apply"
    if len(set(paths.values())) == 1:
        return next(iter(paths.values()))
    return ", ".join(f"{vm}: {p}" for vm, p in paths.items())


def said_path(said: str, vm: str, result: dict[str, Any]) -> str:
    """A recovery run in another process (`glue watch`), from its console output and its record: spare, seed
    (it said the new VM configured itself from the seed), else not the seed."""
    if (result.get("new_vm") or {}).get("spare"):
        return "spare"
    seeded = f"{vm}: configured itself at first boot from the cluster's seed" in " ".join(said.split())
    return "seed" if seeded else "playbook (or another path: it never said the VM configured itself)"


def expect(expected: str, taken: str, what: str) -> None:
    """Stop the bench (exit status 1, one line) when `what` took another path than the one it measures."""
    if taken != expected:
        raise SystemExit(f"bench: {what}: expected the {expected} path, took: {taken}")
