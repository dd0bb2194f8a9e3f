"""With nothing but `glue watch` polling, a run outlives many lifetimes of its bucket credentials: the
watcher refreshes them and pushes them to the VM's trainer file and mount, and no bucket write of the
trainer fails (Lyceum emulator: real STS-style expiry, real VMs, the real CLI).

Long: by default credentials live 60 s through a 5-minute run (GPUKIT_SOAK_TTL, GPUKIT_SOAK_SECONDS
make it shorter or longer)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from glue.cloud.lyceum.backend import LyceumBackend
from glue.runs.store import RunStore
from glue.train import layout
from tests.integration.test_runs import run_config
from tests.kit import GLUE
from tests.lyceum_emulator import Emulator

from .conftest import Kit
from .test_lyceum_e2e import without_group_firewall

pytestmark = [pytest.mark.integration, pytest.mark.stress]


@pytest.mark.timeout(1800)
def test_watch_keeps_expiring_credentials_fresh(kit: Kit, tmp_path: Path) -> None:
    ttl = float(os.environ.get("GPUKIT_SOAK_TTL", "60"))
    seconds = float(os.environ.get("GPUKIT_SOAK_SECONDS", "300"))
    without_group_firewall(kit.home)
    # `glue up` (the playbook pushes the credentials once) gets long-lived ones; the run gets short ones.
    with Emulator(tmp_path / "emu", pending_s=0.2, credentials_ttl=1800) as emu:
        env = {**kit.env, **emu.env(), "LYCEUM_HARDWARE_PROFILE": "cpu", "LYCEUM_POLL_INTERVAL": "0.2",
               "LYCEUM_CREATE_TIMEOUT": "60"}
        kit.glue("up", "--backend", "lyceum", "--vms", "1", env=env, timeout=900)
        emu.sts.ttl = ttl
        (kit.home / "bucket" / "credentials.json").unlink()  # the next use fetches short-lived ones
        try:
            steps = int(seconds / 0.1)
            cfg = run_config(tmp_path, config={"steps": steps, "step_sleep": 0.1, "checkpoint_interval": 100},
                             checkpoint={"interval_steps": 100})
            kit.glue("deploy", "--run", "soak", "--config", str(cfg), env=env)
            log = tmp_path / "watch.log"
            with open(log, "w") as out:
                watcher = subprocess.run([*GLUE, "watch", "--run", "soak", "--interval", "2"], env=env, stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         timeout=seconds * 3 + 300, check=False)
            assert watcher.returncode == 0, log.read_text()[-3000:]
            os.environ.update(emu.env())
            try:
                backend = LyceumBackend(kit.home)
                store = RunStore(backend.bucket(), backend.bucket_credentials(), "soak",
                                 refresh=backend.bucket_credentials)
                state = store.get_json(layout.WATCH_STATE)
                assert state["done"] and store.attempts() == [1], state  # completed, never recovered
                assert store.get_json(f"{layout.OUTPUTS}/final.json")["step"] == steps
                assert sorted(store.metrics().get(1, {})) == list(range(1, steps + 1))  # every step's record landed
                assert not store.keys(layout.errors_prefix(1))  # no trainer error (a failed write would raise)
                assert len(emu.sts.tokens) > seconds / ttl  # the credentials really expired and were renewed
            finally:
                for key in emu.env():
                    os.environ.pop(key, None)
        finally:
            kit.glue("down", "--force", env=env, check=False)
