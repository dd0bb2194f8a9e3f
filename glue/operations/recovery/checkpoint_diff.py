"""Two checkpoints of the same step compared by what they hold, object by object (glue drill's final check).

gpukit's own components (`<name>.pt`, `<name>.rank<r>.pt`) and the files of a sealed framework folder
(`files/...`: Hugging Face Trainer's checkpoint-<N>/, a Lightning `.ckpt`, any FolderCheckpoints folder) are
read by their kind: safetensors tensor by tensor (its header parsed here, each tensor's bytes compared: no
package needed), torch files with torch.load(weights_only=True) and compared key by key (optimizer,
scheduler, RNG states), JSON by its fields (times and paths left out), anything else byte for byte. An
object that cannot be read that way (a pickle weights_only refuses) is named, never a traceback.
"""

from __future__ import annotations

import io
import json
import pickle
import re
import struct
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from glue.train.checkpoint.format import Commit

# Fields that differ between two equal runs by when and where they ran, not by what they trained: times
# (trainer_state.json's train_runtime, *_per_second), and paths (best_model_checkpoint, a Lightning
# ModelCheckpoint's dirpath / best_model_path). Only values that are not tensors are left out.
_VOLATILE = re.compile(r"time|per_second|timestamp|date|path|dir|checkpoint$|_at$", re.IGNORECASE)
# Files that hold a framework's settings, not training state, and that only an unrestricted unpickle reads.
SETTINGS_FILES = {"training_args.bin": "the Trainer's arguments: settings, not state; a pickle, not loaded"}
_TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".tar")
# A random stream's state: a path segment named like one (gpukit's `rng.rank0`, the Trainer's rng_state.pth,
# Lightning's gpukit_rng, a sampler's `generator`); not any name containing "random" (a model's random_proj).
_RNG = re.compile(r"(^|[./:\[])(rng[^./:\[]*|[^./:\[]*_rng|generator)($|[./:\[\]])", re.IGNORECASE)


@dataclass(frozen=True)
class RawTensor:
    """One safetensors entry: compared by dtype, shape and its exact bytes."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes


@dataclass(frozen=True)
class Difference:
    where: str  # the object and the key within it: "files/model.safetensors:lm_head.weight", "rng.rank0.numpy"

    @property
    def rng(self) -> bool:
        """A random stream's state (not a tensor of the model or the optimizer)."""
        return bool(_RNG.search(self.where))


@dataclass
class Comparison:
    """What two checkpoints' comparison found: every object's first differing key, and what was not compared."""

    differences: list[Difference] = field(default_factory=list)
    uncomparable: list[str] = field(default_factory=list)  # "<object>: <why>", one line each
    skipped: list[str] = field(default_factory=list)  # left out on purpose, with the reason
    objects: int = 0
    tensors: int = 0
    fields: int = 0

    def summary(self) -> str:
        """What was and was not compared, in one line."""
        out = f"{self.objects} objects compared ({self.tensors} tensors, {self.fields} other values)"
        if self.skipped:
            out += f"; not compared: {'; '.join(self.skipped)}"
        if self.uncomparable:
            out += f"; could not compare: {'; '.join(self.uncomparable)}"
        return out


class Uncomparable(ValueError):
    """An object that cannot be read for comparison; the message says what it is."""


def _safetensors(data: bytes) -> dict[str, Any]:
    """A safetensors file's tensors by name: 8 bytes of header length, a JSON header, the tensors' bytes."""
    if len(data) < 8:
        raise Uncomparable("not a safetensors file (shorter than its header length)")
    (n,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8 : 8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Uncomparable("not a safetensors file (its header is not JSON)") from exc
    if not isinstance(header, dict):
        raise Uncomparable("not a safetensors file (its header is not a JSON object)")
    body = data[8 + n :]
    out: dict[str, Any] = {"__metadata__": header.pop("__metadata__", {})}
    for name, entry in header.items():
        try:
            start, end = entry["data_offsets"]
            out[name] = RawTensor(str(entry["dtype"]), tuple(entry["shape"]), body[start:end])
        except (KeyError, TypeError, ValueError) as exc:
            raise Uncomparable(f"not a safetensors file (entry {name!r} has no dtype/shape/data_offsets)") from exc
    return out


def _numpy_allowed() -> AbstractContextManager[Any]:
    """NumPy arrays (the Trainer's rng_state.pth holds NumPy's state) allowed to torch.load(weights_only)."""
    import numpy as np
    import torch

    core = getattr(np, "_core", None) or np.core
    return torch.serialization.safe_globals([core.multiarray._reconstruct, np.ndarray, np.dtype,
                                             type(np.dtype(np.uint32))])


def _torch(data: bytes) -> Any:
    import torch

    try:
        with _numpy_allowed():
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL (\S+)", str(exc))
        what = f" (it holds {found.group(1)})" if found else ""
        raise Uncomparable(f"a pickle torch.load(weights_only=True) refuses{what}: only tensors, containers "
                           "and plain values can be compared") from exc
    except (RuntimeError, EOFError, ValueError, OSError) as exc:
        raise Uncomparable(f"not a torch file torch.load can read ({str(exc).splitlines()[0][:120]})") from exc


def load(key: str, data: bytes) -> Any:
    """An object's content by its kind; Uncomparable (one line) when it cannot be read."""
    name = key.rsplit("/", 1)[-1]
    if name.endswith(".safetensors"):
        return _safetensors(data)
    if name.endswith(".json"):
        try:
            return json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise Uncomparable("not valid JSON") from exc
    if name.endswith(_TORCH_SUFFIXES):
        return _torch(data)
    return data  # any other file: byte for byte


def _tensor_diff(a: Any, b: Any) -> bool:
    import numpy as np
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a, b)
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.shape != b.shape or a.dtype != b.dtype or not np.array_equal(a, b)
    return True


class _Walk:
    """The first differing path of two loaded objects; counts tensors and other values compared."""

    def __init__(self) -> None:
        import numpy as np
        import torch

        self.arrays: tuple[type, ...] = (torch.Tensor, np.ndarray, RawTensor)
        self.tensors = 0
        self.fields = 0

    def diff(self, a: Any, b: Any, path: str) -> str | None:
        if isinstance(a, self.arrays) or isinstance(b, self.arrays):
            self.tensors += 1
            if isinstance(a, RawTensor) or isinstance(b, RawTensor):
                return None if a == b else path
            return path if _tensor_diff(a, b) else None
        if isinstance(a, dict) and isinstance(b, dict):
            return self._dict(a, b, path)
        if isinstance(a, list | tuple) and isinstance(b, list | tuple):
            if len(a) != len(b):
                return f"{path} (length {len(a)} vs {len(b)})"
            return next((d for i, (x, y) in enumerate(zip(a, b, strict=True))
                         if (d := self.diff(x, y, f"{path}[{i}]"))), None)
        self.fields += 1
        return None if a == b else path

    def _dict(self, a: dict[Any, Any], b: dict[Any, Any], path: str) -> str | None:
        keys = [k for k in set(a) | set(b) if not self._volatile(k, a.get(k), b.get(k))]
        for k in sorted(keys, key=str):
            sub = f"{path}{k}" if path.endswith(":") or not path else f"{path}.{k}"
            if k not in a or k not in b:
                return f"{sub} (in only one of them)"
            d = self.diff(a[k], b[k], sub)
            if d:
                return d
        return None

    def _volatile(self, key: Any, a: Any, b: Any) -> bool:
        """A time or path: a plain value (not a tensor, not a container) under a key named like one."""
        nested = (dict, list, tuple, *self.arrays)
        return isinstance(key, str) and bool(_VOLATILE.search(key)) and not isinstance(a, nested) \
            and not isinstance(b, nested)


def first_difference(a: Any, b: Any, path: str) -> str | None:
    """Path of the first tensor/value that differs between two loaded state objects."""
    return _Walk().diff(a, b, path)


def _label(key: str) -> str:
    """How an object is named in a difference: a component's file without `.pt`, a framework file as is."""
    return key.removesuffix(".pt") if "/" not in key else key + ":"


def _objects(commits: tuple[Commit, Commit], out: Comparison) -> Iterator[str]:
    """The keys of both commits' objects in order; an object or component in only one is a difference."""
    for name in sorted(set(commits[0].components) | set(commits[1].components)):
        keys = [{o.key for o in c.components.get(name, [])} for c in commits]
        if not keys[0] or not keys[1]:
            out.differences.append(Difference(f"{name} (component present in only one run)"))
            continue
        for key in sorted(keys[0] ^ keys[1]):
            out.differences.append(Difference(f"{key} (object present in only one run)"))
        yield from sorted(keys[0] & keys[1])


def compare(commits: tuple[Commit, Commit], read: tuple[Callable[[str], bytes | None], Callable[[str], bytes | None]],
            ) -> Comparison:
    """Every object of two commits of the same step, read with `read[i](key)`, compared by what it holds."""
    out = Comparison()
    walk = _Walk()
    for key in _objects(commits, out):
        base = key.rsplit("/", 1)[-1]
        if base in SETTINGS_FILES:
            out.skipped.append(f"{key} ({SETTINGS_FILES[base]})")
            continue
        got = [r(key) for r in read]
        data = [d for d in got if d is not None]
        if len(data) != 2:
            out.uncomparable.append(f"{key}: missing from the bucket although COMMIT.json lists it")
            continue
        out.objects += 1
        try:
            loaded = [load(key, d) for d in data]
        except Uncomparable as exc:
            if data[0] != data[1]:  # equal bytes are equal whatever they hold; other bytes cannot be judged
                out.uncomparable.append(f"{key}: {exc}")
            continue
        diff = walk.diff(loaded[0], loaded[1], _label(key))
        if diff:
            out.differences.append(Difference(diff.rstrip(":")))
    out.tensors, out.fields = walk.tensors, walk.fields
    return out
