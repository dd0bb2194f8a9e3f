"""The user's job on a VM, from the controller: what the VM installs (for resolving the requirements
on the first deploy), and the code and virtualenv prepared before every attempt (glue.train.workspace
does the work on the VM).

Nothing here reads the user's folder: the VM is handed the hashes the manifest pins and fetches the
package and the wheels from the bucket itself.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from glue.errors import GlueError
from glue.infra import ssh
from glue.infra.inventory import Host
from glue.runs import remote
from glue.runs.store import RunStore
from glue.storage import bucket as bucket_store
from glue.train.run.launch import workdir_vars
from glue.train.state_paths import StatePaths
from glue.train.storage.credentials import credentials_doc
from glue.train.workspace.paths import CONTAINER_WORKDIR
from glue.workdir import plan as wplan
from glue.workdir import ship as ship_mod
from glue.workdir import wheelhouse
from glue.workdir.pin import Workspace

# Preparing fetches the package and installs the wheels from the bucket (minutes for a large set).
PREPARE_TIMEOUT_S = 1800


def push_credentials(home: Path, host: Host, store: RunStore) -> None:
    """The bucket credentials for the VM's own S3 calls (0600, on its tmpfs)."""
    ssh.put_file(home, host, remote.CREDENTIALS_PATH, credentials_doc(store.creds))


def _bucket(store: RunStore) -> dict[str, Any]:
    return {"bucket": {"endpoint": store.info.endpoint, "name": store.info.name,
                       "region": store.info.signing_region},
            "credentials_file": remote.CREDENTIALS_PATH}


def _call(home: Path, host: Host, store: RunStore, verb: str, spec: dict[str, Any], path: str,
          timeout: float) -> dict[str, Any]:
    ssh.put_file(home, host, path, json.dumps({**spec, **_bucket(store)}).encode())
    res = ssh.run(home, host, f"{shlex.quote(remote.python(host))} -m glue.train.workspace {verb} "
                  f"{shlex.quote(path)}", timeout=timeout)
    if res.exit_code != 0:
        lines = res.stderr.strip().splitlines()
        raise GlueError(f"{host.name}: {lines[-1] if lines else f'glue.train.workspace {verb} exited {res.exit_code}'}")
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def target(home: Path, host: Host) -> dict[str, Any]:
    """The VM's interpreter (Python, ABIs, platforms) and its image's packages (glue.train.workspace.target)."""
    res = ssh.run(home, host, f"{shlex.quote(remote.python(host))} -m glue.train.workspace target", timeout=120)
    if res.exit_code != 0:
        lines = res.stderr.strip().splitlines()
        raise GlueError(f"{host.name}: {lines[-1] if lines else 'the trainer runtime does not answer'}")
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def prepare(home: Path, host: Host, store: RunStore, ws: Workspace, attempt: int) -> dict[str, Any]:
    """Code unpacked and venv ready on `host` for `attempt`: {python, code_dir, package_sha256, requirements_set,
    environment}. How the venv came to be is said on stderr (a live status display prints it above itself)."""
    ready = _call(home, host, store, "prepare", ws.prepare_spec(store.run, attempt),
                  StatePaths.of(store.run, attempt).workspace_spec,
                  PREPARE_TIMEOUT_S)
    said = environment_line(host.name, ready.get("environment"))
    if said:
        print(said, file=sys.stderr, flush=True)
    return ready


def environment_line(vm: str, how: dict[str, Any] | None) -> str | None:
    """One line on how `vm` made the run's environment (glue.train.workspace.environment); None: reused."""
    if not how or how.get("source") == "reused":
        return None
    if how.get("source") == "pack":
        where = "in memory" if how.get("in_memory") else "on disk"
        return (f"{vm}: environment: unpacked the set's packed virtualenv ({how['bytes'] / 2**20:.0f} MiB, {where}) "
                f"in {how['seconds']:.1f} s, its pins checked against the manifest's")
    return f"{vm}: environment: {how.get('note')} ({how.get('seconds', 0):.1f} s)"


def launch(argv: list[str], image_python: str, env: dict[str, str], ready: dict[str, Any] | None,
           docker: bool) -> tuple[list[str], dict[str, str], str | None]:
    """The command, environment and cwd of a prepared attempt: the run's python, the code as cwd and
    first on PYTHONPATH (in a container: at CONTAINER_WORKDIR, where it is mounted read-only)."""
    if not ready:
        return argv, env, None
    if argv and argv[0] == image_python and not docker:
        argv = [str(ready["python"]), *argv[1:]]
    code = CONTAINER_WORKDIR if docker else ready.get("code_dir")
    if code:
        extra = env.get("PYTHONPATH")
        env = {**env, **workdir_vars(code, str(ready["package_sha256"])),
               "PYTHONPATH": f"{code}:{extra}" if extra else code}
    return argv, env, ready.get("code_dir")


def ship(home: Path, host: Host, store: RunStore, plan: wplan.Plan, console: Console) -> Workspace:
    """The requirements resolved on the first VM (a set that cannot be resolved: nothing uploaded), then
    the code package into the bucket under its content address. Returns what the manifest pins."""
    if plan.empty:
        return Workspace()
    req = None
    if plan.requirements:
        with console.status(f"requirements: resolving {len(plan.requirements)} for {host.name}'s Python and image"):
            resolved = wheelhouse.pin(store.s3, store.info.name, plan.requirements, target(home, host))
        req = resolved
        how = "wheelhouse uploaded" if resolved.get("uploaded") else "wheelhouse already in the bucket"
        console.print(f"requirements: {len(resolved['pins'])} pinned, set {resolved['set_sha256'][:12]} ({how})"
                      if resolved["pins"] else "requirements: all satisfied by the image (nothing to install)")
    pkg = None
    if plan.package is not None:
        with console.status(f"workdir: uploading {plan.package.size / 2**20:.1f} MiB"):
            s3 = bucket_store.client(store.info, store.creds, timeout=60, checksums=False)
            uploaded = ship_mod.upload(s3, store.info.name, plan.package)
        pkg = plan.manifest_workdir(uploaded)
        console.print(f"workdir: {len(plan.package.files)} files, {plan.package.size / 2**20:.2f} MiB, sha256 "
                      f"{plan.package.sha256[:12]} ({'uploaded' if uploaded else 'already in the bucket'})")
    return Workspace(package=pkg, requirements=req)
