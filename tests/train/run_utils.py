"""Helpers of the resume / fault tests: small configs, the CLI in a fresh process, bitwise
comparison of checkpoints, and fault injection (NaN at chosen steps, poisoned samples)."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from train import checkpoint
from train import config as C

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "demo.yaml"
TINY = ROOT / "configs" / "cocostuff_tiny.yaml"
TIMING = {
    "train_seconds",
    "epoch_end_seconds",
    "eval_seconds",
    "train_seconds_total",
    "epoch_end_seconds_total",
}
RUN_CONTROL = ("out", "stop_after_steps", "checkpoint_every", "keep_checkpoints")
# one thread everywhere: an in-process run and a fresh process then do the same arithmetic
SMALL = ("train.epochs=2", "train.progress=false", "train.num_threads=1")


def quiet(*_: object) -> None:
    """A ``log`` for ``train.loop.run`` that prints nothing."""


def smnist_args(data: Path, out: Path, *extra: str) -> list[str]:
    """``python -m train`` arguments: the demo (MLP + F-beta regularizer) on ``data``, 2 epochs."""
    return ["--config", str(DEMO), "--out", str(out), f"data.path={data}", *SMALL, *extra]


def smnist_cfg(data: Path, out: Path, *extra: str) -> C.Config:
    return C.load(DEMO, [f"data.path={data}", f"train.out={out}", *SMALL, *extra])


def steps_per_epoch(cfg: C.Config) -> int:
    from train.data import load_data

    return math.ceil(len(load_data(cfg.data).train) / cfg.data.batch_size)


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m train ARGS`` in a fresh process."""
    return subprocess.run(
        [sys.executable, "-m", "train", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def final_checkpoint(run_dir: Path) -> dict[str, Any]:
    found = checkpoint.latest(run_dir)
    assert found is not None, f"no checkpoint in {run_dir}"
    return found[1]


def without_timing(x: Any) -> Any:
    """``metrics.json`` content / a history with the wall-clock fields removed."""
    if isinstance(x, dict):
        return {k: without_timing(v) for k, v in x.items() if k not in TIMING}
    if isinstance(x, list):
        return [without_timing(v) for v in x]
    return x


def assert_bitwise_equal(a: Any, b: Any, where: str = "checkpoint") -> None:
    """Same structure, tensors ``torch.equal`` with the same dtype, other leaves ``==``."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{where}: tensor vs {type(b).__name__}"
        assert a.dtype == b.dtype and a.shape == b.shape, (
            f"{where}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
        )
        assert torch.equal(a, b), f"{where}: tensors differ (max |diff| {_max_diff(a, b)})"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: keys {set(a) ^ set(b)}"
        for k in a:
            assert_bitwise_equal(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), f"{where}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_bitwise_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if not a.is_floating_point():
        return float((a.long() - b.long()).abs().max()) if a.numel() else 0.0
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def assert_same_training_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Two checkpoints hold the same training state bit for bit: model, optimizer, schedule,
    scaler, regularizer, RNG and sampler states, counters and the metrics history (timing
    excluded); configs equal except the keys that do not change the arithmetic (``RUN_CONTROL``)."""
    assert a.keys() == b.keys()
    for key in a.keys() - {"history", "config"}:
        assert_bitwise_equal(a[key], b[key], key)
    assert_bitwise_equal(without_timing(a["history"]), without_timing(b["history"]), "history")
    ca, cb = (_run_independent(c) for c in (a["config"], b["config"]))
    assert ca == cb


def _run_independent(cfg: dict[str, Any]) -> dict[str, Any]:
    train = {k: v for k, v in cfg["train"].items() if k not in RUN_CONTROL}
    return {**cfg, "train": train}


def poison_training_forwards(monkeypatch, calls: Iterable[int], target: str = "logits") -> None:
    """Make the trainer's model return NaN logits (``target="logits"``) or an infinite shape
    score (``"u"``) on the given training forward passes (1-based, counted per built model)."""
    import train.setup as train_setup

    calls, build = set(calls), train_setup.build_model

    def build_poisoned(*args, **kwargs):
        model = build(*args, **kwargs)
        forward, count = model.forward, [0]

        def poisoned(x):
            logits, u = forward(x)
            if model.training:
                count[0] += 1
                if count[0] in calls and target == "logits":
                    logits = logits * float("nan")
                elif count[0] in calls:
                    u = u + float("inf")
            return logits, u

        model.forward = poisoned
        return model

    monkeypatch.setattr(train_setup, "build_model", build_poisoned)


def poison_training_samples(monkeypatch, indices: Iterable[int]) -> None:
    """Training images ``indices`` become NaN (S-MNIST: the images turn float in [0, 1])."""
    import train.setup as train_setup

    load, indices = train_setup.load_data, list(indices)

    def load_poisoned(*args, **kwargs):
        data = load(*args, **kwargs)
        images = data.train.tensors["image"].float().div_(255.0)
        images[indices] = float("nan")
        data.train.tensors["image"] = images
        return data

    monkeypatch.setattr(train_setup, "load_data", load_poisoned)


def all_finite(state: dict[str, Any]) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in state.values() if v.is_floating_point())
