"""The boot disk qemu VMs boot from: made once from the image with the real mke2fs, cached next to it
under a name carrying the image's hash, never cached half-made; an image without a kernel is one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from glue.errors import GlueError
from glue.images import cache, disk


def _image(tmp_path: Path, kernel: bool = True) -> cache.Image:
    entry = tmp_path / "gpukit-0123456789abcdef"
    boot = entry / "rootfs" / "boot"
    boot.mkdir(parents=True)
    (entry / "rootfs" / "etc").mkdir()
    (entry / "rootfs" / "etc" / "hostname").write_text("image\n")
    if kernel:
        (boot / "vmlinuz-6.1.0-1-cloud-amd64").write_bytes(b"kernel")
        (boot / "initrd.img-6.1.0-1-cloud-amd64").write_bytes(b"initrd")
    (entry / cache.META).write_text(json.dumps({"name": "gpukit", "hash": "0123456789abcdef" * 4, "size_bytes": 1,
                                                "build_seconds": 1, "built_at": "now", "packages": []}))
    image = cache.read(entry)
    assert image is not None
    return image


def test_made_once_with_the_image_inside_and_cached_by_hash(tmp_path: Path) -> None:
    image = _image(tmp_path)
    boot = disk.boot_disk(image, size_gb=1)
    assert boot.disk.name == "disk-0123456789abcdef-1g.ext4" and boot.disk.parent == image.path
    assert boot.kernel.name == "vmlinuz-6.1.0-1-cloud-amd64" and boot.initrd.name.startswith("initrd.img-")
    listing = subprocess.run(["debugfs", "-R", "cat /etc/hostname", str(boot.disk)], capture_output=True, text=True)
    assert listing.stdout == "image\n"
    mtime = boot.disk.stat().st_mtime_ns
    assert disk.boot_disk(image, size_gb=1).disk.stat().st_mtime_ns == mtime  # cached: not made again
    assert [p.name for p in image.path.glob(".*partial")] == []


def test_a_failed_build_caches_nothing(tmp_path: Path) -> None:
    image = _image(tmp_path)
    with pytest.raises(GlueError, match="making the boot disk of image gpukit failed"):
        disk.boot_disk(image, size_gb=0)  # an empty device: mke2fs refuses it
    assert not disk.disk_path(image, 0).exists()
    assert [p.name for p in image.path.iterdir() if "disk-" in p.name] == []


def test_an_image_without_a_kernel_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(GlueError, match=r"has no vmlinuz in /boot: .*linux-image-cloud-amd64"):
        disk.boot_disk(_image(tmp_path, kernel=False), size_gb=1)
