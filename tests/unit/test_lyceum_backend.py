"""LyceumBackend against the emulator without booting VMs (the host key scan is stubbed here;
tests/integration/test_lyceum_e2e.py reads real keys): bad input, cleanup, gone-mapping."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from glue.cloud.base import VMSpec
from glue.cloud.lyceum import backend as lyceum
from glue.cloud.lyceum.api import LyceumClient, RetryPolicy
from glue.cloud.lyceum.backend import LyceumBackend, parse_address, tf_vars
from glue.cloud.lyceum.spec import LyceumVMSpec
from glue.errors import GlueError, NoCapacity
from tests.lyceum_emulator import Emulator

PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBvTfQeuTCMyBZ1R3j2pWLZ6d5xUuQ0Q3uF1x4uQ2zVr test"
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostKeyHostKeyHostKeyHostKeyHostKeyHostKey0"


@pytest.fixture
def emu(tmp_path: Path) -> Iterator[Emulator]:
    with Emulator(tmp_path / "emu", boot_vms=False, pending_s=0.1) as emulator:
        yield emulator


@pytest.fixture
def backend(emu: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LyceumBackend:
    return _backend(emu, tmp_path, monkeypatch)


def _backend(emu: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LyceumBackend:
    monkeypatch.setattr(lyceum, "scan_host_key", lambda host, port, timeout=10.0: HOST_KEY)
    # No VM boots here: the login is taken as given (tests/integration/test_lyceum_users.py logs in for real).
    monkeypatch.setattr(lyceum.login, "detect", lambda host, port, key, path, wanted="", **kw: wanted or "root")
    monkeypatch.setenv("LYCEUM_POLL_INTERVAL", "0.05")
    monkeypatch.setenv("LYCEUM_CREATE_TIMEOUT", "5")
    monkeypatch.setenv("LYCEUM_DELETE_TIMEOUT", "2")
    client = LyceumClient(emu.api_key, emu.url, retry=RetryPolicy(attempts=3, base_s=0.01, max_s=0.02, deadline_s=2))
    return LyceumBackend(tmp_path / "kit", client=client)


def spec(name: str = "gpukit-1", gpu_type: str = "a100", gpu_count: int = 1, **kw: object) -> VMSpec:
    base = VMSpec(name=name, gpu_type=gpu_type, gpu_count=gpu_count, disk_gb=100, ssh_public_key=PUB)
    return LyceumVMSpec(**base.__dict__, **kw) if kw else base  # type: ignore[arg-type]


def api_calls(emu: Emulator) -> list[str]:
    return [f"{m} {p.rsplit('/external', 1)[-1]}" for m, p, _ in emu.requests]


def test_create_read_delete(backend: LyceumBackend, emu: Emulator) -> None:
    rec = backend.create_vm(spec(cpu=16, memory_gb=128))
    assert rec.status == "running" and rec.backend == "lyceum" and rec.ssh_user == "root"
    assert rec.ssh_host == "127.0.0.1" and rec.ssh_port > 0 and rec.host_key == HOST_KEY
    assert (rec.gpu_type, rec.gpu_count, rec.name) == ("a100", 1, "gpukit-1")
    assert emu.vms[rec.id].specs == {"disk": 100, "gpu_count": 1, "cpu": 16, "memory": 128}
    assert backend.read_vm(rec.id) == rec  # the pinned key survives a read
    backend.delete_vm(rec.id)
    assert backend.read_vm(rec.id) is None and emu.live_vms() == []


def test_the_live_shapes_ready_before_an_address_opaque_ids_and_values_in_instance_specs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As the live API answers: "ready" with a null ip_address for a while (glue waits for the address), ids
    that are undashed hex or a dashed UUID (never parsed), a create answer whose top-level hardware_profile
    and gpu_count are null (the values are read from instance_specs)."""
    with Emulator(tmp_path / "live", boot_vms=False, pending_s=0.1, live=True) as emu:
        backend = _backend(emu, tmp_path, monkeypatch)
        recs = [backend.create_vm(spec(name=f"gpukit-{i}", gpu_count=2)) for i in (1, 2)]
        assert emu.ready_without_address >= 2  # each VM was ready before it had an address
        assert sorted(len(r.id) for r in recs) == [32, 36]  # undashed hex, dashed UUID
        for rec in recs:
            assert rec.status == "ready" and rec.ssh_host == "127.0.0.1" and rec.ssh_port > 0, rec
            assert (rec.gpu_type, rec.gpu_count) == ("a100", 2) and backend.read_vm(rec.id) == rec
            backend.delete_vm(rec.id)
        assert emu.live_vms() == [] and backend.owned_vm_ids() == []


@pytest.mark.parametrize("lost", ["dropped", "502"])
def test_a_create_whose_answer_was_lost_adopts_the_vm(backend: LyceumBackend, emu: Emulator, lost: str) -> None:
    """The create went through but its answer never came: the VM is found by name and used, not made twice."""
    if lost == "dropped":
        emu.inject(0, path="/vms/create", drop=True, after_processing=True)
    else:
        emu.inject(502, path="/vms/create", after_processing=True)
    rec = backend.create_vm(spec())
    assert list(emu.vms) == [rec.id] and rec.status == "running" and rec.host_key == HOST_KEY
    assert api_calls(emu)[:4] == ["GET /vms/availability", "GET /vms/list", "POST /vms/create", "GET /vms/list"]
    assert api_calls(emu).count("POST /vms/create") == 1


def test_a_flaky_api_is_ridden_out(backend: LyceumBackend, emu: Emulator) -> None:
    emu.inject(503, count=1, path="/vms/availability")
    emu.inject(0, count=1, path="/status", drop=True)
    emu.inject(502, count=1, path="/vms/vm-", method="DELETE", after_processing=True)  # deleted; answer lost
    rec = backend.create_vm(spec())
    backend.delete_vm(rec.id)
    assert emu.live_vms() == [] and len(emu.vms) == 1
    assert [s for m, p, s in emu.requests if m == "DELETE"] == [502, 200]  # repeated: harmless


@pytest.mark.parametrize("status", ["terminated", "error"])
def test_read_maps_a_lost_vm_to_gone(backend: LyceumBackend, emu: Emulator, status: str) -> None:
    rec = backend.create_vm(spec())
    emu.kill(rec.id, status)
    assert backend.read_vm(rec.id) is None
    assert backend.read_vm("vm-neverexisted") is None  # 404 = gone too


def test_unknown_hardware_profile_never_reaches_the_api(backend: LyceumBackend, emu: Emulator) -> None:
    with pytest.raises(GlueError, match=r"^unknown hardware profile 'tpu': Use one of: cpu, a100, b200, b300, h100, "
                                        r"h200, l40s\.$"):
        backend.create_vm(spec(gpu_type="tpu"))
    with pytest.raises(GlueError, match="cpu profile has no GPUs"):
        backend.create_vm(spec(gpu_type="none", gpu_count=1))
    with pytest.raises(GlueError, match="at least 100 GB"):
        backend.create_vm(VMSpec("x1", "a100", 1, 50, PUB))
    assert emu.requests == []


@pytest.mark.parametrize("shape", ["profiles", "variants"])
def test_no_capacity_is_refused_before_terraform(backend: LyceumBackend, emu: Emulator, shape: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`glue up` asks the backend for its terraform variables first: a profile without capacity stops there."""
    for key, value in {**emu.env(), "LYCEUM_HARDWARE_PROFILE": "h100", "LYCEUM_GPU_COUNT": "1"}.items():
        monkeypatch.setenv(key, value)
    emu.availability_shape = shape
    emu.set_capacity("h100", None)
    with pytest.raises(NoCapacity) as err:
        backend.tf_vars(1, "gpukit", PUB)
    available = "cpu (64 of 64 free), a100 (8 of 16 free)" if shape == "profiles" else \
        "cpu (on-demand), a100 (on-demand: 1, 2, 4, 8 GPUs)"
    assert str(err.value) == (f"Lyceum has no capacity for h100 with 1 GPU right now (available: {available}); "
                              "try another GPU type (a100, cpu: LYCEUM_HARDWARE_PROFILE), or later")
    assert api_calls(emu) == ["GET /vms/availability"] and emu.vms == {}
    monkeypatch.setenv("LYCEUM_HARDWARE_PROFILE", "a100")
    assert backend.tf_vars(1, "gpukit", PUB)["hardware_profile"] == "a100"


@pytest.mark.parametrize(("status", "detail"), [(500, "VM could not be provisioned"),  # live
                                                (409, "No capacity available for a100 with 1 GPU(s)")])  # docs
def test_a_create_refused_for_capacity_is_one_line_with_the_alternatives(backend: LyceumBackend, emu: Emulator,
                                                                          status: int, detail: str) -> None:
    """Availability can race the create: Lyceum then refuses it (live: HTTP 500 "could not be provisioned",
    nothing created). Not retried, no VM left, one line naming what else is on offer, and a NoCapacity that
    `glue watch` waits out instead of counting a failed recovery."""
    emu.inject(status, count=3, path="/vms/create", detail=detail)
    with pytest.raises(NoCapacity) as err:
        backend.create_vm(spec())
    assert str(err.value) == (f"no capacity: Lyceum could not provision a100 with 1 GPU (HTTP {status}: {detail}); "
                              "try another GPU type (cpu, h100: LYCEUM_HARDWARE_PROFILE), or later")
    assert api_calls(emu).count("POST /vms/create") == 1 and emu.vms == {} and backend.owned_vm_ids() == []


@pytest.mark.parametrize("strict", ["current", "legacy"])
def test_instance_specs_shapes_against_a_strict_server(backend: LyceumBackend, emu: Emulator, strict: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The default (documented) shape and the older CLI's shape (LYCEUM_INSTANCE_SPECS=legacy); a
    server that takes only one answers 422 to the other, one line, nothing created."""
    emu.specs_shape = strict
    other = "legacy" if strict == "current" else "current"
    monkeypatch.setenv("LYCEUM_INSTANCE_SPECS", other)
    with pytest.raises(GlueError) as err:
        backend.create_vm(spec(cpu=16, memory_gb=128))
    assert str(err.value).startswith("Lyceum rejected the request as malformed (422 on POST /vms/create: "
                                     "instance_specs.")
    assert "Extra inputs are not permitted" in str(err.value) and emu.vms == {}
    monkeypatch.setenv("LYCEUM_INSTANCE_SPECS", strict)
    rec = backend.create_vm(spec(cpu=16, memory_gb=128))
    assert emu.vms[rec.id].specs == {"disk": 100, "gpu_count": 1, "cpu": 16, "memory": 128}
    sent = {"current": {"disk": 100, "gpu_count": 1, "cpu": 16, "memory": 128},
            "legacy": {"disk": {"min": 100}, "gpu_count": 1, "vcpu": {"min": 16}, "memory": {"min": 128},
                       "gpu_type": "a100"}}[strict]
    assert emu.create_bodies[-1]["instance_specs"] == sent


def test_unknown_instance_specs_shape_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LYCEUM_API_KEY", "lk_0123456789abcdef")
    monkeypatch.setenv("LYCEUM_INSTANCE_SPECS", "v3")
    with pytest.raises(GlueError, match=r"^LYCEUM_INSTANCE_SPECS='v3': use one of current, legacy$"):
        tf_vars(1, "g", PUB)


def test_no_capacity_is_one_line_and_creates_nothing(backend: LyceumBackend, emu: Emulator) -> None:
    emu.availability_shape = "variants"
    emu.set_capacity("h100", None)
    emu.set_capacity("a100", [1, 2])
    with pytest.raises(GlueError) as err:
        backend.create_vm(spec(gpu_type="h100"))
    assert str(err.value).startswith("Lyceum has no capacity for h100 with 1 GPU right now (available: cpu "
                                     "(on-demand), a100 (on-demand: 1, 2 GPUs))")
    with pytest.raises(GlueError, match="no capacity for a100 with 8 GPUs"):
        backend.create_vm(spec(gpu_count=8))
    assert "\n" not in str(err.value) and emu.vms == {}


def test_spot_or_on_demand_is_chosen_explicitly_against_each_pools_capacity(backend: LyceumBackend,
                                                                            emu: Emulator) -> None:
    """Spot and on-demand are separate pools (the availability variants): every create names its pool, the
    VM reports it, and a pool without capacity is refused in one line naming the other."""
    emu.availability_shape = "variants"
    emu.set_capacity("a100", [1, 2], market="spot")
    emu.set_capacity("h100", [], market="spot")  # a spot variant with nothing free now
    on_demand = backend.create_vm(spec())
    assert emu.create_bodies[-1]["instance_type"] == "on-demand" and on_demand.market == "on-demand"
    spot_vm = backend.create_vm(spec(market="spot"))
    assert emu.create_bodies[-1]["instance_type"] == "spot" and spot_vm.market == "spot"
    assert emu.vms[spot_vm.id].instance_type == "spot" and backend.read_vm(spot_vm.id).market == "spot"
    with pytest.raises(NoCapacity) as err:
        backend.create_vm(spec(gpu_type="h100", market="spot"))
    assert str(err.value).startswith("Lyceum has no capacity for h100 with 1 GPU as spot right now (available: ")
    assert "); try another GPU type (a100: LYCEUM_HARDWARE_PROFILE) or h100 as on-demand (LYCEUM_MARKET), or " \
           "later; still up and billed" in str(err.value)
    emu.set_capacity("l40s", [1], market="on-demand")  # l40s has no spot variant at all (live)
    with pytest.raises(NoCapacity, match=r"^Lyceum has no spot variant of l40s \(only on-demand\); set "
                                         r"LYCEUM_MARKET=on-demand or pick another LYCEUM_HARDWARE_PROFILE; still up"):
        backend.create_vm(spec(gpu_type="l40s", market="spot"))
    assert len(emu.live_vms()) == 2


def test_stuck_pending_times_out_and_deletes_the_vm(backend: LyceumBackend, emu: Emulator,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LYCEUM_CREATE_TIMEOUT", "0.5")
    emu.stuck_pending = True
    with pytest.raises(GlueError) as err:
        backend.create_vm(spec())
    [vm] = emu.vms.values()
    assert str(err.value) == (f"Lyceum VM gpukit-1 ({vm.vm_id}) is still pending after 0.5s (LYCEUM_CREATE_TIMEOUT); "
                              f"Lyceum may be short of capacity; VM {vm.vm_id} was deleted again")
    assert vm.status == "terminated" and emu.live_vms() == []


def test_failed_cleanup_names_the_vm_and_the_command(backend: LyceumBackend, emu: Emulator,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LYCEUM_CREATE_TIMEOUT", "0.3")
    emu.stuck_pending = True
    emu.inject(500, count=50, path="/vms/vm-", method="DELETE", detail="internal error")
    with pytest.raises(GlueError) as err:
        backend.create_vm(spec())
    [vm] = emu.vms.values()
    msg = str(err.value)
    assert f"deleting VM {vm.vm_id} ALSO failed" in msg
    assert f"run `python -m glue.cloud.lyceum delete {vm.vm_id}`" in msg
    assert f"still up and billed on this Lyceum account: gpukit-1 ({vm.vm_id}, pending)" not in msg  # excluded
    assert "\n" not in msg


def test_a_later_failure_lists_the_vms_already_running(backend: LyceumBackend, emu: Emulator) -> None:
    first = backend.create_vm(spec("gpukit-1"))
    emu.set_capacity("a100", None)
    with pytest.raises(GlueError) as err:
        backend.create_vm(spec("gpukit-2"))
    assert (f"still up and billed on this Lyceum account: gpukit-1 ({first.id}, running): `glue down` deletes "
            f"this cluster's, `python -m glue.cloud.lyceum delete <vm_id>` any one") in str(err.value)


def test_vm_that_errors_while_starting_is_deleted(backend: LyceumBackend, emu: Emulator,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    real_boot = emu._boot

    def failing_boot(vm: object) -> None:
        real_boot(vm)  # type: ignore[arg-type]
        emu.kill(vm.vm_id, "error")  # type: ignore[attr-defined]

    monkeypatch.setattr(emu, "_boot", failing_boot)
    monkeypatch.setattr(lyceum, "scan_host_key", lambda *a, **k: (_ for _ in ()).throw(OSError("refused")))
    monkeypatch.setenv("LYCEUM_CREATE_TIMEOUT", "1")
    with pytest.raises(GlueError, match=r"(became error while starting|never answered).*was deleted again"):
        backend.create_vm(spec())
    assert emu.live_vms() == []


def test_interrupt_during_create_still_deletes(backend: LyceumBackend, emu: Emulator,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*a: object, **k: object) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(lyceum, "scan_host_key", interrupted)
    with pytest.raises(KeyboardInterrupt):
        backend.create_vm(spec())
    assert emu.live_vms() == []


def test_parse_address() -> None:
    assert parse_address("10.0.1.5:22") == ("10.0.1.5", 22)
    assert parse_address("10.0.1.5") == ("10.0.1.5", 22)
    assert parse_address("127.0.0.1:40222") == ("127.0.0.1", 40222)
    assert parse_address("[2001:db8::1]:2222") == ("2001:db8::1", 2222)
    with pytest.raises(GlueError, match="unusable VM address"):
        parse_address("host:ssh")


def test_ssh_user_setting(backend: LyceumBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LYCEUM_API_KEY", "lk_0123456789abcdef")
    monkeypatch.setenv("LYCEUM_SSH_USER", "ubuntu")
    assert tf_vars(1, "g", PUB)["ssh_user"] == "ubuntu"
    rec = backend.create_vm(spec(ssh_user="ubuntu"))
    assert rec.ssh_user == "ubuntu" and backend.read_vm(rec.id) == rec  # recorded, read back
    monkeypatch.setenv("LYCEUM_SSH_USER", "Ubuntu; rm -rf /")
    with pytest.raises(GlueError, match=r"^LYCEUM_SSH_USER='Ubuntu; rm -rf /' is not a user name"):
        tf_vars(1, "g", PUB)


def test_tf_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LYCEUM_API_KEY", "lk_0123456789abcdef")
    monkeypatch.delenv("LYCEUM_SSH_USER", raising=False)
    monkeypatch.delenv("LYCEUM_HARDWARE_PROFILE", raising=False)
    monkeypatch.delenv("LYCEUM_GPU_COUNT", raising=False)
    monkeypatch.delenv("LYCEUM_MARKET", raising=False)
    assert tf_vars(2, "gpukit", PUB) == {"vm_count": 2, "name_prefix": "gpukit", "ssh_public_key": PUB,
                                         "hardware_profile": "a100", "gpu_count": 1, "market": "on-demand"}
    monkeypatch.setenv("LYCEUM_MARKET", "Spot")
    assert tf_vars(1, "g", PUB)["market"] == "spot"
    monkeypatch.setenv("LYCEUM_MARKET", "preemptible")
    with pytest.raises(GlueError, match=r"^LYCEUM_MARKET='preemptible' is not a market: use on-demand or spot$"):
        tf_vars(1, "g", PUB)
    monkeypatch.delenv("LYCEUM_MARKET")
    monkeypatch.setenv("LYCEUM_HARDWARE_PROFILE", "CPU")
    assert tf_vars(1, "g", PUB)["gpu_count"] == 0
    monkeypatch.setenv("LYCEUM_HARDWARE_PROFILE", "tpu")
    with pytest.raises(GlueError, match=r"^unknown hardware profile 'tpu' \(LYCEUM_HARDWARE_PROFILE\): Use one of"):
        tf_vars(1, "g", PUB)
    monkeypatch.setenv("LYCEUM_HARDWARE_PROFILE", "h100")
    for bad in ("9", "3", "0"):  # the live API takes 1, 2, 4 or 8 (and silently bills a 0 as 1)
        monkeypatch.setenv("LYCEUM_GPU_COUNT", bad)
        with pytest.raises(GlueError, match=r"\(LYCEUM_GPU_COUNT\): Use 1, 2, 4 or 8 GPUs per VM"):
            tf_vars(1, "g", PUB)
    monkeypatch.delenv("LYCEUM_API_KEY")
    with pytest.raises(GlueError, match="LYCEUM_API_KEY is not set"):
        tf_vars(1, "g", PUB)


def test_parallel_creates_share_one_progress_display(backend: LyceumBackend, emu: Emulator) -> None:
    """Terraform creates VMs in parallel threads of one provider process."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        recs = list(pool.map(lambda i: backend.create_vm(spec(f"gpukit-{i}")), range(1, 5)))
    assert sorted(r.name for r in recs) == ["gpukit-1", "gpukit-2", "gpukit-3", "gpukit-4"]
    assert len({r.id for r in recs}) == 4 and backend._live is None


def test_doctor_names_a_vm_without_an_address_and_one_that_is_gone(backend: LyceumBackend, emu: Emulator,
                                                                   tmp_path: Path) -> None:
    """`glue doctor` with a cluster up: a VM Lyceum lists without an address yet (live: `ready` for minutes
    before it has one) and a VM gone from the account are each one line with the fix."""
    from glue.cloud.lyceum import doctor

    client = backend.api
    emu.stuck_pending = True  # it never gets an address
    waiting = client.create_vm({"hardware_profile": "a100", "user_public_key": PUB, "name": "gpukit-1"})
    checks = doctor.cluster_vms(client, {waiting["vm_id"]: {"name": "gpukit-1", "ssh_user": "lyceum"},
                                         "vm-gone": {"name": "gpukit-2"}}, tmp_path / "no-key")
    assert [(c.name, c.ok) for c in checks] == [("VM gpukit-1", False), ("VM gpukit-2", False)]
    assert "Lyceum reports no address for it yet" in checks[0].detail and "glue doctor" in checks[0].fix
    assert checks[1].detail == "vm-gone is gone from the account" and "glue up" in checks[1].fix
