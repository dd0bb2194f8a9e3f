"""Copying live state to host memory (the only work done on the training thread), and checking a
loaded checkpoint against the live objects before anything is loaded into them."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from glue.train.errors import StateMismatchError

_SCALARS = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device)


class HostSnapshotter:
    """Deep-copies a state_dict to host memory. Tensor buffers are kept and reused by path, so a
    steady-state save allocates nothing (and CUDA copies land in pinned memory, asynchronously).

    Reuse is safe because the checkpointer never snapshots while the previous save still reads them.
    """

    def __init__(self, reuse: bool = True) -> None:
        self.reuse = reuse
        self._pool: dict[str, torch.Tensor] = {}
        self._cuda_pending = False

    def copy(self, states: Mapping[str, Any]) -> dict[str, Any]:
        out = {name: self._copy(state, name) for name, state in states.items()}
        self.wait()
        return out

    def copy_tensor(self, path: str, src: torch.Tensor) -> torch.Tensor:
        """One tensor into the host buffer kept for `path` (CUDA copies: call wait() before use)."""
        out: torch.Tensor = self._copy(src, path)
        return out

    def wait(self) -> None:
        """Until every CUDA copy started by copy_tensor has landed."""
        if self._cuda_pending:
            torch.cuda.synchronize()
            self._cuda_pending = False

    def _buffer(self, path: str, src: torch.Tensor) -> torch.Tensor:
        buf = self._pool.get(path)
        if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
            buf = torch.empty(src.shape, dtype=src.dtype, device="cpu", pin_memory=src.is_cuda)
            if self.reuse:
                self._pool[path] = buf
        return buf

    def _copy(self, value: Any, path: str) -> Any:
        if isinstance(value, torch.Tensor):
            src = value.detach()
            if src.layout != torch.strided:
                return src.to("cpu", copy=True)
            buf = self._buffer(path, src)
            buf.copy_(src, non_blocking=src.is_cuda)
            self._cuda_pending |= src.is_cuda
            return buf
        if isinstance(value, _SCALARS):
            return value
        if isinstance(value, dict):
            # dict subclasses (OrderedDict) keep their type: some load_state_dict methods care.
            items = [(k, self._copy(v, f"{path}/{k}")) for k, v in value.items()]
            return type(value)(items) if type(value) is not dict else dict(items)
        if isinstance(value, list):
            return [self._copy(v, f"{path}/{i}") for i, v in enumerate(value)]
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return tuple(self._copy(v, f"{path}/{i}") for i, v in enumerate(value))
        if isinstance(value, np.ndarray):
            return value.copy()
        return copy.deepcopy(value)


# ---------------------------------------------------------------------------------------------
# compatibility checks (before any load_state_dict)

# Per-parameter optimizer state that has the parameter's shape (torch.optim built-ins).
_PARAM_SHAPED = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "square_avg", "sum", "acc_delta"}


def _shape(t: torch.Tensor) -> list[int]:
    return list(t.shape)


def check_compatible(name: str, saved: Any, live: Any) -> None:
    """Raise StateMismatchError naming the component and key if `saved` cannot load into `live`."""
    hook = getattr(live, "checkpoint_check", None)
    if callable(hook) and isinstance(saved, dict):
        problems = hook(saved)
        if problems:
            key, what = problems[0]
            raise StateMismatchError(name, key, what)
    if isinstance(live, torch.nn.Module):
        _check_module(name, saved, live)
    elif isinstance(live, torch.optim.Optimizer):
        _check_optimizer(name, saved, live)
    else:
        state_dict = getattr(live, "state_dict", None)
        if callable(state_dict):
            _check_tensors(name, saved, state_dict(), "")


def _check_module(name: str, saved: Any, module: torch.nn.Module) -> None:
    if not isinstance(saved, Mapping):
        raise StateMismatchError(name, "", f"checkpoint holds a {type(saved).__name__}, not a state_dict")
    live = module.state_dict()
    for key in live:
        if key not in saved:
            raise StateMismatchError(name, key, "missing from the checkpoint (a different model?)")
    for key in saved:
        if key not in live:
            raise StateMismatchError(name, key, "in the checkpoint but not in the model (a different model?)")
    for key, want in live.items():
        got = saved[key]
        if isinstance(want, torch.Tensor):
            if not isinstance(got, torch.Tensor):
                raise StateMismatchError(name, key, f"checkpoint holds a {type(got).__name__}, model a tensor")
            if got.shape != want.shape:
                raise StateMismatchError(
                    name, key, f"shape {_shape(got)} in the checkpoint, {_shape(want)} in the model"
                )
            if got.dtype != want.dtype:
                raise StateMismatchError(name, key, f"dtype {got.dtype} in the checkpoint, {want.dtype} in the model")


def _check_optimizer(name: str, saved: Any, opt: torch.optim.Optimizer) -> None:
    if not isinstance(saved, Mapping) or "param_groups" not in saved or "state" not in saved:
        raise StateMismatchError(name, "", "not an optimizer state_dict")
    groups = saved["param_groups"]
    if len(groups) != len(opt.param_groups):
        raise StateMismatchError(
            name, "param_groups", f"{len(groups)} groups in the checkpoint, {len(opt.param_groups)} here"
        )
    by_id: dict[Any, torch.Tensor] = {}
    for gi, (sg, lg) in enumerate(zip(groups, opt.param_groups, strict=True)):
        if len(sg["params"]) != len(lg["params"]):
            raise StateMismatchError(
                name,
                f"param_groups.{gi}.params",
                f"{len(sg['params'])} parameters in the checkpoint, {len(lg['params'])} here",
            )
        by_id.update(zip(sg["params"], lg["params"], strict=True))
    for pid, pstate in saved["state"].items():
        if pid not in by_id:
            raise StateMismatchError(name, f"state.{pid}", "state for a parameter that is not in any group")
        param = by_id[pid]
        if not isinstance(pstate, Mapping):
            continue
        for key, value in pstate.items():
            if key in _PARAM_SHAPED and isinstance(value, torch.Tensor) and value.shape != param.shape:
                raise StateMismatchError(
                    name, f"state.{pid}.{key}", f"shape {_shape(value)} in the checkpoint, parameter is {_shape(param)}"
                )


def _check_tensors(name: str, saved: Any, live: Any, path: str) -> None:
    if isinstance(live, torch.Tensor) and isinstance(saved, torch.Tensor):
        if saved.shape != live.shape:
            raise StateMismatchError(name, path, f"shape {_shape(saved)} in the checkpoint, {_shape(live)} here")
    elif isinstance(live, Mapping) and isinstance(saved, Mapping):
        for key, value in live.items():
            if key in saved:
                _check_tensors(name, saved[key], value, f"{path}.{key}" if path else str(key))
