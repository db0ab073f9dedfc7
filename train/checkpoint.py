"""Checkpoints and run files, written atomically (``train.files``: temp file, fsync, rename).

A run folder keeps its checkpoints as ``checkpoints/step-<global step>.pt`` (the last
``train.keep_checkpoints``); ``latest`` returns the newest one that loads, so a run killed while
writing one resumes from the previous. A checkpoint holds everything an exact resume needs: model,
optimizer, lr schedule, gradient scaler, regularizer (eps, tau, lambda, mu, scores, counters), the
RNG states (python, numpy, torch, CUDA), the sampler's position (epoch, step in epoch, generator
state at the epoch's start), the metrics history and the resolved config.
``checkpoints/best.pt`` (``train.run_info``) sits next to them: the weights of the epoch the run
selects, for ``train.predict``; not a resume point, not counted or pruned here.
"""

from __future__ import annotations

import random
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .files import atomic_path

FOLDER = "checkpoints"
_NAME = re.compile(r"^step-(\d+)\.pt$")


def save_atomic(obj: Any, path: str | Path) -> None:
    """``torch.save(obj)`` to ``path`` so that a crash leaves either the old file or the new one."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        torch.save(obj, f)


def load(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    return torch.load(path, map_location=map_location, weights_only=True)


def path_for(run_dir: str | Path, global_step: int) -> Path:
    return Path(run_dir) / FOLDER / f"step-{global_step:09d}.pt"


def step_of(path: Path) -> int:
    """The global step of a checkpoint file ``step-<N>.pt``."""
    return int(_NAME.match(Path(path).name).group(1))


def listing(run_dir: str | Path) -> list[Path]:
    """The run's checkpoints, newest (highest step) first."""
    folder = Path(run_dir) / FOLDER
    found = [(int(m.group(1)), p) for p in folder.glob("step-*.pt") if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def latest(run_dir: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint of ``run_dir`` that loads (an unreadable one is skipped, with a
    warning naming it), or ``None`` when there is none."""
    for path in listing(run_dir):
        try:
            return path, load(path)
        except Exception as e:  # any unpickling / zip error means: not usable
            warnings.warn(
                f"checkpoint {path} cannot be read ({e}); trying an older one", stacklevel=2
            )
    return None


def prune(run_dir: str | Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints (and temp files of interrupted writes)."""
    for path in listing(run_dir)[keep:]:
        path.unlink(missing_ok=True)
    for tmp in (Path(run_dir) / FOLDER).glob(".*.tmp*"):
        tmp.unlink(missing_ok=True)


def rng_state() -> dict[str, Any]:
    """Python, numpy (legacy global) and torch CPU/CUDA generator states, as checkpointable types."""
    np_state = np.random.get_state(legacy=False)  # noqa: NPY002  (the global state libraries use)
    numpy_state = {
        "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
        "pos": int(np_state["state"]["pos"]),
        "has_gauss": int(np_state["has_gauss"]),
        "gauss": float(np_state["gauss"]),
    }
    return {
        "python": random.getstate(),
        "numpy": numpy_state,
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_as_tuple(state["python"]))
    n = state["numpy"]
    numpy_state = {
        "bit_generator": "MT19937",
        "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
        "has_gauss": n["has_gauss"],
        "gauss": n["gauss"],
    }
    np.random.set_state(numpy_state)  # noqa: NPY002  (the global state libraries use)
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(x: Any) -> Any:
    return tuple(_as_tuple(v) for v in x) if isinstance(x, list | tuple) else x
