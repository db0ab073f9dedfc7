"""Checkpoints and run files, written atomically (``train.files``: temp file, fsync, rename).

A run folder keeps its checkpoints as ``checkpoints/step-<global step>.pt`` (the last
``train.keep_checkpoints``); ``latest`` returns the newest one that loads, so a run killed while
writing one resumes from the previous. A checkpoint holds everything an exact resume needs: model,
optimizer, lr schedule, gradient scaler, regularizer (eps, tau, lambda, mu, scores, counters), the
RNG states (python, numpy, torch, CUDA), the sampler's position (epoch, step in epoch, generator
state at the epoch's start), the metrics history and the resolved config.
``checkpoints/best.pt`` (``train.run_info``) sits next to them: the weights of the epoch the run
selects, for ``train.predict``; not a resume point, not counted or pruned here.

Reading a file (:func:`load`) checks it before torch unpickles anything: a file cut short or with a
flipped bit (every zip member's CRC-32 is checked: torch's reader checks none, so a flipped bit in a
tensor would load silently) is "truncated or corrupt"; a file torch did not write, or one holding
Python objects other than tensors and plain containers (``weights_only=True``: nothing in a file
runs code), is "not a checkpoint of this project". Either is a one-line :class:`CheckpointError`
that names the file.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import warnings
import zipfile
from collections.abc import Callable
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


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used: truncated or corrupt, or not a checkpoint of this
    project. The message is one line that names the file."""


class CheckpointWarning(UserWarning):
    """:func:`latest` skipped a checkpoint file that cannot be used (one line naming it)."""


_ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes a zip archive


def load(path: str | Path, map_location: str | torch.device = "cpu") -> Any:
    """The object ``torch.save`` wrote to ``path``, read with ``weights_only=True`` (tensors,
    numbers, strings and containers only: nothing in the file runs code) after the zip archive's
    CRC-32 checksums are checked (one extra read of the file).

    Raises :class:`CheckpointError` (one line naming ``path``) for a file that cannot be read, is
    truncated or corrupt, or is not a checkpoint of this project.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head, size = f.read(len(_ZIP_MAGIC)), os.fstat(f.fileno()).st_size
    except OSError as e:
        raise CheckpointError(f"checkpoint {path} cannot be read ({e.strerror or e})") from e
    if head != _ZIP_MAGIC[: len(head)]:
        raise CheckpointError(
            f"{path} is not a checkpoint of this project (not a file torch.save writes)"
        )
    corrupt = CheckpointError(f"checkpoint {path} is truncated or corrupt ({size} bytes)")
    try:
        with zipfile.ZipFile(path) as archive:
            names, damaged = archive.namelist(), archive.testzip()
    except Exception as e:  # zipfile meets damage with BadZipFile, ValueError, EOFError, ...
        raise corrupt from e
    if damaged is not None:  # a member whose CRC-32 does not match its bytes
        raise corrupt
    if not any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
        raise CheckpointError(
            f"{path} is not a checkpoint of this project (a zip archive torch.save did not write)"
        )
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:  # (torch's message advises weights_only=False: never that)
        raise CheckpointError(
            f"{path} is not a checkpoint of this project (it holds Python objects other than "
            f"tensors and plain containers, which are never unpickled here)"
        ) from None
    except Exception:  # a zip torch's reader cannot follow although its checksums match
        raise corrupt from None


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


def latest(
    run_dir: str | Path,
    check: Callable[[Any, Path], None] | None = None,
    skipped: Callable[[str], object] | None = None,
) -> tuple[Path, Any] | None:
    """The newest checkpoint of ``run_dir`` that loads, or ``None`` when there is none.

    A file that cannot be used (:class:`CheckpointError` from :func:`load`, or from ``check``,
    which is called with what loaded and the path) is skipped: ``skipped`` is called with one line
    naming it and why (``None``: a :class:`CheckpointWarning` with that line), and an older one is
    tried. Any other error of ``check`` propagates.
    """
    paths = listing(run_dir)
    for i, path in enumerate(paths):
        try:
            state = load(path)
            if check is not None:
                check(state, path)
        except CheckpointError as e:
            older = "trying an older one" if i + 1 < len(paths) else "no older one"
            line = f"skipped: {e}; {older}"
            if skipped is None:
                warnings.warn(line, CheckpointWarning, stacklevel=2)
            else:
                skipped(line)
            continue
        return path, state
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
