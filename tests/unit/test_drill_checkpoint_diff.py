"""glue drill's final check over real checkpoint files: safetensors tensor by tensor, torch files (optimizer,
scheduler, NumPy RNG state) key by key, JSON by its fields with times and paths left out, the first
differing file and key named, and an object that cannot be compared named in one line."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
import torch
from safetensors.torch import save as save_safetensors

from glue.operations.recovery.checkpoint_diff import Comparison, Difference, compare, load
from glue.train.checkpoint.format import Commit, ObjectRef


def _sealed(files: dict[str, bytes]) -> tuple[Commit, Callable[[str], bytes | None]]:
    """A sealed framework folder's commit (component `files`) over these files, and its reader."""
    blobs = {f"files/{k}": v for k, v in files.items()}
    refs = [ObjectRef(k, len(v), hashlib.sha256(v).hexdigest()) for k, v in blobs.items()]
    return Commit(10, "", 1, {"files": refs}), blobs.get


def _compare(a: dict[str, bytes], b: dict[str, bytes]) -> Comparison:
    (ca, ra), (cb, rb) = _sealed(a), _sealed(b)
    return compare((ca, cb), (ra, rb))


def _torch(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _trainer_folder(weight_delta: float = 0.0, lr: float = 1e-3, numpy_seed: int = 0, runtime: float = 1.5,
                    out_dir: str = "/scratch/a") -> dict[str, bytes]:
    """A Trainer's checkpoint-<N>/ as it writes it: weights, optimizer, scheduler, RNG states, state JSON."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    with torch.no_grad():
        model.bias[1] += weight_delta
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    (model(torch.ones(2, 4)) ** 2).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    rng = {"python": ("3", tuple(range(5)), None), "numpy": np.random.RandomState(numpy_seed).get_state(),
           "cpu": torch.get_rng_state()}
    state = {"global_step": 10, "best_model_checkpoint": f"{out_dir}/checkpoint-10",
             "log_history": [{"step": 10, "loss": 2.5, "train_runtime": runtime, "train_samples_per_second": 9.0}]}
    return {"model.safetensors": save_safetensors({k: v.detach() for k, v in model.state_dict().items()}),
            "optimizer.pt": _torch(opt.state_dict()), "scheduler.pt": _torch(sched.state_dict()),
            "rng_state.pth": _torch(rng), "trainer_state.json": json.dumps(state).encode(),
            "training_args.bin": _torch({"output_dir": out_dir, "frac": Fraction(1, 3)})}


def test_equal_trainer_folders_compare_every_object_and_leave_times_and_paths_out() -> None:
    res = _compare(_trainer_folder(), _trainer_folder(runtime=99.0, out_dir="/scratch/b"))
    assert res.differences == [] and res.uncomparable == [], res
    assert res.objects == 5 and res.tensors >= 2 + 4 + 2  # weights, optimizer moments, RNG states
    assert res.skipped == ["files/training_args.bin (the Trainer's arguments: settings, not state; a pickle, not "
                           "loaded)"]
    assert "5 objects compared" in res.summary() and "not compared: files/training_args.bin" in res.summary()


def test_the_first_differing_tensor_of_each_file_is_named() -> None:
    res = _compare(_trainer_folder(), _trainer_folder(weight_delta=1.0))
    wheres = [d.where for d in res.differences]
    assert wheres[0] == "files/model.safetensors:bias", wheres  # safetensors: tensor by tensor, by name
    assert "files/optimizer.pt:state.0.exp_avg" in wheres, wheres  # the moments after a different step
    assert not any(d.rng for d in res.differences)


def test_a_scheduler_setting_and_a_numpy_stream_are_named_by_their_key() -> None:
    res = _compare(_trainer_folder(), _trainer_folder(lr=2e-3, numpy_seed=1))
    wheres = {d.where: d.rng for d in res.differences}
    assert wheres["files/optimizer.pt:param_groups[0].initial_lr"] is False, wheres
    assert wheres["files/scheduler.pt:_last_lr[0]"] is False, wheres  # keys in sorted order: _last_lr first
    assert wheres["files/rng_state.pth:numpy[1]"] is True, wheres  # NumPy's state array, read back as an array


def test_json_is_compared_by_its_fields() -> None:
    a = {"trainer_state.json": json.dumps({"global_step": 10, "epoch": 0.5}).encode()}
    b = {"trainer_state.json": json.dumps({"epoch": 0.75, "global_step": 10}, indent=2).encode()}
    assert [d.where for d in _compare(a, b).differences] == ["files/trainer_state.json:epoch"]
    assert _compare(a, {"trainer_state.json": json.dumps({"epoch": 0.5, "global_step": 10}).encode()}).differences == []


def test_a_pickle_weights_only_refuses_is_one_line_naming_it_unless_its_bytes_are_equal() -> None:
    a, b = {"extra.pt": _torch({"w": Fraction(1, 3)})}, {"extra.pt": _torch({"w": Fraction(1, 4)})}
    res = _compare(a, b)
    assert res.differences == [] and len(res.uncomparable) == 1, res
    assert res.uncomparable[0].startswith("files/extra.pt: a pickle torch.load(weights_only=True) refuses")
    assert "fractions.Fraction" in res.uncomparable[0] and "\n" not in res.uncomparable[0]
    assert "could not compare: files/extra.pt" in res.summary()
    assert _compare(a, a).uncomparable == []  # the same bytes are equal whatever they hold


def test_other_files_compare_byte_for_byte_and_a_missing_file_is_a_difference() -> None:
    res = _compare({"vocab.txt": b"a b c", "x.txt": b"1"}, {"vocab.txt": b"a b d"})
    assert [d.where for d in res.differences] == ["files/x.txt (object present in only one run)", "files/vocab.txt"]


def test_a_truncated_safetensors_file_cannot_be_read() -> None:
    good = save_safetensors({"w": torch.ones(3)})
    try:
        load("files/model.safetensors", good[:4])
    except ValueError as exc:
        assert "not a safetensors file" in str(exc)
    else:
        raise AssertionError("a truncated safetensors file was read")
    assert load("files/model.safetensors", good)["w"].shape == (3,)


def test_only_a_random_streams_state_counts_as_one_not_a_tensor_named_random() -> None:
    a = {"model.safetensors": save_safetensors({"random_proj.weight": torch.zeros(2)})}
    b = {"model.safetensors": save_safetensors({"random_proj.weight": torch.ones(2)})}
    [diff] = _compare(a, b).differences
    assert diff.where == "files/model.safetensors:random_proj.weight" and not diff.rng
    assert Difference("rng.rank0.numpy.keys").rng and Difference("files/x.ckpt:gpukit_rng.torch").rng
