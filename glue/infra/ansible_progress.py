"""The live host x stage table for a playbook run, fed from ansible-runner's events.

`Progress` collects the events (per-host stage marks, task counts, the first failure per host, the
summaries verify.yml records as facts, the final stats); `live()` shows its table with rich while a
playbook runs. `failure_message` turns a failed task's result into one line.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

# The fact verify.yml sets on every host: that host's summary (see ansible_verify).
SUMMARY_FACT = "gpukit_summary"


@dataclass
class _HostState:
    stage: str = ""
    task: str = ""
    done: int = 0
    changed: int = 0
    state: str = "waiting"  # waiting | running | ok | failed | unreachable
    stages: dict[str, str] = field(default_factory=dict)  # stage -> running | ok | changed | failed


_STAGE_LABEL = {"play": "facts", "nvidia_driver": "driver", "container_runtime": "docker",
                "bucket_mount": "/mnt/s3", "trainer": "trainer"}
_STAGE_STYLE = {"running": ("…", "yellow"), "ok": ("✓", "green"), "changed": ("✓", "cyan"),
                "failed": ("✗", "bold red"), "skipped": ("-", "dim")}


class Progress:
    """Collects runner events; renders a host x stage table (stages = roles, in order seen)."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.play = ""
        self.started = time.monotonic()
        self.hosts: dict[str, _HostState] = {}
        self.stages: list[str] = []
        self.failed: dict[str, str] = {}
        self.summaries: dict[str, dict[str, Any]] = {}
        self.stats: dict[str, Any] = {}
        self.lock = threading.Lock()

    def _host(self, name: str) -> _HostState:
        return self.hosts.setdefault(name, _HostState())

    def handle(self, event: dict[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        with self.lock:
            if kind == "playbook_on_play_start":
                self.play = str(data.get("play", ""))
            elif kind == "runner_on_start":
                self._on_start(data)
            elif kind in ("runner_on_ok", "runner_on_skipped", "runner_on_failed", "runner_on_unreachable"):
                self._on_result(kind, data)
            elif kind == "playbook_on_stats":
                self.stats = data
        return True  # keep the event in the artifacts

    def _stage(self, data: Mapping[str, Any]) -> str:
        stage = str(data.get("role") or "play")
        if stage not in self.stages:
            self.stages.append(stage)
        return stage

    def _on_start(self, data: Mapping[str, Any]) -> None:
        h = self._host(str(data.get("host", "?")))
        h.stage = self._stage(data)
        h.task = str(data.get("task", ""))
        if h.state in ("waiting", "ok"):
            h.state = "running"
        if h.stages.get(h.stage) not in ("failed", "changed"):
            h.stages[h.stage] = "running"

    def _on_result(self, kind: str, data: Mapping[str, Any]) -> None:
        host = str(data.get("host", "?"))
        h = self._host(host)
        stage = self._stage(data)
        res = data.get("res") or {}
        h.done += 1
        if kind == "runner_on_ok":
            if res.get("changed"):
                h.changed += 1
                h.stages[stage] = "changed"
            elif h.stages.get(stage) in (None, "running"):
                h.stages[stage] = "ok"
            facts = res.get("ansible_facts") or {}
            if isinstance(facts.get(SUMMARY_FACT), dict):
                self.summaries[host] = facts[SUMMARY_FACT]
        elif kind == "runner_on_skipped":
            if h.stages.get(stage) in (None, "running"):
                h.stages[stage] = "ok"
        elif kind == "runner_on_failed" and data.get("ignore_errors"):
            pass
        else:
            h.stages[stage] = "failed"
            h.state = "unreachable" if kind == "runner_on_unreachable" else "failed"
            if host not in self.failed:
                label = "unreachable" if kind == "runner_on_unreachable" else str(data.get("task", "?"))
                self.failed[host] = f"{label}: {failure_message(res)}"

    def finish(self) -> None:
        with self.lock:
            for host, n in (self.stats.get("changed") or {}).items():
                if host in self.hosts:
                    self.hosts[host].changed = int(n)  # no_log results hide `changed` from the events
            for h in self.hosts.values():
                if h.state == "running":
                    h.state = "ok"
                for stage, st in h.stages.items():
                    if st == "running":
                        h.stages[stage] = "ok"

    def render(self) -> Group:
        with self.lock:
            table = Table(title=None, expand=False, show_edge=False, pad_edge=False)
            table.add_column("host", style="bold")
            for stage in self.stages:
                table.add_column(_STAGE_LABEL.get(stage, stage), justify="center")
            table.add_column("tasks", justify="right")
            table.add_column("changed", justify="right")
            table.add_column("now", overflow="fold")
            for name in sorted(self.hosts):
                h = self.hosts[name]
                cells: list[Text | str] = [name]
                for stage in self.stages:
                    mark, style = _STAGE_STYLE.get(h.stages.get(stage, ""), ("", ""))
                    cells.append(Text(mark, style=style))
                now = h.task if h.state == "running" else h.state
                if h.state in ("failed", "unreachable"):
                    now = self.failed.get(name, h.state)
                cells += [str(h.done), str(h.changed), Text(now[:90], style="red" if name in self.failed else "")]
                table.add_row(*cells)
            head = Text(f"{self.title} — {self.play}  {time.monotonic() - self.started:5.1f}s", style="bold")
            return Group(head, table)


@contextmanager
def live(progress: Progress, show: bool = True) -> Iterator[None]:
    """Show the table on stderr while the body runs (re-rendered from rich's own thread, while the
    runner feeds events); `progress.finish()` when it ends, shown or not."""
    if not show:
        try:
            yield
        finally:
            progress.finish()
        return
    console = Console(stderr=True)
    with Live(console=console, get_renderable=progress.render, refresh_per_second=4,
              transient=False) as display:
        try:
            yield
        finally:
            progress.finish()
            display.refresh()
    if not console.is_terminal:  # rich ends a non-terminal Live without a newline: the next line would run on
        console.line()


# What ssh itself adds to a raw task's stderr when a multiplexed session ends.
_SSH_NOISE = re.compile(r"^(Shared connection|Connection) to \S+ closed\.$")


def failure_message(res: Mapping[str, Any]) -> str:
    """One line from a failed task's result: its msg, plus the last line of stderr for commands."""
    if not isinstance(res, Mapping):
        return str(res)
    if res.get("censored"):
        return "output hidden (no_log)"
    msg = str(res.get("msg") or "").strip()
    output = [str(res.get(k) or "") for k in ("stderr", "stdout")]  # stdout: a raw task under a pty
    if any(output) and (not msg or msg == "non-zero return code" or res.get("failed_when_result")):
        for text in output:
            lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not _SSH_NOISE.match(ln.strip())]
            if lines:
                return lines[-1] if not msg or msg == "non-zero return code" else f"{msg}: {lines[-1]}"
    if not msg and res.get("results"):  # a loop: the first failed item
        for item in res["results"]:
            if isinstance(item, Mapping) and item.get("failed"):
                return failure_message(item)
    return " ".join(msg.split()) or json.dumps(res)[:300]
