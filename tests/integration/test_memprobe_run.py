"""`glue memprobe --run X`: the config and the memory limit come from the run's records in the bucket
(a real rclone S3 server), the report goes back into the bucket at runs/X/memprobe/<UTC>.json.

No VMs: the run's manifest and failed attempt are written the way `glue deploy` / the monitor write
them. Seven trial processes (3 search, 1 breakdown, 1 reference, 2 remedies) at tiny sizes: only the
remedies this test checks are asked for (bf16 and adapter are two more trial processes of ~7 s each here,
and nothing below looks at them; which remedies apply is unit-tested in test_memprobe_parts).
"""

from __future__ import annotations

import json

import pytest

from glue.runs.store import RunStore
from glue.train import layout

from .conftest import Kit

pytestmark = pytest.mark.integration


# `stress` (make test-all, since 2026-12-07: the suite's time): make test probes a deployed run's own job on a VM
# (search, breakdown, a declared remedy, the reproducer: tests/e2e/test_memprobe_own_job.py); this adds the
# example trainer's reference and two remedies, in local trial processes.
@pytest.mark.stress
@pytest.mark.timeout(900)
def test_memprobe_for_an_oom_host_run(kit: Kit) -> None:
    store = RunStore.open(kit.home, "mp-oom")
    store.put_json(layout.MANIFEST, {
        "run": "mp-oom", "command": ["python", "-m", "glue.examples.tiny_gpt"],
        "config": {"command": ["python", "-m", "glue.examples.tiny_gpt"], "runtime": "process",
                   "config": {"batch_size": 16, "seq_len": 128, "d_model": 64, "n_layer": 2, "steps": 100}},
    })
    store.put_json(layout.attempt_key(1), {"run": "mp-oom", "attempt": 1, "vm": "gpukit-2", "memory_limit_mb": 450,
                                       "failure_class": "oom_host", "last_step": 0})
    res = kit.glue("memprobe", "--run", "mp-oom", "--range", "16:64", "--grid", "pow2", "--trial-steps", "1",
                   "--accept-steps", "6", "--remedy", "grad_accum", "--remedy", "checkpointing", timeout=800)
    keys = [k for k in store.keys(layout.MEMPROBE_PREFIX) if k.endswith(".json")]
    assert len(keys) == 1, keys
    report = store.get_json(keys[0])
    assert report["source"]["run"] == "mp-oom" and report["memory_limit_mb"] == 450
    assert "attempt 1" in report["limit_source"]
    [s] = report["searches"]
    assert (s["largest_fit"], s["smallest_fail"]) == (32, 64)
    bd = report["breakdown"]
    assert bd["at"] == {"batch_size": 32} and bd["breakdown"]["at_peak_mb"]["activations"] > 50
    rm = report["remedies"]
    assert rm["at"] == {"batch_size": 64} and rm["baseline"]["status"] == "oom"
    assert rm["reference"]["status"] == "fit" and rm["reference"]["loss"] is not None
    items = {r["name"]: r for r in rm["items"]}
    assert set(items) == {"grad_accum", "checkpointing"}  # what was asked for, no more
    assert items["grad_accum"]["status"] == "fit" and items["grad_accum"]["accepted"]
    assert items["grad_accum"]["change"] == {"batch_size": 16, "grad_accum": 4}
    # with 2 layers, checkpointing saves at most one layer's activations: it may or may not fit here,
    # but it is measured, alone, and when it fits it passes the loss check (same arithmetic)
    assert items["checkpointing"]["status"] in ("fit", "oom") and items["checkpointing"]["change"] == {
        "checkpointing": True}
    assert items["checkpointing"]["status"] == "oom" or items["checkpointing"]["accepted"]
    assert items["grad_accum"]["peak_mb"] < rm["baseline"]["peak_mb"]
    assert "grad_accum" in rm["works"]
    assert layout.run_prefix("mp-oom") + keys[0] in res.stderr
    assert "smallest that fails 64" in res.stdout
    assert json.dumps(report)  # plain JSON all the way down

    missing = kit.glue("memprobe", "--run", "no-such-run", check=False)
    assert missing.returncode != 0 and "unknown run" in missing.stderr and "Traceback" not in missing.stderr
