"""Bad input to `glue memprobe`: one clear line, a non-zero exit, no traceback, nothing lost, and no trial
run. Every case is refused before the first trial process starts (each invocation also limits the search
to one or two tiny trials, so that a regression shows up as a wrong exit code, not as a long test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from glue.cli import cli
from glue.errors import GlueError
from glue.memprobe import investigate, source

RUN_YAML = "command: [python, -m, glue.examples.tiny_gpt]\nconfig: {batch_size: 4, seq_len: 16, d_model: 16}\n"
QUICK = ["--range", "1:2", "--no-breakdown", "--trial-steps", "1", "--limit-mechanism", "rlimit"]


@pytest.fixture
def run_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # a default ./memprobe-<UTC>.json would land here
    path = tmp_path / "run.yaml"
    path.write_text(RUN_YAML)
    return path


def _memprobe(*args: str) -> Result:
    return CliRunner().invoke(cli, ["memprobe", *args])


def _refused(res: Result, code: int, *says: str) -> str:
    """The refusal: exit `code`, exactly one `Error:` line that says each of `says`, no traceback, and
    nothing probed (no trial ran, no report was written)."""
    assert res.exit_code == code, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    errors = [ln for ln in res.output.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1, res.output
    for text in says:
        assert text in errors[0], errors[0]
    assert "saved:" not in res.output and not list(Path.cwd().glob("memprobe-*.json")), res.output
    return errors[0]


@pytest.mark.parametrize("value", ["0", "-5", "0.5", "nan", "inf"])
def test_trial_timeout_must_be_a_sane_positive_number_of_seconds(run_yaml: Path, value: str) -> None:
    res = _memprobe("--config", str(run_yaml), *QUICK, "--no-remedies", "--trial-timeout", value)
    _refused(res, 2, "--trial-timeout")


@pytest.mark.parametrize("value", ["0", "-3"])
def test_remedies_at_must_be_at_least_one(run_yaml: Path, value: str) -> None:
    res = _memprobe("--config", str(run_yaml), *QUICK, "--remedy", "bf16", "--remedies-at", value)
    _refused(res, 2, "--remedies-at", "x>=1")


def test_remedies_at_a_d_model_that_is_no_multiple_of_n_head(run_yaml: Path) -> None:
    res = _memprobe("--config", str(run_yaml), "--vary", "d_model", *QUICK, "--remedy", "bf16",
                    "--remedies-at", "18")
    _refused(res, 1, "--remedies-at 18", "multiple of n_head")


@pytest.mark.parametrize("flag", [["--remedies-at", "8"], ["--remedy", "bf16"]])
def test_remedy_options_with_no_remedies_contradict(run_yaml: Path, flag: list[str]) -> None:
    res = _memprobe("--config", str(run_yaml), *QUICK, "--no-remedies", *flag)
    _refused(res, 1, flag[0], "--no-remedies")


@pytest.mark.parametrize("key", ["batch_size", "seq_len", "d_model", "n_layer"])
@pytest.mark.parametrize("value", ["0", "-2"])
def test_a_run_config_whose_size_is_not_positive_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            key: str, value: str) -> None:
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"command: [python, -m, glue.examples.tiny_gpt]\nconfig: {{{key}: {value}}}\n")
    res = _memprobe("--config", str(bad), "--vary", key, *QUICK, "--no-remedies")
    line = _refused(res, 1, f"config.{key}", str(bad), f"--set {key}=")
    assert ">= 1" in line


@pytest.mark.parametrize("item, says", [("batch_size=0", "--set batch_size=0"), ("seq_len=-1", "--set seq_len=-1"),
                                        ("batch_size=2.5", "must be int"), ("d_model=30", "multiple of"),
                                        ("lr=[", "not a YAML value")])
def test_bad_set_values_are_refused(run_yaml: Path, item: str, says: str) -> None:
    res = _memprobe("--config", str(run_yaml), *QUICK, "--no-remedies", "--set", item)
    _refused(res, 1, says)


def test_set_fixes_a_bad_value_in_the_run_config(tmp_path: Path) -> None:
    cfg = source.trainer_config({"batch_size": 0}, {"batch_size": 8})
    assert cfg["batch_size"] == 8


def test_a_config_that_is_not_utf8_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(bytes([0x86, 0xFF, 0x00, 0xC3]) + bytes(range(256)))
    with pytest.raises(GlueError, match="not a UTF-8 text YAML file"):
        source.from_config_file(binary)
    _refused(_memprobe("--config", str(binary), *QUICK), 1, str(binary), "not a UTF-8 text YAML file")


def test_a_config_that_is_not_a_regular_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _refused(_memprobe("--config", "/dev/null", *QUICK), 1, "/dev/null", "not a regular file")


@pytest.mark.parametrize("option, value", [("--trial-steps", "0"), ("--accept-steps", "1"), ("--accum", "1"),
                                           ("--accum", "-4"), ("--tolerance", "0"), ("--tolerance", "-0.1"),
                                           ("--tolerance", "nan"), ("--tolerance", "inf")])
def test_step_counts_and_tolerance_are_checked_by_click(run_yaml: Path, option: str, value: str) -> None:
    _refused(_memprobe("--config", str(run_yaml), *QUICK, "--no-remedies", option, value), 2, option)


@pytest.mark.parametrize("item", ["1:2", "batch_size=2:4"])
def test_a_range_given_twice_for_one_input(run_yaml: Path, item: str) -> None:
    res = _memprobe("--config", str(run_yaml), "--range", "1:1", "--range", item, "--no-breakdown",
                    "--no-remedies", "--trial-steps", "1")
    _refused(res, 1, "--range", "twice")


def test_out_never_overwrites_a_file_that_is_not_a_memprobe_report(run_yaml: Path) -> None:
    before = run_yaml.read_text()
    _refused(_memprobe("--config", str(run_yaml), *QUICK, "--no-remedies", "--out", str(run_yaml)), 1,
             f"--out {run_yaml}", "not a memprobe report")
    assert run_yaml.read_text() == before
    notes = run_yaml.parent / "notes.json"
    notes.write_text('{"mine": true}')
    _refused(_memprobe("--config", str(run_yaml), *QUICK, "--no-remedies", "--out", str(notes)), 1,
             "not a memprobe report")
    assert notes.read_text() == '{"mine": true}'


def test_out_under_a_file_is_refused_before_probing(run_yaml: Path) -> None:
    _refused(_memprobe("--config", str(run_yaml), *QUICK, "--no-remedies", "--out", f"{run_yaml}/report.json"), 1,
             "--out", "not a directory")


def test_out_may_overwrite_an_earlier_report(run_yaml: Path) -> None:
    from glue.memprobe.session import check_out

    earlier = run_yaml.parent / "earlier.json"
    earlier.write_text(json.dumps({"kind": "gpukit.memprobe", "complete": False}))
    check_out(earlier)  # no error
    check_out(run_yaml.parent / "new" / "dir" / "report.json")


def test_duplicate_vary_and_remedy_are_probed_once(run_yaml: Path) -> None:
    from glue.memprobe.session import unique

    assert unique(("batch_size", "seq_len", "batch_size")) == ["batch_size", "seq_len"]


def test_probe_run_checks_remedies_at_itself() -> None:
    cfg = source.trainer_config({}, {})
    for bad in (0, -3):
        with pytest.raises(GlueError, match="--remedies-at"):
            investigate.run(cfg, investigate.Options(remedies_at=bad, ranges={"batch_size": (1, 1)}, breakdown=False,
                                         trial_steps=1, mechanism="rlimit", remedies=("bf16",)))


def test_a_cpu_memory_limit_above_the_machines_memory(run_yaml: Path) -> None:
    # it limited nothing (cgroup), or overflowed setrlimit in the trial's preexec_fn (a traceback)
    for mechanism in ("auto", "rlimit"):
        res = _memprobe("--config", str(run_yaml), "--device", "cpu", "--range", "1:1", "--no-breakdown",
                        "--no-remedies", "--trial-steps", "1", "--limit-mechanism", mechanism,
                        "--memory-limit-mb", "999999999999999")
        _refused(res, 1, "--memory-limit-mb 999999999999999", "more than this machine's memory")


@pytest.mark.parametrize("item", ["1:99999999999999999999", "0:4", "4:2", "-1:4", "a:b"])
def test_a_range_out_of_bounds(run_yaml: Path, item: str) -> None:
    _refused(_memprobe("--config", str(run_yaml), "--range", item, "--no-breakdown", "--no-remedies",
                       "--trial-steps", "1"), 1, "--range wants LO:HI", "2147483647")
