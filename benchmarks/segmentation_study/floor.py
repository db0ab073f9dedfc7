"""The 1-pixel boundary floor of a segmentation cache: its ground truth scored against itself moved by
one pixel, with the trainer's own metrics (``train.metrics``).

A model whose every boundary is off by one pixel, and nothing else wrong, scores this. A small region
has more boundary per pixel of area than a big one, so such a model is worse on small-object images:
the floor is the gap and the mIoU that a 1-pixel boundary error alone costs at this resolution. Two
ways to be off by one pixel:

* ``dilation``: a maximum filter of the label map over each pixel and its 4 neighbours (the cross,
  scipy's default structuring element). Sky task: the sky grown by one pixel; 11 classes: at every
  boundary the higher class index grows by one pixel. Ignored pixels (255) never grow (they count
  as below every class) and stay ignored as targets.
* ``shift``: the label map moved by one pixel, the mean over the four moves (right, left, down, up;
  the edge row or column repeated). Where the moved map holds an ignored pixel the prediction keeps
  the truth (no error is counted where nothing is known).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from data_prep.camvid import CLASS_NAMES
from train.metrics import GroupedSegmentationConfusion

from .._report import markdown_table
from .spec import SMALL_CLASSES, TASKS, cache

IGNORE = 255
MOVES = ((0, 1), (0, -1), (1, 0), (-1, 0))  # (rows, columns): right, left, down, up


def dilated(labels: np.ndarray) -> np.ndarray:
    """``(N, H, W)`` uint8 labels -> each pixel the largest class among itself and its 4 neighbours
    (ignored pixels count as below every class; a pixel with only ignored ones stays ignored)."""
    x = labels.astype(np.int16)
    x[labels == IGNORE] = -1
    h, w = x.shape[1:]
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1)), constant_values=-1)
    out = x.copy()
    for dy, dx in MOVES:
        np.maximum(out, padded[:, 1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w], out=out)
    return np.where(out < 0, IGNORE, out).astype(np.uint8)


def shifted(labels: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """``labels`` moved by ``(dy, dx)`` pixels (``|dy|, |dx| <= 1``; edge rows/columns repeated);
    where the moved map is ignored, the original label."""
    h, w = labels.shape[1:]
    padded = np.pad(labels, ((0, 0), (1, 1), (1, 1)), mode="edge")
    moved = padded[:, 1 - dy : 1 - dy + h, 1 - dx : 1 - dx + w]
    return np.where(moved == IGNORE, labels, moved)


def score(
    labels: np.ndarray, pred: np.ndarray, shape: np.ndarray, classes: int, groups: int
) -> dict:
    """The trainer's test summary (``GroupedSegmentationConfusion``) of ``pred`` against ``labels``."""
    cm = GroupedSegmentationConfusion(classes, groups, IGNORE)
    # an ignored prediction where the target is labelled cannot happen (see ``dilated``/``shifted``)
    cm.update(torch.from_numpy(labels), torch.from_numpy(pred), torch.from_numpy(shape))
    return cm.summary()


def per_image_iou(labels: np.ndarray, pred: np.ndarray, classes: int) -> np.ndarray:
    """``(N, C)`` IoU of each image and class over its labelled pixels (NaN where the class is in
    neither the truth nor the prediction)."""
    valid = labels != IGNORE
    out = np.full((len(labels), classes), np.nan)
    for c in range(classes):
        t, q = (labels == c) & valid, (pred == c) & valid
        inter, union = (t & q).sum((1, 2)), (t | q).sum((1, 2))
        out[:, c] = np.where(union > 0, inter / np.maximum(union, 1), np.nan)
    return out


def floor(cache: Path | str, split: str = "test") -> dict:
    """``{"dilation": summary, "shift": mean summary over the four moves, "shift_moves": the four,
    "dilation_per_image_iou": (N, C) IoU of each image and class}`` of ``cache``'s ``split`` (a
    summary: ``miou``, ``miou_small``, ``miou_big``, ``miou_gap``, ``iou`` per class, ...)."""
    cache = Path(cache)
    meta = json.loads((cache / "meta.json").read_text())
    classes, groups = int(meta["num_classes"]), int(meta["shape_bins"])
    labels = np.load(cache / split / "labels.npy")
    shape = np.load(cache / split / "shape.npy")
    grown = dilated(labels)
    out: dict = {"dilation": score(labels, grown, shape, classes, groups)}
    per = per_image_iou(labels, grown, classes)
    out["dilation_per_image_iou"] = [[None if np.isnan(v) else float(v) for v in r] for r in per]
    moves = [score(labels, shifted(labels, dy, dx), shape, classes, groups) for dy, dx in MOVES]
    out["shift"], out["shift_moves"] = _mean(moves), moves
    return out


def _mean(summaries: list[dict]) -> dict:
    """Key by key mean of ``summaries`` (lists element-wise; ``None`` where any is ``None``)."""
    out: dict = {}
    for key, first in summaries[0].items():
        values = [s[key] for s in summaries]
        if isinstance(first, list):
            out[key] = [
                None if any(v is None for v in col) else float(np.mean(col))
                for col in zip(*values, strict=True)
            ]
        else:
            out[key] = None if any(v is None for v in values) else float(np.mean(values))
    return out


def _floor_name(task: str, size: tuple[int, int]) -> str:
    return f"floor-{task}-{size[0]}x{size[1]}.json"


def save_floors(archive: Path, sizes: list[tuple[int, int]]) -> None:
    """Write each task's floor (``floor.floor`` of its test split, and the dilation's per-image
    IoU of the task's object class) into ``archive``, for every cache there is at ``sizes``."""
    for size in sizes:
        for task in TASKS:
            path = Path(cache(task, size))
            if (path / "meta.json").is_file():
                archive.mkdir(parents=True, exist_ok=True)
                (archive / _floor_name(task, size)).write_text(json.dumps(floor(path)) + "\n")


def floors(archive: Path, sizes: list[tuple[int, int]]) -> dict[tuple[str, tuple[int, int]], dict]:
    """``{(task, size): floor}`` from the cache where it is here, else from ``archive``."""
    out = {}
    for size in sizes:
        for task in TASKS:
            path, kept = Path(cache(task, size)), archive / _floor_name(task, size)
            if (path / "meta.json").is_file():
                out[(task, size)] = floor(path)
            elif kept.is_file():
                out[(task, size)] = json.loads(kept.read_text())
    return out


def class_names(n: int) -> list[str]:
    """The class names of a CamVid cache with ``n`` classes where its meta.json is not at hand: the
    builder's 11, or the sky task's rest / sky."""
    return list(CLASS_NAMES) if n == len(CLASS_NAMES) else ["rest", "sky"][:n]


def small_classes(iou: list[float | None], classes: list[str]) -> float | None:
    """The mean IoU of CamVid's small-object classes (``SMALL_CLASSES``; ``None`` if a task has
    none of them or one is undefined)."""
    values = [iou[classes.index(c)] for c in SMALL_CLASSES if c in classes]
    return None if not values or None in values else float(np.mean(values))


def floor_report(archive: Path) -> str:
    """Every archived floor (``floor-<task>-<H>x<W>.json``), task by task, size by size: the
    markdown table of the gap and mIoU of the ground truth dilated / shifted by one pixel."""
    rows = []
    found = []
    for path in archive.glob("floor-*-*x*.json"):
        task, size = path.stem.split("-")[1:]
        found.append((task, tuple(int(v) for v in size.split("x")), path))
    for task, size, path in sorted(found):
        fl = json.loads(path.read_text())
        d, s = fl["dilation"], fl["shift"]
        gaps = [m["miou_gap"] for m in fl["shift_moves"]]
        classes = class_names(len(d["iou"]))
        small = [small_classes(x["iou"], classes) for x in (d, s)]
        rows.append(
            [
                f"{task}, {size[0]}x{size[1]}",
                f"{d['miou']:.3f}",
                f"{d['miou_gap']:.3f}",
                f"{s['miou']:.3f}",
                f"{s['miou_gap']:.3f}",
                f"{min(gaps):.3f}-{max(gaps):.3f}",
                *("-" if v is None else f"{v:.3f}" for v in small),
            ]
        )
    header = ["task, size", "dilated: mIoU", "gap", "shifted: mIoU", "gap", "gap of each shift"]
    header += ["small classes: dilated", "shifted"]
    return markdown_table(header, rows)
