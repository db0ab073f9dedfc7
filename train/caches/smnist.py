"""The S-MNIST cache written by ``python -m data_prep.smnist``: its format and its reader.

Folder layout: ``smnist.npz`` (per split: ``{split}_images`` uint8 ``(N, canvas, canvas)``,
``{split}_labels``, ``{split}_size``, ``{split}_shape``, ``{split}_source_index``, ``{split}_rescaled``),
``meta.json`` (counts, threshold, input md5s, options, the npz's sha256 and size; written last, so a
folder without a valid one is incomplete) and ``size_histograms.png``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

FORMAT_VERSION = 1
NPZ_NAME, META_NAME, PLOT_NAME = "smnist.npz", "meta.json", "size_histograms.png"
SPLITS = ("train", "test")


def is_complete(out: str | Path, options: dict[str, Any] | None = None) -> bool:
    """True if ``out`` holds a finished build (made with ``options``, as saved in ``meta.json``)."""
    meta_path, npz = Path(out) / META_NAME, Path(out) / NPZ_NAME
    if not (meta_path.is_file() and npz.is_file()):
        return False
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError:
        return False
    if meta.get("format_version") != FORMAT_VERSION or meta.get("npz_bytes") != npz.stat().st_size:
        return False
    return options is None or meta.get("options") == options


def load(out: str | Path) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, Any]]:
    """Read a finished build: ``({split: {name: array}}, meta)``; clear error when incomplete."""
    out = Path(out)
    if not is_complete(out):
        raise FileNotFoundError(
            f"{out} does not hold a complete S-MNIST build ({META_NAME} + {NPZ_NAME}); create it "
            f"with: python -m data_prep.smnist --mnist-dir <dir> --out {out} "
            f"(or --source digits for the offline variant)"
        )
    meta = json.loads((out / META_NAME).read_text())
    with np.load(out / NPZ_NAME, allow_pickle=False) as z:
        splits = {
            s: {k[len(s) + 1 :]: z[k] for k in z.files if k.startswith(s + "_")} for s in SPLITS
        }
    return splits, meta
