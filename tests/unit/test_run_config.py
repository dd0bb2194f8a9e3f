"""The kit's run-config keys are validated: types, ranges, unknown keys; one line naming the key."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from glue.errors import GlueError
from glue.runs import config
from glue.runs.store import RunStore
from glue.train import layout

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny_gpt.yaml"


def _base() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE.read_text())


def test_the_example_parses_with_locations_substituted() -> None:
    rc = config.parse(_base(), "r1", "bkt")
    target = layout.run_uri("bkt", "r1")
    assert rc.checkpoint.target == target and rc.outputs.destination == f"{target}/{layout.OUTPUTS}"
    assert rc.monitor.heartbeat_seconds == 1.0 and rc.checkpoint.interval_steps == 20
    assert rc.as_dict()["outputs"]["required"] == ["model.pt", "final.json"]
    assert rc.with_config({"steps": 7}).config["steps"] == 7 and rc.config["steps"] == 120


@pytest.mark.parametrize(
    ("section", "key", "value", "needle"),
    [
        ("monitor", "heartbeat_seconds", -1, "monitor.heartbeat_seconds"),
        ("monitor", "heartbeat_seconds", 0, "monitor.heartbeat_seconds"),
        ("monitor", "heartbeat_seconds", "abc", "monitor.heartbeat_seconds: must be a number"),
        ("monitor", "heartbeat_seconds", True, "monitor.heartbeat_seconds: must be a number"),
        ("monitor", "stall_timeout_seconds", -1, "monitor.stall_timeout_seconds"),
        ("monitor", "stall_timeout_seconds", 1.5, "at least twice heartbeat_seconds"),
        ("monitor", "every", 3, "unknown key 'every' in monitor"),
        ("checkpoint", "interval_steps", 0, "checkpoint.interval_steps"),
        ("checkpoint", "interval_steps", "10", "checkpoint.interval_steps"),
        ("checkpoint", "interval_steps", True, "checkpoint.interval_steps"),
        ("checkpoint", "keep_last", 1, "checkpoint.keep_last"),
        ("outputs", "destination", "", "outputs.destination"),
        (None, "runtime", "k8s", "runtime"),
        (None, "secrets", ["lower"], "secrets.0: must be an environment variable NAME"),
        (None, "colour", "blue", "unknown key 'colour' in run config"),
    ],
)
def test_each_bad_kit_input_is_one_line_naming_the_key(section: str | None, key: str, value: Any,
                                                        needle: str) -> None:
    raw = copy.deepcopy(_base())
    (raw[section] if section else raw)[key] = value
    with pytest.raises(GlueError) as err:
        config.parse(raw, "r1", "bkt")
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_the_users_own_config_block_is_passed_through_unchecked() -> None:
    raw = _base()
    raw["config"] = {"anything": {"nested": [1, "two"]}, "steps": "many"}
    assert config.parse(raw, "r1", "bkt").config["steps"] == "many"


def test_the_committed_json_schema_matches_the_models() -> None:
    committed = json.loads(config.SCHEMA_PATH.read_text())
    assert committed == json.loads(json.dumps(config.json_schema())), \
        "regenerate: python -m glue.runs.config --schema > docs/run-config.schema.json"
    assert committed["properties"]["monitor"] and committed["additionalProperties"] is False


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"recovery": {"backoff_seconds": 10, "backoff_max_seconds": 5}}, "backoff_max_seconds (5) must be at least"),
        ({"recovery": {"max_failures": -1}}, "recovery.max_failures"),
        ({"recovery": {"keep_failed": "yes"}}, "recovery.keep_failed"),
        ({"notify": {"webhook": "ftp://127.0.0.1/x"}}, "notify.webhook"),
        ({"notify": {"events": ["sometimes"]}}, "notify.events.0"),
        ({"notify": {"webhook_env": "lower-case"}}, "notify.webhook_env"),
        ({"evaluation": {"metrics": {}}}, "evaluation.metrics"),
        ({"evaluation": {"metrics": {"val_loss": {}}}}, "give min and/or max"),
        ({"evaluation": {"metrics": {"acc": {"min": 0.9, "max": 0.5}}}}, "min (0.9) is above max (0.5)"),
        ({"evaluation": {"metrics": {"l": {"max": 1}}, "dataset": {"uri": "s3://b/e", "sha256": "abc"}}},
         "evaluation.dataset.sha256"),
        ({"pricing": {"vm_hour": -1}}, "pricing.vm_hour"),
        ({"monitor": {"heartbeat_seconds": 2, "lost_after_seconds": 2}}, "lost_after_seconds (2) must be more than"),
    ],
)
def test_watch_and_evaluation_blocks_are_checked(extra: dict[str, Any], needle: str) -> None:
    raw = {**copy.deepcopy(_base()), **extra}
    with pytest.raises(GlueError) as err:
        config.parse(raw, "r1", "bkt")
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_watch_and_evaluation_defaults_and_substitution() -> None:
    raw = {**_base(), "evaluation": {"metrics": {"val_loss": {"max": 4.5}},
                                     "dataset": {"uri": "s3://{bucket}/eval/{run}.bin", "sha256": "0" * 64}}}
    rc = config.parse(raw, "r1", "bkt")
    assert (rc.recovery.max_preemptions, rc.recovery.max_failures, rc.recovery.keep_failed) == (10, 3, False)
    assert rc.monitor.lost_after_seconds == 5.0 and rc.notify.events[0] == "recovered" and rc.pricing is None
    assert rc.evaluation is not None and rc.evaluation.dataset is not None
    assert rc.evaluation.dataset.uri == "s3://bkt/eval/r1.bin"


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"recovery": {"retries": 3}}, "unknown key 'retries' in recovery; allowed: max_preemptions,"),
        ({"notify": {"email": "a@b"}}, "unknown key 'email' in notify; allowed: command, webhook,"),
        ({"pricing": {"vm_hour": 1, "gpu_hour": 2}},
         "unknown key 'gpu_hour' in pricing (did you mean 'vm_hour'?); allowed: vm_hour, currency"),
        ({"evaluation": {"metrics": {"loss": {"max": 1, "below": 2}}}},
         "unknown key 'below' in evaluation.metrics.loss; allowed: min, max"),
        ({"evaluation": {"dataset": {"uri": "s3://b/e", "sha256": "0" * 64, "size": 1},
                         "metrics": {"loss": {"max": 1}}}},
         "unknown key 'size' in evaluation.dataset; allowed: uri, sha256"),
    ],
)
def test_an_unknown_key_in_any_section_is_one_line_with_the_allowed_keys(extra: dict[str, Any], needle: str) -> None:
    with pytest.raises(GlueError) as err:
        config.parse({**_base(), **extra}, "r1", "bkt")
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("content", "needle"), [
    (bytes(range(128, 256)), "is not a text file"),
    (b"", "is empty: a run config needs at least `outputs:` and `checkpoint:`"),
    (b"- a\n- b\n", "must be a mapping of settings"),
    # YAML would keep the second `steps` without a word: which one did the user mean?
    (b"config:\n  steps: 100\n  lr: 0.1\n  steps: 10\n",
     "is not valid YAML at line 4, column 3: key 'steps' is given twice (first at line 2); keep one"),
])
def test_a_file_that_is_no_run_config_is_one_line(tmp_path: Path, content: bytes, needle: str) -> None:
    path = tmp_path / "run.yaml"
    path.write_bytes(content)
    with pytest.raises(GlueError, match="") as exc:
        config.load(path, "r1", "gpukit")
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_a_run_id_with_a_path_in_it_is_refused_before_the_bucket_is_asked(tmp_path: Path) -> None:

    escape = f"../{layout.RUNS_PREFIX}r1"  # another run's records
    with pytest.raises(GlueError, match=re.escape(f"invalid run id '{escape}'")):
        RunStore.open(tmp_path, escape)  # no cluster, no bucket: the id alone is refused


@pytest.mark.parametrize(("extra", "needle"), [
    ({"runtime": "lyceum-run"}, "runtime lyceum-run needs `image:`"),
    ({"runtime": "lyceum-run", "image": "i:1", "workdir": "."}, "ships no `workdir:`"),
    ({"runtime": "lyceum-run", "image": "i:1", "requirements": ["numpy"]}, "requirements: needs `runtime: process`"),
    ({"execution": {"type": "gpu.a100"}}, "execution: goes with `runtime: lyceum-run`"),
    ({"runtime": "lyceum-run", "image": "i:1", "execution": {"timeout": 601}}, "execution.timeout:"),
    ({"runtime": "lyceum-run", "image": "i:1", "execution": {"type": "gpu a100"}}, "execution.type:"),
    ({"runtime": "lyceum-run", "image": "i:1", "execution": {"timeout": 30, "save_margin_seconds": 30}},
     "save_margin_seconds must be below the cap"),
])
def test_a_serverless_run_config_is_checked_in_one_line(extra: dict[str, Any], needle: str) -> None:
    with pytest.raises(GlueError) as err:
        config.parse({**_base(), **extra}, "r1", "bkt")
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_serverless_run_config_defaults_to_a_safe_cap(tmp_path: Path) -> None:
    rc = config.parse({**_base(), "runtime": "lyceum-run", "image": "i:1"}, "r1", "bkt")
    assert rc.execution is None  # the defaults: gpu.a100, 600 units read as seconds (the unit is undocumented)
    assert config.ExecutionSpec().cap_seconds == 600
    assert config.ExecutionSpec(timeout_unit_seconds=60).cap_seconds == 36000
    path = tmp_path / "run.yaml"
    path.write_text("runtime: lyceum-run\n")
    assert config.runtime_of(path) == "lyceum-run" and config.runtime_of(tmp_path / "missing.yaml") == "process"


def test_a_misspelt_required_key_is_named_with_the_key_meant() -> None:
    raw = _base()
    raw["checkpint"] = raw.pop("checkpoint")
    with pytest.raises(GlueError) as err:
        config.parse(raw, "r1", "bkt")
    said = str(err.value)
    assert "unknown key 'checkpint' in run config (did you mean 'checkpoint'?)" in said and "\n" not in said
