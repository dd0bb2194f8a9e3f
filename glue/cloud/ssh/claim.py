"""Taking a host into the cluster and releasing it, over the owner's own SSH login.

Take: note which of gpukit's paths the host already had (a machine baked with gpukit's image has its venv),
and authorise the kit's key for the file's user, so glue's SSH, Ansible and the recovery code reach the
host as they reach any VM. Release: gpukit's units stopped, its processes and containers ended, /mnt/s3
unmounted, the paths gpukit created removed, the kit's key taken out again. Nothing else on the machine is
touched; the machine itself keeps running."""

from __future__ import annotations

import shlex

from glue.cloud.jumps import Jump
from glue.cloud.ssh import remote
from glue.cloud.ssh.hosts import HostEntry
from glue.errors import GlueError
from glue.train.state_paths import RUN_STATE_ROOT  # the attempts' pids files (StatePaths.pids)

KEY_MARK = "gpukit-kit-key"
# What the playbook and the runs leave on a host (ansible/roles/*, glue/runs/remote.py, glue.train's state).
PATHS = ("/etc/gpukit", "/usr/local/sbin/gpukit-mount", "/opt/gpukit", "/var/lib/gpukit/work",
         "/var/lib/gpukit/scratch", "/var/lib/gpukit/configured-from", "/var/lib/gpukit", "/var/cache/gpukit-rclone",
         "/etc/systemd/system/gpukit-*.service", "/etc/systemd/system/gpukit-*.socket",
         "/etc/tmpfiles.d/gpukit-*.conf", "/etc/ansible/facts.d/gpukit.fact", "/run/gpukit", "/mnt/s3",
         "/dev/shm/gpukit-envs")  # runs' environments unpacked into memory (glue.train.workspace.paths.MEMORY_ROOT)
MOUNT = "/mnt/s3"
VENV = "/opt/gpukit/venv"
WORK = "/var/lib/gpukit/work"  # runs' code and virtualenvs (glue.train.workspace.paths)
ENVS = "/var/lib/gpukit/envs"  # the sets' virtualenvs: a spare's warm process per run environment runs from one

_EXISTING = "for p in " + " ".join(PATHS) + '; do [ -e "$p" ] && echo "$p"; done; true'


def _key_line(public_key: str) -> str:
    return " ".join(public_key.split()[:2]) + f" {KEY_MARK}"


def _authorize(public_key: str) -> str:
    line = shlex.quote(_key_line(public_key))
    return ('umask 077; mkdir -p "$HOME/.ssh"; f="$HOME/.ssh/authorized_keys"; touch "$f"; '
            f'grep -qxF {line} "$f" || echo {line} >> "$f"')


def _unauthorize() -> str:
    return (f'f="$HOME/.ssh/authorized_keys"; [ -f "$f" ] || exit 0; grep -v " {KEY_MARK}$" "$f" > "$f.gpukit" '
            '|| true; cat "$f.gpukit" > "$f"; rm -f "$f.gpukit"')


def _release(before: list[str]) -> str:
    kept = " ".join(shlex.quote(p) for p in before)
    return "\n".join([
        f"kept=' {kept} '",
        # gpukit's units, but not those of the host's own (a gpukit image's first-boot unit, there before)
        "for u in $(systemctl list-units --all --plain --no-legend 'gpukit*' 2>/dev/null | awk '{print $1}'); do "
        'case "$kept" in *" /etc/systemd/system/$u "*) continue;; esac; '
        'systemctl disable --now "$u" >/dev/null 2>&1 || systemctl stop "$u" >/dev/null 2>&1 || true; done',
        # The attempts' supervisors and trainers (their pids files, and whatever runs from gpukit's venvs), with
        # their children and grandchildren (torchrun's workers run in sessions of their own).
        f"all=$( (cat {RUN_STATE_ROOT}/*/attempt-*.pids.json 2>/dev/null | grep -o '_pid\": *[0-9]*' "
        f"| grep -o '[0-9]*$'; pgrep -f '^({VENV}|{WORK}|{ENVS})/') | sort -u | tr '\\n' ' ')",
        "for p in $all; do for c in $(pgrep -P $p); do all=\"$all $c $(pgrep -P $c | tr '\\n' ' ')\"; done; done",
        '[ -z "${all# }" ] || kill -9 $all 2>/dev/null || true',
        "if command -v docker >/dev/null 2>&1; then ids=$(docker ps -aq --filter name=^gpukit- 2>/dev/null); "
        '[ -z "$ids" ] || docker rm -f $ids >/dev/null 2>&1; fi',
        f"if mountpoint -q {MOUNT}; then umount {MOUNT} 2>/dev/null || umount -l {MOUNT}; fi",
        f"chattr -i {MOUNT} 2>/dev/null || true",
        "for p in " + " ".join(PATHS) + '; do [ -e "$p" ] || continue; case "$kept" in *" $p "*) continue;; esac; '
        'rm -rf "$p" 2>/dev/null || echo "left $p"; done',
        "systemctl daemon-reload 2>/dev/null || true",
        # a unit that failed on its way down (rclone killed under its mount) is not remembered as failed
        "systemctl reset-failed 'gpukit*' 2>/dev/null || true",
    ])


def take(host: HostEntry, pinned: str, kit_public_key: str, via: Jump | None = None) -> list[str]:
    """Authorise the kit's key on the host; return gpukit's paths the host had before."""
    client = remote.connect(host, pinned, via=via)
    try:
        code, out, err = remote.run(client, host, remote.as_root(host, _EXISTING))
        if code != 0:
            raise GlueError(f"{host.id}: listing gpukit's paths failed: {err.strip()[-200:]}")
        code, _, err = remote.run(client, host, _authorize(kit_public_key))
        if code != 0:
            raise GlueError(f"{host.id}: authorising the kit's key for {host.user} failed: {err.strip()[-200:]}")
        return out.split()
    finally:
        client.close()


def release(host: HostEntry, pinned: str, before: list[str], via: Jump | None = None) -> list[str]:
    """Stop and remove what gpukit put on the host; return what could not be removed (in use)."""
    client = remote.connect(host, pinned, via=via)
    try:
        code, out, err = remote.run(client, host, remote.as_root(host, _release(before)), timeout=120)
        if code != 0:
            raise GlueError(f"{host.id}: releasing failed (exit {code}): {err.strip()[-200:]}")
        remote.run(client, host, _unauthorize())
        return [line.removeprefix("left ") for line in out.splitlines() if line.startswith("left ")]
    finally:
        client.close()
