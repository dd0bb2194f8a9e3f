"""The kit's SSH client key: generated once into <home>/ssh/ (private key 0600)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from glue.paths import ssh_client_key_path


def ssh_dir(home: Path) -> Path:
    d = home / "ssh"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    return d


def client_key(home: Path) -> Path:
    """Path of the private key; created on first use."""
    ssh_dir(home)
    key = ssh_client_key_path(home)
    if not key.exists():
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpukit", "-f", str(key)],
            check=True, stdin=subprocess.DEVNULL,
        )
    key.chmod(0o600)
    return key


def public_key(home: Path) -> str:
    return Path(f"{client_key(home)}.pub").read_text().strip()
