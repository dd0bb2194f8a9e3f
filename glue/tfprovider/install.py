"""Install the provider launcher into a filesystem mirror and write glue's own Terraform CLI config.

Terraform then finds `local/gpukit/gpukit` offline: no registry, no download. The launcher sets
HOME and TMPDIR (the tf framework caches its TLS cert under $HOME) and execs this venv's python.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from glue.tfprovider.identity import SOURCE, VERSION

PLATFORM = "linux_amd64"


def mirror_dir(home: Path) -> Path:
    return home / "terraform" / "mirror"


def cli_config_path(home: Path) -> Path:
    return home / "terraform" / "terraformrc"


def _python() -> str:
    """This environment's interpreter under one stable name: `glue` runs as .../bin/python3 and
    `python -m glue` as .../bin/python, and a launcher that changed would fail terraform's lock check."""
    stable = Path(sys.prefix) / "bin" / "python3"
    return str(stable) if stable.exists() else sys.executable


def provider_tmp_dir(home: Path) -> Path:
    """The provider's TMPDIR. The plugin's gRPC unix socket lives there and socket paths max out at 107
    bytes, so it is a short per-home directory rather than one under a possibly deep kit home."""
    return Path(f"/tmp/gpukit-tf-{hashlib.sha256(str(home).encode()).hexdigest()[:10]}")


def launcher_text(home: Path) -> str:
    prov_home = home / "terraform" / "provider-home"
    tmp = provider_tmp_dir(home)
    return (
        "#!/bin/sh\n"
        "# gpukit provider launcher (written by glue; see glue/tfprovider/install.py)\n"
        f'export HOME="{prov_home}"\n'
        f'export TMPDIR="{tmp}"\n'
        'mkdir -p -m 700 "$HOME" "$TMPDIR"\n'
        f'exec "{_python()}" -m glue.tfprovider.main "$@"\n'
    )


def install(home: Path) -> Path:
    """Write the launcher and CLI config if they differ from what is there; return the config path."""
    target = mirror_dir(home) / SOURCE / VERSION / PLATFORM
    target.mkdir(parents=True, exist_ok=True)
    launcher = target / f"terraform-provider-gpukit_v{VERSION}"
    text = launcher_text(home)
    if not launcher.exists() or launcher.read_text() != text:
        launcher.write_text(text)
        os.chmod(launcher, 0o755)
    config = cli_config_path(home)
    conf_text = (
        "# Terraform CLI config written by glue: providers come only from gpukit's local mirror.\n"
        "disable_checkpoint = true\n"
        "provider_installation {\n"
        f'  filesystem_mirror {{\n    path    = "{mirror_dir(home)}"\n    include = ["{SOURCE}"]\n  }}\n'
        f'  direct {{\n    exclude = ["{SOURCE}"]\n  }}\n'
        "}\n"
    )
    if not config.exists() or config.read_text() != conf_text:
        config.write_text(conf_text)
    return config
