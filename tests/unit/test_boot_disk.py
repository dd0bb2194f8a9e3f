"""The boot disk qemu VMs boot from: made once from the image with the real mke2fs, cached next to it
under a name carrying the image's hash, never cached half-made; an image without a kernel is one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from glue.errors import GlueError
from glue.images import cache, disk, docker_seed


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


def _docker_image(tmp_path: Path) -> cache.Image:
    image = _image(tmp_path)
    (image.rootfs / "usr" / "sbin").mkdir(parents=True)
    (image.rootfs / "usr" / "sbin" / "dockerd").write_text("#!/bin/sh\nexit 1\n")
    return image


def test_an_image_with_docker_gets_a_disk_named_for_its_docker_base(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    plain = disk.disk_path(_image(tmp_path / "plain"), 1)
    image = _docker_image(tmp_path / "docker")
    seeded = disk.disk_path(image, 1)
    assert plain.name == "disk-0123456789abcdef-1g.ext4"
    assert seeded.name == f"disk-0123456789abcdef-docker{docker_seed.base().fingerprint}-1g.ext4"
    # The trainer role's exclude list is the base's recipe: changing it names another disk.
    defaults = tmp_path / "main.yml"
    defaults.write_text(docker_seed.ROLE_DEFAULTS.read_text().replace(
        "trainer_base_excludes:\n", "trainer_base_excludes:\n  - /usr/share/info\n"))
    monkeypatch.setattr(docker_seed, "ROLE_DEFAULTS", defaults)
    assert disk.disk_path(image, 1) != seeded


def test_a_docker_base_that_cannot_be_imported_caches_nothing(tmp_path: Path) -> None:
    image = _docker_image(tmp_path)  # no OS in it: the throwaway container cannot start
    with pytest.raises(GlueError, match=r"importing the Docker base gpukit-base:vm for image gpukit failed: "):
        disk.boot_disk(image, size_gb=1)
    assert [p.name for p in image.path.iterdir() if "disk-" in p.name] == []
    assert sorted(p.name for p in image.rootfs.rglob("*")) == ["boot", "dockerd", "etc", "hostname",
                                                              "initrd.img-6.1.0-1-cloud-amd64", "sbin", "usr",
                                                              "vmlinuz-6.1.0-1-cloud-amd64"]


def test_a_docker_base_import_that_overruns_is_one_line_and_caches_nothing(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    image = _docker_image(tmp_path)
    monkeypatch.setattr(docker_seed, "IMPORT_TIMEOUT_S", 0.001)  # no container starts that fast
    with pytest.raises(GlueError, match=r"took over 0.001 s .*nothing was cached"):
        disk.boot_disk(image, size_gb=1)
    assert [p.name for p in image.path.iterdir() if "disk-" in p.name] == []


def test_the_docker_base_lands_on_the_disk_and_the_cached_image_is_untouched(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    image = _docker_image(tmp_path)
    (image.rootfs / "var" / "lib" / "docker").mkdir(parents=True)
    (image.rootfs / "var" / "lib" / "docker" / "keep").write_text("the image's own\n")

    def fake_import(img: cache.Image, data_root: Path, base: docker_seed.Base) -> str:
        (data_root / "image").mkdir(parents=True)
        (data_root / "image" / "marker").write_text(f"{base.tag}\n")
        return "sha256:" + "0" * 64

    monkeypatch.setattr(docker_seed, "import_base", fake_import)  # the real one needs a whole OS (test_qemu)
    boot = disk.boot_disk(image, size_gb=1)

    def on_disk(path: str) -> str:
        return subprocess.run(["debugfs", "-R", f"cat {path}", str(boot.disk)], capture_output=True,
                              text=True).stdout

    assert on_disk("/var/lib/docker/image/marker") == "gpukit-base:vm\n"
    assert on_disk("/var/lib/docker/keep") == "" and on_disk("/etc/hostname") == "image\n"
    # The hard-linked copy is gone: the image's files are as before, with one link each.
    assert (image.rootfs / "var" / "lib" / "docker" / "keep").read_text() == "the image's own\n"
    assert {p.stat().st_nlink for p in image.rootfs.rglob("*") if p.is_file()} == {1}
    assert [p.name for p in image.path.iterdir() if p.name.startswith(".disk-work")] == []
