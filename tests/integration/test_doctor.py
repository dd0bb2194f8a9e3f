"""`glue doctor` against the Lyceum emulator (real client, real bucket behind expiring credentials,
real terraform and provider mirror): green on a good account, and each failure named on its own
✗ line with the fix, exit status 1, no traceback, no VM created, nothing left in the bucket."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from glue.cloud.lyceum.backend import LyceumBackend
from glue.storage import bucket as bucket_store
from glue.train import layout
from tests.kit import Kit
from tests.lyceum_emulator import Emulator

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    with Emulator(tmp_path_factory.mktemp("emu"), boot_vms=False) as emulator:
        yield emulator


@pytest.fixture(autouse=True)
def healthy(emu: Emulator) -> Iterator[None]:
    yield
    emu.set_capacity("cpu", [])
    emu.sts.ttl = 900.0
    emu.faults.clear()


def doctor(kit: Kit, emu: Emulator, *args: str, **extra: str) -> tuple[int, dict[str, dict[str, object]], str]:
    env = {**kit.env, **emu.env(), "LYCEUM_HARDWARE_PROFILE": "cpu", **extra}
    env = {k: v for k, v in env.items() if v != ""}
    res = kit.glue("doctor", "--backend", "lyceum", *args, env=env, check=False)
    assert "Traceback" not in res.stderr, res.stderr
    if "--json" in args:
        return res.returncode, {c["name"]: c for c in json.loads(res.stdout)["checks"]}, res.stdout
    return res.returncode, {}, res.stdout


def probe_keys(kit: Kit, emu: Emulator) -> list[str]:
    os.environ.update(emu.env())
    try:
        backend = LyceumBackend(kit.home / "probe")
        s3 = bucket_store.client(backend.bucket(), backend.bucket_credentials())
        listing = s3.list_objects_v2(Bucket=emu.sts.bucket, Prefix=layout.DOCTOR_PREFIX)
        return [o["Key"] for o in listing.get("Contents", [])]
    finally:
        for key in emu.env():
            os.environ.pop(key, None)


def test_green_against_the_emulator(kit: Kit, emu: Emulator) -> None:
    code, _, out = doctor(kit, emu)
    assert code == 0, out
    lines = out.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "✓ API key", "✓ capacity", "✓ storage credentials", "✓ bucket probe", "✓ SSH key", "✓ terraform",
        "✓ provider mirror"]
    assert "expire in 15 min (expires_at)" in out and emu.api_key not in out
    assert emu.vms == {} and not any(m == "POST" and p.endswith("/vms/create") for m, p, _ in emu.requests)
    assert probe_keys(kit, emu) == []  # the probe object was deleted again
    assert not (kit.home / "bucket" / "credentials.json").exists()  # doctor keeps no credentials


@pytest.mark.parametrize(
    ("case", "name", "needle"),
    [
        # make test: one failure of each kind of check's source (the API, the storage, this machine); the rest in
        # make test-all (since 2026-12-07: the suite's time)
        ("wrong key", "API key", "Lyceum rejected the API key (401 on GET /vms/list"),
        pytest.param("missing key", "API key", "LYCEUM_API_KEY is not set", marks=pytest.mark.stress),
        pytest.param("no capacity", "capacity", "Lyceum has no capacity for cpu right now (available: a100",
                     marks=pytest.mark.stress),
        pytest.param("short-lived credentials", "storage credentials", "but they expire in 30 s (expires_at)",
                     marks=pytest.mark.stress),
        ("storage refused", "storage credentials", "Lyceum refused POST /storage/credentials (403"),
        pytest.param("old terraform", "terraform", "is older than the lyceum env needs (>= 1.9)",
                     marks=pytest.mark.stress),
        ("open SSH key", "SSH key", "is readable by others (mode 644)"),
    ],
)
def test_each_failure_is_named_with_its_fix(kit: Kit, emu: Emulator, tmp_path: Path, case: str, name: str,
                                            needle: str) -> None:
    extra: dict[str, str] = {}
    if case == "wrong key":
        extra["LYCEUM_API_KEY"] = "lk_not_a_key_the_emulator_knows"
    if case == "missing key":
        extra["LYCEUM_API_KEY"] = ""
    if case == "no capacity":
        emu.set_capacity("cpu", None)
    if case == "short-lived credentials":
        emu.sts.ttl = 30.0
    if case == "storage refused":
        emu.inject(403, count=2, path="/storage/credentials", detail="storage is not enabled for this account")
    if case == "old terraform":  # a terraform that reports 1.5.7 first on PATH
        fake = tmp_path / "bin"
        fake.mkdir()
        (fake / "terraform").write_text('#!/bin/sh\necho \'{"terraform_version": "1.5.7"}\'\n')
        (fake / "terraform").chmod(0o755)
        extra["PATH"] = f"{fake}:{os.environ['PATH']}"
    if case == "open SSH key":
        kit.glue("doctor", "--backend", "local", check=False)  # no key yet: doctor does not make one
        from glue.infra.ssh_keys import client_key

        client_key(kit.home).chmod(0o644)
    code, checks, out = doctor(kit, emu, "--json", **extra)
    assert code == 1, out
    failed = [c for c in checks.values() if not c["ok"]]
    assert [c["name"] for c in failed] == [name], out
    assert needle in str(failed[0]["detail"]) and failed[0]["fix"], failed[0]
    assert emu.vms == {}
    human = doctor(kit, emu, **extra)[2]
    [line] = [ln for ln in human.splitlines() if ln.startswith("✗")]
    assert line.startswith(f"✗ {name}: ") and " — fix: " in line
