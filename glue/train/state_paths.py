"""Where an attempt's own files live on its VM: one owner of their names (submitit's JobPaths is the model).

They sit on the VM's tmpfs (/run), under the run's folder, and go with the VM: the launch spec (0600: it
holds the trainer's environment, secrets included), the docker env file, the trainer's local log, the
supervisor's pids and its own log, and the workspace spec. What outlives the VM is in the bucket
(glue.train.layout). The code and virtualenv on the VM's disk: glue.train.workspace.paths.WorkPaths.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

RUN_STATE_ROOT = "/run/gpukit/runs"  # tmpfs on the VM: launch specs (0600), pids, local log


@dataclass(frozen=True)
class StatePaths:
    folder: str  # the run's folder on this VM: every attempt's files
    attempt: int

    @classmethod
    def of(cls, run: str, attempt: int, root: str = RUN_STATE_ROOT) -> StatePaths:
        return cls(f"{root}/{run}", attempt)

    @classmethod
    def of_spec(cls, spec: str, attempt: int) -> StatePaths:
        """The paths beside a launch spec wherever it was written (a serverless attempt's is in a temp dir)."""
        return cls(str(PurePosixPath(spec).parent), attempt)

    def _file(self, name: str) -> str:
        return f"{self.folder}/{name}"

    @property
    def spec(self) -> str:
        """The launch spec the supervisor runs (glue.train.run.launch.LaunchSpec), 0600."""
        return self._file(f"attempt-{self.attempt}.json")

    @property
    def env_file(self) -> str:
        """A docker attempt's environment (`docker run --env-file`), 0600."""
        return self._file(f"attempt-{self.attempt}.env")

    @property
    def log(self) -> str:
        """The trainer's output on the VM; shipped to the bucket in parts as it grows."""
        return self._file(f"attempt-{self.attempt}.log")

    @property
    def pids(self) -> str:
        """The supervisor's and trainer's pids and start time, written by the supervisor once it started it."""
        return self._file(f"attempt-{self.attempt}.pids.json")

    @property
    def supervisor_log(self) -> str:
        """The supervisor's own output (its Python errors before the trainer starts)."""
        return self._file(f"supervisor-{self.attempt}.log")

    @property
    def workspace_spec(self) -> str:
        """What `python -m glue.train.workspace prepare` gets: the attempt's code and requirements by hash."""
        return self._file(f"workspace-{self.attempt}.json")
