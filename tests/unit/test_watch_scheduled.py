"""The watcher leaves a run a job scheduler restarts itself (Slurm) to the `scheduled` hook: no classification,
no recovery of its own beside the scheduler's restart; runs the hook declines get the watcher's usual poll."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml
from rich.console import Console

from glue.paths import PROJECT_ROOT
from glue.runs.records import Manifest
from glue.watch.controller import Watcher
from glue.watch.watch_state import Row


class Untouchable:
    """A store the watcher must not read: the hook answered for the run."""

    run = "sl"

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the watcher read the store ({name}) of a run the scheduler owns")


def test_a_scheduled_run_gets_the_hooks_row_and_nothing_else(tmp_path: Path) -> None:
    seen: list[str] = []

    def hook(store: Any) -> Row | None:
        seen.append(store.run)
        return Row(run=store.run, state="waiting", outcome="slurm", note="Slurm job 7 PENDING (Resources)")

    store = Untouchable()
    watcher = Watcher(tmp_path, ("sl",), Console(file=io.StringIO()), stores={"sl": store},  # type: ignore[dict-item]
                      scheduled=hook)
    row = watcher.watch_run("sl")
    assert (row.state, row.note, seen) == ("waiting", "Slurm job 7 PENDING (Resources)", ["sl"])


def test_a_run_the_hook_declines_is_polled_as_usual(tmp_path: Path) -> None:
    class NoAttempts:
        """A run deployed a moment ago: its manifest written, no attempt recorded yet."""

        run = "plain"
        info = SimpleNamespace(name="gpukit")

        def read_manifest(self) -> Manifest:
            config = yaml.safe_load((PROJECT_ROOT / "examples" / "tiny_gpt.yaml").read_text())
            return Manifest.from_dict({"config": config}, run="plain")

        def attempts(self) -> list[int]:
            return []

    watcher = Watcher(tmp_path, ("plain",), Console(file=io.StringIO()), stores={"plain": NoAttempts()},  # type: ignore[dict-item]
                      scheduled=lambda store: None)
    row = watcher.watch_run("plain")
    assert (row.state, row.note) == ("waiting", "no attempt yet")
