"""A bootable disk made from a baked image, for VMs with their own kernel (the qemu backend).

The disk is an ext4 filesystem holding the image's root filesystem (`mke2fs -d`: no mount, no loop
device), as a sparse raw file cached next to the image it was made from
(`<cache>/<name>-<hash16>/disk-<hash16>[-docker<seed8>]-<size>g.ext4`): the image directory is keyed
by the recipe's hash, so the disk is too. An image that bakes Docker also gets the trainer's Docker
base already imported (glue.images.docker_seed, named by its fingerprint): mke2fs then reads a
hard-linked copy of the root filesystem with that data root added at /var/lib/docker. The disk is
written under another name and renamed into place only when complete, under a lock, so a killed or
failed build never leaves a disk that looks finished. VMs never write to it: each boots a
copy-on-write overlay of it. The kernel and initrd come from the image's /boot (direct kernel boot).
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from glue.errors import GlueError
from glue.images import docker_seed
from glue.images.cache import Image

# Tools and the Debian package each comes from (bootstrap installs them).
TOOLS = {"mke2fs": "e2fsprogs"}
DISK_GB = 10


@dataclass(frozen=True)
class BootDisk:
    disk: Path      # raw ext4, read-only to VMs
    kernel: Path
    initrd: Path


def check_tools() -> None:
    for binary, package in TOOLS.items():
        if shutil.which(binary, path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
            raise GlueError(f"{binary} is missing: install the Debian package {package} (`make bootstrap` does)")


def _newest(boot: Path, prefix: str, image: Image) -> Path:
    found = sorted(boot.glob(f"{prefix}-*"))
    if not found:
        raise GlueError(f"image {image.name} {image.hash[:16]} has no {prefix} in /boot: its recipe must install a "
                        "kernel (linux-image-cloud-amd64) for VMs that boot their own; rebake with `glue image build`")
    return found[-1]


def _base(image: Image) -> docker_seed.Base | None:
    return docker_seed.base() if docker_seed.wanted(image) else None


def disk_path(image: Image, size_gb: int = DISK_GB, base: docker_seed.Base | None = None) -> Path:
    base = base or _base(image)
    seed = f"-docker{base.fingerprint}" if base else ""
    return image.path / f"disk-{image.hash[:16]}{seed}-{size_gb}g.ext4"


def boot_disk(image: Image, size_gb: int = DISK_GB) -> BootDisk:
    """The image's boot disk, made now if not cached; its kernel and initrd."""
    kernel = _newest(image.rootfs / "boot", "vmlinuz", image)
    initrd = _newest(image.rootfs / "boot", "initrd.img", image)
    base = _base(image)
    final = disk_path(image, size_gb, base)
    if not final.is_file():
        check_tools()
        with open(image.path / ".disk.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not final.is_file():
                _make(image, final, size_gb, base)
    return BootDisk(disk=final, kernel=kernel, initrd=initrd)


def _source_tree(image: Image, work: Path, base: docker_seed.Base | None) -> Path:
    """What mke2fs copies: the image's root filesystem, plus the Docker base where the image bakes Docker."""
    if base is None:
        return image.rootfs
    tree = work / "root"
    docker_seed.import_base(image, work / "docker", base)
    # Hard links: no copy of the image's bytes, and mke2fs only reads them.
    copy = subprocess.run(["cp", "-al", str(image.rootfs), str(tree)], capture_output=True, text=True,
                          check=False, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"})
    if copy.returncode != 0:
        raise GlueError(f"making the boot disk of image {image.name} failed: {copy.stderr.strip()[-300:]}")
    shutil.rmtree(tree / "var" / "lib" / "docker", ignore_errors=True)
    (work / "docker").rename(tree / "var" / "lib" / "docker")
    return tree


def _make(image: Image, final: Path, size_gb: int, base: docker_seed.Base | None) -> None:
    partial = final.with_name(f".{final.name}.{os.getpid()}.partial")
    work = image.path / f".disk-work.{os.getpid()}.partial"
    for stale in [*image.path.glob(f".{final.name}.*.partial"), *image.path.glob(".disk-work.*.partial")]:
        # a killed build's leftover (we hold the lock)
        shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)
    try:
        source = _source_tree(image, work, base)
        with open(partial, "wb") as fh:
            fh.truncate(size_gb << 30)  # sparse
        # -i 65536: fewer inodes than the default (the image has ~100k files); itables written now, so the
        # guest kernel does not zero them in the background under emulation.
        proc = subprocess.run(
            ["mke2fs", "-q", "-F", "-t", "ext4", "-L", "gpukit-root", "-i", "65536",
             "-E", "lazy_itable_init=0,lazy_journal_init=0", "-d", str(source), str(partial)],
            capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8"},
        )
        if proc.returncode != 0:
            if "No space left" in proc.stderr:
                raise OSError(errno.ENOSPC, "No space left on device")
            tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            raise GlueError(f"making the boot disk of image {image.name} failed: {tail[:300]}")
        partial.rename(final)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise GlueError(f"disk full while making the boot disk of image {image.name}; nothing was cached "
                            f"(free space under {image.path})") from None
        raise
    finally:
        partial.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)
