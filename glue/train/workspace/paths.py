"""Where a run's code and virtualenv live on the VM: one owner of the file names (like submitit's JobPaths).

The VM's own disk is wiped with the VM; everything here is rebuilt from the bucket on a new one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

WORK_ROOT = Path("/var/lib/gpukit/work")
# Where a packed environment is unpacked when it fits in a small share of the VM's memory (tmpfs: writing
# its thousands of files costs no disk metadata); the environment's own path stays env_dir, a link to it.
MEMORY_ROOT = Path("/dev/shm/gpukit-envs")
# Where a docker trainer sees the code (bind-mounted read-only); docs/guides/own-job.md.
CONTAINER_WORKDIR = "/gpukit/workdir"


@dataclass(frozen=True)
class WorkPaths:
    run: str
    attempt: int
    root: Path = WORK_ROOT
    memory: Path | None = None  # MEMORY_ROOT on a VM (glue.train.workspace.prepare); None: always on disk

    @property
    def run_dir(self) -> Path:
        return self.root / self.run

    @property
    def attempt_dir(self) -> Path:
        return self.run_dir / f"attempt-{self.attempt}"

    @property
    def code_dir(self) -> Path:
        """The unpacked package: the trainer's cwd and first PYTHONPATH entry."""
        return self.attempt_dir / "code"

    @property
    def package_record(self) -> Path:
        """The package's sha256 as verified on this node (read by the ranks' agreement check)."""
        return self.attempt_dir / "package.json"

    def venv_dir(self, set_sha256: str) -> Path:
        """The run's virtualenv for a dependency set: a link to env_dir (a --same-vm recovery reuses it once
        checked)."""
        return self.run_dir / f"venv-{set_sha256[:16]}"

    def env_dir(self, set_sha256: str) -> Path:
        """The set's virtualenv, at the same path on every VM (/var/lib/gpukit/envs/<set>), so its packed
        form unpacks there with nothing to relocate (its scripts name this path's python)."""
        return self.root.parent / "envs" / set_sha256[:16]

    def env_lock(self, set_sha256: str) -> Path:
        """Held while the set's environment is checked, built or unpacked (two runs of one set on a VM)."""
        return self.root.parent / "envs" / f"{set_sha256[:16]}.lock"

    def wheelhouse_dir(self, set_sha256: str) -> Path:
        return self.run_dir / f"wheels-{set_sha256[:16]}"
