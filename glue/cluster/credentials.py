"""Push refreshed bucket credentials to the copies the VMs hold.

Some backends' bucket credentials expire (Lyceum's); the backend refreshes the controller's copy
(<home>/bucket/credentials.json). Each VM holds two copies that must follow:
- the trainer's file (glue.train.storage.credentials.TRAINER_FILE), which the checkpointer re-reads whenever
  its credentials near expiry: rewriting it is enough;
- the /mnt/s3 mount's rclone config (the bucket_mount role's /etc/gpukit/rclone.conf): rclone reads
  it at start, so its three credential lines are rewritten and the mount is reloaded.
`push_if_refreshed` is meant to be called from a loop that already runs while jobs run (the
monitor): it does nothing until the controller's credentials changed since the last push.
The secrets travel on the SSH channel's stdin, never in a command line.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Iterable
from pathlib import Path

from glue.bucket_access import BucketCredentials
from glue.cloud.base import Backend
from glue.cluster import current
from glue.errors import GlueError
from glue.infra import ssh
from glue.infra.inventory import Host
from glue.train.storage.credentials import TRAINER_FILE, credentials_doc

RCLONE_CONF = "/etc/gpukit/rclone.conf"  # bucket_mount_rclone_config
RCLONE_REMOTE = "gpukit"  # bucket_mount_remote_name
MOUNT_SCRIPT = "/usr/local/sbin/gpukit-mount"  # bucket_mount_script

# Reads three lines (access key, secret key, session token) on stdin; rewrites the remote's
# credential keys in rclone.conf (0600, replaced atomically); reloads the mount when it runs.
_MOUNT_UPDATE = f"""set -eu
conf={RCLONE_CONF}
[ -f "$conf" ] || {{ cat >/dev/null; echo no-mount; exit 0; }}
IFS= read -r AK; IFS= read -r SK; IFS= read -r TOK || true
export AK SK TOK
umask 077
awk -v remote='[{RCLONE_REMOTE}]' '
  function tok() {{ if (insec && !seen && ENVIRON["TOK"] != "") print "session_token = " ENVIRON["TOK"] }}
  /^\\[/ {{ tok(); insec = ($0 == remote); seen = 0 }}
  insec && /^access_key_id[ \\t]*=/ {{ print "access_key_id = " ENVIRON["AK"]; next }}
  insec && /^secret_access_key[ \\t]*=/ {{ print "secret_access_key = " ENVIRON["SK"]; next }}
  insec && /^session_token[ \\t]*=/ {{
    seen = 1; if (ENVIRON["TOK"] != "") print "session_token = " ENVIRON["TOK"]; next }}
  {{ print }}
  END {{ tok() }}' "$conf" > "$conf.new"
mv -f "$conf.new" "$conf"
if [ -x {MOUNT_SCRIPT} ]; then {MOUNT_SCRIPT} reload >/dev/null; fi
echo updated
"""


def _run_with_input(home: Path, host: Host, script: str, data: bytes, timeout: float = 60.0) -> tuple[int, str, str]:
    """Run `sh -c script` on the VM with `data` on its stdin (pinned host key, as every glue SSH)."""
    client = ssh.connect(home, host)
    try:
        chan = client.get_transport().open_session()  # type: ignore[union-attr]
        chan.settimeout(timeout)
        chan.exec_command(f"sh -c {shlex.quote(script)}")
        chan.sendall(data)
        chan.shutdown_write()
        out, err = chan.makefile("rb").read(), chan.makefile_stderr("rb").read()
        code = chan.recv_exit_status()
    except (TimeoutError, OSError) as exc:
        raise GlueError(f"{host.name}: updating the bucket credentials failed ({exc})") from exc
    finally:
        client.close()
    return code, out.decode(errors="replace"), err.decode(errors="replace")


def _fingerprint(creds: BucketCredentials) -> str:
    return hashlib.sha256(f"{creds.access_key}\0{creds.session_token}".encode()).hexdigest()


def push(home: Path, hosts: Iterable[Host], creds: BucketCredentials) -> dict[str, str]:
    """Write `creds` into every VM's copies. Returns {vm: "updated" | "no-mount" | error}."""
    trainer_doc = credentials_doc(creds)
    lines = f"{creds.access_key}\n{creds.secret_key}\n{creds.session_token or ''}\n".encode()
    results: dict[str, str] = {}
    for host in hosts:
        try:
            ssh.put_file(home, host, TRAINER_FILE, trainer_doc)
            code, out, err = _run_with_input(home, host, _MOUNT_UPDATE, lines)
            results[host.name] = out.strip() if code == 0 else f"error: {' '.join(err.split())[-200:]}"
        except GlueError as exc:
            results[host.name] = f"error: {exc}"
    return results


def push_if_refreshed(home: Path, hosts: list[Host], backend: Backend) -> dict[str, str]:
    """Refresh the controller's credentials when near expiry; push them when they changed."""
    creds = backend.bucket_credentials()
    marker = home / backend.name / "pushed.json"
    try:
        pushed = json.loads(marker.read_text())
    except (OSError, ValueError):
        pushed = {}
    fp = _fingerprint(creds)
    todo = [h for h in hosts if pushed.get(h.id) != fp]
    if not todo:
        return {}
    results = push(home, todo, creds)
    pushed.update({h.id: fp for h in todo if not results[h.name].startswith("error")})
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({h.id: pushed[h.id] for h in hosts if h.id in pushed}))
    return results


def refresh(home: Path) -> None:
    """Expiring bucket credentials (lyceum's are STS-style): refresh them near expiry and push the new
    ones to every VM's trainer file and /mnt/s3 mount. A no-op for backends whose keys do not expire."""
    backend = current.backend(home)
    if backend.credentials_expire:
        push_if_refreshed(home, current.all_hosts(home), backend)
