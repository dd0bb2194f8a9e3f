"""Terraform's state made to say which warm spare serves in which lost VM's place (glue.cluster.spare_roles
records it at once; this catches the state up under terraform's lock, before any apply)."""

from __future__ import annotations

from pathlib import Path

from glue.cluster import current, spare_roles
from glue.infra.terraform import Terraform, vm_address


def reconcile(home: Path, tf: Terraform) -> set[str]:
    """Terraform's state made to say what spare_roles records: for each spare taken, the VM it replaced is
    deleted (unless kept) and dropped from the state, and the spare's state moved to that VM's address
    (the next apply renames it in place). Idempotent; call under tf.locked(). Returns the names done."""
    entries = spare_roles.taken(home)
    if not entries:
        return set()
    backend = current.backend(home)
    ids = tf.state_ids()
    for t in entries:
        node, spare = vm_address(t.name), vm_address(t.spare)
        if ids.get(node) == t.id:
            continue  # moved already (an earlier refill stopped before it dropped the entry)
        if t.old_id and backend.read_vm(t.old_id) is not None:
            backend.delete_vm(t.old_id)  # the failed VM is replaced, as `-replace` would
        if node in ids:
            tf.state_rm(node)
        if ids.get(spare) == t.id:
            tf.state_mv(spare, node)
    return {t.name for t in entries}


def settled(home: Path, names: set[str]) -> None:
    """After an apply: the entries reconcile() handled are in terraform's state now (and its outputs)."""
    if names:
        with spare_roles.locked(home):
            spare_roles.drop(home, names)


def forget_all(home: Path) -> None:
    """After `glue down`: no spare serves anywhere."""
    with spare_roles.locked(home):
        spare_roles.drop(home, {t.name for t in spare_roles.taken(home)})
