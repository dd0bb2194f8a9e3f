"""The bucket_mount role's gpukit-mount script, without a VM: shellcheck-clean, its settings file
rendered by Ansible from the role's defaults (so quoting goes through the real `quote` filter),
the rclone command line it builds from them, and one clear line when the settings are missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "ansible" / "roles" / "bucket_mount"
SCRIPT = ROLE / "files" / "gpukit-mount"
BIN = Path(sys.executable).parent

RENDER = """
- name: Render the gpukit-mount settings from the role's defaults
  hosts: localhost
  connection: local
  gather_facts: false
  vars_files:
    - {defaults}
  vars:
    ansible_python_interpreter: {python}
    gpukit_bucket_endpoint: http://127.0.0.1:9
    gpukit_bucket_name: my bucket
    gpukit_bucket_region: local
    gpukit_bucket_credentials_file: /nonexistent
    gpukit_backend: local
  tasks:
    - name: Render
      ansible.builtin.template:
        src: {template}
        dest: "{{{{ out }}}}"
        mode: "0644"
"""


def render(tmp_path: Path, **overrides: object) -> Path:
    play = tmp_path / "render.yml"
    play.write_text(RENDER.format(defaults=ROLE / "defaults" / "main.yml",
                                  template=ROLE / "templates" / "mount.conf.j2", python=sys.executable))
    out = tmp_path / "mount.conf"
    extra = tmp_path / "extra.yml"
    extra.write_text(yaml.safe_dump({"out": str(out), **overrides}))
    env = {**os.environ, "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_NOCOLOR": "1"}
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(play), "-e", f"@{extra}"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def run(config: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GPUKIT_MOUNT_CONFIG"}
    if config is not None:
        env["GPUKIT_MOUNT_CONFIG"] = str(config)
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed (make bootstrap)")
def test_shellcheck_clean() -> None:
    proc = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_script_is_a_plain_executable_file_not_a_template() -> None:
    text = SCRIPT.read_text()
    assert text.startswith("#!/bin/bash\n") and "{{" not in text and "{%" not in text
    assert os.access(SCRIPT, os.X_OK)
    assert not (ROLE / "templates" / "gpukit-mount.j2").exists()


def test_rclone_command_line_from_the_rendered_settings(tmp_path: Path) -> None:
    fake = tmp_path / "rclone"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    fake.chmod(0o755)
    mnt = tmp_path / "mnt s3"
    config = render(tmp_path, bucket_mount_rclone_bin=str(fake), bucket_mount_path=str(mnt),
                    bucket_mount_cache_dir=str(tmp_path / "cache"), bucket_mount_guard=False,
                    bucket_mount_allow_other=True, bucket_mount_extra_args=["--transfers", "8", "--x=it's"])
    text = config.read_text()
    assert "REMOTE='gpukit:my bucket'" in text and "GUARD=0" in text and "ALLOW_OTHER=1" in text
    proc = run(config, "run")  # prepares the mount point, then execs "rclone mount ..."
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "mount", "gpukit:my bucket", str(mnt),
        "--vfs-cache-mode", "writes", "--vfs-write-back", "1s", "--vfs-cache-max-age", "1h",
        "--vfs-cache-max-size", "20G", "--dir-cache-time", "10s", "--cache-dir", str(tmp_path / "cache"),
        "--log-level", "NOTICE", "--allow-other", "--transfers", "8", "--x=it's",
    ]
    assert mnt.is_dir() and (tmp_path / "cache").is_dir()

    status = run(config, "status")
    assert (status.returncode, status.stdout.strip()) == (18, "not mounted")


def test_defaults_mount_without_allow_other_or_extra_args(tmp_path: Path) -> None:
    text = render(tmp_path).read_text()
    assert "ALLOW_OTHER=0" in text and "GUARD=1" in text and "EXTRA_ARGS=( )" in text
    assert "MNT=/mnt/s3" in text and "RCLONE_CONFIG=/etc/gpukit/rclone.conf" in text


def test_missing_or_incomplete_settings_are_one_clear_line(tmp_path: Path) -> None:
    proc = run(tmp_path / "nope.conf", "status")
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"gpukit-mount: settings missing: cannot read {tmp_path / 'nope.conf'} " \
                                  "(written by the bucket_mount role)"
    partial = tmp_path / "partial.conf"
    partial.write_text("RCLONE=/usr/bin/rclone\n")
    proc = run(partial, "status")
    assert proc.returncode == 2 and "RCLONE_CONFIG is not set in" in proc.stderr
    assert run(None, "help").returncode == 2  # default /etc/gpukit/mount.conf: absent here
