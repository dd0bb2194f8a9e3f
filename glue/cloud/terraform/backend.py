"""Backend `terraform`: the user's own root module (`glue up --backend terraform --module DIR`) makes the
VMs with whatever provider it uses; gpukit runs terraform on it (glue/infra/user_module.py) and reads its
outputs (glue.cloud.terraform.contract). This backend answers glue's questions about those VMs without a
cloud API of its own: a VM is there while terraform's state lists it and it answers SSH; gpukit never
creates or deletes one itself (an apply does: `-replace` for a lost VM, `glue down` destroys).

The bucket is the one the module's `bucket` output names; its credentials come from the environment
(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, optional AWS_SESSION_TOKEN) into <home>/bucket/credentials.json
(0600), never from terraform; a module using gpukit's own local bucket finds that file written already."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from glue.bucket_access import BucketCredentials, BucketInfo
from glue.cloud.base import VMRecord, VMSpec
from glue.cloud.checks import Readiness, host_readiness
from glue.cloud.ssh import remote
from glue.cloud.terraform import contract, hostkeys, module
from glue.errors import GlueError
from glue.paths import write_secret

READ_TRIES = 2  # a VM that does not answer twice in a row is lost (one dropped packet is not)
ENV_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def state_outputs(home: Path) -> dict[str, Any]:
    """The module's outputs as terraform's state holds them now (no terraform run), kept to the contract."""
    try:
        raw = json.loads((home / "terraform" / contract.BACKEND / "terraform.tfstate").read_text())
    except FileNotFoundError:
        return {"vms": {}}
    except (OSError, ValueError) as exc:
        raise GlueError(f"terraform's state of your module cannot be read ({exc})") from None
    outputs = {k: (v or {}).get("value") for k, v in (raw.get("outputs") or {}).items()}
    found = contract.lenient(outputs)
    hostkeys.fill(home, found["vms"], None, lambda line: None)
    return found


class TerraformBackend:
    """Backend `terraform`: VMs made by the user's own module (`--module DIR`), any provider."""

    name = contract.BACKEND
    credentials_expire = False
    bucket_on_host = False
    baked_image: str | None = None
    multi_node: str | None = None  # the module's VMs share a network, as its own provider makes them
    takes_config_seed = False
    deletes_vms = False

    def __init__(self, home: Path) -> None:
        self.home = home

    def check_host(self) -> None:
        module.check(module.recorded(self.home))

    def readiness(self) -> Readiness:
        return host_readiness("your Terraform module", self.check_host, "the module of `glue up --module` is there")

    def spares_problem(self) -> str | None:
        return ("warm spares are not supported with --backend terraform yet (a spare taken would move between "
                "your module's resources); leave --spares out: a recovery replaces the lost VM with `-replace`")

    def tf_vars(self, vm_count: int, name_prefix: str, ssh_public_key: str) -> dict[str, Any]:
        return {"vm_count": vm_count, "name_prefix": name_prefix, "ssh_public_key": ssh_public_key,
                "module_digest": module.digest(module.recorded(self.home))}

    def create_vm(self, spec: VMSpec) -> VMRecord:
        raise GlueError("the terraform backend makes no VM itself: your module's own provider does (use "
                        "`provider \"gpukit\" { backend = \"local\" }` or another backend in a module)")

    def _record(self, name: str, vm: dict[str, Any]) -> VMRecord:
        return VMRecord(id=vm["id"], name=name, ssh_host=vm["ssh_host"], ssh_port=vm["ssh_port"],
                        ssh_user=vm["ssh_user"], host_key=vm["host_key"], gpu_type=vm["gpu_type"],
                        gpu_count=vm["gpu_count"], backend=self.name, status="running", market=vm["market"])

    def read_vm(self, vm_id: str) -> VMRecord | None:
        """The VM while terraform's state lists it and it answers SSH (its key read, no login)."""
        found = [(n, vm) for n, vm in state_outputs(self.home)["vms"].items() if vm["id"] == vm_id]
        if not found:
            return None
        name, vm = found[0]
        for attempt in range(READ_TRIES):
            try:
                remote.server_key(hostkeys.entry(name, vm), timeout=5.0)
            except GlueError:
                if attempt + 1 < READ_TRIES:
                    time.sleep(1.0)
                continue
            return self._record(name, vm)
        return None

    def delete_vm(self, vm_id: str) -> None:
        if vm_id not in self.owned_vm_ids():
            return
        raise GlueError(f"VM {vm_id} was made by your module: gpukit deletes it only through terraform (`glue "
                        "recover` replaces a lost VM, `glue drill` destroys its victim's resource, `glue down` "
                        "destroys them all)")

    def owned_vm_ids(self) -> list[str]:
        return sorted(vm["id"] for vm in state_outputs(self.home)["vms"].values())

    # -- bucket ------------------------------------------------------------------------------
    def _last_bucket(self) -> Path:
        return self.home / "user-module" / "bucket.json"

    def remember_bucket(self, info: dict[str, str]) -> None:
        """The bucket as the module emitted it last (after `glue down` its outputs are gone, its data is not)."""
        path = self._last_bucket()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(info))

    def bucket(self) -> BucketInfo:
        info = state_outputs(self.home).get("bucket")
        if info is None:
            try:
                info = json.loads(self._last_bucket().read_text())
            except (OSError, ValueError):
                raise GlueError("your module has not emitted a bucket yet: run `glue up --backend terraform "
                                "--module DIR`") from None
        return BucketInfo(**info)

    def bucket_credentials(self) -> BucketCredentials:
        """From the environment (written to the kit's 0600 credentials file the VMs get), else that file."""
        path = self.home / "bucket" / "credentials.json"
        env = {k: os.environ.get(k, "") for k in ENV_KEYS}
        if env["AWS_ACCESS_KEY_ID"] and env["AWS_SECRET_ACCESS_KEY"]:
            creds = {"access_key": env["AWS_ACCESS_KEY_ID"], "secret_key": env["AWS_SECRET_ACCESS_KEY"],
                     **({"session_token": env["AWS_SESSION_TOKEN"]} if env["AWS_SESSION_TOKEN"] else {})}
            if not path.exists() or json.loads(path.read_text() or "{}") != creds:
                write_secret(path, json.dumps(creds))
            return BucketCredentials(access_key=creds["access_key"], secret_key=creds["secret_key"],
                                     session_token=creds.get("session_token"))
        try:
            raw = json.loads(path.read_text())
            return BucketCredentials(access_key=raw["access_key"], secret_key=raw["secret_key"],
                                     session_token=raw.get("session_token"))
        except (OSError, ValueError, KeyError, TypeError):
            raise GlueError("your module's bucket needs credentials: export AWS_ACCESS_KEY_ID and "
                            "AWS_SECRET_ACCESS_KEY (never put them in your module or its outputs)") from None
