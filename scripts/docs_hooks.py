"""mkdocs hook (mkdocs.yml `hooks:`): adds the reference pages scripts/docs_reference.py generates from the
code to every build, as reference/<page>.md, so the site's reference is the code it was built from."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

_spec = importlib.util.spec_from_file_location("docs_reference", Path(__file__).with_name("docs_reference.py"))
assert _spec is not None and _spec.loader is not None
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)


def on_files(files: Files, config: Any) -> Files:
    for name, make in reference.PAGES.items():
        files.append(File.generated(config, f"reference/{name}", content=make()))
    return files
