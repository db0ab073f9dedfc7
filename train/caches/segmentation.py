"""The segmentation cache both builders write (``python -m data_prep.cocostuff``,
``python -m data_prep.camvid``): its format and its reader.

Layout of a cache folder ``DIR``, one sub-folder per split named in ``meta.json``::

    DIR/meta.json                  written last, atomically: its presence + validity mark completion
    DIR/<split>/images.npy         uint8 (N, H, W, 3)
    DIR/<split>/labels.npy         uint8 (N, H, W), class index, IGNORE (255) = unlabelled
    DIR/<split>/shape.npy          int64 (N,) shape label s
    DIR/<split>/size.npy           int64 (N,) s' (pixels of the size class, or labelled pixels)
    DIR/<split>/fractions.npy      float32 (N, C) per-class pixel fraction f_c
    DIR/<split>/image_ids.npy      int64 (N,), ascending
    DIR/<split>/table.csv          image_id, file_name, orig_height, orig_width, size, shape, classes
    DIR/class_sizes.png            histogram of the class sizes with the shape threshold(s)

``meta.json`` lists every array with its sha256 and size (``files``), the classes
(``class_names``, ``num_classes``), the image size, the options, the per-split counts and
``split_names``: the splits in the order train, then the selection split, then the report split
(COCO-Stuff: ``train, val``, reported on val, as the paper; CamVid: ``train, val, test``: select
on val, report on test). Format 1 (caches built before CamVid) had no ``split_names`` and always
``train, val``; it is read as such.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from train.files import file_digest

FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)  # 1: COCO-Stuff caches built before format 2 (train + val only)
META_NAME, PLOT_NAME, TABLE_NAME = "meta.json", "class_sizes.png", "table.csv"
SPLITS = ("train", "val")  # format 1's splits, and the COCO-Stuff builder's
ARRAYS = ("images", "labels", "shape", "size", "fractions", "image_ids")
IGNORE = 255  # unlabelled pixels; the loss and the metrics skip them
PREP_HINT = (
    "python -m data_prep.cocostuff --root <COCO-Stuff dir> --setup stuff --out {out} "
    "(add --only sky-other for the sky task, or --setup stuffthing), or "
    "python -m data_prep.camvid --root <CamVid dir> --out {out}"
)


def split_names(meta: dict[str, Any]) -> list[str]:
    """The cache's splits, train first: ``meta["split_names"]`` (format 2) or train, val (1)."""
    return list(meta.get("split_names", SPLITS))


def eval_splits(meta: dict[str, Any]) -> tuple[str, str]:
    """``(select, report)``: the split a run selects its epoch on and the one it reports.
    ``("val", "test")`` when the cache has a test split, else ``("val", "val")``."""
    names = split_names(meta)
    return (names[1], names[2]) if len(names) > 2 else (names[1], names[1])


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
    if not isinstance(meta, dict) or meta.get("format_version") not in READABLE_VERSIONS:
        version = meta.get("format_version") if isinstance(meta, dict) else None
        return None, (
            f"{META_NAME} has format_version {version!r}; this reader reads "
            f"{list(READABLE_VERSIONS)} (rebuild the cache with --force)"
        )
    names = split_names(meta)
    if len(names) < 2 or names[0] != "train":
        return (
            None,
            f"{META_NAME}: split_names must start with train and name >= 2 splits, got {names}",
        )
    for rel, info in meta.get("files", {}).items():
        p = out / rel
        if not p.is_file() or p.stat().st_size != info.get("bytes"):
            return None, f"{rel} is missing or has the wrong size"
    expected = {f"{s}/{a}.npy" for s in names for a in ARRAYS}
    if not expected <= set(meta.get("files", {})):
        return None, f"{META_NAME} does not list all of {sorted(expected)}"
    return meta, None


def load(
    out: str | Path, *, verify: bool = False
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, Any]]:
    """``({split: {name: memmapped array}}, meta)``; ``verify`` also checks every sha256.

    ``ValueError`` (with the commands that build one) when the cache is missing or incomplete.
    """
    out = Path(out)
    meta, problem = inspect(out)
    if meta is None:
        raise ValueError(
            f"{out} does not hold a complete segmentation cache: {problem}; build it with: "
            + PREP_HINT.format(out=out)
        )
    if verify:
        for rel, info in meta["files"].items():
            if file_digest(out / rel, "sha256") != info["sha256"]:
                raise ValueError(
                    f"{out / rel}: sha256 differs from {META_NAME}; rebuild with --force"
                )
    splits = {
        s: {a: np.load(out / s / f"{a}.npy", mmap_mode="r", allow_pickle=False) for a in ARRAYS}
        for s in split_names(meta)
    }
    return splits, meta
