"""`make demo`: the whole loop on the local backend, in its own kit home (.gpukit/demo).

up (2 VMs, playbook) -> deploy tiny_gpt twice (reference + drill) -> destroy the drill run's VM
mid-run -> recover it onto a new VM -> verify against the uninterrupted reference -> recovery
table -> down. Exits 0 only when the verification passes.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime

from rich.console import Console
from rich.rule import Rule

from glue.cluster import current
from glue.errors import GlueError
from glue.operations import lifecycle
from glue.operations.recovery import drill
from glue.paths import PROJECT_ROOT, glue_command, home
from glue.runs.records import RecoveryRecord
from glue.train.layout import run_uri

STEPS, KILL_AT = 60, 30


def main() -> int:
    console = Console(stderr=True)
    base = home()
    demo_home = base / "demo"
    demo_home.mkdir(exist_ok=True)
    os.environ["GPUKIT_HOME"] = str(demo_home)
    backend = os.environ.get("BACKEND", "local")
    run_id = "demo-" + datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    t0 = time.monotonic()
    try:
        console.print(Rule(f"1/4  up: 2 VMs on the {backend} backend, configured by Ansible"))
        cfg = current.ClusterConfig(backend=backend, vms=2, name_prefix="demo")
        lifecycle.up(demo_home, cfg, console)
        console.print(Rule(f"2/4  train tiny_gpt twice ({STEPS} steps); destroy one VM at step {KILL_AT}; recover"))
        result = drill.drill(demo_home, run_id, PROJECT_ROOT / "examples" / "tiny_gpt.yaml", console,
                             steps=STEPS, kill_at=KILL_AT)
        console.print(Rule("3/4  down: destroy the VMs (the bucket and its data stay)"))
        lifecycle.down(demo_home, console)
    except GlueError as exc:
        console.print(f"[red]demo failed:[/] {exc}")
        glue = glue_command()
        console.print(f"inspect with: GPUKIT_HOME={demo_home} {glue} status; clean up with "
                      f"GPUKIT_HOME={demo_home} {glue} down --force", soft_wrap=True)
        return 1
    console.print(Rule("4/4  result"))
    verdict = "[green]PASS[/]" if result.passed else "[red]FAIL[/]"
    console.print(f"{verdict} in {time.monotonic() - t0:.0f}s: run {result.drill_run} lost its VM at step "
                  f"{result.destroyed_at} (asked: {result.kill_at}), resumed from step "
                  f"{RecoveryRecord.from_dict(result.recovery).checkpoint_step} on a new VM and "
                  f"matched the uninterrupted {result.ref_run} exactly ({result.compared_steps} per-step losses, "
                  f"{result.compared_tensors} tensors)." if result.passed else f"{verdict}: {result.problem}")
    console.print(f"records: {run_uri('gpukit', result.drill_run)}/ (GPUKIT_HOME={demo_home} {glue_command()} "
                  f"status --run {result.drill_run})", soft_wrap=True)
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
