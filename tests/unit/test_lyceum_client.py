"""The Lyceum API client against the emulator (no VMs booted): shapes, retries, errors, secrets."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from glue.cloud.lyceum.api import (
    LyceumClient,
    LyceumError,
    LyceumNotFound,
    RetryPolicy,
    api_key_from_env,
    api_url_from_env,
)
from glue.errors import GlueError
from tests.lyceum_emulator import Emulator

FAST = RetryPolicy(attempts=4, base_s=0.01, max_s=0.05, deadline_s=5)
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBvTfQeuTCMyBZ1R3j2pWLZ6d5xUuQ0Q3uF1x4uQ2zVr test"


@pytest.fixture
def emu(tmp_path: Path) -> Iterator[Emulator]:
    with Emulator(tmp_path / "emu", boot_vms=False, pending_s=0.1) as emulator:
        yield emulator


@pytest.fixture
def client(emu: Emulator) -> LyceumClient:
    return LyceumClient(emu.api_key, emu.url, retry=FAST)


def creates(emu: Emulator) -> int:
    return sum(1 for m, p, _ in emu.requests if m == "POST" and p.endswith("/vms/create"))


def test_create_poll_list_delete(client: LyceumClient, emu: Emulator) -> None:
    vm = client.create_vm({"hardware_profile": "a100", "user_public_key": KEY, "name": "c1",
                           "instance_specs": {"gpu_count": 2, "disk": 200}})
    assert vm["status"] == "pending" and vm["ip_address"] is None and vm["vm_id"].startswith("vm-")
    deadline = time.monotonic() + 5
    while (status := client.vm_status(vm["vm_id"]))["status"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    host, port = status["ip_address"].split(":")
    assert host == "127.0.0.1" and int(port) > 0
    assert status["gpu_count"] == 2 and status["instance_specs"]["disk"] == 200
    [listed] = client.list_vms()
    assert listed["vm_id"] == vm["vm_id"] and listed["status"] == "running" and listed["name"] == "c1"
    client.delete_vm(vm["vm_id"])
    assert client.vm_status(vm["vm_id"])["status"] == "terminated"
    client.delete_vm("vm-doesnotexist")  # already gone: not an error


def test_availability_lists_variants(client: LyceumClient, emu: Emulator) -> None:
    emu.set_capacity("h100", None)
    profiles = {v["hardware_profile"]: v for v in client.availability()}
    assert set(profiles) == {"cpu", "a100"} and profiles["a100"]["available_gpus_per_instance"] == [1, 2, 4, 8]


def test_401_shows_detail_and_never_the_key(emu: Emulator) -> None:
    bad = "lk_wrong_key_0123456789abcdef"
    with pytest.raises(LyceumError) as err:
        LyceumClient(bad, emu.url, retry=FAST).list_vms()
    msg = str(err.value)
    assert err.value.status == 401 and "Invalid or expired API key" in msg and "LYCEUM_API_KEY" in msg
    assert bad not in msg and bad not in repr(LyceumClient(bad, emu.url))
    assert "\n" not in msg


def test_403_inactive_key(client: LyceumClient, emu: Emulator) -> None:
    emu.inactive_keys.add(emu.api_key)
    with pytest.raises(LyceumError, match=r"403: API key is inactive"):
        client.list_vms()


def test_404_unknown_vm(client: LyceumClient) -> None:
    with pytest.raises(LyceumNotFound, match=r"404 on GET /vms/vm-nope/status: VM vm-nope not found"):
        client.vm_status("vm-nope")


def test_422_lists_the_fields(client: LyceumClient, emu: Emulator) -> None:
    with pytest.raises(LyceumError) as err:
        client.create_vm({"hardware_profile": 7, "name": "x", "instance_specs": {"gpu_count": -1}})
    assert err.value.status == 422
    assert str(err.value) == (
        "Lyceum rejected the request as malformed (422 on POST /vms/create: user_public_key: Field required; "
        "hardware_profile: Input should be a valid string; instance_specs.gpu_count: Input should be a valid "
        "non-negative integer)")
    assert creates(emu) == 1  # a 4xx is never retried


def test_5xx_and_429_are_retried(client: LyceumClient, emu: Emulator) -> None:
    emu.inject(503, count=2, path="/vms/list")
    emu.inject(429, count=1, path="/vms/list", retry_after=0.2)
    start = time.monotonic()
    assert client.list_vms() == []
    assert time.monotonic() - start >= 0.2  # Retry-After honoured
    assert [s for m, p, s in emu.requests if p.endswith("/vms/list")] == [503, 503, 429, 200]


def test_retries_give_up_with_one_line(client: LyceumClient, emu: Emulator) -> None:
    emu.inject(502, count=10, path="/vms/availability", detail="bad gateway upstream")
    with pytest.raises(LyceumError) as err:
        client.availability()
    assert str(err.value) == ("Lyceum API 502 on GET /vms/availability: bad gateway upstream "
                              "(gave up after 4 attempts)")


def test_create_retried_after_a_lost_answer_makes_one_vm(client: LyceumClient, emu: Emulator) -> None:
    emu.inject(502, count=1, path="/vms/create", after_processing=True)
    vm = client.create_vm({"hardware_profile": "cpu", "user_public_key": KEY, "name": "once"})
    assert len(emu.vms) == 1 and vm["vm_id"] in emu.vms
    emu.inject(503, count=1, path="/vms/create")  # not processed: retried, still one VM each
    client.create_vm({"hardware_profile": "cpu", "user_public_key": KEY, "name": "twice"})
    assert sorted(v.name or "" for v in emu.vms.values()) == ["once", "twice"]


def test_unreachable_api_is_one_line() -> None:
    client = LyceumClient("lk_0123456789abcdef", "http://127.0.0.1:9/api/v2/external",
                          retry=RetryPolicy(attempts=2, base_s=0.01, max_s=0.01))
    with pytest.raises(LyceumError, match=r"^cannot reach the Lyceum API at http://127.0.0.1:9/api/v2/external "
                                          r"\(.*\) \(gave up after 2 attempts\)$"):
        client.list_vms()


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        (None, "LYCEUM_API_KEY is not set"),
        ("", "LYCEUM_API_KEY is not set"),
        ("   ", "LYCEUM_API_KEY is not set"),
        ("not-a-key", "LYCEUM_API_KEY is malformed"),
        ("lk_has a space inside", "LYCEUM_API_KEY is malformed"),
        ('"lk_0123456789abcdef"', "LYCEUM_API_KEY is malformed"),
    ],
)
def test_bad_api_keys_are_one_clear_line(value: str | None, needle: str) -> None:
    env = {} if value is None else {"LYCEUM_API_KEY": value}
    with pytest.raises(GlueError) as err:
        api_key_from_env(env)
    assert str(err.value).startswith(needle) and "\n" not in str(err.value)
    if value and value.strip():
        assert value.strip() not in str(err.value)


def test_good_api_keys() -> None:
    assert api_key_from_env({"LYCEUM_API_KEY": " lk_0123456789abcdef\n"}) == "lk_0123456789abcdef"
    assert api_key_from_env({"LYCEUM_API_KEY": "eyJhbGci.eyJzdWIi.c2ln"}) == "eyJhbGci.eyJzdWIi.c2ln"


def test_api_url_rules() -> None:
    assert api_url_from_env({}) == "https://api.lyceum.technology/api/v2/external"
    assert api_url_from_env({"LYCEUM_API_URL": "http://127.0.0.1:8/x/"}) == "http://127.0.0.1:8/x"
    with pytest.raises(GlueError, match="only travels over https"):
        api_url_from_env({"LYCEUM_API_URL": "http://api.example.com/v2"})
    with pytest.raises(GlueError, match="is not an http"):
        api_url_from_env({"LYCEUM_API_URL": "ftp://x"})
