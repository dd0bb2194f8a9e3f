"""The playbooks parse, every role has the layout docs/design.md asks for ("Repository layout"), and yamllint is clean.
(ansible-lint --profile production runs in `make lint`; it takes too long for the unit suite.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = ROOT / "ansible"
BIN = Path(sys.executable).parent
ROLES = ("nvidia_driver", "container_runtime", "bucket_mount", "trainer", "group_firewall")


@pytest.mark.parametrize("playbook", ["site.yml", "verify.yml", "up.yml"])
def test_playbook_syntax(playbook: str, tmp_path: Path) -> None:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ANSIBLE / "ansible.cfg"), "ANSIBLE_LOCAL_TEMP": str(tmp_path)}
    proc = subprocess.run([str(BIN / "ansible-playbook"), "--syntax-check", "-i", "localhost,",
                           str(ANSIBLE / playbook)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("role", ROLES)
def test_role_layout(role: str) -> None:
    d = ANSIBLE / "roles" / role
    for part in ("defaults/main.yml", "tasks/main.yml", "meta/main.yml", "README.md"):
        assert (d / part).is_file(), f"{role}: {part} missing"
    meta = yaml.safe_load((d / "meta/main.yml").read_text())
    assert meta["galaxy_info"]["role_name"] == role
    defaults = yaml.safe_load((d / "defaults/main.yml").read_text())
    unprefixed = [k for k in defaults if not k.startswith(role + "_")]
    assert not unprefixed, f"{role}: defaults without the role prefix: {unprefixed}"


def test_ansible_cfg_pipelining_control_sockets_and_host_keys() -> None:
    cfg = (ANSIBLE / "ansible.cfg").read_text()
    assert "pipelining = True" in cfg
    assert "host_key_checking = True" in cfg
    assert "StrictHostKeyChecking=yes" in cfg
    assert "control_path_dir = ../.gpukit/" in cfg
    gv = (ANSIBLE / "group_vars" / "all.yml").read_text()
    assert "UserKnownHostsFile" in gv and "known_hosts" in gv


def test_yamllint_clean() -> None:
    proc = subprocess.run([str(BIN / "yamllint"), "--strict", str(ANSIBLE)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
