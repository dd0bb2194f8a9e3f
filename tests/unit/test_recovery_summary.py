"""The lines `glue recover` prints under its phase table: what the resume check compared, said as it was."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from glue.operations.recovery.recover import print_table
from glue.runs.records import RecoveryRecord


def _printed(**over: Any) -> str:
    result = {"run": "r", "failed_attempt": 1, "new_attempt": 2, "failure_class": "killed",
              "seconds": {"detect": 1.0, "provision": None}, "work_lost": {"steps": 5, "seconds": 2.0},
              "checkpoint_step": 40, "failure_step": 45, "verified": True, "problem": None,
              "first_resumed_step": 41, "compared_steps": list(range(41, 51)), **over}
    console = Console(record=True, width=200)
    print_table(console, RecoveryRecord.from_dict(result))
    return " ".join(console.export_text().split())


@pytest.mark.parametrize(("over", "said"), [
    ({}, "resume verified: first resumed step 41, losses equal at steps 41..50"),
    ({"verified": False, "problem": "loss at step 44 differs", "compared_steps": [41, 42, 43]},
     "resume NOT verified: loss at step 44 differs: first resumed step 41, losses equal at steps 41..43, then differ"),
    ({"verified": False, "problem": "loss at step 41 differs", "compared_steps": []},
     "resume NOT verified: loss at step 41 differs: first resumed step 41, its loss already differs"),
])
def test_the_resume_line_says_what_was_compared(over: dict[str, Any], said: str) -> None:
    text = _printed(**over)
    assert said in text, text
    assert "no overlapping steps" not in text
