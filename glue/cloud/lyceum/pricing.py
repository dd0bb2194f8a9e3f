"""What a Lyceum VM costs per hour: from the account's `GET /pricing` when it answered (cached with its date
in <home>/lyceum/pricing.json), else the figures recorded from the live API in 2026-07/08.

`GET /pricing` (authenticated) answers rows like
  {"meter_slug": "vm_running", "applies_to": {"hardware_profile": "on-demand.h100.1x"}, "unit": "second",
   "unit_price_per_hour": "2.79"}
one per (market, GPU model, GPUs per VM); a row's price is for the whole VM of that profile. Neither the
rows nor the recorded figures state a currency, and the reports say so. Spot and on-demand are separate
prices: the market comes from the run's environment (on-demand unless it says spot).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from glue.cloud.lyceum.api import LyceumClient, LyceumError

CURRENCY = "(currency not stated)"
RECORDED_ON = "2026-07/08"
# GPU model -> (on-demand, spot) per GPU-hour, as recorded from the live API (GET /pricing) in 2026-07/08.
RECORDED: dict[str, tuple[float, float]] = {
    "a100": (1.59, 0.80), "l40s": (1.19, 0.55), "h100": (2.79, 1.10),
    "h200": (4.29, 1.60), "b200": (6.49, 2.40), "b300": (7.99, 2.99),
}
MARKETS = ("on-demand", "spot")
_PROFILE = re.compile(r"^(?P<market>on-demand|spot)\.(?P<gpu>[a-z0-9]+)\.(?P<count>[0-9]+)x$")


def cache_path(home: Path) -> Path:
    return home / "lyceum" / "pricing.json"


def per_gpu_hour(rows: Iterable[Any]) -> dict[tuple[str, str], float]:
    """{(market, GPU model): price per GPU-hour} from `GET /pricing` rows; rows of other meters, of a
    profile of another form or with a price that is not a number are left out."""
    out: dict[tuple[str, str], float] = {}
    for row in rows:
        if not isinstance(row, dict) or row.get("meter_slug") != "vm_running":
            continue
        applies = row.get("applies_to")
        match = _PROFILE.match(str(applies.get("hardware_profile") or "")) if isinstance(applies, dict) else None
        try:
            price = float(row.get("unit_price_per_hour"))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if match is None or price < 0 or int(match["count"]) < 1:
            continue
        out.setdefault((match["market"], match["gpu"]), price / int(match["count"]))
    return out


def save(home: Path, rows: list[Any]) -> dict[tuple[str, str], float]:
    """Keep an answer of `GET /pricing` with its date; returns the prices it holds (none: nothing kept)."""
    prices = per_gpu_hour(rows)
    if prices:
        path = cache_path(home)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"fetched_at": datetime.now(UTC).isoformat(timespec="seconds"), "rows": rows}))
        tmp.replace(path)
    return prices


def refresh(home: Path, client: LyceumClient, max_age_s: float = 86400.0) -> None:
    """The account's GET /pricing into the kit home, at most daily. An account or API without it keeps the
    last answer (or the recorded table): prices never stop a `glue up`."""
    cached = cache_path(home)
    if cached.exists() and time.time() - cached.stat().st_mtime < max_age_s:
        return
    try:
        save(home, client.pricing())
    except LyceumError:
        return


def _cached(home: Path | None) -> tuple[dict[tuple[str, str], float], str] | None:
    if home is None:
        return None
    try:
        data = json.loads(cache_path(home).read_text())
        prices = per_gpu_hour(data["rows"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (prices, str(data.get("fetched_at"))) if prices else None


def quote(gpu_type: str, gpu_count: int, market: str = "on-demand",
          home: Path | None = None) -> tuple[float | None, str, str]:
    """(price of one VM-hour or None, currency, where the price came from)."""
    market = market if market in MARKETS else "on-demand"
    gpus = max(gpu_count, 1)
    gpu_type = "cpu" if gpu_type in ("", "none") else gpu_type  # the cpu profile's VMs have no GPU
    cached = _cached(home)
    if cached is not None:
        prices, fetched = cached
        per_gpu = prices.get((market, gpu_type.lower()))
        if per_gpu is not None:
            return per_gpu * gpus, CURRENCY, f"Lyceum GET /pricing of {fetched} ({market}; currency not stated)"
    recorded = RECORDED.get(gpu_type.lower())
    source = f"Lyceum prices recorded {RECORDED_ON} ({market}; currency not stated; glue/cloud/lyceum/pricing.py)"
    if recorded is None:
        return None, CURRENCY, f"no Lyceum price for {gpu_type!r} ({market})"
    return recorded[MARKETS.index(market)] * gpus, CURRENCY, source
