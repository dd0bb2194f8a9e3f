"""Bake an image from its recipe: mmdebstrap (Debian packages only), the recipe's files, the kit's
rclone, a venv of heavy Python dependencies, then customize.sh inside the root filesystem.

One build per recipe at a time (a lock file); the result enters the cache by an atomic rename, and a
build that fails for any reason (a missing package, a full disk, Ctrl-C) leaves nothing behind. A
cached image that a running VM boots (its overlay's lower layer, its boot disk) is never removed: a
forced rebake of it is refused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from glue.errors import GlueError
from glue.images import cache
from glue.images.cache import Image
from glue.images.recipe import Recipe

# Tools and the Debian package that provides each (bootstrap installs them).
TOOLS = {"mmdebstrap": "mmdebstrap"}
# mmdebstrap's own hook directory: dpkg under eatmydata (no fsync per file; a bake that dies is never
# cached anyway). ~1/3 off the package install here; its customize hook removes eatmydata again.
_EATMYDATA_HOOKS = Path("/usr/share/mmdebstrap/hooks/eatmydata")
# Bytecode is compiled for everything a VM may import, not for the packages' own test suites
# (tests/ and test/ directories: 1/5 of the .py files). Not torch/testing/_internal: `import torch`
# imports parts of it.
_NO_BYTECODE = r"/tests?/"
# The environment every build step runs in: nothing of the controller's beyond these.
_ENV_KEEP = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
_CHROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_MISSING = re.compile(r"Unable to locate package (\S+)|Package '?([^' ]+)'? has no installation candidate")

Step = Callable[[str], None]


def _env(**extra: str) -> dict[str, str]:
    env = {"PATH": _CHROOT_PATH, "LC_ALL": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"}
    env.update({k: v for k, v in os.environ.items() if k in _ENV_KEEP})
    env.update(extra)
    return env


def check_tools() -> None:
    for binary, package in TOOLS.items():
        if shutil.which(binary) is None:
            raise GlueError(f"{binary} is missing: install the Debian package {package} (`make bootstrap` does)")


def du(path: Path) -> int:
    """Bytes used under path, hard links counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            st = os.lstat(os.path.join(root, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


@contextmanager
def _locked(cache_root: Path, name: str) -> Iterator[None]:
    with open(cache_root / f".lock-{name}", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _run(cmd: list[str], log: Path, what: str, stdin: Path | None = None, env: dict[str, str] | None = None) -> None:
    with open(log, "ab") as out, open(stdin or os.devnull, "rb") as inp:
        out.write(f"$ {' '.join(cmd)}\n".encode())
        out.flush()
        rc = subprocess.run(cmd, stdin=inp, stdout=out, stderr=subprocess.STDOUT, env=env or _env(),
                            check=False).returncode
    if rc != 0:
        text = log.read_text(errors="replace")
        missing = [a or b for a, b in _MISSING.findall(text)]
        if missing:
            raise GlueError(f"image recipe package {missing[0]!r} does not exist in the Debian archive")
        if "No space left on device" in text:
            raise OSError(errno.ENOSPC, "No space left on device")
        tail = [ln for ln in text.strip().splitlines() if ln.strip()][-1:] or [f"exit {rc}"]
        kept = log.parent.parent / f"{log.parent.name.removeprefix('.build-').rsplit('-', 2)[0]}-failed.log"
        raise GlueError(f"image build failed while {what}: {tail[0][:300]} (log: {kept})")


def _debootstrap(recipe: Recipe, rootfs: Path, log: Path) -> None:
    cmd = ["mmdebstrap", f"--variant={recipe.variant}", "--format=directory"]
    if recipe.preseed.is_dir():
        # Before any package installs: configuration that packages read while they install.
        cmd.append(f"--setup-hook=sync-in {recipe.preseed} /")
    if (_EATMYDATA_HOOKS / "extract.sh").is_file():
        cmd.append(f"--hook-dir={_EATMYDATA_HOOKS}")
    if recipe.packages:
        cmd.append("--include=" + ",".join(recipe.packages))
    _run([*cmd, recipe.suite, str(rootfs)], log, "installing the Debian packages")


def _files(recipe: Recipe, rootfs: Path) -> None:
    if recipe.files.is_dir():
        shutil.copytree(recipe.files, rootfs, symlinks=True, dirs_exist_ok=True)
    if recipe.rclone_path:
        dest = rootfs / recipe.rclone_path.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(recipe.rclone_source(), dest)
        dest.chmod(0o755)


def _venv(recipe: Recipe, rootfs: Path, log: Path) -> None:
    """Wheels resolved by the controller's pip (its indexes), installed offline inside the image."""
    if not recipe.venv_path:
        return
    wheels = rootfs / "tmp/gpukit-wheels"
    wheels.mkdir(parents=True)
    _run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "-d", str(wheels),
          *recipe.venv_requirements], log, "resolving the venv's wheels",
         env=_env(HOME=str(rootfs.parent), **{k: v for k, v in os.environ.items() if k.startswith("PIP_")}))
    venv = recipe.venv_path
    _run(["chroot", str(rootfs), "python3", "-m", "venv", venv], log, "creating the venv")
    _run(["chroot", str(rootfs), f"{venv}/bin/pip", "install", "--quiet", "--no-index", "--no-compile",
          "--disable-pip-version-check", "--find-links", "/tmp/gpukit-wheels", *recipe.venv_requirements],
         log, "installing the venv")
    # Bytecode once, here, on all cores (pip compiles serially): a VM that has to compile it on its
    # first `import torch` spends ~10 s (minutes under qemu's emulation) writing it to its own disk.
    # Some packages ship files that are not Python 3 (templates, test data): compileall reports them
    # (kept in the log) and exits 1, as pip's own compile step would silently skip them.
    _run(["chroot", str(rootfs), "/bin/sh", "-c",
          f"{venv}/bin/python -m compileall -q -j 0 -x '{_NO_BYTECODE}' {venv} || true"],
         log, "compiling the venv's bytecode")
    shutil.rmtree(wheels)


def _keep_log(work: Path, root: Path, recipe: Recipe) -> None:
    """The failed build's log outlives its removed directory, for the error line to point at."""
    with contextlib.suppress(OSError):
        shutil.copyfile(work / "build.log", root / f"{recipe.name}-failed.log")


def users(entry: Path, proc: Path = Path("/proc")) -> list[str]:
    """What runs on an image directory, whichever kit home started it: a process with its path on the
    command line (qemu's -kernel), a file open under it (a qemu VM's boot disk), or a mount namespace
    with it in a mount (a local VM's overlay, whose lower layer is the image's rootfs). VMs by name
    (nspawn's --machine=, qemu's -name); other processes as `pid N (command)`. Unreadable ones are skipped."""
    names: set[str] = set()
    others: list[str] = []
    mentions = re.compile(re.escape(str(entry)) + r"(?=[/,:\s]|$)")
    namespaces: set[str] = set()
    for d in sorted((p for p in proc.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
        if int(d.name) == os.getpid():
            continue
        try:
            argv = [a.decode(errors="replace") for a in (d / "cmdline").read_bytes().split(b"\0")]
        except OSError:
            continue
        hit = any(mentions.search(a) for a in argv)
        with contextlib.suppress(OSError):
            hit = hit or any(mentions.match(os.readlink(fd)) for fd in (d / "fd").iterdir())
        with contextlib.suppress(OSError):
            ns = os.readlink(d / "ns" / "mnt")  # one look per mount namespace: its first process stands for it
            if ns not in namespaces:
                namespaces.add(ns)
                hit = mentions.search((d / "mountinfo").read_text(errors="replace")) is not None or hit
        if not hit:
            continue
        vm = [a.removeprefix("--machine=") for a in argv if a.startswith("--machine=")]
        if os.path.basename(argv[0]).startswith("qemu-system"):
            vm += [b for a, b in itertools.pairwise(argv) if a == "-name"]
        if vm:
            names.add(vm[0])
        else:
            others.append(f"pid {d.name} ({os.path.basename(argv[0]) or '?'})")
    return sorted(names) or others


def _refuse_if_used(recipe: Recipe, entry: Path) -> None:
    """A cached image that a running VM boots is never removed (its root filesystem would go from under it)."""
    if not entry.exists():
        return
    found = users(entry)
    if found:
        raise GlueError(f"image {recipe.name} {entry.name.rsplit('-', 1)[-1]} is in use by {', '.join(found[:5])}"
                        f"{f' and {len(found) - 5} more' if len(found) > 5 else ''}: `glue down` first (in each "
                        "kit home whose VMs boot it), then bake again; the cached image was kept")


def build(recipe: Recipe, home: Path, step: Step = lambda _s: None, force: bool = False) -> tuple[Image, bool]:
    """The image for this recipe, baked now if the cache lacks it. Returns (image, baked_now). `force`
    bakes again, refused (one line, before any work) while a running VM uses the cached one."""
    digest = recipe.content_hash()
    root = cache.cache_dir(home)
    final = cache.entry_dir(root, recipe, digest)
    found = cache.lookup(root, recipe, digest)
    if found and not force:
        return found, False
    _refuse_if_used(recipe, final)
    check_tools()
    cache.ensure(root, home)
    with _locked(root, recipe.name):
        found = cache.lookup(root, recipe, digest)  # another process may have baked it meanwhile
        if found and not force:
            return found, False
        # Holding the lock, any other build directory of this recipe is a killed build's leftover
        # (only this recipe's: `.build-<name>-<hash16>-<pid>`, not those of a recipe named <name>-x).
        mine = re.compile(rf"\.build-{re.escape(recipe.name)}-[0-9a-f]{{16}}-[0-9]+")
        for stale in root.glob(f".build-{recipe.name}-*"):
            if mine.fullmatch(stale.name):
                shutil.rmtree(stale, ignore_errors=True)
        work = root / f".build-{recipe.name}-{digest[:16]}-{os.getpid()}"
        work.mkdir(parents=True)
        try:
            _bake(recipe, digest, work, step)
            if final.exists():
                _refuse_if_used(recipe, final)  # a VM may have booted it during the bake
                shutil.rmtree(final)
            work.rename(final)
        except GlueError:
            _keep_log(work, root, recipe)
            raise
        except OSError as exc:
            _keep_log(work, root, recipe)
            if exc.errno == errno.ENOSPC:
                raise GlueError(f"disk full while baking image {recipe.name}; the partial image was removed "
                                f"(free space under {root})") from None
            raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
        image = cache.read(final)
        if image is None:
            raise GlueError(f"image {recipe.name} baked but unreadable at {final}")
        return image, True


def _bake(recipe: Recipe, digest: str, work: Path, step: Step) -> None:
    started = time.monotonic()
    rootfs, log = work / "rootfs", work / "build.log"
    step("debian packages (mmdebstrap)")
    _debootstrap(recipe, rootfs, log)
    step("files and rclone")
    _files(recipe, rootfs)
    step(f"venv {recipe.venv_path} ({', '.join(recipe.venv_requirements)})" if recipe.venv_path else "venv: none")
    _venv(recipe, rootfs, log)
    step("customize.sh")
    if recipe.customize.is_file():
        _run(["chroot", str(rootfs), "/bin/sh", "-s"], log, "running customize.sh", stdin=recipe.customize)
    step("measuring")
    meta = {"name": recipe.name, "hash": digest, "size_bytes": du(rootfs),
            "build_seconds": round(time.monotonic() - started, 1),
            "built_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "packages": list(recipe.packages)}
    (work / cache.META).write_text(json.dumps(meta, indent=1))
