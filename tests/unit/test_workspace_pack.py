"""A dependency set's virtualenv packed once into the bucket by its first VM, and unpacked on every later VM
(glue.train.workspace.environment): the pins checked against the manifest's, a tampered pack refused, and
the wheelhouse install (said so) when there is no pack to use."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from glue.train import layout
from glue.train.storage.target import Storage, open_target
from glue.train.workspace import envstore, pins, venv
from glue.train.workspace.errors import WorkspaceError
from glue.train.workspace.paths import WorkPaths
from glue.train.workspace.prepare import prepare

WHEEL = "mydep-0.1-py3-none-any.whl"


def wheel(version: str = "0.1") -> bytes:
    """mydep with a console script (its shebang names the venv's python: the path every VM shares)."""
    info = f"mydep-{version}.dist-info"
    files = {"mydep/__init__.py": b"VALUE = 42\ndef main():\n    print('mydep script', VALUE)\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: mydep\nVersion: {version}\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
             f"{info}/entry_points.txt": b"[console_scripts]\nmydep-hello = mydep:main\n"}
    digest = lambda b: base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode()  # noqa: E731
    record = "".join(f"{p},sha256={digest(b)},{len(b)}\n" for p, b in files.items()) + f"{info}/RECORD,,\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for p, b in {**files, f"{info}/RECORD": record.encode()}.items():
            zf.writestr(zipfile.ZipInfo(p, date_time=(2020, 1, 1, 0, 0, 0)), b)
    return buf.getvalue()


@pytest.fixture
def bucket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Storage:
    """A folder bucket; any attempt to reach a package index fails (nothing listens on port 9)."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    return open_target(tmp_path / "bucket")


def requirements(bucket: Storage) -> dict:
    """The manifest's pinned set, its wheel in the bucket's wheelhouse."""
    pinned = ["mydep==0.1"]
    digest = pins.set_hash(pinned, pins.interpreter())
    data = wheel()
    bucket.put(layout.wheel_key(digest, WHEEL), data)
    return {"set_sha256": digest, "pins": pinned, "wheels": {WHEEL: hashlib.sha256(data).hexdigest()}}


def prepare_on(vm: Path, req: dict, bucket: Storage, attempt: int = 1, memory: Path | None = None) -> dict:
    """One VM's prepare: `vm` stands for its disk (work/ and envs/ under it)."""
    spec = {"run": "r1", "attempt": attempt, "package": None, "requirements": req}
    return prepare(bucket, spec, root=vm / "work", memory=memory)


def run(python: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([python, *args], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_a_new_vm_unpacks_the_set_the_first_vm_packed_and_its_pins_are_the_manifests(
        tmp_path: Path, bucket: Storage) -> None:
    vm = tmp_path / "vm"
    req = requirements(bucket)
    first = prepare_on(vm, req, bucket)
    how = first["environment"]
    assert how["source"] == "wheelhouse" and "no VM has packed this dependency set yet" in how["note"]
    assert "installed 1 pinned packages from the wheelhouse, and packed it for the next VM" in how["note"]
    index = json.loads((tmp_path / "bucket" / layout.env_pack_index_key(req["set_sha256"])).read_text())
    pack = (tmp_path / "bucket" / layout.env_pack_key(req["set_sha256"], index["sha256"])).read_bytes()
    assert hashlib.sha256(pack).hexdigest() == index["sha256"] == how["stored"]["sha256"]
    env = vm / "envs" / req["set_sha256"][:16]
    assert index["prefix"] == str(env) and index["files"] > 3

    # A new VM: nothing on its disk, and the wheelhouse gone: only the pack can make the environment.
    shutil.rmtree(vm)
    bucket.delete([layout.wheel_key(req["set_sha256"], WHEEL)])
    second = prepare_on(vm, req, bucket, attempt=2)
    how = second["environment"]
    assert how["source"] == "pack" and how["sha256"] == index["sha256"] and not how["in_memory"]
    assert venv.installed(env) == pins.as_dict(req["pins"])  # importlib.metadata: exactly the manifest's pins
    python = second["python"]
    assert python == str(vm / "work" / "r1" / f"venv-{req['set_sha256'][:16]}" / "bin" / "python")
    assert run(python, "-c", "import mydep, sys; print(mydep.VALUE, mydep.__file__)").startswith("42 ")
    assert run(str(env / "bin" / "mydep-hello")) == "mydep script 42"  # the packed script's shebang still holds
    third = prepare_on(vm, req, bucket, attempt=3)  # the same VM again: reused, nothing fetched
    assert third["environment"]["source"] == "reused" and third["python"] == python


def test_a_pack_that_fits_goes_into_memory_behind_the_same_path(tmp_path: Path, bucket: Storage) -> None:
    req = requirements(bucket)
    prepare_on(tmp_path / "vm1", req, bucket)
    shutil.rmtree(tmp_path / "vm1")
    shm = tmp_path / "shm"
    shm.mkdir()
    out = prepare_on(tmp_path / "vm1", req, bucket, attempt=2, memory=shm / "gpukit-envs")
    env = tmp_path / "vm1" / "envs" / req["set_sha256"][:16]
    assert out["environment"]["in_memory"] and env.is_symlink()
    assert env.resolve() == shm / "gpukit-envs" / env.name
    assert run(str(env / "bin" / "mydep-hello")) == "mydep script 42"
    shutil.rmtree(shm / "gpukit-envs")  # the VM rebooted: its memory is empty, the link dangles
    again = prepare_on(tmp_path / "vm1", req, bucket, attempt=3, memory=shm / "gpukit-envs")
    assert again["environment"]["source"] == "pack" and run(again["python"], "-c", "import mydep") == ""


def retar(pack: bytes, change: dict[str, bytes], extra: tuple[tarfile.TarInfo, ...] = ()) -> bytes:
    """The pack with some members' bytes changed (by name) and members added."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(pack)) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for m in src.getmembers():
            body = change.get(m.name, src.extractfile(m).read() if m.isfile() else None)  # type: ignore[union-attr]
            if body is not None:
                m.size = len(body)
            dst.addfile(m, io.BytesIO(body) if body is not None else None)
        for info in extra:
            dst.addfile(info)
    return out.getvalue()


def packed(tmp_path: Path, bucket: Storage) -> tuple[dict, dict, bytes]:
    req = requirements(bucket)
    prepare_on(tmp_path / "vm", req, bucket)
    shutil.rmtree(tmp_path / "vm")
    index = envstore.find(bucket, req["set_sha256"])
    assert index is not None
    return req, index, (tmp_path / "bucket" / index["key"]).read_bytes()


def refused(tmp_path: Path, bucket: Storage, req: dict, match: str) -> str:
    with pytest.raises(WorkspaceError, match=match) as err:
        prepare_on(tmp_path / "vm", req, bucket, attempt=2)
    env = WorkPaths("r1", 2, tmp_path / "vm" / "work").env_dir(req["set_sha256"])
    assert not env.exists() and not env.is_symlink()  # nothing half-unpacked is left to be reused
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_pack_whose_bytes_changed_in_the_bucket_is_refused(tmp_path: Path, bucket: Storage) -> None:
    req, index, pack = packed(tmp_path, bucket)
    (tmp_path / "bucket" / index["key"]).write_bytes(pack[:-1024] + b"\0" * 1024 + b"x")
    line = refused(tmp_path, bucket, req, "it was changed in the bucket")
    assert index["sha256"] in line and f"delete envs/{req['set_sha256']}/ from the bucket" in line


def test_a_pack_whose_pins_differ_from_the_manifests_is_refused(tmp_path: Path, bucket: Storage) -> None:
    req, index, pack = packed(tmp_path, bucket)
    meta = next(n for n in tarfile.open(fileobj=io.BytesIO(pack)).getnames() if n.endswith(".dist-info/METADATA"))
    other = retar(pack, {meta: b"Metadata-Version: 2.1\nName: mydep\nVersion: 0.2\n"})
    envstore.store(bucket, req["set_sha256"], other, {k: index[k] for k in ("prefix", "files", "unpacked_bytes")})
    refused(tmp_path, bucket, req, r"differs from the manifest's resolved set: mydep is pinned at 0\.1 but 0\.2")


def test_a_pack_put_in_place_of_the_one_the_manifest_pins_is_refused(tmp_path: Path, bucket: Storage) -> None:
    """Pack and index replaced together (each consistent with the other, the same pins): the run's manifest
    pinned the pack its first attempt used, and a later VM refuses any other."""
    req, index, pack = packed(tmp_path, bucket)
    code = next(n for n in tarfile.open(fileobj=io.BytesIO(pack)).getnames() if n.endswith("mydep/__init__.py"))
    other = retar(pack, {code: b"VALUE = 43\n"})  # its code changed, its version (and so the pins check) not
    envstore.store(bucket, req["set_sha256"], other, {k: index[k] for k in ("prefix", "files", "unpacked_bytes")})
    line = refused(tmp_path, bucket, {**req, "pack_sha256": index["sha256"]}, "is not the .* this run's manifest pins")
    assert "replaced in the bucket" in line
    # without the pin (a manifest from before pins were written) the consistent pack is used, its pins checked
    assert prepare_on(tmp_path / "vm", req, bucket, attempt=3)["environment"]["source"] == "pack"


@pytest.mark.parametrize("bad", ["link", "dotdot", "own"])
def test_a_pack_with_what_gpukit_never_packs_is_refused(tmp_path: Path, bucket: Storage, bad: str) -> None:
    req, index, pack = packed(tmp_path, bucket)
    info = tarfile.TarInfo({"link": "bin/evil", "dotdot": "../evil", "own": "pyvenv.cfg"}[bad])
    if bad == "link":
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    envstore.store(bucket, req["set_sha256"], retar(pack, {}, (info,)),
                   {k: index[k] for k in ("prefix", "files", "unpacked_bytes")})
    refused(tmp_path, bucket, req, "not a file or folder|outside its folder|each VM writes itself")
    assert not list(tmp_path.rglob("evil"))


def test_without_a_usable_pack_the_wheelhouse_installs_and_says_why(tmp_path: Path, bucket: Storage) -> None:
    req, index, _ = packed(tmp_path, bucket)
    bucket.delete([index["key"]])  # the index names a pack that is gone: installed again, packed again
    out = prepare_on(tmp_path / "vm", req, bucket, attempt=2)["environment"]
    assert out["source"] == "wheelhouse" and f"{index['key']} is not in the bucket" in out["note"]
    assert envstore.find(bucket, req["set_sha256"])["sha256"] == out["stored"]["sha256"]  # type: ignore[index]
    shutil.rmtree(tmp_path / "vm")
    other = prepare_on(tmp_path / "elsewhere", req, bucket, attempt=3)["environment"]  # another path
    assert other["source"] == "wheelhouse" and "was made for" in other["note"] and "not this VM's" in other["note"]
    bucket.put(layout.env_pack_index_key(req["set_sha256"]), b"{not json")
    shutil.rmtree(tmp_path / "elsewhere")
    refused(tmp_path, bucket, req, "index envs/.* is not JSON; not using it")


def test_without_gnu_tar_the_pack_unpacks_with_tarfile(
        tmp_path: Path, bucket: Storage, monkeypatch: pytest.MonkeyPatch) -> None:
    req, _, _ = packed(tmp_path, bucket)
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools-here"))  # no `tar` to be found
    out = prepare_on(tmp_path / "vm", req, bucket, attempt=2)
    env = tmp_path / "vm" / "envs" / req["set_sha256"][:16]
    assert out["environment"]["source"] == "pack" and venv.installed(env) == {"mydep": "0.1"}
    assert run(str(env / "bin" / "mydep-hello")) == "mydep script 42"
    assert not [p for p in env.rglob("*") if p.is_file() and p.stat().st_mode & 0o022]  # no group/other write
