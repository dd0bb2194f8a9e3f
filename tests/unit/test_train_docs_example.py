"""The documented example loop runs as written: interrupted + resumed == uninterrupted."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import TensorDataset

from glue.train import layout

ROOT = Path(__file__).resolve().parents[2]


def _example() -> str:
    for doc in (ROOT / "docs" / "guides" / "checkpoints.md",):
        if doc.exists():
            for block in re.findall(r"```python\n(.*?)```", doc.read_text(), re.S):
                if "Checkpointer(" in block and "ckpt.save(" in block:
                    return block
    raise AssertionError("no checkpoint example loop found in docs/guides/checkpoints.md")


class Crash(Exception):
    pass


class Net(torch.nn.Linear):
    """The example's model; raises Crash on the forward pass after `crash_after` calls."""

    def __init__(self, crash_after: int | None) -> None:
        super().__init__(6, 3)
        self.calls, self.crash_after = 0, crash_after

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.crash_after is not None and self.calls > self.crash_after:
            raise Crash
        return super().forward(x)


def _run(target: Path, crash_after: int | None = None) -> dict[str, Any]:
    code = _example().replace(f'"{layout.run_uri("gpukit", "my-run")}"', repr(str(target))).replace(
        "save_every = 500", "save_every = 4"
    )
    g = torch.Generator().manual_seed(0)
    ns: dict[str, Any] = {
        "MyModel": lambda: Net(crash_after),
        "dataset": TensorDataset(torch.randn(20, 6, generator=g), torch.randint(0, 3, (20,), generator=g)),
        "total_steps": 10,
    }
    try:
        exec(compile(code, "docs/guides/checkpoints.md", "exec"), ns)
    except Crash:
        ns["ckpt"].close()  # what the exit hook does in a real process
        ns["loader"].close()
    return ns


def test_documented_loop_resumes_exactly(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = _run(tmp_path / "ref")
    torch.manual_seed(0)
    crashed = _run(tmp_path / "run", crash_after=6)  # dies in step 7; last checkpoint at step 4
    assert crashed["step"] == 6
    torch.manual_seed(123)  # a different init: the resumed run must not depend on it
    resumed = _run(tmp_path / "run")
    assert resumed["ckpt"].last_restore.step == 4
    assert resumed["step"] == ref["step"] == 10
    for k, v in ref["model"].state_dict().items():
        assert torch.equal(v, resumed["model"].state_dict()[k]), k
    assert resumed["sampler"].state_dict() == ref["sampler"].state_dict()
    assert resumed["train"].tokens_seen == ref["train"].tokens_seen
