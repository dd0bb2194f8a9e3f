"""`glue memprobe --run X` on a user's own job (a `workdir:` with requirements, not tiny_gpt): the run OOMs under
`deploy --memory-limit-mb`; memprobe runs the run's own command as deployed on a VM, one config value changed per
trial, each trial stopped by the RunContext after K steps (glue.train.run.probe), finds the boundary within the
trial bound, names a reproducer that fails the same way, breaks the step's memory into parts that add up to the
peak, and tries the run's declared remedy. `--config run.yaml` probes the same job undeployed. Bad input: one
line each, the run's records unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from glue.runs.store import RunStore
from tests.integration.test_runs import here, wait_for
from tests.wheels import make_wheel

from .conftest import Kit

pytestmark = pytest.mark.e2e

TRAIN = '''
"""A user's regression: a wide input, a small MLP, its own loop; sizes from ctx.config."""
import torch
from torch import nn

import mp_dep
from glue.train import RunContext


def main() -> None:
    with RunContext.from_env() as ctx:
        cfg = ctx.config
        torch.manual_seed(0)
        torch.set_num_threads(1)
        feats, batch, accum = int(cfg["features"]), int(cfg["batch_size"]), int(cfg.get("grad_accum", 1))
        model = nn.Sequential(nn.Linear(feats, 8), nn.ReLU(), nn.Linear(8, 1))  # narrow: the input is the memory
        opt = torch.optim.AdamW(model.parameters(), lr=float(cfg["lr"]))
        ckpt = ctx.checkpointer()
        ckpt.register("model", model)
        ckpt.register("optimizer", opt)
        gen = torch.Generator().manual_seed(1)
        print("scale", mp_dep.SCALE, flush=True)
        for step in range(1, int(cfg["steps"]) + 1):
            opt.zero_grad(set_to_none=True)
            total = 0.0
            for _ in range(accum):  # micro-batches: the same effective batch in 1/accum of the memory
                x = torch.randn(batch // accum, feats, generator=gen)
                loss = nn.functional.mse_loss(model(x), x[:, :1] * mp_dep.SCALE)
                (loss / accum).backward()
                total += loss.item() / accum
                del x, loss
            opt.step()
            ctx.step(step, total)
            if step % 10 == 0:
                ckpt.save(step)
        ckpt.close()


if __name__ == "__main__":
    main()
'''
LIMIT_MB = 700


def project(tmp_path: Path, config: dict | None = None) -> Path:
    proj, index = tmp_path / "proj", tmp_path / "index"
    proj.mkdir()
    make_wheel(index, "gpukit-mp-dep", "0.1", "mp_dep", "SCALE = 0.5\n")
    (proj / "train.py").write_text(TRAIN)
    (proj / "requirements.txt").write_text(f"--find-links {index}\ngpukit-mp-dep==0.1\n")
    run = {"command": ["python", "train.py"], "workdir": ".", "requirements": "requirements.txt",
           "config": config if config is not None else
           {"features": 2048, "batch_size": 65536, "lr": 0.01, "steps": 40, "grad_accum": 1},
           "memprobe": {"remedies": {"grad_accum": {"grad_accum": 8}}},
           "outputs": {"destination": "s3://{bucket}/runs/{run}/outputs"},
           "checkpoint": {"target": "s3://{bucket}/runs/{run}", "interval_steps": 10},
           "env": {"OMP_NUM_THREADS": "1"}}
    (proj / "run.yaml").write_text(yaml.safe_dump(run))
    return proj / "run.yaml"


def records(store: RunStore) -> list[str]:
    return sorted(k for k in store.keys("") if not k.startswith("memprobe/"))


@pytest.mark.timeout(1500)
def test_memprobe_of_an_own_job_finds_boundary_reproducer_parts_and_remedy(cluster_kit: Kit, tmp_path: Path) -> None:
    kit, fast = cluster_kit, here(cluster_kit)
    cfg = project(tmp_path)
    kit.glue("deploy", "--run", "mp-own", "--config", str(cfg), "--vm", "gpukit-2", "--memory-limit-mb", str(LIMIT_MB),
             timeout=600)
    wait_for(fast, "mp-own", lambda s: s["state"] != "running", timeout=300)
    store = RunStore.open(kit.home, "mp-own")
    assert store.attempt(1).get("failure_class") == "oom_host"
    before = records(store)

    res = kit.glue("memprobe", "--run", "mp-own", "--vary", "batch_size", "--range", "2048:65536", "--grid", "pow2",
                   "--accept-steps", "4", "--json", timeout=1200)
    report = json.loads(res.stdout)
    assert report["memory_limit_mb"] == LIMIT_MB and report["source"]["job"]["vm"] == "gpukit-2"
    [s] = report["searches"]
    assert s["smallest_fail"] is not None and s["largest_fit"] is not None, s
    assert s["smallest_fail"] == 2 * s["largest_fit"] and s["trial_count"] <= s["trial_bound"] == 4
    assert all(t["steps_run"] == 2 for t in s["trials"] if t["status"] == "fit")  # stopped itself after K steps
    # The breakdown: every part of the peak, `other` included, adds up to the measured peak.
    b = report["breakdown"]["breakdown"]
    parts = b["at_peak_mb"]
    assert set(parts) >= {"weights", "gradients", "optimizer_state", "activations", "other"}
    assert abs(sum(parts.values()) - b["peak_mb"]) <= 0.05 * b["peak_mb"]
    assert parts["activations"] > parts["weights"] > 0 and parts["optimizer_state"] == pytest.approx(
        2 * parts["weights"], rel=0.05)
    # The declared remedy, alone at the failing input, fits and passes the loss check.
    rm = report["remedies"]
    [item] = rm["items"]
    assert item["name"] == "grad_accum" and item["change"] == {"grad_accum": 8}
    assert item["status"] == "fit" and item["accepted"], item
    assert rm["baseline"]["status"] == "oom"
    # The reproducer is a command that fails the same way.
    rp = report["reproducer"]
    assert rp["at"] == {"batch_size": s["smallest_fail"]} and rp["fixed_exceeds_limit"] is False
    again = kit.glue(*rp["command"].split()[1:], "--json", timeout=600)
    [one] = json.loads(again.stdout)["searches"][0]["trials"]
    assert one["status"] == "oom" and one["changed"] == {"batch_size": s["smallest_fail"]}
    assert records(store) == before  # trials wrote nothing into the run's records
    # The same job from its run.yaml (not deployed): shipped as deploy ships it, one trial at the failing value.
    out = tmp_path / "from-config.json"
    own = kit.glue("memprobe", "--config", str(cfg), "--vm", "gpukit-2", "--memory-limit-mb", str(LIMIT_MB),
                   "--range", f"{s['smallest_fail']}:{s['smallest_fail']}", "--no-breakdown", "--no-remedies",
                   "--out", str(out), timeout=600)
    [one] = json.loads(out.read_text())["searches"][0]["trials"]
    assert one["status"] == "oom" and str(out) in own.stderr

    # Bad input: one line each, nothing changed in the run's records.
    bad = kit.glue("memprobe", "--run", "mp-own", "--vary", "depth", check=False)
    assert bad.returncode != 0 and "config has no 'depth'" in bad.stderr and "Traceback" not in bad.stderr
    err = kit.glue("memprobe", "--run", "mp-own", "--set", "lr=oops", "--no-remedies", "--no-breakdown",
                   check=False, timeout=600)
    assert err.returncode != 0 and "first trial failed" in err.stderr and "Traceback" not in err.stderr, err.stderr
    bare = RunStore.open(kit.home, "mp-bare")
    manifest = store.manifest()
    bare.put_json("manifest.json", {**manifest, "run": "mp-bare", "config": {**manifest["config"], "config": {}}})
    none = kit.glue("memprobe", "--run", "mp-bare", check=False)
    assert none.returncode != 0 and "has no `config:`" in none.stderr and "Traceback" not in none.stderr
    assert records(store) == before
