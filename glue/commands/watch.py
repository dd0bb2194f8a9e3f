"""glue watch: keeps runs going unattended (automatic verified recovery within budgets)."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from glue.commands.options import NON_NEGATIVE, POLL_SECONDS
from glue.errors import GlueError
from glue.paths import home
from glue.runs.store import RunStore
from glue.watch.watch_state import Row

err = Console(stderr=True)


def _table(rows: list[dict[str, object]]) -> Table:
    table = Table(title=f"glue watch  {time.strftime('%H:%M:%S')}", box=None)
    for col in ("run", "state", "attempt", "step", "class", "preemptions", "failures", "last action", "note"):
        table.add_column(col, overflow="fold")
    for r in rows:
        used, caps = dict(r.get("used") or {}), dict(r.get("caps") or {})  # type: ignore[call-overload]
        table.add_row(str(r["run"]), str(r["state"]), str(r.get("attempt") or ""), str(r.get("step") or ""),
                      str(r.get("outcome") or ""), f"{used.get('preemptions', 0)}/{caps.get('preemptions', '?')}",
                      f"{used.get('failures', 0)}/{caps.get('failures', '?')}", str(r.get("last") or ""),
                      str(r.get("note") or "")[:160])
    return table


def _write_status(rows: list[dict[str, object]]) -> None:
    from glue.runs.store import utc_iso
    from glue.watch.service import watch_dir

    path = watch_dir(home()) / "status.json"
    tmp = path.with_name(f".status.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps({"updated_at": utc_iso(), "rows": rows}, indent=1))
    tmp.replace(path)


def once_failures(rows: list[dict[str, object]]) -> list[str]:
    """What `--once` exits 1 for: a run it could not read, or a recovery that failed in this pass."""
    return [f"{r['run']}: {r['note']}" for r in rows
            if r["state"] == "error" or str(r["note"]).startswith("recovery failed")]


# Whether a run went to Slurm is fixed at its deploy: asked of its manifest once per watcher, not every poll.
_ON_SLURM: dict[str, bool] = {}


def _slurm_row(store: RunStore) -> Row | None:
    """A run under Slurm: Slurm restarts its job; the watcher replaces lost nodes' VMs and checks restarts."""
    from glue.scheduler.slurm import takeover

    if store.run not in _ON_SLURM:
        _ON_SLURM[store.run] = takeover.is_slurm_run(store)
    if not _ON_SLURM[store.run]:
        return None
    taken = takeover.take(home(), store, err)
    latest = store.latest_attempt()
    return Row(run=store.run, state=taken.state, attempt=latest.attempt if latest else None, outcome="slurm",
               note=taken.note)


def _foreground(runs: tuple[str, ...], interval: float, once: bool, keep_failed: bool, tolerance: float) -> None:
    from glue.watch.controller import Watcher

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # --stop, systemd: end between two actions
    live: Live | None = Live(_table([]), console=err, auto_refresh=False) if err.is_terminal else None

    @contextmanager
    def pause() -> Iterator[None]:
        # A recovery shows its own progress (spinners, terraform's table): one live display at a time.
        if live is not None:
            live.stop()
        try:
            yield
        finally:
            if live is not None:
                live.start()

    watcher = Watcher(home(), runs, err, keep_failed=keep_failed, tolerance=tolerance, pause=pause, single_pass=once,
                      scheduled=_slurm_row)
    watcher.validate()
    last_lines: dict[str, str] = {}
    if live is not None:
        live.start()
    try:
        while True:
            rows = [asdict(r) for r in watcher.poll()]
            _write_status(rows)
            if live is not None:
                live.update(_table(rows), refresh=True)
            else:  # a log (detached, or piped): one line per run when its state changes
                for r in rows:
                    line = f"{r['run']}: {r['state']} attempt {r['attempt']} {r['outcome']} {r['note']}".rstrip()
                    if last_lines.get(str(r["run"])) != line:
                        err.print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}", highlight=False, soft_wrap=True)
                        last_lines[str(r["run"])] = line
            if once:  # a cron job's exit status: 1 when this pass could not do what it had to
                failed = once_failures(rows)
                if failed:
                    raise GlueError("; ".join(failed))
                return
            if rows and all(r["state"] in ("completed", "stopped") for r in rows) and runs:
                return
            # A late heartbeat's probe window closes before the next regular poll: poll right then.
            wake = watcher.wake_at - time.time() if watcher.wake_at is not None else interval
            time.sleep(min(interval, max(wake, 0.05)))
    finally:
        if live is not None:
            live.stop()


@click.command()
@click.option("--run", "runs", multiple=True, help="Watch only this run (repeatable; default: every run in the "
              "bucket whose latest attempt had not ended when first seen).")
@click.option("--interval", type=POLL_SECONDS, default=1.0, show_default=True, help="Seconds between polls.")
@click.option("--once", is_flag=True, help="Poll once, act on what it finds, and exit (1 when a recovery failed "
                                          "or a run or the bucket could not be read).")
@click.option("--keep-failed", is_flag=True,
              help="Keep a failed VM that is still alive (stall, comm) for debugging; the run moves to a new VM.")
@click.option("--tolerance", type=NON_NEGATIVE, default=0.0, show_default=True,
              help="Allowed loss difference in the resume check (0 = exact, right for CPU).")
@click.option("--detach", is_flag=True, help="Run as a supervised service (systemd unit, or a daemon with a pidfile).")
@click.option("--status", "show_status", is_flag=True, help="Show the detached watcher and its last table.")
@click.option("--stop", is_flag=True, help="Stop the detached watcher.")
@click.option("--json", "as_json", is_flag=True, help="With --status: machine-readable output.")
def watch(runs: tuple[str, ...], interval: float, once: bool, keep_failed: bool, tolerance: float, detach: bool,
          show_status: bool, stop: bool, as_json: bool) -> None:
    """Keep runs going unattended: detect failures, recover within the run's budgets, notify."""
    from glue.errors import GlueError
    from glue.watch import service

    if sum((detach, show_status, stop)) > 1:
        raise GlueError("--detach, --status and --stop go alone")
    if as_json and not show_status:
        raise GlueError("--json goes with --status")
    if show_status:
        st = service.status(home())
        if as_json:
            click.echo(json.dumps(st, indent=2))
            return
        out = Console()  # a listing: on stdout, like `glue status`
        where = st.get("unit") or (f"pid {st['pid']}" if st.get("pid") else "")
        out.print(f"watcher: {'[green]running[/]' if st['running'] else '[yellow]not running[/]'} {where}".rstrip()
                  + (f", log {st['log']}" if st.get("log") else ""))
        if st["table"]:
            out.print(_table(st["table"]))
            out.print(f"(as of {st['updated_at']})")
        return
    if stop:
        err.print(service.stop(home()))
        return
    if detach:
        from glue.watch.controller import Watcher

        Watcher(home(), runs, err).validate()  # a misspelt run fails here, not in the background
        args = [a for r in runs for a in ("--run", r)] + ["--interval", str(interval)]
        args += ["--keep-failed"] if keep_failed else []
        args += ["--tolerance", str(tolerance)] if tolerance else []
        err.print(f"watching in the background: {service.start(home(), args)}; `glue watch --status`, "
                  "`glue watch --stop`")
        return
    _foreground(runs, interval, once, keep_failed, tolerance)


COMMANDS: list[click.Command] = [watch]
