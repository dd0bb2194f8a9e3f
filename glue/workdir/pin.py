"""What a run's manifest pins of the user's job, and what each VM is handed to bring it back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class Pinned(Protocol):
    """What a manifest pins (glue.runs.records.Manifest): the package and the resolved requirements."""

    workdir: dict[str, Any] | None
    requirements: dict[str, Any] | None


@dataclass(frozen=True)
class Workspace:
    """package: {sha256, size, files, key, command_in_package, git: {...}} (manifest `workdir`).
    requirements: {lines, set_sha256, pins, wheels, python, platform} (manifest `requirements`).
    Both None: the run uses only what the image has (our tiny_gpt example, a docker image)."""

    package: dict[str, Any] | None = None
    requirements: dict[str, Any] | None = None

    @classmethod
    def from_manifest(cls, manifest: Pinned) -> Workspace:
        return cls(manifest.workdir, manifest.requirements)

    @property
    def needs_prepare(self) -> bool:
        return bool(self.package) or bool(self.requirements and self.requirements.get("pins"))

    @property
    def command_in_package(self) -> bool:
        return bool(self.package and self.package.get("command_in_package"))

    def prepare_spec(self, run: str, attempt: int) -> dict[str, Any]:
        """The part of glue.train.workspace's spec that says what to bring back (hashes only)."""
        pkg = {"sha256": self.package["sha256"], "size": self.package["size"]} if self.package else None
        req = None
        if self.requirements and self.requirements.get("pins"):
            req = {k: self.requirements[k] for k in ("set_sha256", "pins", "wheels")}
            if self.requirements.get("pack_sha256"):  # pinned after the first attempt packed (or found) it
                req["pack_sha256"] = self.requirements["pack_sha256"]
        return {"run": run, "attempt": attempt, "package": pkg, "requirements": req}
