"""`glue budget`'s projection equals its documented formula on fixed inputs (docs/report.md)."""

from __future__ import annotations

import pytest

from glue.report.budget import BudgetInputs, project
from glue.runs.records import Manifest


def test_projection_equals_the_formula_by_hand() -> None:
    i = BudgetInputs(steps=10_000, step_s=0.5, interval_steps=500, save_stall_s=2.0, restore_s=60.0,
                     mtbf_s=36_000.0, vms=2, gpus_per_vm=4, vm_hour=10.0, currency="EUR")
    res = project(i)
    # train 10000 x 0.5 = 5000 s; 20 saves x 2 s = 40 s; failures (5040 / 36000) = 0.14;
    # each loses T/2 + R = (500 x 0.5) / 2 + 60 = 185 s -> 25.9 s; wall 5065.9 s.
    assert res["train_s"] == pytest.approx(5000.0)
    assert res["checkpoint_s"] == pytest.approx(40.0)
    assert res["expected_failures"] == pytest.approx(0.14)
    assert res["lost_per_failure_s"] == pytest.approx(185.0)
    assert res["wall_s"] == pytest.approx(5065.9)
    assert res["vm_hours"] == pytest.approx(5065.9 / 3600 * 2)      # 2.81439 VM-hours
    assert res["gpu_hours"] == pytest.approx(5065.9 / 3600 * 8)
    assert res["cost"] == pytest.approx(28.143888, rel=1e-6)


def test_more_failures_cost_more_and_no_price_means_no_cost() -> None:
    base = dict(steps=1000, step_s=1.0, interval_steps=100, save_stall_s=1.0, restore_s=30.0, vms=1,
                gpus_per_vm=1, currency="EUR")
    calm = project(BudgetInputs(mtbf_s=1e6, vm_hour=3.0, **base))  # type: ignore[arg-type]
    rough = project(BudgetInputs(mtbf_s=600.0, vm_hour=3.0, **base))  # type: ignore[arg-type]
    assert rough["cost"] > calm["cost"] and rough["expected_failures"] > calm["expected_failures"]
    assert project(BudgetInputs(mtbf_s=600.0, vm_hour=None, **base))["cost"] is None  # type: ignore[arg-type]


@pytest.mark.parametrize(("backend", "price"), [("local", 0.0), ("qemu", 0.0), ("nowhere", None)])
def test_each_backends_price_table_as_the_readme_says(backend: str, price: float | None) -> None:
    from glue.report.cost import price_for

    got = price_for(Manifest.from_dict({"environment": {"backend": backend, "gpu_type": "none", "gpu_count": 0}}))
    assert got.vm_hour == price
    override = price_for(Manifest.from_dict({"environment": {"backend": backend},
                                                "config": {"pricing": {"vm_hour": 2.5}}}))
    assert (override.vm_hour, override.currency, override.source) == (2.5, "EUR", "run.yaml pricing")
