"""The COCO-Stuff cache written by ``python -m data_prep.cocostuff``: its format and its reader.

Layout of a cache folder ``DIR`` (arrays memory-mapped by :func:`load`)::

    DIR/meta.json                 written last, atomically: its presence + validity mark completion
    DIR/{train,val}/images.npy    uint8 (N, H, W, 3)
    DIR/{train,val}/labels.npy    uint8 (N, H, W), class index, IGNORE (255) = unlabelled
    DIR/{train,val}/shape.npy     int64 (N,) shape label s
    DIR/{train,val}/size.npy      int64 (N,) s' (sky pixels, or labelled pixels for all classes)
    DIR/{train,val}/fractions.npy float32 (N, C) per-class pixel fraction f_c
    DIR/{train,val}/image_ids.npy int64 (N,), ascending
    DIR/{train,val}/table.csv     image_id, file_name, orig_height, orig_width, size, shape, classes
    DIR/class_sizes.png           histogram of the class sizes with the shape threshold(s)

``meta.json`` lists every array with its sha256 and size (``files``), the classes, the image size,
the options and the per-split counts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from train.files import file_digest

FORMAT_VERSION = 1
META_NAME, PLOT_NAME, TABLE_NAME = "meta.json", "class_sizes.png", "table.csv"
SPLITS = ("train", "val")
ARRAYS = ("images", "labels", "shape", "size", "fractions", "image_ids")
IGNORE = 255  # unlabelled pixels; the loss and the metrics skip them
PREP_HINT = "python -m data_prep.cocostuff --root <COCO-Stuff dir> --setup stuff --out {out}"


def inspect(out: str | Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(meta, None)`` for a complete cache, else ``(None, what is wrong)``; sizes, not digests."""
    out = Path(out)
    meta_path = out / META_NAME
    if not meta_path.is_file():
        return None, f"no {META_NAME} (the cache is missing or its build did not finish)"
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return None, f"{META_NAME} is not valid JSON ({e})"
    if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
        return None, f"{META_NAME} has format_version != {FORMAT_VERSION}"
    for rel, info in meta.get("files", {}).items():
        p = out / rel
        if not p.is_file() or p.stat().st_size != info.get("bytes"):
            return None, f"{rel} is missing or has the wrong size"
    expected = {f"{s}/{a}.npy" for s in SPLITS for a in ARRAYS}
    if not expected <= set(meta.get("files", {})):
        return None, f"{META_NAME} does not list all of {sorted(expected)}"
    return meta, None


def load(
    out: str | Path, *, verify: bool = False
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, Any]]:
    """``({split: {name: memmapped array}}, meta)``; ``verify`` also checks every sha256.

    ``ValueError`` (with the command that builds it) when the cache is missing or incomplete.
    """
    out = Path(out)
    meta, problem = inspect(out)
    if meta is None:
        raise ValueError(
            f"{out} does not hold a complete COCO-Stuff cache: {problem}; build it with: "
            + PREP_HINT.format(out=out)
            + " (add --only sky-other for the sky task, or --setup stuffthing)"
        )
    if verify:
        for rel, info in meta["files"].items():
            if file_digest(out / rel, "sha256") != info["sha256"]:
                raise ValueError(
                    f"{out / rel}: sha256 differs from {META_NAME}; rebuild with --force"
                )
    splits = {
        s: {a: np.load(out / s / f"{a}.npy", mmap_mode="r", allow_pickle=False) for a in ARRAYS}
        for s in SPLITS
    }
    return splits, meta
