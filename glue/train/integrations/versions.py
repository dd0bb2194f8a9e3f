"""Which framework versions an integration supports, checked once with a one-line refusal."""

from __future__ import annotations

from glue.train.errors import CheckpointError


def require(framework: str, version: str, minimum: tuple[int, int]) -> None:
    """CheckpointError (one line) when `version` of `framework` is older than `minimum`."""
    have = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if have < minimum:
        raise CheckpointError(f"{framework} {version} is not supported by gpukit's integration: use "
                              f"{minimum[0]}.{minimum[1]} or newer")
