"""``train.compile: true``: the compiled network (and F-beta's compiled per-step math) trains like the
eager one, and checkpoints keep the eager ``state_dict`` keys.

Measured (CPU, torch 2.13, the demo config on the offline digits, 2 epochs): the largest relative
difference of a network parameter 3e-7, of the epoch's mean losses 2e-8, of the regularizer's
learned threshold 4e-7; every test metric equal. Asserted with rtol 1e-5, atol 1e-6. Compiling
takes ~15 s on 2 CPU cores, so the CPU test is marked slow.
"""

from __future__ import annotations

import pytest
import torch

from train.loop import run

from .run_utils import final_checkpoint, quiet, smnist_cfg

TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}
pytestmark = pytest.mark.usefixtures("fresh_dynamo")
# On CUDA inductor's kernels sum in another order than cuBLAS / the eager kernels. Measured (torch
# 2.11 + CUDA 13, H100 and H200, 2026-11-26): after one epoch the first layer's weights differ by up
# to 1.16e-6 absolute (parameters of size 0.03; 7.6e-3 relative on an entry near zero), every other
# tensor by at most 2.4e-7, every metric equal to 8 digits. 10x headroom over that.
CUDA_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


def _eager_and_compiled(data, tmp_path, *extra: str) -> list[tuple[dict, dict]]:
    out = []
    for compiled in ("false", "true"):
        cfg = smnist_cfg(
            data,
            tmp_path / f"compile-{compiled}",
            "train.epochs=1",
            f"train.compile={compiled}",
            *extra,
        )
        history = run(cfg, log=quiet)["history"]
        out.append((history[-1], final_checkpoint(tmp_path / f"compile-{compiled}")))
    return out


def _assert_close_runs(runs: list[tuple[dict, dict]], tolerance: dict = TOLERANCE) -> None:
    (eager_row, eager), (compiled_row, compiled) = runs
    assert compiled["model"].keys() == eager["model"].keys()  # no "_orig_mod." prefix
    for part in ("model", "regularizer"):
        for name, value in eager[part].items():
            torch.testing.assert_close(compiled[part][name], value, **tolerance, msg=name)
    for p, state in eager["optimizer"]["state"].items():
        for key, value in state.items():
            torch.testing.assert_close(compiled["optimizer"]["state"][p][key], value, **tolerance)
    assert compiled_row.keys() == eager_row.keys()
    for key, value in eager_row.items():
        if isinstance(value, float) and not key.endswith("seconds"):
            assert compiled_row[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
        elif not isinstance(value, float):
            assert compiled_row[key] == value, key


@pytest.mark.slow  # ~22 s with a cold compile cache: the network's and the regularizer's graphs
def test_compiled_training_matches_eager(digits_smnist, tmp_path):
    _assert_close_runs(_eager_and_compiled(digits_smnist, tmp_path))


@pytest.mark.cuda
def test_compiled_training_matches_eager_on_cuda(digits_smnist, tmp_path):
    runs = _eager_and_compiled(digits_smnist, tmp_path, "train.device=cuda")
    _assert_close_runs(runs, CUDA_TOLERANCE)


@pytest.mark.slow  # three compiled runs (~1 min with a cold compile cache)
def test_compiled_stop_and_resume_is_bitwise_exact(digits_smnist, tmp_path):
    """``train.compile=true`` with the library's defaults (tracked, sparse ``tau``): a run stopped
    mid-epoch 2 and resumed in a fresh process ends where the uninterrupted compiled run ends, bit
    for bit (model, optimizer, regularizer, metrics)."""
    from .run_utils import assert_same_training_state, smnist_args, steps_per_epoch
    from .test_resume import _stop_then_resume

    extra = ("train.compile=true",)
    cfg = smnist_cfg(digits_smnist, tmp_path / "a", *extra)
    per_epoch = steps_per_epoch(cfg)
    run(cfg, log=quiet)
    a = final_checkpoint(tmp_path / "a")
    b_dir = tmp_path / "b"
    _stop_then_resume(smnist_args(digits_smnist, b_dir, *extra), b_dir, per_epoch + 5)
    b = final_checkpoint(b_dir)
    assert a["global_step"] == b["global_step"] == 2 * per_epoch
    assert_same_training_state(a, b)
