"""Before the first step the ranks of a group all-gather what they are about to train; a rank with a
different config (or restored step) stops the whole group with the rank and the field named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist

from glue.train.run.agreement import AgreementError, agree
from tests.integration.test_ckpt_toy import free_port, fresh_context


def _worker(rank: int, port: int, lr: float, restored: int | None, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        agree({"lr": lr, "steps": 10}, restored)
        Path(out).write_text("agreed")
    except AgreementError as exc:
        Path(out).write_text(str(exc))
    finally:
        dist.destroy_process_group()


def _group(tmp_path: Path, lrs: tuple[float, float], restored: tuple[int | None, int | None]) -> list[str]:
    ctx, port = fresh_context(), free_port()
    outs = [tmp_path / f"rank{r}.txt" for r in range(2)]
    procs = [ctx.Process(target=_worker, args=(r, port, lrs[r], restored[r], str(outs[r]))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    return [o.read_text() for o in outs]


@pytest.mark.timeout(180)
def test_ranks_agree_or_all_stop_naming_rank_and_field(tmp_path: Path) -> None:
    assert _group(tmp_path, (1e-3, 1e-3), (20, 20)) == ["agreed", "agreed"]
    for text in _group(tmp_path, (1e-3, 2e-3), (20, 20)):  # every rank stops, not just the odd one
        assert "rank 1 has config_hash=" in text and "not training" in text
    for text in _group(tmp_path, (1e-3, 1e-3), (20, 10)):
        assert "rank 1 has restored_step=10 but rank 0 has 20" in text
