"""Heartbeat + metrics overhead on step time: tiny_gpt's loop with RunContext reporting to the local
bucket vs the same loop without it, measured in one run (interleaved rounds, median per step).
Goal (issue 5): <= 1% overhead.
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics
import tempfile
import time
from pathlib import Path

from glue.cloud.local.bucket import LocalBucket
from glue.examples import tiny_gpt
from glue.paths import write_secret
from glue.train import layout


class Timer:
    """Stands in for the reporter to time each step (and forwards to a real one when given)."""

    def __init__(self, inner: object | None) -> None:
        self.inner, self.stamps = inner, [time.perf_counter()]

    def step(self, step: int, loss: float, **extra: object) -> None:
        if self.inner is not None:
            self.inner.step(step, loss, **extra)  # type: ignore[attr-defined]
        self.stamps.append(time.perf_counter())


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="gpukit-bench-hb-"))
    server = LocalBucket(home)
    info = server.ensure_running()
    creds = server.credentials()
    cred_file = home / "creds.json"
    write_secret(cred_file, f'{{"access_key": "{creds.access_key}", "secret_key": "{creds.secret_key}"}}')
    os.environ.update({
        "GPUKIT_RUN": "bench-hb", "GPUKIT_CHECKPOINT": layout.run_uri(info.name, "bench-hb"),
        "GPUKIT_OUTPUTS": f"{layout.run_uri(info.name, 'bench-hb')}/{layout.OUTPUTS}", "GPUKIT_BUCKET_NAME": info.name,
        "GPUKIT_BUCKET_ENDPOINT": info.endpoint, "GPUKIT_CREDENTIALS_FILE": str(cred_file),
        "GPUKIT_HEARTBEAT_SECONDS": "1",
    })
    from glue.train.run.context import RunContext

    cfg = {**tiny_gpt.DEFAULTS, "steps": 150, "threads": 1}
    with_hb: list[float] = []
    without: list[float] = []
    try:
        for _ in range(3):
            for use in (False, True):
                ctx = RunContext.from_env() if use else None
                timer = Timer(ctx)
                with contextlib.redirect_stdout(io.StringIO()):
                    tiny_gpt.train(cfg, None, resume=False, report=timer)
                if ctx is not None:
                    ctx.close()
                steps = [b - a for a, b in zip(timer.stamps[10:], timer.stamps[11:], strict=False)]
                (with_hb if use else without).extend(steps)
    finally:
        server.stop()
    a, b = statistics.median(with_hb), statistics.median(without)
    print(f"{'figure':44} {'value':>10}")
    print(f"{'step time with heartbeat + metrics (median)':44} {a * 1000:9.2f}ms")
    print(f"{'step time without (baseline, same run)':44} {b * 1000:9.2f}ms")
    print(f"{'overhead (ratio - 1)':44} {100 * (a / b - 1):9.2f}%   goal <= 1%")


if __name__ == "__main__":
    main()
