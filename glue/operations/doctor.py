"""`glue doctor`: is this machine (and, on a cloud, the account) ready for `glue up`? Creates no VM.

Each check is one `Check` line, ✓ or ✗, with the fix; the backend contributes its own
(`Backend.readiness`), the rest holds for every backend.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import tempfile
from pathlib import Path

import paramiko

from glue.bucket_access import BucketCredentials, BucketInfo, own
from glue.cloud import get_backend
from glue.cloud.checks import Check, Readiness
from glue.errors import GlueError
from glue.infra import preflight
from glue.infra.ssh_keys import ssh_dir
from glue.infra.terraform import ENVS_DIR
from glue.operations import bucket_checks
from glue.tfprovider.identity import SOURCE, VERSION
from glue.tfprovider.install import install

_REQUIRED = re.compile(r'required_version\s*=\s*">=\s*([0-9.]+)"')


def ssh_key_check(h: Path) -> Check:
    key = ssh_dir(h) / "id_ed25519"
    if not key.exists():
        return Check("SSH key", True, f"{key} not created yet: `glue up` creates it (ed25519, 0600)")
    mode = stat.S_IMODE(key.stat().st_mode)
    if mode & 0o077:
        return Check("SSH key", False, f"{key} is readable by others (mode {mode:03o})", f"chmod 600 {key}")
    try:
        private = paramiko.Ed25519Key.from_private_key_file(str(key))
        public = Path(f"{key}.pub").read_text().split()
    except (OSError, paramiko.SSHException, ValueError) as exc:
        return Check("SSH key", False, f"{key} cannot be read ({exc})",
                     f"move {key} and {key}.pub away; `glue up` makes a new pair (VMs made with the old one "
                     "then need `glue up` to be replaced)")
    if public[1:2] != [private.get_base64()]:
        return Check("SSH key", False, f"{key}.pub does not match {key}",
                     f"ssh-keygen -y -f {key} > {key}.pub")
    return Check("SSH key", True, f"{key} (ed25519, 0600)")


def terraform_check(backend: str) -> tuple[Check, str | None]:
    try:
        preflight.check_terraform()
        out = subprocess.run(["terraform", "version", "-json"], capture_output=True, text=True, timeout=60,
                             check=True, stdin=subprocess.DEVNULL, env={**os.environ, "CHECKPOINT_DISABLE": "1"})
        version = str(json.loads(out.stdout)["terraform_version"])
    except GlueError as exc:
        return Check("terraform", False, str(exc), "install Terraform (one binary) on PATH"), None
    except (OSError, subprocess.SubprocessError, ValueError, KeyError) as exc:
        return Check("terraform", False, f"`terraform version` failed ({exc})", "reinstall Terraform"), None
    found = _REQUIRED.search((ENVS_DIR / backend / "versions.tf").read_text())
    need = found.group(1) if found else "0"
    if tuple(map(int, version.split(".")[:3])) < tuple(map(int, need.split("."))):
        return Check("terraform", False, f"terraform {version} is older than the {backend} env needs (>= {need})",
                     f"install Terraform >= {need}"), None
    return Check("terraform", True, f"terraform {version} (the {backend} env needs >= {need})"), version


def provider_check(h: Path) -> Check:
    """`terraform init` of a config that only requires the provider: proves terraform finds it in the
    mirror, offline, through glue's CLI config."""
    config = install(h)
    with tempfile.TemporaryDirectory(prefix="gpukit-doctor-") as tmp:
        Path(tmp, "main.tf").write_text(
            f'terraform {{\n  required_providers {{\n    gpukit = {{\n      source  = "{SOURCE}"\n'
            f'      version = "{VERSION}"\n    }}\n  }}\n}}\n')
        env = {**os.environ, "TF_CLI_CONFIG_FILE": str(config), "CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1",
               "TF_INPUT": "0"}
        try:
            res = subprocess.run(["terraform", "init", "-input=false", "-no-color"], cwd=tmp, env=env,
                                 capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as exc:
            return Check("provider mirror", False, f"terraform init failed to run ({exc})", "check terraform")
    if res.returncode != 0:
        why = " ".join((res.stderr or res.stdout).split())[:240]
        return Check("provider mirror", False, f"terraform cannot install {SOURCE} from the mirror: {why}",
                     f"remove {h / 'terraform' / 'mirror'} and run `glue doctor` again")
    return Check("provider mirror", True, f"terraform installs {SOURCE} {VERSION} from {h / 'terraform' / 'mirror'}")


def bucket_probe(info: BucketInfo, creds: BucketCredentials) -> Check:
    """Write, read back, list, ranged GET, delete and the GET after it (glue.operations.bucket_checks)."""
    return bucket_checks.probe(info, creds)


def own_bucket_readiness(h: Path, backend_name: str, bucket: own.OwnBucket | None) -> Readiness:
    """The backend's own checks with the user's bucket to probe: the one of `glue doctor --bucket ...`, else
    the one `glue up` configured (get_backend's wrapper). Its credentials: boto3's chain, one line without."""
    backend = get_backend(backend_name, h)
    if bucket is None:
        return backend.readiness()
    found = backend.readiness()
    try:
        creds = own.resolve(bucket)
        if creds is None:
            raise own.no_credentials(bucket)
    except GlueError as exc:
        return Readiness([*found.checks, Check(bucket_checks.NAME, False, str(exc), "see the message")])
    return Readiness(found.checks, bucket.info, creds)


def run_checks(h: Path, backend_name: str, bucket: own.OwnBucket | None = None) -> list[Check]:
    """The backend's own checks (this machine, or the cloud account, and the bucket where it can be
    probed without starting anything: `bucket`, the user's own, when given), then what every backend
    needs: the SSH key, terraform, the provider mirror."""
    found = own_bucket_readiness(h, backend_name, bucket)
    checks = list(found.checks)
    if found.bucket is not None and found.credentials is not None:
        checks.append(bucket_probe(found.bucket, found.credentials))
    checks.append(ssh_key_check(h))
    tf, version = terraform_check(backend_name)
    checks.append(tf)
    if version is not None:
        checks.append(provider_check(h))
    return checks
