"""Bad input for a user's own job: each one line naming what is wrong, before any VM work, and nothing
uploaded (no code package, no wheelhouse, no manifest) or started."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from glue.train import layout
from tests.integration.test_runs import ROOT, here, s3

from .conftest import Kit

pytestmark = pytest.mark.integration


def _keys(client: object, prefix: str) -> list[str]:
    resp = client.list_objects_v2(Bucket="gpukit", Prefix=prefix)  # type: ignore[attr-defined]
    return [o["Key"] for o in resp.get("Contents", [])]


def _config(tmp_path: Path, **extra: object) -> Path:
    cfg = yaml.safe_load((ROOT / "examples" / "my_project" / "run.yaml").read_text())
    cfg.update(extra)
    path = tmp_path / "cfg" / f"run-{len(list(tmp_path.glob('cfg/*.yaml')))}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return path


def _project(tmp_path: Path, name: str, files: dict[str, str | bytes]) -> Path:
    root = tmp_path / name
    for rel, body in {"train.py": "print('hi')\n", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(body if isinstance(body, bytes) else body.encode())
    return root


def test_bad_workdirs_and_requirements_are_one_line_and_ship_nothing(cluster_kit: Kit, tmp_path: Path) -> None:
    fast = here(cluster_kit)
    client = s3(fast)
    before = (_keys(client, layout.CODE_PREFIX), _keys(client, layout.WHEELS_PREFIX))
    ok = {"requirements.txt": "einops==0.8.1\n"}
    cases = [
        (_config(tmp_path, workdir=str(tmp_path / "nope")), None, "does not exist"),
        (_config(tmp_path, workdir=str(_project(tmp_path, "f", ok) / "train.py")), None, "is not a folder"),
        (_config(tmp_path, workdir={"path": str(_project(tmp_path, "big", {**ok, "data.bin": b"\0" * (2 << 20)})),
                                    "max_size_mb": 1}), None, "over the 1 MiB cap (workdir.max_size_mb); largest: "
                                                               "data.bin (2.0 MiB)"),
        (_config(tmp_path, workdir=str(_project(tmp_path, "sec", {**ok, ".env": "TOKEN=x"}))), None,
         "workdir: .env looks like a secret"),
        (_config(tmp_path, workdir=str(_project(tmp_path, "typo", ok)), command=["python", "trian.py"]), None,
         "command runs trian.py, which is not in the workdir"),
        (_config(tmp_path, workdir=str(_project(tmp_path, "dep", {
            "requirements.txt": f"--no-index\n--find-links {tmp_path}\ngpukit-no-such-package==9.9\n"}))), None,
         "a requirement cannot be resolved for the VM"),  # and pip's reason names it (below)
        (_config(tmp_path, workdir=str(_project(tmp_path, "fine", ok))), tmp_path / "missing",
         "does not exist"),  # --workdir
    ]
    for i, (cfg, workdir, says) in enumerate(cases):
        args = ["deploy", "--run", f"bad-{i}", "--config", str(cfg), *(["--workdir", str(workdir)] if workdir else [])]
        res = cluster_kit.glue(*args, check=False)
        lines = res.stderr.strip().splitlines()
        assert res.returncode != 0 and says in lines[-1], (says, res.stderr)
        assert "Traceback" not in res.stderr and len(lines) == 1, res.stderr
        assert _keys(client, layout.run_prefix(f"bad-{i}")) == []  # no manifest, no attempt: nothing started
        if "requirement" in says:
            assert "gpukit-no-such-package" in lines[-1], res.stderr
    assert (_keys(client, layout.CODE_PREFIX), _keys(client, layout.WHEELS_PREFIX)) == before  # nothing uploaded
