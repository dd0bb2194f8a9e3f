"""Image recipes and the image cache: the content hash follows every byte of the recipe, the cache
holds only finished images, and bad recipes or a missing tool are one clear line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from glue.errors import GlueError
from glue.images import build, cache, recipe

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def recipes(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "images" / "gpukit", tmp_path / "gpukit")
    return tmp_path


def test_shipped_recipe_loads() -> None:
    rec = recipe.load("gpukit")
    for pkg in ("systemd-sysv", "openssh-server", "fuse3", "python3", "docker.io"):
        assert pkg in rec.packages
    assert rec.venv_path == "/opt/gpukit/venv" and any(r.startswith("torch==") for r in rec.venv_requirements)
    assert rec.customize.is_file() and (rec.files / "usr/local/sbin/gpukit-firstboot").is_file()


def test_hash_changes_with_any_recipe_byte_and_only_then(recipes: Path) -> None:
    first = recipe.load("gpukit", recipes).content_hash()
    assert recipe.load("gpukit", recipes).content_hash() == first
    unit = recipes / "gpukit/files/etc/systemd/system/gpukit-firstboot.service"
    unit.write_text(unit.read_text() + "\n# changed\n")
    second = recipe.load("gpukit", recipes).content_hash()
    assert second != first
    (recipes / "gpukit/customize.sh").chmod(0o644)
    assert recipe.load("gpukit", recipes).content_hash() != second


def test_bad_recipes_are_one_line(recipes: Path) -> None:
    with pytest.raises(GlueError, match="no image recipe 'nope'"):
        recipe.load("nope", recipes)
    path = recipes / "gpukit/recipe.yaml"
    path.write_text(path.read_text().replace("  - fuse3", "  - 'Fuse3; rm -rf /'"))
    with pytest.raises(GlueError, match="is not a Debian package name"):
        recipe.load("gpukit", recipes)
    path.write_text("packages: [fuse3\n  bad: [")
    with pytest.raises(GlueError, match=r"recipe.yaml is not valid YAML at line \d+, column \d+: "):
        recipe.load("gpukit", recipes)


def _fake_entry(root: Path, rec: recipe.Recipe, digest: str, complete: bool) -> Path:
    entry = cache.entry_dir(root, rec, digest)
    (entry / "rootfs/etc").mkdir(parents=True)
    if complete:
        (entry / cache.META).write_text(json.dumps({"name": rec.name, "hash": digest, "size_bytes": 1000,
                                                    "build_seconds": 3.5, "built_at": "2026-01-01T00:00:00Z"}))
    return entry


def test_cache_holds_only_finished_images(tmp_path: Path, recipes: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUKIT_IMAGES", str(tmp_path / "cache"))
    root = cache.cache_dir(tmp_path)
    rec = recipe.load("gpukit", recipes)
    digest = rec.content_hash()
    _fake_entry(root, rec, "0" * 64, complete=False)  # a build without its image.json
    (root / f".build-gpukit-{digest[:16]}-1/rootfs").mkdir(parents=True)
    assert cache.list_images(root) == [] and cache.lookup(root, rec, digest) is None
    damaged = _fake_entry(root, rec, "1" * 64, complete=False)
    for text in ("{}", "[]", '{"name": "gpukit", "hash": "x", "size_bytes": "big"}'):  # JSON, not ours
        (damaged / cache.META).write_text(text)
        assert cache.list_images(root) == [], text
    _fake_entry(root, rec, digest, complete=True)
    found = cache.lookup(root, rec, digest)
    assert found is not None and found.rootfs.is_dir()
    # A cached image is returned without baking (nothing runs: mmdebstrap need not even exist).
    monkeypatch.setenv("PATH", "/nonexistent")
    image, baked = build.build(rec, tmp_path)
    assert (image.hash, baked) == (digest, False)


def test_missing_mmdebstrap_is_one_line_naming_the_package(tmp_path: Path, recipes: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUKIT_IMAGES", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(GlueError, match="install the Debian package mmdebstrap"):
        build.build(recipe.load("gpukit", recipes), tmp_path)
    assert not any((tmp_path / "cache").glob("gpukit-*"))


def test_image_list_json_and_help(tmp_path: Path) -> None:
    env = {**os.environ, "GPUKIT_HOME": str(tmp_path), "GPUKIT_IMAGES": str(tmp_path / "images")}
    for args in (["image", "--help"], ["image", "build", "--help"], ["image", "list", "--help"]):
        out = subprocess.run([sys.executable, "-m", "glue.cli", *args], env=env, capture_output=True, text=True)
        assert out.returncode == 0 and "Usage:" in out.stdout
    out = subprocess.run([sys.executable, "-m", "glue.cli", "image", "list", "--json"], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0 and json.loads(out.stdout) == []
    out = subprocess.run([sys.executable, "-m", "glue.cli", "image", "build", "--name", "nope"], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == ["Error: no image recipe 'nope' (known: gpukit)"]


def test_a_bad_vm_size_fails_glue_up_in_one_line_before_any_bake(tmp_path: Path) -> None:
    env = {**os.environ, "GPUKIT_HOME": str(tmp_path / "home"), "GPUKIT_IMAGES": str(tmp_path / "images"),
           "GPUKIT_VM_MEMORY_GB": "lots"}
    out = subprocess.run([sys.executable, "-m", "glue.cli", "up", "--vms", "1"], env=env, capture_output=True,
                         text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines()[-1] == \
        "Error: GPUKIT_VM_MEMORY_GB='lots': use a whole number from 1 to 4096, or unset it for no limit"
    assert not (tmp_path / "images").exists() or not any((tmp_path / "images").iterdir())  # nothing baked
    assert not list((tmp_path / "home").glob("terraform/*/terraform.tfstate"))  # nothing created


def _write_recipe(recipes: Path, text: str) -> None:
    (recipes / "gpukit/recipe.yaml").write_text(text)


@pytest.mark.parametrize(("text", "line"), [
    ("foo: 1\n", "unknown key 'foo'; known keys: name, suite, variant, packages, venv, rclone"),
    ("packages: [dbus]\nvenv: {path: /opt/v, requirements: [numpy], pth: /x}\n",
     "unknown key 'venv.pth'; known keys under venv: path, requirements"),
    ("suite: bookworm\n", "missing key 'packages' (required: packages)"),
    ("packages: []\n", "packages is empty: list at least one"),
    ("packages: dbus\n", "packages: must be a list (got 'dbus')"),
    ("packages: [dbus]\nvenv: {path: /opt/v}\n", "missing key 'venv.requirements' (required: path, requirements)"),
    ("packages: [dbus]\nvenv: {path: '/opt/v; rm -rf /', requirements: [numpy]}\n",
     "venv.path: '/opt/v; rm -rf /' is not an absolute path in the image"),
    ("packages: [dbus]\nrclone: /../../usr/bin/rclone\n", "rclone: '/../../usr/bin/rclone' is not an absolute path"),
    ("packages: [dbus]\nvenv: {path: /opt/v, requirements: ['--index-url=http://x']}\n",
     "venv.requirements.0: '--index-url=http://x' is not a requirement"),
    ("packages: [dbus]\nname: other\n", "name 'other' must be the recipe's folder name 'gpukit'"),
])
def test_recipe_keys_are_checked(recipes: Path, text: str, line: str) -> None:
    _write_recipe(recipes, text)
    with pytest.raises(GlueError) as info:
        recipe.load("gpukit", recipes)
    assert str(info.value).startswith(f"{recipes / 'gpukit/recipe.yaml'}: {line}"), str(info.value)
    assert "\n" not in str(info.value)


def test_a_minimal_recipe_loads(recipes: Path) -> None:
    _write_recipe(recipes, "packages: [systemd-sysv, openssh-server]\n")
    rec = recipe.load("gpukit", recipes)
    assert (rec.suite, rec.variant, rec.packages, rec.venv_path, rec.rclone_path) == \
        ("bookworm", "apt", ("systemd-sysv", "openssh-server"), None, None)


@pytest.mark.parametrize("name", ["../images/gpukit", "gpukit/", "..", ".hidden", "a/b", ""])
def test_a_recipe_name_is_never_a_path(recipes: Path, name: str) -> None:
    with pytest.raises(GlueError) as info:
        recipe.load(name, recipes)
    assert str(info.value) == (f"image recipe name {name!r} is not a recipe's name (a folder of {recipes}, "
                               "no '/' or '..'; known: gpukit)")


def test_image_build_refuses_a_path_as_name(tmp_path: Path) -> None:
    env = {**os.environ, "GPUKIT_HOME": str(tmp_path), "GPUKIT_IMAGES": str(tmp_path / "images")}
    out = subprocess.run([sys.executable, "-m", "glue.cli", "image", "build", "--name", "../images/gpukit"],
                         env=env, capture_output=True, text=True)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        f"Error: image recipe name '../images/gpukit' is not a recipe's name (a folder of {ROOT / 'images'}, "
        "no '/' or '..'; known: gpukit)"]
    assert not (tmp_path / "images").exists()


@pytest.mark.parametrize("where", ["file", "below a file"])
def test_an_images_path_that_is_a_file_is_one_line(tmp_path: Path, recipes: Path, monkeypatch: pytest.MonkeyPatch,
                                                   where: str) -> None:
    afile = tmp_path / "afile"
    afile.write_text("keep me\n")
    path = afile if where == "file" else afile / "cache"
    monkeypatch.setenv("GPUKIT_IMAGES", str(path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # unset GPUKIT_IMAGES: the machine's cache
    line = (f"GPUKIT_IMAGES={str(path)!r}: cannot use {path} as a directory (a file is in the way); point "
            f"GPUKIT_IMAGES at a directory you can write, or unset it (the cache is then "
            f"{tmp_path / 'xdg' / 'gpukit' / 'images'})")
    with pytest.raises(GlueError) as info:
        build.build(recipe.load("gpukit", recipes), tmp_path)
    assert str(info.value) == line
    with pytest.raises(GlueError) as info:
        cache.cache_dir(tmp_path)
    assert str(info.value) == line
    env = {**os.environ, "GPUKIT_HOME": str(tmp_path / "home"), "GPUKIT_IMAGES": str(path)}
    cli_line = "Error: " + line
    for args in (["image", "list"], ["image", "list", "--json"], ["image", "build"]):
        out = subprocess.run([sys.executable, "-m", "glue.cli", *args], env=env, capture_output=True, text=True)
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.strip().splitlines() == [cli_line]
    assert afile.read_text() == "keep me\n"


def test_an_images_path_that_cannot_be_made_is_one_line(tmp_path: Path, recipes: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUKIT_IMAGES", "/proc/gpukit-nope")
    monkeypatch.setattr(build, "check_tools", lambda: None)
    with pytest.raises(GlueError, match=r"^GPUKIT_IMAGES='/proc/gpukit-nope': cannot use /proc/gpukit-nope as a "
                                        r"directory \(no such file or directory\); point GPUKIT_IMAGES at"):
        build.build(recipe.load("gpukit", recipes), tmp_path)


def _holder(*argv: str, hold: Path | None = None) -> subprocess.Popen[str]:
    """A process that stands for a VM: the path on its command line, or a file open under it."""
    code = "import sys, time\nf = open(sys.argv[1]) if sys.argv[1] != '-' else None\nprint('ready', flush=True)\n" \
           "time.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", code, str(hold) if hold else "-", *argv], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def _cached(tmp_path: Path, recipes: Path, monkeypatch: pytest.MonkeyPatch,
            ) -> tuple[Path, recipe.Recipe, str, Path]:
    """A complete cached image of the gpukit recipe in a cache of its own: (cache, recipe, hash, entry)."""
    monkeypatch.setenv("GPUKIT_IMAGES", str(tmp_path / "cache"))
    root = cache.cache_dir(tmp_path)
    rec = recipe.load("gpukit", recipes)
    digest = rec.content_hash()
    return root, rec, digest, _fake_entry(root, rec, digest, complete=True)


@pytest.mark.parametrize("how", ["open file", "command line"])
def test_force_never_removes_an_image_a_running_vm_uses(tmp_path: Path, recipes: Path,
                                                        monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    root, rec, digest, entry = _cached(tmp_path, recipes, monkeypatch)
    (entry / "disk-x-10g.ext4").write_text("")
    baked: list[str] = []
    monkeypatch.setattr(build, "check_tools", lambda: None)
    monkeypatch.setattr(build, "_bake", lambda *a: baked.append("bake"))
    holder = (_holder(hold=entry / "disk-x-10g.ext4") if how == "open file" else
              _holder("-name", "gpukit-1", "-kernel", str(entry / "rootfs/boot/vmlinuz")))
    try:
        who = f"pid {holder.pid} (python" if how == "open file" else "python"
        with pytest.raises(GlueError) as info:
            build.build(rec, tmp_path, force=True)
    finally:
        holder.kill()
        holder.wait()
    assert str(info.value).startswith(f"image gpukit {digest[:16]} is in use by ")
    assert str(info.value).endswith(": `glue down` first (in each kit home whose VMs boot it), then bake again; "
                                    "the cached image was kept")
    assert who in str(info.value)
    assert baked == [] and cache.lookup(root, rec, digest) is not None and (entry / "disk-x-10g.ext4").exists()


def test_vm_users_are_named_and_mounts_count(tmp_path: Path) -> None:
    """A local VM's overlay (the image's rootfs as its lower layer) shows in its mount namespace."""
    entry = tmp_path / "cache/gpukit-0123456789abcdef"
    proc = tmp_path / "proc"

    def fake(pid: int, argv: list[str], ns: str, mounts: str) -> None:
        d = proc / str(pid)
        (d / "ns").mkdir(parents=True)
        (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        (d / "ns/mnt").symlink_to(f"mnt:[{ns}]")
        (d / "mountinfo").write_text(mounts)

    host = "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
    overlay = f"900 22 0:77 / {tmp_path}/vm/root rw - overlay overlay rw,lowerdir={entry}/rootfs,upperdir=/u\n"
    fake(10, ["/usr/bin/sleep", "60"], "1", host)
    fake(11, ["systemd-nspawn", "--quiet", "--boot", "--machine=gpukit-2"], "2", host + overlay)
    fake(12, ["/usr/lib/systemd/systemd"], "3", overlay)
    fake(13, ["sshd"], "3", overlay)  # the same namespace: counted once
    assert build.users(entry, proc) == ["gpukit-2"]
    assert build.users(Path(f"{entry}0"), proc) == []  # another image's directory
    (proc / "11").rename(proc / "14")
    (proc / "14/cmdline").write_bytes(b"unshare\0")
    assert build.users(entry, proc) == ["pid 12 (systemd)", "pid 14 (unshare)"]


def test_force_rebakes_an_unused_image_and_refuses_one_booted_during_the_bake(
        tmp_path: Path, recipes: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, rec, _, entry = _cached(tmp_path, recipes, monkeypatch)
    (entry / "rootfs/etc/old").write_text("")

    def bake(_rec: recipe.Recipe, _digest: str, work: Path, _step: object) -> None:
        (work / "rootfs/etc").mkdir(parents=True)
        (work / "rootfs/etc/new").write_text("")
        (work / cache.META).write_text((entry / cache.META).read_text())

    monkeypatch.setattr(build, "check_tools", lambda: None)
    monkeypatch.setattr(build, "_bake", bake)
    image, baked = build.build(rec, tmp_path, force=True)
    assert baked and (image.rootfs / "etc/new").exists() and not (image.rootfs / "etc/old").exists()
    looks = iter([[], ["gpukit-1"]])  # nothing uses it before the bake; a VM boots it meanwhile
    monkeypatch.setattr(build, "users", lambda _entry: next(looks))
    with pytest.raises(GlueError, match="is in use by gpukit-1: "):
        build.build(rec, tmp_path, force=True)
    assert (entry / "rootfs/etc/new").exists() and not list(root.glob(".build-*"))


def test_a_build_removes_only_its_own_recipes_leftovers(tmp_path: Path, recipes: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUKIT_IMAGES", str(tmp_path / "cache"))
    root = tmp_path / "cache"
    mine, other = root / f".build-gpukit-{'a' * 16}-1", root / f".build-gpukit-extra-{'b' * 16}-2"
    for d in (mine, other):
        d.mkdir(parents=True)
    monkeypatch.setattr(build, "check_tools", lambda: None)

    def bake(*_a: object) -> None:
        raise GlueError("stop")

    monkeypatch.setattr(build, "_bake", bake)
    with pytest.raises(GlueError, match="stop"):
        build.build(recipe.load("gpukit", recipes), tmp_path)
    assert not mine.exists() and other.is_dir()  # another recipe's build in progress is not a leftover


def test_every_kit_home_shares_the_machines_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset GPUKIT_IMAGES: one cache per user of the machine (a second clone, `make demo`'s own kit home
    and `make up`'s bake nothing the first baked); XDG_CACHE_HOME moves it, a relative one is ignored."""
    monkeypatch.delenv("GPUKIT_IMAGES", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    expected = tmp_path / "xdg" / "gpukit" / "images"
    assert cache.cache_dir(tmp_path / "clone1" / ".gpukit") == cache.cache_dir(tmp_path / "clone2" / ".gpukit") \
        == expected
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert cache.cache_dir(tmp_path) == Path.home() / ".cache" / "gpukit" / "images"
    monkeypatch.setenv("GPUKIT_IMAGES", str(tmp_path / "mine"))
    assert cache.cache_dir(tmp_path) == tmp_path / "mine"
