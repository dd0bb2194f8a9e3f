"""A resolved dependency set: `name==version` pins, their canonical names, and the set's hash."""

from __future__ import annotations

import hashlib
import json
import re
import sys
import sysconfig


def canonical(name: str) -> str:
    """PEP 503: `Foo_Bar.baz` and `foo-bar-baz` are one project."""
    return re.sub(r"[-_.]+", "-", name).lower()


def as_dict(pins: list[str]) -> dict[str, str]:
    """["Foo==1.0"] -> {"foo": "1.0"}."""
    out: dict[str, str] = {}
    for pin in pins:
        name, _, version = pin.partition("==")
        out[canonical(name.strip())] = version.strip()
    return out


def interpreter() -> dict[str, str]:
    """What a wheelhouse is built for: wheels of one Python minor version and platform."""
    return {"python": f"{sys.version_info.major}.{sys.version_info.minor}", "platform": sysconfig.get_platform()}


def set_hash(pins: list[str], target: dict[str, str]) -> str:
    """The set's content address: its sorted canonical pins and the interpreter they are for."""
    body = {"pins": sorted(f"{k}=={v}" for k, v in as_dict(pins).items()), **target}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def first_difference(expected: dict[str, str], installed: dict[str, str]) -> str | None:
    """The first package (by name) whose installed version is not the pinned one, as a sentence."""
    for name in sorted(set(expected) | set(installed)):
        want, got = expected.get(name), installed.get(name)
        if want == got:
            continue
        if got is None:
            return f"{name}=={want} is pinned but not installed"
        if want is None:
            return f"{name}=={got} is installed but not in the pinned set"
        return f"{name} is pinned at {want} but {got} is installed"
    return None
