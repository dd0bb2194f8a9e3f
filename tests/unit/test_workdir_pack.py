"""The user's workdir on the controller: which files ship, the deterministic package, the refusals."""

from __future__ import annotations

import os
import tarfile
import time
from pathlib import Path

import pytest

from glue.errors import GlueError
from glue.workdir import command, requirements
from glue.workdir.pack import pack
from glue.workdir.select import looks_secret, select


def tree(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, body in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(body if isinstance(body, bytes) else body.encode())
    return root


PROJECT = {"train.py": "print('hi')\n", "mylib/__init__.py": "", "mylib/model.py": "X = 1\n",
           "requirements.txt": "einops==0.8.1\n"}


def test_the_same_tree_gives_the_same_bytes_wherever_and_whenever_it_was_written(tmp_path: Path) -> None:
    a = tree(tmp_path / "a", PROJECT)
    pa = pack(select(a), 256)
    time.sleep(0.01)
    b = tree(tmp_path / "elsewhere" / "b", dict(reversed(PROJECT.items())))  # other order, other times
    os.utime(b / "train.py", (1, 1))
    pb = pack(select(b), 256)
    assert pa.sha256 == pb.sha256 and pa.size == pb.size
    (b / "train.py").write_text("print('changed')\n")
    assert pack(select(b), 256).sha256 != pa.sha256
    with tarfile.open(pa.path) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == sorted(PROJECT)
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
    for p in (pa, pb):
        p.close()
    assert not pa.path.exists()


def test_gitignore_at_any_level_and_gpukitignore_are_honoured(tmp_path: Path) -> None:
    root = tree(tmp_path / "w", {**PROJECT, ".gitignore": "*.log\nbuild/\n", ".gpukitignore": "data/\n!keep.log\n",
                                 "run.log": "x", "keep.log": "x", "build/out.bin": "x", "data/big.bin": "x",
                                 "sub/.gitignore": "local.txt\n", "sub/local.txt": "x", "sub/ok.txt": "x",
                                 "local.txt": "x", ".git/HEAD": "x", "mylib/__pycache__/m.pyc": "x"})
    sel = select(root)
    assert "keep.log" in sel.files and "sub/ok.txt" in sel.files and "local.txt" in sel.files
    assert {"run.log", "build/", "data/", "sub/local.txt"} <= set(sel.ignored)
    assert not any(f.startswith((".git/", "mylib/__pycache__")) for f in sel.files)


def test_secret_looking_files_are_refused_by_name_unless_listed(tmp_path: Path) -> None:
    root = tree(tmp_path / "w", {**PROJECT, ".env": "TOKEN=x", "keys/id_rsa": "k", ".env.example": "TOKEN=",
                                 "certs/server.pem": "c"})
    sel = select(root)
    assert sel.refused == [".env", "certs/server.pem", "keys/id_rsa"] and ".env.example" in sel.files
    with pytest.raises(GlueError, match=r"workdir: \.env looks like a secret \(and 2 more: certs/server.pem, "
                                        r"keys/id_rsa\); ignore it in \.gpukitignore, or list it under "
                                        r"workdir\.secret_files"):
        pack(sel, 256)
    sel = select(root, secret_files=(".env", "./certs/server.pem", "keys/id_rsa"))
    assert sel.refused == [] and sel.secrets == [".env", "certs/server.pem", "keys/id_rsa"]
    pack(sel, 256).close()
    assert looks_secret(".aws/credentials") and looks_secret("home/.netrc") and not looks_secret("train.py")


def test_an_oversized_tree_is_refused_naming_its_largest_files(tmp_path: Path) -> None:
    root = tree(tmp_path / "w", {**PROJECT, "ckpt/a.bin": b"\0" * (3 << 20), "ckpt/b.bin": b"\0" * (2 << 20)})
    with pytest.raises(GlueError) as err:
        pack(select(root), 4)
    msg = str(err.value)
    assert "over the 4 MiB cap (workdir.max_size_mb); largest: ckpt/a.bin (3.0 MiB), ckpt/b.bin (2.0 MiB)" in msg
    assert "\n" not in msg


def test_links_inside_ship_as_links_and_outside_are_refused(tmp_path: Path) -> None:
    root = tree(tmp_path / "w", PROJECT)
    (root / "alias.py").symlink_to("train.py")
    pkg = pack(select(root), 256)
    with tarfile.open(pkg.path) as tar:
        assert tar.getmember("alias.py").issym() and tar.getmember("alias.py").linkname == "train.py"
    pkg.close()
    (root / "escape").symlink_to(tmp_path)
    with pytest.raises(GlueError, match=r"escape is a link to .*, outside the workdir"):
        select(root)


@pytest.mark.parametrize(("argv", "expected"), [
    (["python", "train.py", "--lr", "1"], True),
    (["python", "-u", "./train.py"], True),
    (["python", "-m", "mylib.model"], True),
    (["python", "-m", "mylib"], True),
    (["python", "-m", "glue.examples.tiny_gpt"], False),  # the image's: the VM is asked
    (["torchrun", "train.py"], False),
    (["python", "/opt/train.py"], False),
    (["python", "-u", "-X", "dev", "-m", "mylib.model"], True),
    (["python", "-W", "ignore", "train.py"], True),
    (["python", "-c", "print(1)"], False),
])
def test_the_command_is_found_in_the_package(argv: list[str], expected: bool) -> None:
    files = set(PROJECT)
    assert command.in_package(argv, files, "/w") is expected


@pytest.mark.parametrize("argv", [["python", "trian.py"], ["python3", "scripts/go.py"], ["./run.sh"]])
def test_a_command_naming_a_file_not_in_the_workdir_is_refused(argv: list[str]) -> None:
    with pytest.raises(GlueError, match="not in the workdir /w"):
        command.in_package(argv, set(PROJECT), "/w")


def test_requirements_from_a_file_or_a_list_and_what_is_refused(tmp_path: Path) -> None:
    root = tree(tmp_path / "w", {"requirements.txt": "# deps\neinops==0.8.1  # reshape\n\n--index-url http://127.0.0.1:1/simple\n"})
    shipped = {"requirements.txt"}
    assert requirements.lines_of("requirements.txt", root, shipped) == ["einops==0.8.1",
                                                                        "--index-url http://127.0.0.1:1/simple"]
    assert requirements.lines_of(("tqdm>=4",), None, set()) == ["tqdm>=4"]
    for bad, why in [(("-e .",), "not supported"), (("./mylib",), "local path"), (("-r other.txt",), "not supported"),
                     (("--user",), "unknown option")]:
        with pytest.raises(GlueError, match=why):
            requirements.lines_of(bad, None, set())
    with pytest.raises(GlueError, match=r"requirements file .*nope\.txt does not exist"):
        requirements.lines_of("nope.txt", root, shipped)
    with pytest.raises(GlueError, match="is ignored by the workdir's ignore files"):
        requirements.lines_of("requirements.txt", root, set())
    with pytest.raises(GlueError, match="has no `workdir:`"):
        requirements.lines_of("requirements.txt", None, set())


@pytest.mark.parametrize(("name", "size", "mode", "link"), [
    ("train.py", 123, 0o644, None), ("a/b/run.sh", 0, 0o755, None), ("alias.py", 0, 0o777, "train.py"),
    ("données/ü.py", 7, 0o644, None), ("x" * 150, 5, 0o644, None), ("big.bin", 8**11, 0o644, None),
])
def test_our_tar_headers_are_tarfiles_own(name: str, size: int, mode: int, link: str | None) -> None:
    from glue.workdir.tarheader import _tarinfo, header

    want = _tarinfo(name, size, mode, link).tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")
    assert header(name, size, mode, link) == want


def test_the_package_unpacks_to_the_same_files(tmp_path: Path) -> None:
    files = {**PROJECT, "deep/" + "n" * 120 + ".py": "long = True\n", "empty.txt": "", "bin.dat": bytes(range(256)) * 9}
    root = tree(tmp_path / "w", files)
    pkg = pack(select(root), 256)
    with tarfile.open(pkg.path) as tar:
        tar.extractall(tmp_path / "out")
    for rel, body in files.items():
        assert (tmp_path / "out" / rel).read_bytes() == (body if isinstance(body, bytes) else body.encode())
    assert pkg.size % tarfile.RECORDSIZE == 0
    pkg.close()


def test_the_repositorys_gitignore_above_the_workdir_applies_as_in_git(tmp_path: Path) -> None:
    repo = tree(tmp_path / "repo", {".gitignore": "*.ckpt\nsrc/scratch/\n", ".git/HEAD": "ref",
                                    "src/.gitignore": "!keep.ckpt\n"})
    work = tree(repo / "src", {**PROJECT, "a.ckpt": "x", "keep.ckpt": "x", "scratch/t.txt": "x"})
    sel = select(work)
    assert "a.ckpt" in sel.ignored and "scratch/" in sel.ignored and "keep.ckpt" in sel.files
    outside = tree(tmp_path / "plain" / "src", {**PROJECT, "a.ckpt": "x"})
    (tmp_path / "plain" / ".gitignore").write_text("*.ckpt\n")  # not a repository: its .gitignore is not ours
    assert "a.ckpt" in select(outside).files


def test_the_users_repository_is_recorded_not_gpukits(tmp_path: Path) -> None:
    import subprocess

    from glue.workdir.gitinfo import repo_info

    repo = tree(tmp_path / "repo", {"src/train.py": "print(1)\n"})
    assert repo_info(repo / "src") == {"repository": None, "commit": None, "dirty": None, "diff_sha256": None}
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    clean = repo_info(repo / "src")
    assert clean == {"repository": str(repo.resolve()), "commit": head, "dirty": False, "diff_sha256": None}
    (repo / "src" / "train.py").write_text("print(2)\n")
    dirty = repo_info(repo / "src")
    assert dirty["dirty"] is True and dirty["commit"] == head and len(dirty["diff_sha256"]) == 64
    (repo / "src" / "train.py").write_text("print(3)\n")
    assert repo_info(repo / "src")["diff_sha256"] != dirty["diff_sha256"]
