"""A multi-node attempt judged as one run: the earliest failure across ranks is the cause, the group's
classification follows it, and the launch command / bucket keys a group relies on."""

from __future__ import annotations

from typing import Any

from glue.runs.classify import AttemptClass, Evidence, classify
from glue.runs.monitor import NodeState, combine
from glue.runs.records import Manifest
from glue.runs.timeline import Event, order
from glue.runs.vm_group import GroupSpec
from glue.train.layout import error_key, metrics_key
from glue.train.run.agreement import config_hash, find_mismatch
from glue.train.run.torchrun import Rendezvous, node_env, torchrun_argv

T0 = "2026-11-30T01:00:00.000000Z"


def at(seconds: float) -> str:
    return f"2026-11-30T01:00:{seconds:09.6f}Z"


def err(rank: int, node: int, when: str, typ: str, msg: str, restart: int = 0) -> dict[str, Any]:
    return {"type": typ, "message": msg, "traceback": f"Traceback...\n{typ}: {msg}", "rank": rank, "node": node,
            "vm": f"gpukit-{node + 1}", "at": when, "restart": restart}


GLOO = "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:63208"


def judge(states: list[NodeState], errors: list[dict[str, Any]], beats: list[dict[str, Any]] | None = None,
          log: str = "") -> tuple[Evidence, int | None]:
    ev = Evidence()
    node = combine(ev, states, errors, beats or [], T0)
    ev.log_tail = log
    return ev, node


def test_a_lost_vm_is_the_cause_and_the_survivors_comm_error_its_consequence() -> None:
    states = [NodeState(0, "gpukit-1", gone=False, reachable=True,
                        exit={"exit_code": 1, "ended_at": at(9)}),
              NodeState(1, "gpukit-2", gone=True)]
    beats = [{"rank": 0, "node": 1, "updated_at": at(4)}, {"rank": 1, "node": 0, "updated_at": at(8)}]
    ev, _ = judge(states, [err(1, 0, at(5), "builtins.RuntimeError", GLOO)], beats, log=GLOO)
    verdict = classify(ev)
    assert verdict.outcome is AttemptClass.VM_LOST and "gpukit-2" in verdict.reason
    cause, then = ev.failure_events[0], ev.failure_events[1:]
    assert (cause["kind"], cause["vm"], cause["at"]) == ("vm_lost", "gpukit-2", at(4))
    assert [(e["kind"], e["rank"]) for e in then] == [("error", 1)]


def test_the_earliest_error_decides_the_class_not_the_loudest() -> None:
    states = [NodeState(0, "gpukit-1", gone=False, reachable=True, exit={"exit_code": 1, "ended_at": at(7)}),
              NodeState(1, "gpukit-2", gone=False, reachable=True, exit={"exit_code": 1, "ended_at": at(6)})]
    errors = [err(0, 0, at(3.5), "builtins.RuntimeError", GLOO),
              err(1, 1, at(3.1), "builtins.ValueError", "batch_size must be positive")]
    ev, node = judge(states, errors)
    assert classify(ev).outcome is AttemptClass.USER_ERROR
    assert node == 1 and ev.failure_events[0]["rank"] == 1 and "ValueError" in ev.failure_events[0]["summary"]
    # The same errors the other way round: the communication failure came first.
    errors[0]["at"], errors[1]["at"] = at(3.0), at(3.4)
    ev, node = judge(states, errors, log=GLOO)
    assert classify(ev).outcome is AttemptClass.COMM and node == 0


def test_only_the_last_restart_rounds_errors_count() -> None:
    states = [NodeState(0, "gpukit-1", gone=False, reachable=True, exit={"exit_code": 1, "ended_at": at(30)}),
              NodeState(1, "gpukit-2", gone=False, reachable=True, exit={"exit_code": 1, "ended_at": at(30)})]
    errors = [err(0, 0, at(1), "builtins.RuntimeError", GLOO, restart=0),  # handled by torchrun's restart
              err(1, 1, at(20), "builtins.KeyError", "'tokens'", restart=1)]
    ev, _ = judge(states, errors)
    assert [(e["kind"], e["rank"], e["node"]) for e in ev.failure_events] == [("error", 1, 1), ("exit", None, 0)]
    assert classify(ev).outcome is AttemptClass.USER_ERROR


def test_an_oom_killed_node_without_error_file_is_dated_by_its_exit() -> None:
    # torchrun exits 1 when the kernel kills its worker: the cgroup record decides, not the signal.
    states = [NodeState(0, "gpukit-1", gone=False, reachable=True,
                        exit={"exit_code": 1, "oom_kills": 1, "ended_at": at(2)}),
              NodeState(1, "gpukit-2", gone=False, reachable=True, exit={"exit_code": 1, "ended_at": at(4)})]
    ev, _ = judge(states, [err(1, 1, at(3), "builtins.RuntimeError", GLOO)])
    assert ev.failure_events[0]["kind"] == "exit" and "OOM" in ev.failure_events[0]["summary"]
    assert classify(ev).outcome is AttemptClass.OOM_HOST


def test_a_group_runs_only_while_no_node_failed() -> None:
    alive = NodeState(0, "gpukit-1", gone=False, reachable=True, alive=True)
    ev, _ = judge([alive, NodeState(1, "gpukit-2", gone=False, reachable=True, alive=True)], [])
    assert ev.process_alive and ev.exit_code is None
    finished = NodeState(1, "gpukit-2", gone=False, reachable=True, exit={"exit_code": 0, "ended_at": at(1)})
    ev, _ = judge([alive, finished], [])
    assert ev.process_alive  # node 1 is done, node 0 still finishing
    failed = NodeState(1, "gpukit-2", gone=False, reachable=True, exit={"exit_code": 1, "ended_at": at(1)})
    ev, _ = judge([alive, failed], [])
    assert not ev.process_alive and ev.exit_code == 1  # the survivor waiting in the rendezvous does not count


def test_events_at_the_same_time_put_a_lost_vm_first() -> None:
    events = [Event(at(1), "error", "x", rank=0), Event(at(1), "vm_lost", "y", node=1), Event(at(0.5), "error", "z")]
    assert [e.summary for e in order(events)] == ["z", "y", "x"]


def test_agreement_names_the_rank_and_the_field() -> None:
    base = {"config_hash": config_hash({"lr": 1e-3}), "world_size": 2, "code_version": "abc", "restored_step": 20}
    assert find_mismatch([base, dict(base)]) is None
    other = {**base, "restored_step": 10}
    assert find_mismatch([base, other]) == "rank 1 has restored_step=10 but rank 0 has 20"
    other = {**base, "config_hash": config_hash({"lr": 2e-3})}
    assert "rank 1 has config_hash=" in (find_mismatch([base, other]) or "")
    assert "3 ranks joined" in (find_mismatch([{**base, "world_size": 2}] * 3) or "")
    assert config_hash({"a": 1, "b": 2}) == config_hash({"b": 2, "a": 1})


def test_torchrun_command_per_node() -> None:
    spec = GroupSpec(nodes=2, procs_per_node=4, max_restarts=3)
    rdzv = Rendezvous("10.0.0.5", 29400, ("10.0.0.5", "10.0.0.6"), ("eth0", "eth1"))
    head = torchrun_argv("/v/bin/python", ["/v/bin/python", "-m", "pkg.train", "--lr", "1"], spec, rdzv, 0, "r", 3)
    # the head serves the rendezvous store bound to its group address; every agent is a client
    assert head[:5] == ["/v/bin/python", "-m", "glue.train.run.process_group", "--host-store=10.0.0.5:29400", "--"]
    assert {"--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.5:29400",
            "--rdzv-id=r-3", "--max-restarts=3", "--local-addr=10.0.0.5"} <= set(head)
    assert head[-4:] == ["-m", "pkg.train", "--lr", "1"] and any("is_host=0" in a for a in head)
    other = torchrun_argv("/v/bin/python", ["python3", "train.py"], spec, rdzv, 1, "r", 3)
    # every agent runs under process_group (whichever is rank 0 picks the worker store's port there)
    assert other[:4] == ["/v/bin/python", "-m", "glue.train.run.process_group", "--"]
    assert other[-1] == "train.py" and "--local-addr=10.0.0.6" in other and any("is_host=0" in a for a in other)
    assert torchrun_argv("/p", ["./run.sh", "x"], spec, rdzv, 1, "r", 3)[-3:] == ["--no-python", "./run.sh", "x"]
    assert node_env(rdzv, 1)["GLOO_SOCKET_IFNAME"] == "eth1"
    assert node_env(rdzv, 0)["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert spec.world_size == 8 and GroupSpec.from_manifest(Manifest.from_dict({"distributed": spec.as_dict()})) == spec
    assert not GroupSpec.from_manifest(Manifest.from_dict({"distributed": None})).distributed


def test_bucket_keys_sort_in_the_order_they_were_written() -> None:
    written = [metrics_key(1, 0, 0, 1), metrics_key(1, 0, 0, 2), metrics_key(1, 0, 0, 99999, "-heartbeat"),
               metrics_key(1, 0, 1, 1), metrics_key(1, 0, 2, 1), metrics_key(2, 0, 0, 1)]
    assert sorted(written) == written
    assert error_key(1, 3, 0) != error_key(1, 3, 1)  # a restart does not overwrite the first error
