"""The lyceum backend's inputs from the environment (LYCEUM_*), checked before terraform runs: each
problem is one line naming the variable and the fix."""

from __future__ import annotations

import os
import re
from typing import Any

from glue.cloud.lyceum.api import api_key_from_env, api_url_from_env
from glue.cloud.lyceum.spec import GPU_PROFILES, MARKETS, ON_DEMAND, SPECS_SHAPES, input_errors
from glue.errors import GlueError

USER_ENV = "LYCEUM_SSH_USER"
MARKET_ENV = "LYCEUM_MARKET"
_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


def tf_vars(vm_count: int, name_prefix: str, ssh_public_key: str) -> dict[str, Any]:
    """Terraform variables for terraform/envs/lyceum; checks key and inputs before terraform runs."""
    api_key_from_env()
    api_url_from_env()
    profile = os.environ.get("LYCEUM_HARDWARE_PROFILE", "").strip().lower() or "a100"
    raw_count = os.environ.get("LYCEUM_GPU_COUNT", "").strip()
    try:
        gpu_count = int(raw_count) if raw_count else (1 if profile in GPU_PROFILES else 0)
    except ValueError:
        raise GlueError(f"LYCEUM_GPU_COUNT={raw_count!r} is not a whole number") from None
    problems = input_errors(profile, gpu_count)
    if problems:
        attr, what, fix = problems[0]
        env = "LYCEUM_HARDWARE_PROFILE" if attr == "hardware_profile" else "LYCEUM_GPU_COUNT"
        raise GlueError(f"{what} ({env}): {fix}")
    specs_shape()
    tfv: dict[str, Any] = {"vm_count": vm_count, "name_prefix": name_prefix, "ssh_public_key": ssh_public_key,
                           "hardware_profile": profile, "gpu_count": gpu_count, "market": market()}
    user = os.environ.get(USER_ENV, "").strip()
    if user and not _USER_RE.match(user):
        raise GlueError(f"{USER_ENV}={user!r} is not a user name (lowercase letters, digits, '_' and '-')")
    if user:
        tfv["ssh_user"] = user
    return tfv


def specs_shape() -> str:
    shape = os.environ.get("LYCEUM_INSTANCE_SPECS", "").strip().lower() or "current"
    if shape not in SPECS_SHAPES:
        raise GlueError(f"LYCEUM_INSTANCE_SPECS={shape!r}: use one of {', '.join(SPECS_SHAPES)}")
    return shape


def market() -> str:
    """The capacity pool every VM of the cluster is created in: on-demand unless LYCEUM_MARKET says spot."""
    pool = os.environ.get(MARKET_ENV, "").strip().lower() or ON_DEMAND
    if pool not in MARKETS:
        raise GlueError(f"{MARKET_ENV}={pool!r} is not a market: use {' or '.join(MARKETS)}")
    return pool
