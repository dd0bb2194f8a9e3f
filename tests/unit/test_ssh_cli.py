"""`glue up`'s ssh options, bad input: one line, non-zero exit, nothing written (click's runner, in process)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from glue.cli import cli


def _up(tmp_path: Path, *args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, ["up", *args], env={"GPUKIT_HOME": str(tmp_path / "home")})
    return res.exit_code, res.stderr


def test_the_ssh_backend_needs_a_hosts_file(tmp_path: Path) -> None:
    code, err = _up(tmp_path, "--backend", "ssh")
    assert code == 2 and "--backend ssh needs --hosts FILE" in err and "Traceback" not in err


def test_hosts_without_the_ssh_backend_is_refused(tmp_path: Path) -> None:
    code, err = _up(tmp_path, "--hosts", str(tmp_path / "h.yaml"))
    assert code == 2 and "--hosts and --accept-new-host-keys are for --backend ssh" in err


def test_a_bad_hosts_file_and_an_unreachable_host_refuse_before_terraform(tmp_path: Path) -> None:
    hosts = tmp_path / "h.yaml"
    hosts.write_text("hosts:\n  - address: 127.0.0.1\n    port: 1\n    identity_file: /nonexistent\n    prot: 3\n")
    code, err = _up(tmp_path, "--backend", "ssh", "--hosts", str(hosts))
    assert code == 1 and "host 1 (127.0.0.1): prot: Extra inputs are not permitted" in err
    assert len(err.strip().splitlines()) == 1
    hosts.write_text("hosts:\n  - address: 127.0.0.1\n    port: 1\n    identity_file: /nonexistent\n")
    code, err = _up(tmp_path, "--backend", "ssh", "--hosts", str(hosts), "--accept-new-host-keys")
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 2 and "Traceback" not in err
    assert lines[0].startswith("FAIL 127.0.0.1-1: unreachable at 127.0.0.1:1 (Connection refused)")
    assert "127.0.0.1-1 failed the checks" in lines[1] and "nothing was configured" in lines[1]
    home = tmp_path / "home"
    assert not (home / "terraform").exists() and not (home / "cluster.json").exists()
