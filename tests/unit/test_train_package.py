"""glue.train's public names: each loads lazily from the module that defines it."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import glue.train as train


def test_every_exported_name_maps_to_its_defining_module() -> None:
    lazy = set(train.__all__)
    assert lazy == set(train._MODULE_OF), "the _WHERE table and __all__ disagree"
    for name, module in train._MODULE_OF.items():
        obj = getattr(importlib.import_module(f"glue.train.{module}"), name)
        assert obj.__module__ == f"glue.train.{module}", f"{name} is defined in {obj.__module__}, not {module}"
        assert getattr(train, name) is obj


def test_every_error_the_docs_name_imports_from_glue_train() -> None:
    readme = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "checkpoints.md").read_text()
    section = readme.split("**Errors** (`glue.train.CheckpointError`", 1)[1].split("\n\n", 1)[0]
    named = set(re.findall(r"`([A-Z][A-Za-z]+Error)`", section))
    assert {"TargetError", "FencedError", "NoValidCheckpointError"} <= named
    for name in named:
        assert issubclass(getattr(train, name), train.CheckpointError), name
