"""A run as a Slurm batch job: sbatch's options from run.yaml's `resources:` (SbatchOptions) and the batch
script that starts the run on its node (BatchScript), both rendered from these typed records.

The script, on the allocated node: a notice file of its own job, removed at every (re)start; its output
appended under the run's state folder; USR1 (sbatch --signal=B:USR1@<s>, before the time limit and on
preemption) trapped and turned into the kit's termination notice (the trainer saves at its next step and
exits PREEMPTED_EXIT); then, on PREEMPTED_EXIT, `scontrol requeue` of its own job, whose next start is
the next attempt, resumed from the newest valid checkpoint. A multi-node job starts one task per node with
srun (each runs its node's torchrun agent, glue.train.run.slurm_group), and the notice reaches every node.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from glue.runs.config_resources import ResourcesSpec
from glue.scheduler.slurm import PARTITION
from glue.train.run.notice import PREEMPTED_EXIT
from glue.train.run.slurm_group import RDZV_PORT
from glue.train.run.slurm_job import notice_file, output_file

JOB_PREFIX = "gpukit-"  # every job glue submits is named gpukit-<run>
EARLY_OUTPUT = "/tmp/gpukit-slurm-%j.out"  # what slurmd itself says before the script moves its output
_GPUS = re.compile(r"gpu(?::[^:(,]+)?:(\d+)")


def gpus_of(gres: str) -> int:
    """GPUs in a GRES as Slurm shows it (gpu:1, gpu:a100:2, gpu:2(S:0-1), gres/gpu:1); 0 without any."""
    found = _GPUS.search(gres)
    return int(found.group(1)) if found else 0


def job_name(run: str) -> str:
    return f"{JOB_PREFIX}{run}"


def run_of_job(name: str) -> str | None:
    """<run> of a job glue submitted (gpukit-<run>); None for another job."""
    return name[len(JOB_PREFIX):] or None if name.startswith(JOB_PREFIX) else None


@dataclass(frozen=True)
class SbatchOptions:
    """sbatch's options for one run: each a `--name=value` (or a bare `--requeue`)."""

    run: str
    gpus_per_node: int = 1
    nodes: int = 1
    cpus_per_gpu: int | None = None
    mem_per_gpu: str | None = None
    time: str | None = None
    notice_seconds: int = 60
    partition: str = PARTITION

    @classmethod
    def of(cls, run: str, resources: ResourcesSpec | None) -> SbatchOptions:
        r = resources or ResourcesSpec()
        return cls(run=run, gpus_per_node=r.gpus_per_node, nodes=r.nodes, cpus_per_gpu=r.cpus_per_gpu,
                   mem_per_gpu=r.mem_per_gpu, time=r.time, notice_seconds=r.notice_seconds)

    def args(self) -> list[str]:
        out = [f"--job-name={job_name(self.run)}", f"--partition={self.partition}", f"--nodes={self.nodes}",
               f"--gres=gpu:{self.gpus_per_node}", "--ntasks-per-node=1"]
        if self.cpus_per_gpu is not None:
            out.append(f"--cpus-per-gpu={self.cpus_per_gpu}")
        if self.mem_per_gpu is not None:
            out.append(f"--mem-per-gpu={self.mem_per_gpu}")
        if self.time is not None:
            out.append(f"--time={self.time}")
        # B: the batch shell gets the signal (it forwards the notice); the trainer is not killed by it.
        out += ["--requeue", f"--signal=B:USR1@{self.notice_seconds}", f"--output={EARLY_OUTPUT}",
                "--export=ALL"]
        return out


@dataclass(frozen=True)
class BatchScript:
    """The script sbatch runs on the job's first node."""

    run: str
    options: SbatchOptions
    python: str  # the trainer runtime's python on the nodes

    def render(self) -> str:
        q = shlex.quote
        notice = notice_file(self.run, "${SLURM_JOB_ID}")
        out = output_file(self.run, "${SLURM_JOB_ID}")
        folder = notice.rsplit("/", 1)[0]
        directives = "".join(f"#SBATCH {a}\n" for a in self.options.args())
        return (
            "#!/bin/bash\n"
            f"{directives}"
            f"# gpukit run {self.run}: each (re)start of this job is an attempt (glue.train.run.slurm_job)\n"
            f"mkdir -p -m 0700 \"{folder}\"\n"
            f"exec >>\"{out}\" 2>&1\n"
            f"notice=\"{notice}\"\n"
            "rm -f \"$notice\"\n"
            "# trapped before the start line: a USR1 once the job says it started never ends the shell\n"
            f"trap 'echo \"gpukit: USR1 from Slurm: termination notice\"; {self._notify()}' USR1\n"
            "echo \"gpukit: job $SLURM_JOB_ID start ${SLURM_RESTART_COUNT:-0} on $SLURMD_NODENAME "
            "(nodes $SLURM_JOB_NODELIST, CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-})\"\n"
            f"{self._start(q(self.python))}"
            "child=$!\n"
            "# a trapped signal interrupts wait (status > 128): wait again until the child has exited; its own\n"
            "# status then comes from one more wait (bash keeps it), never from the interrupted one\n"
            "while kill -0 \"$child\" 2>/dev/null; do wait \"$child\"; done\n"
            "wait \"$child\"; code=$?\n"
            f"if [ \"$code\" -eq {PREEMPTED_EXIT} ]; then\n"
            "  echo \"gpukit: saved on the notice; requeueing job $SLURM_JOB_ID\"\n"
            "  scontrol requeue \"$SLURM_JOB_ID\" && exit 0\n"
            "fi\n"
            "exit \"$code\"\n"
        )

    def _notify(self) -> str:
        """The trap's action: the notice file on this node, and on every node of a multi-node job (a step of
        its own beside the running one, no GPUs)."""
        if self.options.nodes == 1:
            return 'touch \"$notice\"'
        return ('touch \"$notice\"; srun --overlap --gres=none --ntasks-per-node=1 -N \"$SLURM_JOB_NUM_NODES\" '
                'touch \"$notice\" || true')

    def _start(self, python: str) -> str:
        """The start line, in the background: slurm_job on this node; for a multi-node job one srun task per
        node (each with the job's GPUs on its node), after picking node 0's free rendezvous port."""
        job = f"{python} -m glue.train.run.slurm_job \"$notice\" &\n"
        if self.options.nodes == 1:
            return job
        return (f"{RDZV_PORT}=$({python} -m glue.train.run.slurm_group port \"$SLURMD_NODENAME\") || exit 1\n"
                f"export {RDZV_PORT}\n"
                f"srun --kill-on-bad-exit=1 --ntasks-per-node=1 {job}")
