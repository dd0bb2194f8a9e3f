"""`glue deploy --dry-run`: what would ship, from the user's folder alone (no cluster, no bucket), and the
run config's `workdir:` / `requirements:` keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from glue.cli import cli
from glue.errors import GlueError
from glue.runs import config as runconfig

BASE = {"command": ["python", "train.py"], "outputs": {"destination": "s3://{bucket}/runs/{run}/outputs"},
        "checkpoint": {"target": "s3://{bucket}/runs/{run}"}}


def project(root: Path, **cfg: object) -> Path:
    for rel, body in {"train.py": "import mylib\n", "mylib/__init__.py": "", "requirements.txt": "einops==0.8.1\n",
                      ".gitignore": "*.log\n", "train.log": "noise\n", ".env": "TOKEN=x\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(body)
    (root / "run.yaml").write_text(yaml.safe_dump({**BASE, "workdir": ".", "requirements": "requirements.txt", **cfg}))
    return root / "run.yaml"


def dry(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, ["deploy", "--run", "r1", "--dry-run", *args],
                             env={"GPUKIT_HOME": str(tmp_path / "home")})
    return res.exit_code, res.stdout, res.stderr


def test_dry_run_lists_what_would_ship_and_refuses_like_deploy(tmp_path: Path) -> None:
    cfg = project(tmp_path / "p")
    code, out, err = dry(tmp_path, "--config", str(cfg), "--json")
    d = json.loads(out)
    assert code == 1 and err.strip().splitlines() == [
        "Error: deploy would refuse: .env looks like a secret; ignore it in .gpukitignore, or list it under "
        "workdir.secret_files to ship it on purpose"]
    assert [f["path"] for f in d["files"]] == [".gitignore", "mylib/__init__.py", "requirements.txt", "run.yaml",
                                               "train.py"]
    assert d["ignored"] == ["train.log"] and d["refused"] == [".env"] and d["requirements"] == ["einops==0.8.1"]
    assert len(d["sha256"]) == 64 and d["size"] > 0 and d["command_in_package"] is True

    cfg = project(tmp_path / "p", workdir={"path": ".", "secret_files": [".env"]})
    code, out, err = dry(tmp_path, "--config", str(cfg), "--json")
    d = json.loads(out)
    assert code == 0 and d["refused"] == [] and d["secret_files_shipped"] == [".env"], err
    code, out, _ = dry(tmp_path, "--config", str(cfg))
    assert code == 0 and "nothing uploaded, nothing started" in out and "train.log" in out


def test_dry_run_of_the_example_project_and_a_workdir_override(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "my_project" / "run.yaml"
    code, out, err = dry(tmp_path, "--config", str(example), "--json")
    d = json.loads(out)
    assert code == 0, err
    assert {"train.py", "mylib/model.py", "mylib/data.py", "requirements.txt"} <= {f["path"] for f in d["files"]}
    other = tmp_path / "other"
    other.mkdir()
    (other / "train.py").write_text("print('other')\n")
    (other / "requirements.txt").write_text("einops==0.8.1\n")
    code, out, _ = dry(tmp_path, "--config", str(example), "--json", "--workdir", str(other))
    assert code == 0 and json.loads(out)["workdir"] == str(other.resolve())
    assert json.loads(out)["sha256"] != d["sha256"]
    code, _, err = dry(tmp_path, "--config", str(example), "--workdir", str(other / "train.py"))
    assert code == 1 and "is not a folder" in err and len(err.strip().splitlines()) == 1


def test_the_run_config_keys() -> None:
    rc = runconfig.parse({**BASE, "workdir": "src", "requirements": ["einops==0.8.1"]}, "r1", "b")
    assert rc.workdir is not None and rc.workdir.path == "src" and rc.workdir.max_size_mb == 256
    assert rc.requirements == ("einops==0.8.1",)
    for raw, says in [({"workdir": {"path": ".", "cap": 1}}, "unknown key 'cap' in workdir"),
                      ({"workdir": {"max_size_mb": 0}}, "workdir.max_size_mb"),
                      ({"requirements": [1]}, "requirements"),
                      ({"runtime": "docker", "image": "x", "requirements": ["a"]}, "needs `runtime: process`")]:
        with pytest.raises(GlueError, match=says):
            runconfig.parse({**BASE, **raw}, "r1", "b")
