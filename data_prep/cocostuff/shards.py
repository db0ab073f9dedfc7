"""Resumable processing: images in shards of ``shard_size``, by a process pool, each shard written
atomically under ``DIR/.partial/<split>/`` with the build's key; a shard whose key and image ids
match is reused by the next run."""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import shutil
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from train.files import atomic_path, write_npz, write_text_atomic

from .decode import Job, process_image

PARTIAL_NAME = ".partial"  # shards of an unfinished build


@contextlib.contextmanager
def _mapper(workers: int) -> Iterator[Callable]:
    """``map``-like callable: in this process (workers <= 1) or ordered over a process pool."""
    if workers <= 1:
        yield map
        return
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with ctx.Pool(workers) as pool:
        yield lambda fn, jobs: pool.imap(fn, jobs, chunksize=4)


def _write_shard(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with atomic_path(path) as tmp:
        write_npz(tmp, arrays)


def _shard_ok(path: Path, key: str, ids: np.ndarray) -> bool:
    if not path.is_file():
        return False
    try:
        with np.load(path, allow_pickle=False) as z:
            return z["key"].tolist() == [key] and np.array_equal(z["ids"], ids)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return False


def _process_split(
    split: str, jobs: list[Job], folder: Path, key: str, shard_size: int, map_fn: Callable, log
) -> list[Path]:
    """Process ``jobs`` into shards ``folder/shard_XXXXX.npz`` (valid ones are reused)."""
    from tqdm import tqdm

    folder.mkdir(parents=True, exist_ok=True)
    ids = np.array([j.record["id"] for j in jobs], np.int64)
    h, w = jobs[0].size
    c = jobs[0].num_classes
    paths, reused = [], 0
    with tqdm(total=len(jobs), desc=f"{split}", unit="img", disable=None, file=sys.stderr) as bar:
        for k in range(math.ceil(len(jobs) / shard_size)):
            lo, hi = k * shard_size, min(len(jobs), (k + 1) * shard_size)
            path = folder / f"shard_{k:05d}.npz"
            paths.append(path)
            if _shard_ok(path, key, ids[lo:hi]):
                reused += 1
                bar.update(hi - lo)
                continue
            images, labels, counts, positions, skipped, reasons = [], [], [], [], [], []
            for i, result in enumerate(map_fn(process_image, jobs[lo:hi]), start=lo):
                if isinstance(result, str):
                    skipped.append(i)
                    reasons.append(result)
                else:
                    images.append(result[0])
                    labels.append(result[1])
                    counts.append(result[2])
                    positions.append(i)
                bar.update(1)
            _write_shard(
                path,
                {
                    "key": np.array([key]),
                    "ids": ids[lo:hi],
                    "images": np.stack(images) if images else np.zeros((0, h, w, 3), np.uint8),
                    "labels": np.stack(labels) if labels else np.zeros((0, h, w), np.uint8),
                    "counts": np.stack(counts) if counts else np.zeros((0, c), np.int64),
                    "positions": np.array(positions, np.int64),
                    "skipped": np.array(skipped, np.int64),
                    "reasons": np.array(reasons, dtype=str) if reasons else np.zeros(0, "<U1"),
                },
            )
    if reused:
        log(f"{split}: reused {reused} of {len(paths)} shards from an earlier run")
    return paths


def _reset_partial(partial: Path, key: str, force: bool) -> None:
    key_file = partial / "key.txt"
    stale = force or not key_file.is_file() or key_file.read_text() != key
    if stale and partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True, exist_ok=True)
    if stale:
        write_text_atomic(key, key_file)


def _gather(paths: list[Path]) -> dict[str, np.ndarray]:
    """The small per-shard arrays of a split, concatenated."""
    parts: dict[str, list[np.ndarray]] = {
        k: [] for k in ("counts", "positions", "skipped", "reasons")
    }
    for path in paths:
        with np.load(path, allow_pickle=False) as z:
            for k in parts:
                parts[k].append(z[k])
    return {k: np.concatenate(v) for k, v in parts.items()}
