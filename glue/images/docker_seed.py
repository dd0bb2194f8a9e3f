"""The trainer's Docker base image, imported natively once per boot disk rather than on every VM.

A `runtime: docker` run on a VM without network builds its trainer image on a base imported from the
VM's own root filesystem (the trainer role, tasks/image-build.yml). Under emulation (qemu, TCG) that
import pushes ~1.2 GB through tar, Docker's digest and untar at 1-3 MB/s: about half an hour per VM,
repeated by every recovery. Here the image's own dockerd runs at native speed in a throwaway
systemd-nspawn container of the image (a volatile root: the cached image is never written), imports
the same tree with the role's own excludes, and its data root (overlay2) is what the boot disk gets
at /var/lib/docker: every VM booted from that disk starts with the base, and the role finds it there.
Only images that bake Docker get it.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from glue.errors import GlueError
from glue.images.cache import Image
from glue.paths import PROJECT_ROOT

# The trainer role's defaults: the base's tag and what the base leaves out (one list, used by both).
ROLE_DEFAULTS = PROJECT_ROOT / "ansible" / "roles" / "trainer" / "defaults" / "main.yml"
TOOLS = {"systemd-nspawn": "systemd-container", "unshare": "util-linux", "setpriv": "util-linux"}
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8"}
# Bump when what the seed puts on a disk changes in a way the role's defaults do not show.
SEED_VERSION = "1"
# What a Docker data root needs to know an image: the rest (networks, buildkit, containerd's state) the
# VM's daemon makes itself at its first start.
DATA_ROOT_KEPT = ("image", "overlay2")
IMPORT_TIMEOUT_S = 1800

# A private mount namespace (nspawn's propagation directory must be on tmpfs; the host's /run may not
# be) and a PID namespace whose first process is killed when unshare ends (--kill-child), and unshare
# when glue ends (setpriv --pdeathsig): killing nspawn alone would leave the container's processes
# running and writing into the work directory; killing the namespace's first process takes them all.
_UNSHARE = ["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--kill-child", "--mount-proc"]
_LAUNCH = ('set -e; mkdir -p /run/systemd/nspawn; mount -t tmpfs -o mode=0755 tmpfs /run/systemd/nspawn; '
           'exec systemd-nspawn "$@"')
# PID 1 of the throwaway container: the image's dockerd on a private socket, no networking of its own,
# then tar | docker import of the image's tree (bound read-only at /mnt/base) with the excludes.
_IMPORT = r"""
set -u -o pipefail
tag=$1; shift
sock=unix:///run/gpukit-seed.sock
dockerd --host "$sock" --data-root /var/lib/docker --storage-driver overlay2 --iptables=false \
  --ip6tables=false --ip-forward=false --ip-masq=false --bridge=none >/run/dockerd.log 2>&1 &
daemon=$!
for _ in $(seq 600); do
  docker -H "$sock" version >/dev/null 2>&1 && break
  kill -0 "$daemon" 2>/dev/null || break
  sleep 0.1
done
if ! docker -H "$sock" version >/dev/null 2>&1; then
  tail -n 3 /run/dockerd.log >&2; echo "the image's dockerd did not start" >&2; exit 1
fi
excludes=(); for p in "$@"; do excludes+=("--exclude=.$p"); done
tar -C /mnt/base --one-file-system --numeric-owner -cf - "${excludes[@]}" . | docker -H "$sock" import - "$tag"
status=("${PIPESTATUS[@]}")
kill "$daemon"; wait "$daemon"
[ "${status[0]}" -eq 0 ] && [ "${status[1]}" -eq 0 ]
"""


def wanted(image: Image) -> bool:
    """Whether the image bakes Docker (then its disks carry the trainer base)."""
    return (image.rootfs / "usr" / "sbin" / "dockerd").is_file()


@dataclass(frozen=True)
class Base:
    """What the base is made from, read once: the disk's name and its content come from the same read."""
    tag: str
    excludes: tuple[str, ...]

    @property
    def fingerprint(self) -> str:
        """A new tag, exclude list or seed makes a new disk."""
        return hashlib.sha256("\n".join([SEED_VERSION, self.tag, *self.excludes]).encode()).hexdigest()[:8]


def base() -> Base:
    """The trainer role's defaults. An override in group_vars does not reach the disk (see docs/qemu.md)."""
    defaults = yaml.safe_load(ROLE_DEFAULTS.read_text())
    return Base(str(defaults["trainer_base_image"]), tuple(str(p) for p in defaults["trainer_base_excludes"]))


def check_tools() -> None:
    for binary, package in TOOLS.items():
        if shutil.which(binary, path=ENV["PATH"]) is None:
            raise GlueError(f"{binary} is missing: install the Debian package {package} (`make bootstrap` does)")


def import_base(image: Image, data_root: Path, spec: Base) -> str:
    """Import the trainer base into a fresh Docker data root at `data_root` (left with only what a VM's
    daemon needs); returns the base's image id."""
    check_tools()
    tag = spec.tag
    data_root.mkdir(parents=True)
    nspawn = ["--quiet", "--register=no", "--keep-unit", "--volatile=overlay", "--resolv-conf=off",
              "--timezone=off", "--link-journal=no", f"--directory={image.rootfs}",
              f"--bind={data_root}:/var/lib/docker", f"--bind-ro={image.rootfs}:/mnt/base",
              "/bin/bash", "-c", _IMPORT, "bash", tag, *spec.excludes]
    try:
        proc = subprocess.run(["setpriv", "--pdeathsig", "KILL", *_UNSHARE, "sh", "-c", _LAUNCH, "sh", *nspawn],
                              capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL, env=ENV,
                              timeout=IMPORT_TIMEOUT_S)
    except subprocess.TimeoutExpired:  # run() has killed nspawn: the container and its mounts are gone
        raise GlueError(f"importing the Docker base {tag} for image {image.name} took over {IMPORT_TIMEOUT_S} s "
                        "(~15 s on an idle 2-core host); nothing was cached: retry on a less busy host") from None
    image_id = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    if proc.returncode != 0 or not image_id.startswith("sha256:"):
        # nspawn relays the container's own errors (a failed exec) on stdout
        tail = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines()
                or [f"exit {proc.returncode}"])[-1]
        raise GlueError(f"importing the Docker base {tag} for image {image.name} failed: {tail[:300]}")
    for entry in data_root.iterdir():
        if entry.name not in DATA_ROOT_KEPT:
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    return image_id
