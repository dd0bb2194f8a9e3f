"""glue doctor: is this machine (and, on Lyceum, the account) ready for `glue up`? Creates no VM.

Each check is one line, ✓ or ✗, with the fix. Exit status 1 when any check fails.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import stat
import subprocess
import tempfile
from pathlib import Path

import click
import paramiko
from botocore.exceptions import BotoCoreError, ClientError
from rich.console import Console
from rich.markup import escape

from glue.bucket_access import BucketCredentials, BucketInfo
from glue.cloud import BACKENDS
from glue.cloud.checks import Check
from glue.cluster.current import ClusterConfig
from glue.errors import GlueError
from glue.infra import preflight
from glue.infra.ssh_keys import ssh_dir
from glue.infra.terraform import ENVS_DIR
from glue.paths import home
from glue.storage import bucket as bucket_store
from glue.tfprovider.install import install
from glue.tfprovider.provider import SOURCE, VERSION

PROBE_PREFIX = "gpukit-doctor/"  # the only keys doctor ever writes (and deletes again)
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
    """Write one object under PROBE_PREFIX, read it back, delete it, and see it gone."""
    key = f"{PROBE_PREFIX}{socket.gethostname()}-{secrets.token_hex(6)}"
    body = secrets.token_bytes(32)
    try:
        s3 = bucket_store.client(info, creds)
        s3.put_object(Bucket=info.name, Key=key, Body=body)
        try:
            same = s3.get_object(Bucket=info.name, Key=key)["Body"].read() == body
        finally:
            s3.delete_object(Bucket=info.name, Key=key)
        gone = bucket_store.read(s3, info.name, key) is None
    except (BotoCoreError, ClientError) as exc:
        return Check("bucket probe", False, f"writing s3://{info.name}/{key} failed: {' '.join(str(exc).split())}",
                     "check that the credentials allow writes to the bucket")
    if not same or not gone:
        return Check("bucket probe", False, f"s3://{info.name}/{key} did not read back" if not same
                     else f"s3://{info.name}/{key} is still there after its delete", "check the bucket's endpoint")
    return Check("bucket probe", True, f"wrote, read back and deleted s3://{info.name}/{PROBE_PREFIX}…")


def run_checks(h: Path, backend: str) -> list[Check]:
    checks: list[Check] = []
    if backend == "lyceum":
        from glue.cloud.lyceum import doctor as lyceum_doctor

        account = lyceum_doctor.account()
        checks += account.checks
        if account.bucket is not None and account.credentials is not None:
            checks.append(bucket_probe(account.bucket, account.credentials))
    elif backend == "qemu":
        try:
            preflight.check("qemu")
            checks.append(Check("qemu VMs", True, "qemu, qemu-img, socat, mke2fs and systemd-nspawn are installed"))
        except GlueError as exc:
            checks.append(Check("qemu VMs", False, str(exc), "see the message"))
    else:
        try:
            preflight.check_local_backend()
            checks.append(Check("local VMs", True, "systemd-nspawn, FUSE and mount namespaces are available"))
        except GlueError as exc:
            checks.append(Check("local VMs", False, str(exc), "see the message"))
    checks.append(ssh_key_check(h))
    tf, version = terraform_check(backend)
    checks.append(tf)
    if version is not None:
        checks.append(provider_check(h))
    return checks


@click.command()
@click.option("--backend", type=click.Choice(list(BACKENDS)), default=None,
              help="The backend to check (default: the cluster's, else local).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def doctor(backend: str | None, as_json: bool) -> None:
    """Check that `glue up` can work here, without creating a VM: on Lyceum the API key (one
    authenticated read), capacity, storage credentials and a probe object; everywhere the SSH key,
    terraform and the provider mirror. Exit status 1 when a check fails."""
    h = home()
    chosen = backend or ClusterConfig.load(h).backend
    checks = run_checks(h, chosen)
    ok = all(c.ok for c in checks)
    if as_json:
        click.echo(json.dumps({"backend": chosen, "ok": ok, "checks": [c.as_dict() for c in checks]}, indent=2))
    else:
        out = Console(highlight=False, soft_wrap=True)
        for c in checks:
            mark = "[green]✓[/]" if c.ok else "[red]✗[/]"
            fix = f" — fix: {escape(c.fix)}" if c.fix and not c.ok else ""
            out.print(f"{mark} {escape(c.name)}: {escape(c.detail)}{fix}")
    if not ok:
        raise SystemExit(1)


COMMANDS = [doctor]
