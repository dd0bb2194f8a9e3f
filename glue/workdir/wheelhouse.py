"""The run's requirements resolved on the controller, with its own pip configuration (index, mirror,
find-links: the same way the image's packages were resolved), for the first VM's exact interpreter and
over the packages its image already has; the resulting wheels stored once in the bucket, keyed by the
set's hash. Every attempt then installs from the bucket only (glue.train.workspace.prepare)."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from boto3.s3.transfer import TransferConfig
from botocore.exceptions import BotoCoreError, ClientError

from glue.errors import GlueError
from glue.train.layout import wheel_key, wheelhouse_index_key
from glue.train.workspace.pins import canonical, set_hash
from glue.train.workspace.venv import pip_problem
from glue.workdir import image_stubs
from glue.workdir.pack import sha256_of

PIP_TIMEOUT_S = 1800
TRANSFER = TransferConfig(multipart_threshold=16 << 20, multipart_chunksize=16 << 20, max_concurrency=8)


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise GlueError(f"pip did not finish within {PIP_TIMEOUT_S}s ({args[0]}); check your package index") from None


def _tags(target: dict[str, Any]) -> list[str]:
    """The VM's interpreter for pip: only wheels it can install (sdists cannot be built for another host)."""
    args = ["--only-binary=:all:", "--python-version", str(target["python_version"]),
            "--implementation", str(target["implementation"])]
    for abi in target["abis"]:
        args += ["--abi", abi]
    for plat in target["platforms"]:
        args += ["--platform", plat]
    return args


def _options(lines: list[str]) -> list[str]:
    return [arg for ln in lines if ln.startswith("-") for arg in shlex.split(ln)]


def resolve(lines: list[str], target: dict[str, Any], scratch: Path) -> list[str]:
    """The pinned set (`name==version`, sorted) the VM needs beyond its image."""
    image: dict[str, str] = dict(target["image_packages"])
    stubs = scratch / "image"
    image_stubs.write(stubs, image)
    (scratch / "image.txt").write_text("".join(f"{n}=={v}\n" for n, v in sorted(image.items())))
    (scratch / "requirements.txt").write_text("\n".join(ln for ln in lines if not ln.startswith("-")) + "\n")
    report = scratch / "report.json"
    res = _pip("install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
               "--target", str(scratch / "target"), *_tags(target), *_options(lines), "--find-links", str(stubs),
               "-c", str(scratch / "image.txt"), "-r", str(scratch / "requirements.txt"))
    if res.returncode != 0:
        raise GlueError(f"a requirement cannot be resolved for the VM (Python {target['python']}, "
                        f"{target['platform']}, over its image): {pip_problem(res)}")
    items = json.loads(report.read_text()).get("install") or []
    return sorted(f"{canonical(i['metadata']['name'])}=={i['metadata']['version']}" for i in items
                  if canonical(i["metadata"]["name"]) not in image)


def _download(pins: list[str], lines: list[str], target: dict[str, Any], folder: Path) -> dict[str, str]:
    res = _pip("download", "--no-deps", "--quiet", "-d", str(folder), *_tags(target), *_options(lines), *pins)
    if res.returncode != 0:
        raise GlueError(f"downloading the pinned requirements failed: {pip_problem(res)}")
    wheels = {p.name: sha256_of(p) for p in sorted(folder.glob("*.whl"))}
    if len(wheels) != len(pins):
        raise GlueError(f"the wheelhouse holds {len(wheels)} wheels for {len(pins)} pinned packages")
    return wheels


def _index(s3: Any, bucket: str, digest: str) -> dict[str, Any] | None:
    try:
        body = s3.get_object(Bucket=bucket, Key=wheelhouse_index_key(digest))["Body"].read()
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise
    return dict(json.loads(body))


def _upload(s3: Any, bucket: str, digest: str, folder: Path, index: dict[str, Any]) -> None:
    """Every wheel, then the index: a set whose index is in the bucket is complete."""
    for name in sorted(index["wheels"]):
        s3.upload_file(str(folder / name), bucket, wheel_key(digest, name), Config=TRANSFER)
    s3.put_object(Bucket=bucket, Key=wheelhouse_index_key(digest), Body=json.dumps(index, indent=1).encode())


def pin(s3: Any, bucket: str, lines: list[str], target: dict[str, Any]) -> dict[str, Any]:
    """The manifest's `requirements`: {lines, set_sha256, pins, wheels, python, platform, uploaded}."""
    scratch = Path(tempfile.mkdtemp(prefix="gpukit-requirements-"))
    try:
        pins = resolve(lines, target, scratch)
        digest = set_hash(pins, {"python": target["python"], "platform": target["platform"]})
        out = {"lines": lines, "set_sha256": digest, "pins": pins, "python": target["python"],
               "platform": target["platform"], "wheels": {}, "uploaded": False}
        if not pins:
            return out
        try:
            found = _index(s3, bucket, digest)
            if found is not None:
                return {**out, "wheels": dict(found["wheels"])}
            wheels = _download(pins, lines, target, scratch / "wheels")
            _upload(s3, bucket, digest, scratch / "wheels", {**out, "wheels": wheels, "uploaded": True})
        except (ClientError, BotoCoreError) as exc:
            raise GlueError(f"bucket {bucket} did not take the wheelhouse: {str(exc).splitlines()[0]}") from exc
        return {**out, "wheels": wheels, "uploaded": True}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
