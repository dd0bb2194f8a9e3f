"""Lyceum prices: the account's GET /pricing rows (from the emulator, in the live API's shape) cached with
their date, else the figures recorded from the live API; spot and on-demand apart; the cost of a run and
the source it names follow."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from glue.cloud.lyceum import pricing
from glue.cloud.lyceum.api import LyceumClient, RetryPolicy
from glue.report.cost import price_for
from glue.runs.records import Manifest
from tests.lyceum_emulator import Emulator

FAST = RetryPolicy(attempts=2, base_s=0.01, max_s=0.05, deadline_s=5)


def row(profile: str, price: str, meter: str = "vm_running") -> dict[str, object]:
    return {"meter_slug": meter, "applies_to": {"hardware_profile": profile}, "unit": "second",
            "unit_price_per_hour": price}


def test_rows_become_prices_per_gpu_hour_and_odd_rows_are_left_out() -> None:
    rows = [row("on-demand.h100.1x", "2.79"), row("spot.h100.1x", "1.10"), row("on-demand.h200.8x", "34.32"),
            row("on-demand.a100.1x", "1.59", meter="storage"), row("reserved.a100.1x", "1.0"),
            row("on-demand.b200.1x", "n/a"), {"meter_slug": "vm_running"}, "not a row"]
    assert pricing.per_gpu_hour(rows) == {("on-demand", "h100"): 2.79, ("spot", "h100"): 1.10,
                                          ("on-demand", "h200"): 4.29}


def test_without_an_answer_the_recorded_figures_are_used_and_say_so(tmp_path: Path) -> None:
    vm_hour, currency, source = pricing.quote("h100", 2, "on-demand", tmp_path)
    assert vm_hour == pytest.approx(5.58) and currency == "(currency not stated)"
    assert "recorded 2026-07/08" in source and "currency not stated" in source
    assert pricing.quote("h100", 1, "spot", tmp_path)[0] == pytest.approx(1.10)
    assert pricing.quote("l40s", 1, "spot", tmp_path)[0] == pytest.approx(0.55)
    assert pricing.quote("mi300", 1, "on-demand", tmp_path)[0] is None  # no figure: no cost, never a guess


def test_the_accounts_answer_wins_and_is_named_with_its_date(tmp_path: Path) -> None:
    pricing.save(tmp_path, [row("on-demand.h100.1x", "3.00"), row("spot.h100.8x", "9.60")])
    vm_hour, _, source = pricing.quote("h100", 1, "on-demand", tmp_path)
    assert vm_hour == pytest.approx(3.00) and source.startswith("Lyceum GET /pricing of 20")
    assert pricing.quote("h100", 8, "spot", tmp_path)[0] == pytest.approx(9.60)
    # A profile the answer lacks falls back to the recorded figure, and says so.
    assert "recorded" in pricing.quote("a100", 1, "on-demand", tmp_path)[2]
    # An answer without VM prices keeps nothing: the last good one stays.
    assert pricing.save(tmp_path, [row("on-demand.h100.1x", "x")]) == {}
    assert pricing.quote("h100", 1, "on-demand", tmp_path)[0] == pytest.approx(3.00)


@pytest.fixture
def emu(tmp_path: Path) -> Iterator[Emulator]:
    with Emulator(tmp_path / "emu", boot_vms=False, pending_s=0.1) as emulator:
        yield emulator


def test_get_pricing_from_the_emulator_prices_a_runs_cost(emu: Emulator, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    client = LyceumClient(emu.api_key, emu.url, retry=FAST)
    pricing.refresh(home, client)
    assert pricing.cache_path(home).is_file()
    monkeypatch.setenv("GPUKIT_HOME", str(home))
    manifest = {"environment": {"backend": "lyceum", "gpu_type": "a100", "gpu_count": 2}}
    got = price_for(Manifest.from_dict(manifest))
    assert got.vm_hour == pytest.approx(2 * 1.79) and got.source.startswith("Lyceum GET /pricing of ")
    spot = price_for(Manifest.from_dict({"environment": {**manifest["environment"], "market": "spot"}}))
    assert spot.vm_hour == pytest.approx(2 * 0.90) and "(spot;" in spot.source  # the row says "0.90"
    # Refreshed at most daily: a second call within the day asks nothing.
    before = len(emu.requests)
    pricing.refresh(home, client)
    assert len(emu.requests) == before


def test_an_api_without_pricing_keeps_the_recorded_table(emu: Emulator, tmp_path: Path) -> None:
    emu.inject(404, count=5, path="/pricing", detail="Not Found")
    pricing.refresh(tmp_path, LyceumClient(emu.api_key, emu.url, retry=FAST))
    assert not pricing.cache_path(tmp_path).exists()
    assert "recorded" in pricing.quote("a100", 1, "on-demand", tmp_path)[2]
