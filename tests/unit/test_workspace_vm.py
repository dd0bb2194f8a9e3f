"""The workspace step on the VM (glue.train.workspace): the run's code package and its pinned requirements,
read from the bucket by hash, checked, and made ready for one attempt; and the ranks' agreement on it."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from glue.train.layout import code_key, wheelhouse_prefix
from glue.train.run import agreement
from glue.train.storage.target import Storage, open_target
from glue.train.workspace import pins, venv
from glue.train.workspace.errors import WorkspaceError
from glue.train.workspace.paths import WorkPaths
from glue.train.workspace.prepare import ensure_venv, prepare

CODE = {"train.py": "print('training')\n", "mylib/__init__.py": "X = 1\n"}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def member(name: str, type_: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = type_, linkname
    return info


def make_tar(files: dict[str, str], extra: tuple[tarfile.TarInfo, ...] = ()) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, body in files.items():
            info, data = member(name), body.encode()
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info)
    return buf.getvalue()


def make_wheel(name: str, version: str, body: str) -> bytes:
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": body.encode(),
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    digest = lambda b: base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode()  # noqa: E731
    record = "".join(f"{p},sha256={digest(b)},{len(b)}\n" for p, b in files.items()) + f"{info}/RECORD,,\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for p, b in {**files, f"{info}/RECORD": record.encode()}.items():
            zf.writestr(zipfile.ZipInfo(p, date_time=(2020, 1, 1, 0, 0, 0)), b)  # the same bytes every time
    return buf.getvalue()


@pytest.fixture
def bucket(tmp_path: Path) -> Storage:
    return open_target(tmp_path / "bucket")  # a plain folder: keys become files under it


def spec(data: bytes, attempt: int = 3, requirements: dict | None = None) -> dict:
    return {"run": "r1", "attempt": attempt, "package": {"sha256": sha(data), "size": len(data)},
            "requirements": requirements}


def files_under(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def test_prepare_unpacks_the_checked_package_afresh_for_every_attempt(tmp_path: Path, bucket: Storage) -> None:
    data = make_tar(CODE)
    bucket.put(code_key(sha(data)), data)
    out = prepare(bucket, spec(data), root=tmp_path / "work")
    code = tmp_path / "work" / "r1" / "attempt-3" / "code"
    assert out == {"python": sys.executable, "code_dir": str(code), "package_sha256": sha(data),
                   "requirements_set": None}
    assert files_under(code) == ["mylib/__init__.py", "train.py"]
    assert (code / "train.py").read_text() == CODE["train.py"]
    assert json.loads((code.parent / "package.json").read_text())["sha256"] == sha(data)
    (code / "stray.py").write_text("left by the last try\n")
    out4 = prepare(bucket, spec(data, attempt=4), root=tmp_path / "work")
    assert out4["code_dir"] == str(code.parent.parent / "attempt-4" / "code")
    assert files_under(Path(out4["code_dir"])) == ["mylib/__init__.py", "train.py"]
    prepare(bucket, spec(data), root=tmp_path / "work")  # the same attempt again: made anew
    assert files_under(code) == ["mylib/__init__.py", "train.py"]


def test_a_changed_or_missing_package_is_refused_and_nothing_is_unpacked(tmp_path: Path, bucket: Storage) -> None:
    data, other = make_tar(CODE), make_tar({"train.py": "print('not what was deployed')\n"})
    bucket.put(code_key(sha(data)), other)
    with pytest.raises(WorkspaceError) as err:
        prepare(bucket, spec(data), root=tmp_path / "work")
    assert sha(data) in str(err.value) and sha(other) in str(err.value)
    paths = WorkPaths("r1", 3, tmp_path / "work")
    assert not paths.code_dir.exists() and not paths.package_record.exists()
    missing = make_tar({"train.py": "never uploaded\n"})
    with pytest.raises(WorkspaceError, match="not in the bucket"):
        prepare(bucket, spec(missing), root=tmp_path / "work")


@pytest.mark.parametrize("bad", [
    member("../evil.py"),
    member("ABSOLUTE/evil.py"),
    member("link", tarfile.SYMTYPE, "../../evil.py"),
    member("mylib/link", tarfile.SYMTYPE, "/etc/passwd"),
    member("fifo", tarfile.FIFOTYPE),
    member("dev", tarfile.CHRTYPE),
], ids=["dotdot", "absolute", "symlink-out", "symlink-absolute", "fifo", "device"])
def test_unsafe_members_are_refused(tmp_path: Path, bucket: Storage, bad: tarfile.TarInfo) -> None:
    bad.name = bad.name.replace("ABSOLUTE", str(tmp_path))  # an absolute path into this test's folder
    data = make_tar(CODE, (bad,))
    bucket.put(code_key(sha(data)), data)
    with pytest.raises(WorkspaceError, match=r"outside its folder|not a file or folder"):
        prepare(bucket, spec(data), root=tmp_path / "work" / "deep")
    assert not list(tmp_path.rglob("evil.py"))
    assert not (tmp_path / "work" / "deep" / "r1" / "attempt-3" / "package.json").exists()


def test_links_that_stay_inside_the_tree_are_unpacked(tmp_path: Path, bucket: Storage) -> None:
    links = (member("mylib/alias.py", tarfile.SYMTYPE, "__init__.py"), member("lib", tarfile.SYMTYPE, "mylib"))
    data = make_tar(CODE, links)
    bucket.put(code_key(sha(data)), data)
    code = Path(prepare(bucket, spec(data), root=tmp_path / "work")["code_dir"])
    assert (code / "mylib" / "alias.py").is_symlink() and (code / "lib" / "alias.py").read_text() == "X = 1\n"


def test_a_chain_of_links_cannot_reach_outside_the_tree(tmp_path: Path, bucket: Storage) -> None:
    """s/d -> .. passes a lexical check, and so does s/d/e -> ..: unpacked, s/d/e lands at code/e and points
    above the code folder. Nothing may sit below a link."""
    chain = (member("s", tarfile.DIRTYPE), member("s/d", tarfile.SYMTYPE, ".."),
             member("s/d/e", tarfile.SYMTYPE, ".."))
    data = make_tar(CODE, chain)
    bucket.put(code_key(sha(data)), data)
    with pytest.raises(WorkspaceError, match="'s/d/e' below a link"):
        prepare(bucket, spec(data), root=tmp_path / "work")
    code = WorkPaths("r1", 3, tmp_path / "work").code_dir
    assert not code.exists() or not [p for p in code.rglob("*") if p.is_symlink()]


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to reach a package index fails (nothing listens on port 9)."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", "")


def publish_set(bucket: Storage, wheel: bytes, pinned_sha: str | None = None) -> dict:
    pinned = ["mydep==0.1"]
    digest = pins.set_hash(pinned, pins.interpreter())
    bucket.put(wheelhouse_prefix(digest) + "mydep-0.1-py3-none-any.whl", wheel)
    return {"set_sha256": digest, "pins": pinned, "wheels": {"mydep-0.1-py3-none-any.whl": pinned_sha or sha(wheel)}}


def run_in(python: str, code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


@pytest.mark.usefixtures("offline")
def test_requirements_install_from_the_wheelhouse_over_the_image_packages(tmp_path: Path, bucket: Storage) -> None:
    data = make_tar(CODE)
    bucket.put(code_key(sha(data)), data)
    req = publish_set(bucket, make_wheel("mydep", "0.1", "VALUE = 42\n"))
    out = prepare(bucket, spec(data, requirements=req), root=tmp_path / "work")
    vdir = tmp_path / "work" / "r1" / f"venv-{req['set_sha256'][:16]}"
    assert out["python"] == str(vdir / "bin" / "python") and out["requirements_set"] == req["set_sha256"]
    lines = run_in(out["python"], "import mydep, torch; print(mydep.VALUE); print(mydep.__file__); "
                   "print(torch.__file__)").splitlines()
    assert lines[0] == "42"
    assert Path(lines[1]).is_relative_to(vdir) and not Path(lines[2]).is_relative_to(vdir)  # the image's torch
    assert venv.installed(vdir) == {"mydep": "0.1"}


@pytest.mark.usefixtures("offline")
def test_a_wheel_that_differs_from_its_pinned_hash_is_refused(tmp_path: Path, bucket: Storage) -> None:
    wheel = make_wheel("mydep", "0.1", "VALUE = 42\n")
    req = publish_set(bucket, wheel, pinned_sha=sha(b"another wheel"))
    paths = WorkPaths("r1", 3, tmp_path / "work")
    with pytest.raises(WorkspaceError, match=rf"mydep-0\.1-py3-none-any\.whl .*{sha(wheel)}.*{sha(b'another wheel')}"):
        ensure_venv(bucket, paths, req)
    assert not paths.venv_dir(req["set_sha256"]).exists()


@pytest.mark.usefixtures("offline")
def test_a_checked_venv_is_reused_and_a_tampered_one_rebuilt(tmp_path: Path, bucket: Storage) -> None:
    req = publish_set(bucket, make_wheel("mydep", "0.1", "VALUE = 42\n"))
    paths = WorkPaths("r1", 3, tmp_path / "work")
    python = ensure_venv(bucket, paths, req)
    vdir = paths.venv_dir(req["set_sha256"])
    with pytest.raises(WorkspaceError, match=re.escape("mydep is pinned at 0.2 but 0.1 is installed")):
        venv.check(vdir, ["mydep==0.2"])
    sentinel = vdir / "sentinel"
    sentinel.write_text("from the first build\n")
    bucket.delete([wheelhouse_prefix(req["set_sha256"]) + "mydep-0.1-py3-none-any.whl"])
    assert ensure_venv(bucket, WorkPaths("r1", 4, paths.root), req) == python  # reused: no fetch, no rebuild
    assert sentinel.exists()
    extra = tmp_path / "otherdep-1.0-py3-none-any.whl"
    extra.write_bytes(make_wheel("otherdep", "1.0", "Y = 1\n"))
    assert venv.pip(vdir, "install", "--no-index", "--no-deps", str(extra)).returncode == 0
    with pytest.raises(WorkspaceError, match=re.escape("otherdep==1.0 is installed but not in the pinned set")):
        venv.check(vdir, req["pins"])
    with pytest.raises(WorkspaceError, match=r"wheel mydep-0\.1-py3-none-any\.whl .* not in the bucket"):
        ensure_venv(bucket, WorkPaths("r1", 5, paths.root), req)  # tampered: rebuilt, so fetched again
    publish_set(bucket, make_wheel("mydep", "0.1", "VALUE = 42\n"))
    assert ensure_venv(bucket, WorkPaths("r1", 5, paths.root), req) == python
    assert not sentinel.exists() and venv.installed(vdir) == {"mydep": "0.1"}


def test_pins_name_the_first_difference_and_hash_the_set_not_its_spelling() -> None:
    assert pins.canonical("Foo_Bar.baz") == "foo-bar-baz"
    assert pins.as_dict(["Foo_Bar == 1.0", "numpy==2.0"]) == {"foo-bar": "1.0", "numpy": "2.0"}
    assert pins.first_difference({"a": "1", "b": "2"}, {"a": "1", "b": "2"}) is None
    assert pins.first_difference({"a": "1", "b": "2"}, {"a": "1"}) == "b==2 is pinned but not installed"
    assert pins.first_difference({"b": "2"}, {"a": "9", "b": "2"}) == "a==9 is installed but not in the pinned set"
    assert pins.first_difference({"a": "1", "b": "2"}, {"a": "3", "b": "4"}) == "a is pinned at 1 but 3 is installed"
    x86 = {"python": "3.11", "platform": "linux-x86_64"}
    h = pins.set_hash(["Foo_Bar==1", "numpy==2.0"], x86)
    assert h == pins.set_hash(["numpy==2.0", "foo-bar==1"], x86)
    assert h != pins.set_hash(["Foo_Bar==1", "numpy==2.0"], {**x86, "platform": "linux-aarch64"})
    assert h != pins.set_hash(["Foo_Bar==1", "numpy==2.0"], {**x86, "python": "3.12"})
    assert h != pins.set_hash(["Foo_Bar==2", "numpy==2.0"], x86)


def test_ranks_agree_on_the_package_verified_on_their_node(
        tmp_path: Path, bucket: Storage, monkeypatch: pytest.MonkeyPatch) -> None:
    base = {"config_hash": "c", "world_size": 2, "code_version": "v", "workdir_sha256": "a" * 64,
            "restored_step": 7}
    assert agreement.find_mismatch([base, dict(base)]) is None
    problem = agreement.find_mismatch([base, {**base, "workdir_sha256": "b" * 64}])
    assert problem is not None and problem.startswith("rank 1 has workdir_sha256=") and "b" * 64 in problem
    data = make_tar(CODE)
    bucket.put(code_key(sha(data)), data)
    code = prepare(bucket, spec(data), root=tmp_path / "work")["code_dir"]
    monkeypatch.setenv("GPUKIT_WORKDIR", code)
    assert agreement.workdir_sha256() == sha(data)
    (Path(code).parent / "package.json").unlink()
    assert agreement.workdir_sha256() == "unreadable"
    monkeypatch.delenv("GPUKIT_WORKDIR")
    assert agreement.workdir_sha256() is None
