"""A drill's config names its own run in the locations: the deployed run's id becomes `{run}` again."""

from __future__ import annotations

import pytest

from glue.errors import GlueError
from glue.operations.recovery.drill import run_neutral


def _config(target: str, destination: str) -> dict[str, dict[str, str]]:
    return {"checkpoint": {"target": target, "interval_steps": "5"}, "outputs": {"destination": destination}}


def test_the_run_id_in_either_location_becomes_the_placeholder() -> None:
    out = run_neutral(_config("s3://gpukit/runs/r1", "s3://gpukit/runs/r1/outputs"), "r1")
    assert out["checkpoint"] == {"target": "s3://gpukit/runs/{run}", "interval_steps": "5"}
    assert out["outputs"] == {"destination": "s3://gpukit/runs/{run}/outputs"}
    mounted = run_neutral(_config("/mnt/s3/runs/r1/", "/mnt/s3/runs/r1/out"), "r1")
    assert mounted["checkpoint"]["target"] == "/mnt/s3/runs/{run}/"
    assert mounted["outputs"]["destination"] == "/mnt/s3/runs/{run}/out"


@pytest.mark.parametrize("target", ["s3://gpukit/shared", "s3://gpukit/runs/r10", "s3://gpukit/runs/r1x/ckpt"])
def test_a_location_that_does_not_name_the_run_is_refused(target: str) -> None:
    with pytest.raises(GlueError, match="does not name the run"):
        run_neutral(_config(target, "s3://gpukit/runs/r1/outputs"), "r1")
