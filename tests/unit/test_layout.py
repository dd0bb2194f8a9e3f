"""glue.train.layout names every key as buckets written before it hold them (existing runs stay readable),
and its parsers invert its builders."""

from __future__ import annotations

import pytest

from glue.train import layout

# Every builder, and the key it must give: the bucket layout of docs/design.md §4, spelled out.
KEYS = [
    (layout.code_key("ab12"), "code/ab12.tar"),
    (layout.code_index_key("ab12"), "code/ab12.json"),
    (layout.wheelhouse_prefix("s1"), "wheels/s1/"),
    (layout.wheel_key("s1", "six-1.16.0-py2.py3-none-any.whl"), "wheels/s1/six-1.16.0-py2.py3-none-any.whl"),
    (layout.wheelhouse_index_key("s1"), "wheels/s1/index.json"),
    (layout.run_prefix("r1"), "runs/r1/"),
    (layout.run_uri("gpukit", "r1"), "s3://gpukit/runs/r1"),
    (layout.doctor_probe_key("ctl", "0a1b"), "gpukit-doctor/ctl-0a1b"),
    (layout.MANIFEST, "manifest.json"),
    (layout.attempt_key(3), "attempts/3.json"),
    (layout.exit_key(3, 0), "attempts/3.exit.json"),
    (layout.exit_key(3, 2), "attempts/3.exit.node2.json"),
    (layout.error_key(3, 1, 0), "attempts/3.error.rank1.json"),
    (layout.error_key(3, 1, 2), "attempts/3.error.rank1.x02.json"),
    (layout.errors_prefix(3), "attempts/3.error"),
    (layout.notice_key(3, 1), "attempts/3.notice.rank1.json"),
    (layout.notices_prefix(3), "attempts/3.notice."),
    (layout.heartbeat_key(0), "heartbeat.json"),
    (layout.heartbeat_key(2), "heartbeat.rank2.json"),
    (layout.metrics_key(3, 1, 0, 7), "metrics/003-r1-00007.jsonl"),
    (layout.metrics_key(3, 1, 2, 7), "metrics/003-r1-x02-00007.jsonl"),
    (layout.carried_metrics_key(3, 0, 1), "metrics/003-r0-x01-99999-heartbeat.jsonl"),
    (layout.log_prefix(), "logs/"),
    (layout.log_prefix(3), "logs/003-"),
    (layout.log_prefix(3, 1), "logs/003-n1-"),
    (layout.log_key(3, 0, 4), "logs/003-00004.log"),
    (layout.log_key(3, 1, 4), "logs/003-n1-00004.log"),
    (layout.incident_key(layout.key_stamp("2025-01-02T03:04:05.123456Z"), "vm_lost"),
     "incidents/20250102T030405.123456Z-vm_lost.json"),
    (layout.recovery_key(2), "recoveries/2.json"),
    (layout.WATCH_STATE, "watch/state.json"),
    (layout.evaluation_key(3, 120), "evaluation/003-000000120.json"),
    (layout.REPORT, "report.html"),
    (layout.DRILL, "drill.json"),
    (layout.memprobe_key("20250102T030405Z"), "memprobe/20250102T030405Z.json"),
    (layout.memprobe_snapshot_key("20250102T030405Z"), "memprobe/20250102T030405Z.snapshot.pickle"),
    (layout.lease_claim_key(4, "t0k"), "lease/000004/claim-t0k.json"),
    (layout.lease_released_key(4), "lease/000004/released.json"),
    (layout.step_prefix(60), "ckpt/step-60/"),
    (layout.commit_key(60), "ckpt/step-60/COMMIT.json"),
    (layout.step_prefix(60) + layout.REJECTED, "ckpt/step-60/REJECTED.json"),
    (layout.step_prefix(60) + layout.checkpoint_object_key("model", None), "ckpt/step-60/model.pt"),
    (layout.step_prefix(60) + layout.checkpoint_object_key("train", 3), "ckpt/step-60/train.rank3.pt"),
    (layout.step_prefix(60) + layout.rank_part_key(3), "ckpt/step-60/rank3.json"),
    (layout.invalid_step_prefix("20250102T030405.123456Z", 60), "ckpt-invalid/20250102T030405.123456Z/step-60/"),
]


@pytest.mark.parametrize(("built", "stored"), KEYS, ids=[k for _, k in KEYS])
def test_every_key_is_the_one_existing_buckets_hold(built: str, stored: str) -> None:
    assert built == stored


def test_the_parsers_invert_the_builders() -> None:
    assert layout.attempt_of(layout.attempt_key(12)) == 12
    assert layout.attempt_of(layout.exit_key(12, 0)) is None and layout.attempt_of(layout.error_key(1, 0, 0)) is None
    assert layout.run_of_prefix(layout.run_prefix("r-1")) == "r-1" and layout.run_of_prefix("runs/") is None
    assert layout.commit_step(layout.commit_key(60)) == 60
    assert layout.commit_step(layout.step_prefix(60) + "model.pt") is None
    assert layout.commit_step(layout.invalid_step_prefix("t", 60) + layout.COMMIT) is None
    assert layout.step_of_dir("step-7") == 7 and layout.step_of_dir("step-x") is None
    assert layout.recovery_number(layout.recovery_key(10)) == 10
    newest = sorted([layout.recovery_key(10), layout.recovery_key(9)], key=layout.recovery_number)[-1]
    assert newest == "recoveries/10.json"
    assert layout.lease_entry(layout.lease_claim_key(4, "t")) == (4, layout.lease_claim_name("t"))
    assert layout.is_lease_claim(layout.lease_claim_name("t")) and not layout.is_lease_claim("released.json")
    assert layout.is_lease_release(layout.lease_entry(layout.lease_released_key(4))[1])  # type: ignore[index]
    assert layout.lease_entry("lease/x/claim-t.json") is None


@pytest.mark.parametrize(("node", "part"), [(0, 1), (0, 12), (1, 1), (11, 3)])
def test_a_log_part_names_its_node(node: int, part: int) -> None:
    key = layout.log_key(5, node, part)
    assert layout.log_node(key, 5) == node and layout.log_node(key, 4) is None
    assert key.startswith(layout.log_prefix(5, node)) and key.startswith(layout.log_prefix(5))


def test_metrics_parts_of_a_rank() -> None:
    assert layout.metrics_of_rank(layout.metrics_key(1, 1, 0, 1), 1)
    assert not layout.metrics_of_rank(layout.metrics_key(1, 11, 0, 1), 1)
    assert layout.metrics_of_rank(layout.carried_metrics_key(1, 0, 0), 0)
