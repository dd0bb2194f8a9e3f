"""Bad input that needs no cluster: one line, exit 1, nothing written (click's test runner, in process)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from glue.cli import cli
from glue.train import layout


def _glue(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, list(args), env={"GPUKIT_HOME": str(tmp_path / "home")})
    return res.exit_code, res.stdout, res.stderr


def test_advise_example_has_json_with_the_worked_numbers(tmp_path: Path) -> None:
    code, out, _ = _glue(tmp_path, "advise", "--example", "--json")
    numbers = json.loads(out)
    assert code == 0 and numbers["lost_minutes"] == 10 and numbers["restore_minutes"] == 5
    assert 37 < numbers["young_interval_minutes"] < 39


def test_compare_of_a_run_with_itself_is_refused(tmp_path: Path) -> None:
    code, _, err = _glue(tmp_path, "compare", "r1", "r1")
    assert code == 1 and "compare needs two different runs (got r1 twice)" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_report_into_a_missing_folder_is_refused_before_the_bucket_is_read(tmp_path: Path) -> None:
    code, _, err = _glue(tmp_path, "report", "--run", "r1", "--out", str(tmp_path / "nope" / "r.html"))
    assert code == 1 and "folder" in err and "does not exist; create it or pick another --out" in err
    assert not (tmp_path / "nope").exists()


def test_a_bad_run_id_is_a_usage_error_not_a_bucket_error(tmp_path: Path) -> None:
    escape = f"../{layout.RUNS_PREFIX}r1"  # another run's records
    code, _, err = _glue(tmp_path, "status", "--run", escape)
    assert code == 1 and f"invalid run id '{escape}'" in err and "bucket" not in err


def test_a_damaged_cluster_json_is_one_line_not_the_defaults(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    for text, needle in (('{"backend": "aws"}', "is not a cluster config"), ("garbage", "cannot be read"),
                         ('{"vms": "two"}', "is not a cluster config")):
        (home / "cluster.json").write_text(text)
        code, _, err = _glue(tmp_path, "status")
        assert code == 1 and needle in err and "remove it" in err and "Traceback" not in err, err
        assert (home / "cluster.json").read_text() == text


def test_watch_once_fails_for_a_failed_recovery_or_an_unreadable_run() -> None:
    from glue.commands.watch import once_failures

    rows: list[dict[str, object]] = [
        {"run": "a", "state": "running", "note": ""},
        {"run": "b", "state": "recover", "note": "recovery failed: unknown VM 'gpukit-1'"},
        {"run": "c", "state": "error", "note": "bucket did not answer"},
        {"run": "d", "state": "stopped", "note": "budget exhausted"},
    ]
    assert once_failures(rows) == ["b: recovery failed: unknown VM 'gpukit-1'", "c: bucket did not answer"]
    assert once_failures(rows[:1] + rows[3:]) == []


def test_nan_and_inf_are_refused_by_every_number_option(tmp_path: Path) -> None:
    """A nan tolerance would pass every resume check and a nan poll interval crash-loops a watcher: every
    float option refuses non-finite numbers (and durations that overflow) before anything runs."""
    cases = [("watch", "--interval", "nan"), ("watch", "--detach", "--interval", "inf"),
             ("watch", "--interval", "1e308"), ("watch", "--tolerance", "nan"),
             ("recover", "--run", "r1", "--tolerance", "nan"),
             ("drill", "--config", "x.yaml", "--timeout", "inf"), ("advise", "--mtbf", "nan", "--json"),
             ("advise", "--mtbf", "1", "--restore-seconds", "inf"), ("budget", "--run", "r1", "--steps", "10",
                                                                      "--mtbf", "inf")]
    for args in cases:
        code, out, err = _glue(tmp_path, *args)
        assert code == 2 and "Traceback" not in err and not out, (args, code, out, err)
        assert "finite" in err or "range" in err, (args, err)
    assert not (tmp_path / "home" / "watch").exists()  # no watcher was started


def test_a_damaged_bucket_credentials_file_is_one_line_and_kept(tmp_path: Path) -> None:
    creds = tmp_path / "home" / "bucket" / "credentials.json"
    creds.parent.mkdir(parents=True)
    for text in ("garbage", "", "{}", "[]"):
        creds.write_text(text)
        code, _, err = _glue(tmp_path, "status", "--run", "r1")
        assert code == 1 and "credentials.json is damaged" in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1 and creds.read_text() == text


def test_a_usage_error_is_one_line_naming_the_help() -> None:
    """A bad option is one line too (click alone prints usage, a hint, a blank line, then the error)."""
    for args, needle, where in ((["logs", "--run", "x", "--attempt", "0"], "'--attempt': 0 is not in the range",
                                 "glue logs --help"),
                                (["lgs"], "No such command 'lgs'", "glue --help"),
                                (["deploy"], "Missing option '--run'", "glue deploy --help"),
                                (["image", "build", "--nope"], "No such option '--nope'", "glue image build --help")):
        res = CliRunner().invoke(cli, args, prog_name="glue")
        lines = res.stderr.strip().splitlines()
        assert res.exit_code == 2 and len(lines) == 1 and needle in lines[0] and where in lines[0], res.stderr
