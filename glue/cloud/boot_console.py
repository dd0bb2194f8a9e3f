"""What a local VM's console says of its first boot (nspawn's and qemu's alike): the host key the image's
first-boot unit printed, a failure that ends the boot's wait at once, and its last lines for the message
(the console is removed with a VM that failed to boot, so the message carries what it said)."""

from __future__ import annotations

import re

HOSTKEY = re.compile(r"gpukit-hostkey: (ssh-ed25519 [A-Za-z0-9+/=]+)")
# images/gpukit/files/usr/local/sbin/gpukit-firstboot prints its own errors as `gpukit-firstboot: ...`;
# systemd's status line names the unit by its description; a guest kernel's panic ends a qemu boot.
_FAILED = re.compile(r"^.*(?:gpukit-firstboot: |Failed to start .*gpukit first boot|Kernel panic).*$", re.MULTILINE)


def host_key(text: str) -> str | None:
    found = HOSTKEY.search(text)
    return found.group(1) if found else None


def failure(text: str) -> str | None:
    """The console's first line saying the boot failed, or None."""
    found = _FAILED.search(text)
    return found.group(0).strip()[:300] if found else None


def tail(text: str, lines: int = 3) -> str:
    """The console's last non-empty lines, on one line, for a message."""
    last = [ln.strip() for ln in text.splitlines() if ln.strip()][-lines:]
    return " | ".join(last)[-400:] or "(empty)"
