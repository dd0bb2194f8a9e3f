"""The records that cross to the VM (TrainerEnv, LaunchSpec), where an attempt's files are on it
(StatePaths), and the controller's records (Manifest, AttemptRecord and its AttemptNode entries): built once,
their wire form as before."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from glue.bucket_access import BucketCredentials, BucketInfo
from glue.errors import GlueError
from glue.paths import PROJECT_ROOT
from glue.runs import attempt as attempt_mod
from glue.runs.records import AttemptNode, AttemptRecord, Manifest, RecoveryRecord, nodes_of
from glue.runs.store import RunStore
from glue.train import layout, trainer_vars
from glue.train.run.launch import LaunchSpec, MissingTrainerEnv, SpecBucket, TrainerEnv, node_vars
from glue.train.state_paths import StatePaths

# A launch spec as glue deploy wrote it before the types (an attempt started by an older controller).
OLD_VM_SPEC = {"run": "r1", "attempt": 3, "node": 1, "command": ["/opt/gpukit/venv/bin/python", "-m", "x"],
               "env": {"GPUKIT_RUN": "r1"}, "memory_limit_mb": 512, "credentials_file": "/run/gpukit/creds.json",
               "cwd": "/var/lib/gpukit/scratch",
               "bucket": {"endpoint": "http://127.0.0.1:9000", "name": "gpukit", "region": "us-east-1"}}
OLD_SERVERLESS_SPEC = {"run": "r2", "attempt": 1, "node": 0, "command": ["python3", "train.py"], "env": {},
                       "memory_limit_mb": None, "cwd": None,
                       "bucket": {"name": "gpukit", "via": "mount", "mount": "/mnt/s3"}}


def test_trainer_env_round_trips_and_leaves_unset_variables_out() -> None:
    env = TrainerEnv(run="r1", checkpoint=layout.run_uri("b", "r1"),
                     outputs=f"{layout.run_uri('b', 'r1')}/{layout.OUTPUTS}", bucket_name="b",
                     attempt=2, resume=True, config={"lr": 0.1}, via_mount=True, stop_at=12.5, vm="lyceum-run-2")
    wire = env.to_env()
    assert wire["GPUKIT_RESUME"] == "1" and wire["GPUKIT_BUCKET_VIA"] == "mount"
    assert json.loads(wire["GPUKIT_CONFIG"]) == {"lr": 0.1} and wire["GPUKIT_STOP_AT"] == "12.500"
    assert "GPUKIT_BUCKET_ENDPOINT" not in wire and "GPUKIT_CREDENTIALS_FILE" not in wire
    back = TrainerEnv.from_env(wire)
    assert back == TrainerEnv(**{**env.__dict__, "node": 0})


def test_trainer_env_defaults_are_the_trainers() -> None:
    env = TrainerEnv.from_env({"GPUKIT_RUN": "r", "GPUKIT_CHECKPOINT": "c", "GPUKIT_OUTPUTS": "o",
                               "GPUKIT_BUCKET_NAME": "b"})
    assert (env.attempt, env.resume, env.checkpoint_interval, env.keep_last, env.heartbeat_seconds) == (1, False, 50,
                                                                                                          2, 2.0)
    assert env.mount == "/mnt/s3" and env.scratch == "/tmp" and env.config == {}


def test_trainer_env_names_the_missing_variable() -> None:
    with pytest.raises(MissingTrainerEnv, match=r"^GPUKIT_OUTPUTS is not set") as info:
        TrainerEnv.from_env({"GPUKIT_RUN": "r", "GPUKIT_CHECKPOINT": "c", "GPUKIT_BUCKET_NAME": "b"})
    assert info.value.name == "GPUKIT_OUTPUTS"


def test_node_vars_are_what_the_trainer_reads() -> None:
    base = {"GPUKIT_RUN": "r", "GPUKIT_CHECKPOINT": "c", "GPUKIT_OUTPUTS": "o", "GPUKIT_BUCKET_NAME": "b"}
    env = TrainerEnv.from_env({**base, **node_vars(3, "gpukit-4")})
    assert (env.node, env.vm) == (3, "gpukit-4")


@pytest.mark.parametrize("old", [OLD_VM_SPEC, OLD_SERVERLESS_SPEC])
def test_an_old_launch_spec_reads_and_writes_back_the_same_json(old: dict) -> None:
    spec = LaunchSpec.from_json(json.dumps(old))
    assert json.loads(spec.to_json()) == old


def test_launch_spec_fields() -> None:
    spec = LaunchSpec.from_json(json.dumps(OLD_VM_SPEC))
    assert spec.bucket == SpecBucket(name="gpukit", endpoint="http://127.0.0.1:9000", region="us-east-1")
    assert (spec.node, spec.memory_limit_mb, spec.log_every_s) == (1, 512, 3.0)


def test_state_paths_are_the_files_the_supervisor_and_monitor_share() -> None:
    paths = StatePaths.of("r1", 3)
    assert paths.folder == "/run/gpukit/runs/r1"
    assert [paths.spec, paths.env_file, paths.log, paths.pids, paths.supervisor_log, paths.workspace_spec] == [
        f"/run/gpukit/runs/r1/{n}" for n in ("attempt-3.json", "attempt-3.env", "attempt-3.log",
                                             "attempt-3.pids.json", "supervisor-3.log", "workspace-3.json")]
    beside = StatePaths.of_spec("/tmp/gpukit/runs/r1/attempt-3.json", 3)
    assert beside.log == "/tmp/gpukit/runs/r1/attempt-3.log"


def test_attempt_record_keeps_keys_it_does_not_know() -> None:
    doc = {"run": "r", "attempt": 2, "vm": "gpukit-1", "vm_id": "v1", "backend": "local", "resume": True,
           "nodes": [{"node": 0, "vm": "gpukit-1", "vm_id": "v1"}], "started_at": "2026-01-01T00:00:00Z",
           "memory_limit_mb": None, "ended_at": None, "exit": None, "failure_class": "stall", "last_step": 7,
           "rendezvous": None, "incident": "20260101T000000Z-stall"}
    rec = AttemptRecord.from_dict(doc | {"written_later": {"x": 1}})
    assert rec.failure_class == "stall" and rec.incident == "20260101T000000Z-stall" and rec.rendezvous is None
    assert rec.extra == {"rendezvous": None, "written_later": {"x": 1}}  # a null optional key, an unknown key
    assert rec.to_dict() == doc | {"written_later": {"x": 1}}


def test_an_old_shaped_record_reads_and_is_written_back_as_it_was() -> None:
    """Records an older gpukit wrote lack keys (and hold null blocks): they read as the fields' defaults, and a
    record written back unchanged is the JSON it was."""
    old_attempt = {"attempt": 2, "vm": "gpukit-1", "nodes": None}
    rec = AttemptRecord.from_dict(old_attempt)
    assert (rec.attempt, rec.backend, rec.resume, rec.nodes, rec.vm_id, rec.incident) == (2, "local", False, [],
                                                                                          None, None)
    assert rec.to_dict() == old_attempt
    rec.update(failure_class="stall", signal=None, exit=None)  # as the monitor records an end: nulls written
    assert rec.to_dict() == old_attempt | {"failure_class": "stall", "signal": None, "exit": None}
    old_manifest = {"run": "r", "config": {"monitor": {"stall_timeout_seconds": 5}}, "environment": None}
    m = Manifest.from_dict(old_manifest)
    assert m.environment == {} and m.monitor == {"stall_timeout_seconds": 5} and m.workdir is None
    assert m.to_dict() == old_manifest
    m.outputs["required"] = ["model.pt"]  # a block filled in place is written
    assert m.to_dict() == old_manifest | {"outputs": {"required": ["model.pt"]}}
    interrupted = {"run": "r", "failed_attempt": 1, "new_attempt": 2, "verified": True, "interrupted": True}
    assert RecoveryRecord.from_dict(interrupted).to_dict() == interrupted


def test_a_new_attempt_record_writes_the_keys_it_wrote_before() -> None:
    rec = AttemptRecord(run="r", attempt=1, vm="gpukit-1", vm_id="v1", backend="local", resume=False, nodes=[])
    rec.update(rendezvous=None)
    assert set(rec.to_dict()) == {"run", "attempt", "vm", "vm_id", "backend", "resume", "nodes", "started_at",
                                  "memory_limit_mb", "ended_at", "exit", "failure_class", "last_step", "rendezvous"}
    with pytest.raises(TypeError, match="no field 'incidnet'"):
        rec.update(incidnet="x")


# A group's attempt record as glue deploy wrote it: node 0 a cold start on a warm spare, node 1 warm; the run has
# requirements but no workdir (code_sha256 null), runtime docker.
GROUP_ATTEMPT = {
    "run": "g", "attempt": 2, "vm": "gpukit-1", "vm_id": "v1", "backend": "local", "resume": True,
    "started_at": "2026-01-01T00:00:01.000000Z", "memory_limit_mb": None, "ended_at": None, "exit": None,
    "failure_class": None, "last_step": None, "rendezvous": "10.0.0.1:29500", "supervisor_pid": 11,
    "trainer_pid": 12, "code_sha256": None, "requirements_set": "abc",
    "nodes": [{"node": 0, "vm": "gpukit-1", "vm_id": "v1", "code_sha256": None, "requirements_set": "abc",
               "docker_gpus": False, "supervisor_pid": 11, "trainer_pid": 12,
               "started_at": "2026-01-01T00:00:01.000000Z", "start": "cold", "cold_reason": "another environment"},
              {"node": 1, "vm": "gpukit-2", "vm_id": "v2", "code_sha256": None, "requirements_set": "abc",
               "docker_gpus": False, "supervisor_pid": 21, "trainer_pid": 22,
               "started_at": "2026-01-01T00:00:02.000000Z", "start": "warm"}]}


def test_an_attempt_record_with_nodes_round_trips_to_the_same_json() -> None:
    rec = AttemptRecord.from_dict(json.loads(json.dumps(GROUP_ATTEMPT)))
    assert all(isinstance(nd, AttemptNode) for nd in rec.nodes)
    assert [(nd.node, nd.vm, nd.vm_id, nd.trainer_pid, nd.start) for nd in rec.nodes] == [
        (0, "gpukit-1", "v1", 12, "cold"), (1, "gpukit-2", "v2", 22, "warm")]
    assert rec.nodes[0].cold_reason == "another environment" and rec.nodes[1].cold_reason is None
    assert rec.nodes[0].code_sha256 is None and rec.nodes[0].extra == {"code_sha256": None}  # stored as null
    assert json.dumps(rec.to_dict(), sort_keys=True) == json.dumps(GROUP_ATTEMPT, sort_keys=True)
    assert nodes_of(rec) == rec.nodes


def test_an_old_node_entry_keeps_a_key_it_does_not_know_and_lacks_the_new_ones() -> None:
    old = {"attempt": 1, "vm": "gpukit-1", "vm_id": "v1",
           "nodes": [{"node": 0, "vm": "gpukit-1", "vm_id": "v1", "pid": 7, "gpu": {"uuid": "GPU-1"}}, {"vm": "x"}]}
    rec = AttemptRecord.from_dict(old)
    first, bare = rec.nodes
    assert first.extra == {"pid": 7, "gpu": {"uuid": "GPU-1"}} and first.trainer_pid is None and first.start is None
    assert (bare.node, bare.vm, bare.vm_id) == (0, "x", None)  # the keys it lacks read empty, not written back
    assert rec.to_dict() == old
    rec.nodes[0].update(trainer_pid=8)
    assert rec.to_dict()["nodes"][0] == old["nodes"][0] | {"trainer_pid": 8}


def test_a_node_writes_only_the_keys_it_holds() -> None:
    node = AttemptNode(node=1, vm="gpukit-2", vm_id="v2")
    assert node.to_dict() == {"node": 1, "vm": "gpukit-2", "vm_id": "v2"}  # every optional field unset: absent
    node.update(code_sha256=None, requirements_set="abc")  # as a run with requirements only prepares it: null
    node.update(docker_gpus=True)
    assert node.to_dict() == {"node": 1, "vm": "gpukit-2", "vm_id": "v2", "code_sha256": None,
                              "requirements_set": "abc", "docker_gpus": True}
    with pytest.raises(TypeError, match="no field 'trainer_pdi'"):
        node.update(trainer_pdi=3)


def test_a_nodes_pids_file_goes_into_it_whole() -> None:
    """The supervisor's pids file, as the dict the node entry was updated with: known keys as fields, a key
    a newer supervisor adds kept as it is."""
    node = AttemptNode(node=0, vm="gpukit-1", vm_id="v1")
    pids = {"supervisor_pid": 5, "trainer_pid": 6, "started_at": "2026-01-01T00:00:00.000000Z", "start": "cold",
            "cold_reason": "no warm trainer process on this VM", "written_later": 1}
    node.add_pids(pids)
    assert (node.supervisor_pid, node.trainer_pid, node.start, node.extra) == (5, 6, "cold", {"written_later": 1})
    assert node.to_dict() == {"node": 0, "vm": "gpukit-1", "vm_id": "v1"} | pids


def test_the_attempt_takes_node_0s_pids_start_and_prepared_code() -> None:
    rec = AttemptRecord(run="r", attempt=1, vm="gpukit-1", vm_id="v1", backend="local", resume=False,
                        nodes=[AttemptNode(node=0, vm="gpukit-1", vm_id="v1")])
    rec.nodes[0].update(code_sha256=None, requirements_set="abc")
    rec.nodes[0].add_pids({"supervisor_pid": 5, "trainer_pid": 6, "started_at": "2026-01-02T00:00:00.000000Z",
                           "start": "warm"})
    attempt_mod._from_head(rec, prepared=True)
    doc = rec.to_dict()
    assert {k: doc[k] for k in ("supervisor_pid", "trainer_pid", "code_sha256", "requirements_set", "started_at")} \
        == {"supervisor_pid": 5, "trainer_pid": 6, "code_sha256": None, "requirements_set": "abc",
            "started_at": "2026-01-02T00:00:00.000000Z"}
    assert "start" not in doc  # how the trainer started is the node's alone
    bare = AttemptRecord(run="r", attempt=1, vm="gpukit-1", vm_id="v1", backend="local", resume=False,
                         nodes=[AttemptNode(node=0, vm="gpukit-1", vm_id="v1")], started_at="t0")
    attempt_mod._from_head(bare, prepared=False)  # nothing reported, nothing prepared: nothing taken
    assert bare.to_dict() == AttemptRecord(run="r", attempt=1, vm="gpukit-1", vm_id="v1", backend="local",
                                           resume=False, nodes=[AttemptNode(node=0, vm="gpukit-1", vm_id="v1")],
                                           started_at="t0").to_dict()


@pytest.mark.parametrize("stored", [{"attempt": 1, "vm": "gpukit-3", "vm_id": "v3", "nodes": []},
                                    {"attempt": 1, "vm": "gpukit-3", "vm_id": "v3"}])
def test_nodes_of_a_single_node_attempt_is_its_one_vm(stored: dict) -> None:
    rec = AttemptRecord.from_dict(stored)
    assert rec.nodes == [] and nodes_of(rec) == [AttemptNode(node=0, vm="gpukit-3", vm_id="v3")]
    assert nodes_of(rec)[0].to_dict() == {"node": 0, "vm": "gpukit-3", "vm_id": "v3"}
    assert rec.to_dict() == stored  # nodes_of leaves the record as it was


@pytest.mark.parametrize("nodes", [["gpukit-1"], "gpukit-1", [{"node": 0, "vm": "gpukit-1", "vm_id": "v1"}, 3]])
def test_an_attempt_record_whose_nodes_are_not_objects_is_not_glues(monkeypatch: pytest.MonkeyPatch,
                                                                    nodes: object) -> None:
    store = RunStore(BucketInfo("http://127.0.0.1:9", "b", "us-east-1"), BucketCredentials("AKIA", "secret"), "r")
    monkeypatch.setattr(store, "get_json", lambda key: {"attempt": 1, "vm": "gpukit-1", "nodes": nodes})
    with pytest.raises(GlueError, match=r'is not a record glue wrote \(an attempt record\'s "nodes" is a list of '):
        store.read_attempt(1)
    monkeypatch.setattr(store, "get_json", lambda key: {"attempt": 1, "vm": "gpukit-1", "nodes": None})
    assert store.read_attempt(1) == AttemptRecord.from_dict({"attempt": 1, "vm": "gpukit-1", "nodes": None})


def test_a_serverless_attempt_names_its_execution_as_its_node_once_started() -> None:
    rec = AttemptRecord(run="s", attempt=1, vm="lyceum-run-1", vm_id=None, backend="lyceum", resume=False, nodes=[])
    assert rec.to_dict()["nodes"] == []
    rec.nodes = [AttemptNode(node=0, vm=rec.vm, vm_id="ex-1")]
    assert rec.to_dict()["nodes"] == [{"node": 0, "vm": "lyceum-run-1", "vm_id": "ex-1"}]


def test_manifest_writes_every_key_a_reader_expects() -> None:
    m = Manifest(run="r", runtime="process", command=["python", "t.py"], config={}, environment={})
    assert set(m.to_dict()) == {
        "run", "created_at", "image", "image_digest", "command", "runtime", "config", "input", "code", "environment",
        "distributed", "secrets", "outputs", "checkpoint", "bucket", "evaluation", "workdir", "requirements"}


def _spelled(path: Path) -> list[str]:
    """`path:line NAME` for each trainer variable written as a string outside a docstring."""
    tree = ast.parse(path.read_text())
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    names = re.compile(r"\b(" + "|".join(sorted(trainer_vars.ALL, key=len, reverse=True)) + r")\b")
    return [f"{path}:{node.lineno} {found.group(0)}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
            and (found := names.search(node.value))]


def test_the_trainer_variables_are_spelled_in_trainer_vars_only() -> None:
    """The controller writes them and the trainer reads them: one owner of the names, like the bucket keys'."""
    owner = PROJECT_ROOT / "glue" / "train" / "trainer_vars.py"
    found = [hit for path in sorted((PROJECT_ROOT / "glue").rglob("*.py")) if path != owner for hit in _spelled(path)]
    assert not found, "use glue.train.trainer_vars (or TrainerEnv) instead of spelling:\n" + "\n".join(found)


def test_the_lint_finds_a_spelled_variable(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text('"""GPUKIT_RUN in a docstring is fine."""\nimport os\nrun = os.environ["GPUKIT_RUN"]\n')
    assert _spelled(bad) == [f"{bad}:3 GPUKIT_RUN"]


def test_a_trainer_run_by_hand_outside_a_deployment_exits_in_one_line(tmp_path: Path) -> None:
    """The user's script run without `glue deploy`: one line naming the missing variable and where the
    docs say how to give it, exit 1, no KeyError traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUKIT_")}
    script = "from glue.train import RunContext\nwith RunContext.from_env() as ctx:\n    pass\n"
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines() == [
        "gpukit: GPUKIT_RUN is not set: this trainer runs under `glue deploy`, which sets gpukit's environment; "
        "to try the loop without a cluster give it that environment (docs/guides/trainer-contract.md)"]
