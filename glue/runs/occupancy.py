"""Which VMs of the cluster a live run uses: what `glue deploy` places around and `glue recover` never
replaces under another run.

A run is live on a VM when its latest attempt ran there (the VM's name and id: a VM re-created under
the same name is a new VM) and the monitor classes that attempt running (training, or starting under a
deploy's or recover's lease). The run records narrow it first: an attempt recorded as ended (an
outcome or a failure class) is not asked about, so a placement costs one monitor poll per run that
may still be alive, not one per run in the bucket.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from glue.cluster import current
from glue.errors import GlueError
from glue.infra.inventory import Host
from glue.runs import monitor, records
from glue.runs.classify import AttemptClass
from glue.runs.store import RunStore, run_ids


@dataclass(frozen=True)
class Occupancy:
    """VM name -> the live runs on it (sorted); a VM not named is free."""

    runs: dict[str, list[str]] = field(default_factory=dict)

    def busy(self, name: str) -> list[str]:
        return self.runs.get(name, [])

    def free(self, hosts: list[Host]) -> list[Host]:
        return [h for h in hosts if not self.busy(h.name)]

    def describe(self, names: list[str]) -> str:
        """'gpukit-1 (run a), gpukit-2 (runs b, c)' for the busy ones of `names`."""
        said = []
        for name in names:
            runs = self.busy(name)
            if runs:
                said.append(f"{name} ({'run' if len(runs) == 1 else 'runs'} {', '.join(runs)})")
        return ", ".join(said)


def live_on(home: Path, hosts: list[Host], exclude: str | None = None) -> Occupancy:
    """The live runs on `hosts` (every run in the cluster's bucket but `exclude`)."""
    by_id = {h.id: h for h in hosts}
    if not by_id:
        return Occupancy()
    info = current.bucket_info(home)
    creds = current.backend(home).bucket_credentials()
    found: dict[str, list[str]] = {}
    for run in run_ids(info, creds):
        if run == exclude:
            continue
        store = RunStore(info, creds, run)
        attempt = store.latest_attempt()
        if attempt is None:
            continue
        on = [by_id[str(nd.vm_id)] for nd in records.nodes_of(attempt) if str(nd.vm_id) in by_id]
        if not on or attempt.ended:
            continue
        if _running(home, store):
            for host in on:
                found.setdefault(host.name, []).append(run)
    return Occupancy({name: sorted(runs) for name, runs in found.items()})


def _running(home: Path, store: RunStore) -> bool:
    """The monitor's verdict, recording nothing (an incident is the business of that run's own watcher or
    status). A run whose state cannot be read counts as live: placing beside it blindly is what this
    module exists to prevent."""
    try:
        return monitor.check(home, store, record_incident=False).diagnosis.outcome is AttemptClass.RUNNING
    except GlueError:
        return True
