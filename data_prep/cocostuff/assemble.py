"""Assembly of one split from its shards: the readable (sky: sky-containing) images, the arrays
and ``table.csv`` written atomically, and the split's counts for ``meta.json``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from train.caches.segmentation import TABLE_NAME
from train.files import atomic_path

from ..segmentation_cache import array_entries, split_counts, table_rows, write_array, write_table
from .options import Options
from .shards import _gather


def _select(split: str, shards: list[Path], records: list[dict], options: Options) -> dict:
    """The split's readable images (sky: those with sky), their pixels per class and ``s'``."""
    g = _gather(shards)
    skipped = [
        {"image_id": records[i]["id"], "file_name": records[i]["file_name"], "reason": str(r)}
        for i, r in zip(g["skipped"].tolist(), g["reasons"].tolist(), strict=True)
    ]
    if not len(g["positions"]):
        examples = "; ".join(s["reason"] for s in skipped[:3])
        raise ValueError(f"{split}: none of the {len(records)} images could be read ({examples})")
    keep = g["counts"][:, 1] >= 1 if options.sky else np.ones(len(g["positions"]), bool)
    if not keep.any():
        h, w = options.size
        raise ValueError(f"{split}: no image contains {options.only} after resizing to {h}x{w}")
    counts = g["counts"][keep]
    return {
        "keep": keep,
        "counts": counts,
        "skipped": skipped,
        "records": [records[i] for i in g["positions"][keep]],
        "size": counts[:, 1] if options.sky else counts.sum(1),
    }


def _write_split(folder: Path, shards: list[Path], r: dict, n_pixels: int) -> dict[str, dict]:
    """Write one split's arrays and table; returns ``{file: {sha256, bytes}}``."""
    folder.mkdir(exist_ok=True)
    h, w = r["image_size"]
    _write_images_and_labels(folder, shards, r["keep"], (h, w))
    write_array(folder / "shape.npy", r["shape"].astype(np.int64))
    write_array(folder / "size.npy", r["size"].astype(np.int64))
    write_array(folder / "fractions.npy", (r["counts"] / n_pixels).astype(np.float32))
    write_array(folder / "image_ids.npy", np.array([x["id"] for x in r["records"]], np.int64))
    write_table(folder / TABLE_NAME, table_rows(r["records"], r["size"], r["shape"], r["counts"]))
    return array_entries(folder)


def _write_images_and_labels(folder: Path, paths: list[Path], keep: np.ndarray, hw) -> None:
    """Stream the shards' kept images and labels into ``images.npy`` / ``labels.npy``."""
    n, (h, w) = int(keep.sum()), hw
    with atomic_path(folder / "images.npy") as t_img, atomic_path(folder / "labels.npy") as t_lab:
        images = np.lib.format.open_memmap(t_img, "w+", np.uint8, (n, h, w, 3))
        labels = np.lib.format.open_memmap(t_lab, "w+", np.uint8, (n, h, w))
        cursor = done = 0
        for path in paths:
            with np.load(path, allow_pickle=False) as z:
                m = keep[done : done + len(z["positions"])]
                done += len(m)
                k = int(m.sum())
                images[cursor : cursor + k] = z["images"][m]
                labels[cursor : cursor + k] = z["labels"][m]
                cursor += k
        images.flush()
        labels.flush()
        del images, labels


def _split_meta(result: dict, no_sky: int | None) -> dict[str, object]:
    meta = split_counts(result["shape"], result["counts"], result["size"], result["bins"])
    meta |= {
        "skipped": result["skipped"],
        "skipped_count": len(result["skipped"]),
        "edges": result["edges"],
    }
    if no_sky is not None:
        meta["dropped_no_sky"] = no_sky
    return meta
