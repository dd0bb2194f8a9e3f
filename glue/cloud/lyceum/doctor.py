"""`glue doctor --backend lyceum`: the account checked without creating a VM.

API key (shape, then one authenticated read), capacity for the profile `glue up` would ask for, and
storage credentials (issued, their expiry read); then, with a cluster up, each of its VMs: an address and
the recorded SSH user getting root. The issued credentials stay in memory: the caller
writes and deletes a probe object with them, and nothing here writes them anywhere.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from glue.cloud.checks import Check, Readiness
from glue.cloud.lyceum import bucket as lyceum_creds
from glue.cloud.lyceum import login
from glue.cloud.lyceum.address import parse_address
from glue.cloud.lyceum.api import (
    KEY_ENV,
    KEYS_PAGE,
    LyceumClient,
    LyceumNotFound,
    api_key_from_env,
    api_url_from_env,
)
from glue.cloud.lyceum.capacity import offers, shortfall
from glue.cloud.lyceum.inputs import tf_vars
from glue.errors import GlueError

# Credentials that live shorter than this cannot carry a run between refreshes: gpukit refreshes
# at a quarter of their lifetime and pushes the new ones to every VM over SSH.
MIN_LIFETIME_S = 120.0
_PLACEHOLDER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGdvY3RvcmRvY3RvcmRvY3RvcmRvY3RvcmRvY3Rvcg doctor"


def _lifetime(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def account(client: LyceumClient | None = None) -> Readiness:
    checks: list[Check] = []
    if not os.environ.get(KEY_ENV, "").strip():  # the API's own message would repeat the fix line's text
        return Readiness([Check("API key", False, f"{KEY_ENV} is not set",
                                f"create a key at {KEYS_PAGE} and `export {KEY_ENV}=lk_...`")])
    try:
        api_key_from_env()
        url = api_url_from_env()
        api = client or LyceumClient.from_env()
        vms = api.list_vms()
    except GlueError as exc:
        fix = f"create a key at {KEYS_PAGE} and `export {KEY_ENV}=lk_...`" if "API key" in str(exc) or \
            KEY_ENV in str(exc) else "check LYCEUM_API_URL and the network"
        return Readiness([Check("API key", False, str(exc), fix)])
    live = [v for v in vms if str(v.get("status", "")).lower() in ("pending", "provisioning", "running", "ready")]
    checks.append(Check("API key", True, f"accepted by {url} (GET /vms/list: {len(live)} VM(s) up on the account)"))

    try:
        wanted = tf_vars(1, "doctor", _PLACEHOLDER_KEY)
        found = offers(api.availability_answer())
        problem = shortfall(found, wanted["hardware_profile"], wanted["gpu_count"])
    except GlueError as exc:
        checks.append(Check("capacity", False, str(exc), "fix the setting named above"))
    else:
        profile, gpus = wanted["hardware_profile"], wanted["gpu_count"]
        if problem:
            checks.append(Check("capacity", False, problem,
                                "set LYCEUM_HARDWARE_PROFILE / LYCEUM_GPU_COUNT to what is available, or wait"))
        else:
            mine = ", ".join(o.describe() for o in found if o.profile == profile)
            want = f"{profile} with {gpus} GPU(s) per VM" if gpus else profile
            checks.append(Check("capacity", True, f"{want} is offered: {mine}"))

    now = time.time()
    try:
        answer = api.storage_credentials()
        creds = lyceum_creds.parse(answer, now=now)
    except GlueError as exc:
        checks.append(Check("storage credentials", False, str(exc),
                            "is storage enabled for this account? (POST /storage/credentials)"))
        return Readiness(checks)
    said = any(answer.get(k) is not None for k in ("expires_at", "expiration", "expiry", "expires_in"))
    life = creds.expires_at - now
    where = f"bucket {creds.bucket} at {creds.endpoint}"
    if not said:
        detail = (f"issued for {where}; the answer has no expires_at, so gpukit assumes "
                  f"{_lifetime(lyceum_creds.ASSUMED_TTL_S)} and refreshes early")
        checks.append(Check("storage credentials", True, detail))
    elif life < MIN_LIFETIME_S:
        checks.append(Check("storage credentials", False,
                            f"issued for {where}, but they expire in {_lifetime(max(0.0, life))} (expires_at)",
                            f"gpukit needs at least {MIN_LIFETIME_S:.0f} s of lifetime to refresh and push them "
                            "to the VMs; check the host clock (`date -u`) and Lyceum's storage settings"))
    else:
        checks.append(Check("storage credentials", True,
                            f"issued for {where}; they expire in {_lifetime(life)} (expires_at), and gpukit "
                            f"refreshes them {_lifetime(creds.margin())} before"))
    return Readiness(checks, creds.bucket_info(), creds.bucket_credentials())


def cluster_vms(api: LyceumClient, records: dict[str, dict[str, Any]], key_path: Path) -> list[Check]:
    """One line per VM of the cluster (gpukit's records): it is on the account, has an address (live, a VM
    can be `ready` for minutes before it has one) and lets its recorded user in with root."""
    checks = []
    for vm_id, rec in sorted(records.items(), key=lambda kv: str(kv[1].get("name") or kv[0])):
        what = f"VM {rec.get('name') or vm_id}"
        try:
            status = api.vm_status(vm_id)
        except LyceumNotFound:
            checks.append(Check(what, False, f"{vm_id} is gone from the account", "`glue up` replaces it"))
            continue
        except GlueError as exc:
            checks.append(Check(what, False, str(exc), "check LYCEUM_API_URL and the network"))
            continue
        state = str(status.get("status") or "unknown").lower()
        if not status.get("ip_address"):
            checks.append(Check(what, False, f"{state}, but Lyceum reports no address for it yet",
                                "wait and run `glue doctor` again (live VMs were seen ready 100 s before their "
                                "address); `glue up` waits for it"))
            continue
        host, port = parse_address(str(status["ip_address"]))
        user = str(rec.get("ssh_user") or "root")
        why = login.problem(host, port, str(rec.get("host_key") or ""), key_path, user)
        checks.append(Check(what, True, f"{state} at {host}:{port}; {user} logs in and gets root") if why is None
                      else Check(what, False, f"{state} at {host}:{port}, but {why}",
                                 "set LYCEUM_SSH_USER to the image's user (live VMs: lyceum) and `glue up`"))
    return checks


def settings() -> dict[str, str]:
    """The settings `glue up` would use, for the report (never the key)."""
    names = ("LYCEUM_API_URL", "LYCEUM_HARDWARE_PROFILE", "LYCEUM_GPU_COUNT", "LYCEUM_INSTANCE_SPECS",
             "LYCEUM_SSH_USER")
    return {n: os.environ[n] for n in names if os.environ.get(n)}
