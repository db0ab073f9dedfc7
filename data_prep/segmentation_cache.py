"""Writing the segmentation cache that ``train.caches.segmentation`` reads (both builders use it).

Every file goes through :func:`train.files.atomic_path`; ``meta.json`` is written last by the
builders, so a folder without a valid one is incomplete whatever else it holds.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from train.caches.segmentation import ARRAYS, TABLE_NAME
from train.files import atomic_path, file_digest

TABLE_COLUMNS = ("image_id", "file_name", "orig_height", "orig_width", "size", "shape", "classes")


def write_array(path: Path, array: np.ndarray) -> None:
    """One ``.npy`` file, atomically (same array, same bytes)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.lib.format.write_array(f, np.ascontiguousarray(array), allow_pickle=False)


def write_table(path: Path, rows: Iterable[Sequence[object]]) -> None:
    """``table.csv``: one row per image in :data:`TABLE_COLUMNS` order (``classes``: the class
    indices present, space-separated)."""
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(TABLE_COLUMNS)
        writer.writerows(rows)


def table_rows(records: Sequence[dict], size, shape, counts) -> list[list[object]]:
    """The rows of ``table.csv`` from per-image records (``id``, ``file_name``, ``height``,
    ``width``) and the per-image ``s'``, ``s`` and pixels per class."""
    return [
        [
            r["id"],
            r["file_name"],
            r["height"],
            r["width"],
            int(sz),
            int(s),
            " ".join(str(c) for c in np.flatnonzero(cnt)),
        ]
        for r, sz, s, cnt in zip(records, size, shape, counts, strict=True)
    ]


def array_entries(folder: Path) -> dict[str, dict[str, object]]:
    """``{"<split>/<array>.npy": {sha256, bytes}}`` of a split folder's arrays, for ``meta.json``."""
    return {
        f"{folder.name}/{a}.npy": {
            "sha256": file_digest(folder / f"{a}.npy", "sha256"),
            "bytes": (folder / f"{a}.npy").stat().st_size,
        }
        for a in ARRAYS
    }


def split_counts(shape: np.ndarray, counts: np.ndarray, size: np.ndarray, bins: int) -> dict:
    """The per-split figures both builders put in ``meta.json``."""
    return {
        "count": len(shape),
        "shape_counts": {str(b): int(n) for b, n in enumerate(np.bincount(shape, minlength=bins))},
        "class_pixels": counts.sum(0).astype(np.int64).tolist(),
        "class_images": (counts > 0).sum(0).astype(np.int64).tolist(),
        "size_mean": float(size.mean()),
        "size_min": int(size.min()),
        "size_max": int(size.max()),
        "no_labelled_pixels": int((counts.sum(1) == 0).sum()),
    }


__all__ = [
    "TABLE_COLUMNS",
    "TABLE_NAME",
    "array_entries",
    "split_counts",
    "table_rows",
    "write_array",
    "write_table",
]


def save_size_histogram(
    path: Path,
    values: np.ndarray,
    edges: Sequence[float],
    *,
    xlabel: str,
    title: str,
    log_from: float | None = None,
) -> None:
    """``class_sizes.png`` (the paper's Fig. 6): a histogram of ``values`` with the shape
    threshold(s) ``edges`` in red; ``log_from``: log-spaced bins from that value to 1, log x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    bins = 40 if log_from is None else np.logspace(np.log10(log_from), 0, 50)
    ax.hist(values, bins=bins, color="tab:blue")
    if log_from is not None:
        ax.set_xscale("log")
    for e in edges:
        ax.axvline(e, color="tab:red", lw=1)
    ax.set(xlabel=xlabel, ylabel="count", title=f"{title}; red: threshold(s)")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)
