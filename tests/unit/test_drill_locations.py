"""A drill's config names its own run in the locations: the deployed run's id becomes `{run}` again."""

from __future__ import annotations

import pytest

from glue.errors import GlueError
from glue.operations.recovery.drill import run_neutral
from glue.train import layout

RUNS = layout.RUNS_PREFIX  # runs/: the conventional locations are under runs/<run>


def _config(target: str, destination: str) -> dict[str, dict[str, str]]:
    return {"checkpoint": {"target": target, "interval_steps": "5"}, "outputs": {"destination": destination}}


def test_the_run_id_in_either_location_becomes_the_placeholder() -> None:
    out = run_neutral(_config(f"s3://gpukit/{RUNS}r1", f"s3://gpukit/{RUNS}r1/outputs"), "r1")
    assert out["checkpoint"] == {"target": "s3://gpukit/runs/{run}", "interval_steps": "5"}
    assert out["outputs"] == {"destination": "s3://gpukit/runs/{run}/outputs"}
    mounted = run_neutral(_config(f"/mnt/s3/{RUNS}r1/", f"/mnt/s3/{RUNS}r1/out"), "r1")
    assert mounted["checkpoint"]["target"] == "/mnt/s3/runs/{run}/"
    assert mounted["outputs"]["destination"] == "/mnt/s3/runs/{run}/out"


@pytest.mark.parametrize("target", ["s3://gpukit/shared", f"s3://gpukit/{RUNS}r10", f"s3://gpukit/{RUNS}r1x/ckpt"])
def test_a_location_that_does_not_name_the_run_is_refused(target: str) -> None:
    with pytest.raises(GlueError, match="does not name the run"):
        run_neutral(_config(target, f"s3://gpukit/{RUNS}r1/outputs"), "r1")
