"""memprobe pieces that need no trial process: remedies, config sources, findings, OOM messages,
and the profiler breakdown of one whole step (run in this process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from glue.errors import GlueError
from glue.memprobe import investigate, measure, remedies, source
from glue.runs.records import AttemptRecord, Manifest


def test_remedies_change_one_thing_each() -> None:
    cfg = {"batch_size": 64, "grad_accum": 1, "checkpointing": False, "autocast_bf16": False, "adapter_only": True}
    by_name = {r.name: r for r in remedies.remedies(cfg, accum=4)}
    assert by_name["checkpointing"].change == {"checkpointing": True}
    assert by_name["bf16"].change == {"autocast_bf16": True}
    assert by_name["grad_accum"].change == {"batch_size": 16, "grad_accum": 4}  # same effective batch
    assert by_name["adapter"].skipped == "already on in the config"
    one = {r.name: r for r in remedies.remedies({**cfg, "batch_size": 1})}
    assert one["grad_accum"].skipped
    assert remedies.accumulation_split(65, 4) == 5 and remedies.accumulation_split(6, 4) == 3
    assert remedies.accumulation_split(37, 4) == 37
    assert remedies.accepted(2.0, 2.05, 0.05) is True and remedies.accepted(2.5, 2.0, 0.05) is False
    assert remedies.accepted(None, 2.0, 0.05) is None


def test_config_sources(tmp_path: Path) -> None:
    good = tmp_path / "run.yaml"
    good.write_text("command: [python, -m, glue.examples.tiny_gpt]\nconfig: {batch_size: 32}\n")
    src = source.from_config_file(good)
    assert src.trainer_cfg == {"batch_size": 32}
    cfg = source.trainer_config(src.trainer_cfg, source.parse_set(("seq_len=256", "checkpointing=true")))
    assert cfg["batch_size"] == 32 and cfg["seq_len"] == 256 and cfg["checkpointing"] is True
    assert cfg["d_model"] == 64  # tiny_gpt's default fills the rest
    other = tmp_path / "other.yaml"
    other.write_text("command: [python, train.py]\nconfig: {}\n")
    with pytest.raises(GlueError, match="has no `config:`"):  # your own job: it needs sizes to vary
        source.from_config_file(other)
    other.write_text("command: [python, train.py]\nconfig: {batch_size: 8}\n")
    own = source.from_config_file(other)
    assert own.job and own.manifest is not None and own.manifest.config["command"] == ["python", "train.py"]
    with pytest.raises(GlueError, match=r"not a glue\.examples\.tiny_gpt setting"):
        source.trainer_config({}, {"batchsize": 3})
    with pytest.raises(GlueError, match="key=value"):
        source.parse_set(("oops",))
    assert source.parse_ranges(("8:64",), ["batch_size"]) == {"batch_size": (8, 64)}
    assert source.parse_ranges(("seq_len=16:32",), ["batch_size", "seq_len"]) == {"seq_len": (16, 32)}
    for bad in ("0:4", "9:3", "x"):
        with pytest.raises(GlueError):
            source.parse_ranges((bad,), ["batch_size"])


def test_run_manifest_gives_config_and_the_failed_attempts_limit() -> None:
    manifest = {"config": {"command": ["python", "-m", "glue.examples.tiny_gpt"], "config": {"batch_size": 64}}}
    attempts = [{"attempt": 1, "failure_class": "oom_host", "memory_limit_mb": 350, "vm": "gpukit-2"},
                {"attempt": 2, "failure_class": None, "memory_limit_mb": None}]
    src = source.from_manifest("oom-host", Manifest.from_dict(manifest), [AttemptRecord.from_dict(a) for a in attempts])
    assert src.trainer_cfg == {"batch_size": 64} and src.memory_limit_mb == 350
    assert src.failure["failure_class"] == "oom_host" and src.run == "oom-host"
    with pytest.raises(GlueError, match="has no `config:`"):  # any job, but one with sizes to vary
        source.from_manifest("x", Manifest.from_dict({"config": {"command": ["bash", "run.sh"]}}), [])


def test_oom_messages() -> None:
    assert measure.is_oom_message("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert measure.is_oom_message("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory")
    assert not measure.is_oom_message("shape mismatch")
    assert measure.tried_to_allocate_mb("Tried to allocate 2.50 GiB (GPU 0; 79 GiB total)") == 2560.0
    assert measure.tried_to_allocate_mb("you tried to allocate 67108864 bytes") == 64.0


def test_findings_say_when_even_the_smallest_input_does_not_fit() -> None:
    report = {
        "model": {"weights_mb": 50.0, "expected_gradients_mb": 50.0, "expected_optimizer_state_mb": 100.0},
        "searches": [{"vary": "batch_size", "trial_count": 7, "trial_bound": 8, "stopped": None,
                      "smallest_fail": 1, "largest_fit": None, "highest_value": 64,
                      "trials": [{"rss_base_mb": 230.0}]}],
    }
    [line] = investigate.findings(report, investigate.Options(memory_limit_mb=350))
    assert "even batch_size=1 does not fit" in line and "200.0 MB" in line and "cannot help" in line


def _breakdown(tmp_path: Path, batch: int) -> dict:
    """One breakdown trial as memprobe runs it: a fresh process (the profiler's categories depend on process-wide
    torch state that other tests of the same pytest process change: a Lightning fit before it misfiled 0.05 MB)."""
    cfg = {**source.trainer_config({}, {}), "batch_size": batch, "seq_len": 64, "dropout": 0.0}
    spec, result = tmp_path / f"b{batch}.spec.json", tmp_path / f"b{batch}.json"
    spec.write_text(json.dumps({"mode": "breakdown", "cfg": cfg, "device": "cpu"}))
    subprocess.run([sys.executable, "-m", "glue.memprobe.worker", str(spec), str(result)], check=True,
                   capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(result.read_text())


def test_whole_step_breakdown_from_the_profiler(tmp_path: Path) -> None:
    small, big = _breakdown(tmp_path, 2), _breakdown(tmp_path, 16)
    for res in (small, big):
        b, model = res["breakdown"], res["model"]
        parts = b["at_peak_mb"]
        # weights and optimizer state come out of the profiler's categories exactly as counted directly
        assert b["part_max_mb"]["weights"] == pytest.approx(model["weights_mb"], abs=0.02)
        assert b["part_max_mb"]["optimizer_state"] == pytest.approx(model["expected_optimizer_state_mb"], abs=0.02)
        assert b["part_max_mb"]["gradients"] == pytest.approx(model["expected_gradients_mb"], abs=0.02)
        assert res["resident"]["optimizer_state_mb"] == pytest.approx(model["expected_optimizer_state_mb"], abs=0.02)
        assert parts["activations"] > 0 and b["peak_phase"] in ("forward", "backward")
        assert b["peak_mb"] == pytest.approx(sum(parts.values()), abs=0.1)
        assert set(b["phase_peak_mb"]) == {"forward", "backward", "optimizer"}
        assert b["top_ops"] and all("input_shapes" in op for op in b["top_ops"])
    # activations scale with the batch; weights and optimizer state do not
    assert big["breakdown"]["at_peak_mb"]["activations"] > 4 * small["breakdown"]["at_peak_mb"]["activations"]
    assert big["breakdown"]["at_peak_mb"]["weights"] == small["breakdown"]["at_peak_mb"]["weights"]
