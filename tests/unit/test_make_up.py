"""`make up`'s variables reach `glue up` as its options (make -n: printed, nothing run)."""

from __future__ import annotations

import os
import subprocess

from glue.paths import PROJECT_ROOT

VARIABLES = ("VMS", "BACKEND", "SCHEDULER", "HOSTS", "MODULE", "BUCKET_ENDPOINT", "BUCKET", "BUCKET_REGION",
             "BUCKET_PROFILE")


def _make_up(*assignments: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}  # make's `?=` would take them
    out = subprocess.run(["make", "-n", "up", *assignments], cwd=PROJECT_ROOT, capture_output=True, text=True,
                         timeout=60, check=True, env=env).stdout
    return " ".join(out.replace("\\\n", " ").split())


def test_your_machines_and_your_bucket_are_passed_to_glue_up() -> None:
    cmd = _make_up("BACKEND=ssh", "HOSTS=hosts.yaml", "VMS=2", "BUCKET_ENDPOINT=https://s3.example.com",
                   "BUCKET=team-ckpt", "BUCKET_REGION=eu-west-1", "BUCKET_PROFILE=team")
    assert "glue up --vms 2 --backend ssh --hosts hosts.yaml --bucket-endpoint https://s3.example.com " \
           "--bucket team-ckpt --bucket-region eu-west-1 --bucket-profile team" in cmd, cmd
    assert "--module" in _make_up("BACKEND=terraform", "MODULE=infra/")


def test_unset_variables_pass_nothing() -> None:
    cmd = _make_up()
    assert "glue up" in cmd and "--" not in cmd.split("glue up", 1)[1], cmd
