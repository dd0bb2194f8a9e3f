"""Where a Lyceum VM answers SSH: its `ip_address`, which the live API gives as a bare host or as host:port."""

from __future__ import annotations

from glue.errors import GlueError


def parse_address(ip_address: str) -> tuple[str, int]:
    """Lyceum's `ip_address` ("10.0.1.5:22", "10.0.1.5", "[::1]:22") -> (host, port)."""
    text = ip_address.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.lstrip(":")
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, ""
    try:
        return host, int(port) if port else 22
    except ValueError:
        raise GlueError(f"Lyceum reported an unusable VM address {ip_address!r}") from None
