"""Slurm's queue as glue asks it on the head (as root, over SSH): the jobs glue submitted (squeue), and
the commands that change one (sbatch, scancel). slurmctld not answering is one line naming the head."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from glue.errors import GlueError
from glue.infra import ssh
from glue.infra.inventory import Host
from glue.scheduler.slurm.batch import gpus_of, job_name, run_of_job
from glue.scheduler.slurm.nodes import head

TIMEOUT_S = 20  # each Slurm client gives up after this; SSH waits a little longer
SQUEUE_FORMAT = "%i|%j|%T|%r|%N|%b|%D"


@dataclass(frozen=True)
class Job:
    """One line of squeue: a job glue submitted for `run`."""

    job_id: str
    run: str
    state: str  # PENDING, RUNNING, COMPLETING, REQUEUED, ...
    reason: str  # why it waits (Resources, Priority, BeginTime, ...); "" when none
    nodes: str  # the node list it runs on; "" while pending
    gres: str  # what it asked per node (gres/gpu:1, gpu:1)
    node_count: int = 1

    def as_dict(self) -> dict[str, str]:
        return {"job_id": self.job_id, "run": self.run, "state": self.state, "reason": self.reason,
                "nodes": self.nodes, "gres": self.gres}


def gpus_held(job: Job) -> int:
    """GPUs a job holds now: its GPUs per node on each of its nodes while it runs (or is ending)."""
    if job.state not in ("RUNNING", "COMPLETING", "SUSPENDED") or not job.nodes:
        return 0
    return gpus_of(job.gres) * job.node_count


def parse_squeue(text: str) -> list[Job]:
    """`squeue -h -o SQUEUE_FORMAT` -> glue's jobs (other jobs left out)."""
    jobs = []
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 7:
            continue
        job_id, name, state, reason, nodes, gres, count = fields
        run = run_of_job(name)
        if run is None:
            continue
        jobs.append(Job(job_id, run, state.upper(), "" if reason in ("None", "(null)") else reason,
                        "" if nodes == "(null)" else nodes, "" if gres in ("N/A", "(null)") else gres,
                        int(count) if count.isdigit() else 1))
    return jobs


def on_head(home: Path, command: str, what: str, host: Host | None = None) -> str:
    """`command` as root on the Slurm head; its stdout. A failure is one line: `what` failed, and why."""
    host = host or head(home)
    try:
        res = ssh.run(home, host, command, timeout=TIMEOUT_S + 10)
    except GlueError as exc:
        raise GlueError(f"the Slurm head {host.name} does not answer ({exc}); check `glue status`") from None
    if res.exit_code != 0:
        said = (res.stderr.strip() or res.stdout.strip() or f"exit {res.exit_code}").splitlines()[-1]
        down = "slurm_load" in said or "Unable to contact" in said or "Connection refused" in said
        hint = "slurmctld is down: `glue up` starts it again" if down else "see the head's slurmctld log"
        raise GlueError(f"{what} failed on the Slurm head {host.name}: {said} ({hint})")
    return res.stdout


def jobs(home: Path) -> list[Job]:
    """Every job glue submitted that Slurm still knows (pending, running, requeued, just ended)."""
    return parse_squeue(on_head(home, f"timeout {TIMEOUT_S} squeue -h -a -o {shlex.quote(SQUEUE_FORMAT)}",
                                "squeue"))


def job(home: Path, job_id: str) -> Job | None:
    return next((j for j in jobs(home) if j.job_id == job_id), None)


def cancel(home: Path, job_id: str, run: str) -> None:
    """scancel: the run's job ends (a running one's processes are signalled), and is never requeued. Only if
    the job of that id is still the run's (`--name`): a new head numbers jobs from 1 again, and the id a
    record holds may by now be another run's job."""
    if not job_id.isdigit():
        raise GlueError(f"{job_id!r} is not a Slurm job id")
    name = shlex.quote(f"--name={job_name(run)}")
    on_head(home, f"timeout {TIMEOUT_S} scancel {name} {job_id}", f"scancel {job_id}")


def parse_job_id(text: str) -> str:
    """`sbatch --parsable` prints `<id>` or `<id>;<cluster>`."""
    first = text.strip().splitlines()[-1] if text.strip() else ""
    job_id = first.split(";")[0]
    if not job_id.isdigit():
        raise GlueError(f"sbatch did not print a job id (it said {text.strip()[:200]!r})")
    return job_id


def mark_down(home: Path, nodes: list[str], why: str) -> None:
    """Nodes whose VMs are gone, DOWN now: Slurm requeues their jobs at once instead of after SlurmdTimeout
    (ReturnToService=2 takes each back when its new VM registers)."""
    names = ",".join(n for n in nodes if n.replace("-", "").replace(".", "").isalnum())
    on_head(home, f"timeout {TIMEOUT_S} scontrol update nodename={names} state=down reason={shlex.quote(why)}",
            f"marking {names} down")


def start_now(home: Path, job_id: str) -> None:
    """A requeued job held back (Reason=BeginTime: the old credential's lifetime, which guards a job still
    running on its node; none runs on a VM that is gone) may start at once."""
    if not job_id.isdigit():
        raise GlueError(f"{job_id!r} is not a Slurm job id")
    on_head(home, f"timeout {TIMEOUT_S} scontrol update jobid={job_id} starttime=now", f"starting job {job_id} now")
