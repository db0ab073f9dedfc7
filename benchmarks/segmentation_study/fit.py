"""How well each run fits its own training images, beside test: what bounds the small classes.

The best-val checkpoint of every (method, seed) run segments the unaugmented train split and the test
split of its cache (``train.predict.load_predictor``, the images as the trainer's loader ships
them), scored with the trainer's own metrics (``floor.score``: the same confusion matrices). A
class a model segments on its training images but not on test is bounded by the data (how well 367
images generalize); one it misses on its training images too is bounded before that: by the
resolution (a 1-pixel-wide pole), the capacity or the loss. The test columns reproduce the run's
own test metrics at its selected epoch (tested), so the two columns are read alike.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .._report import markdown_table
from .floor import class_names, score, small_classes
from .spec import SMALL_CLASSES, cache, jobs

BATCH = 16  # images per forward


def class_maps(run: Path, images: np.ndarray) -> np.ndarray:
    """The class map of every cached image (``(N, H, W, 3)`` uint8, as the cache holds them) by
    the best-val checkpoint of ``run`` (``train.predict.load_predictor``), ``BATCH`` at a time."""
    import torch

    from train.predict import load_predictor

    predictor = load_predictor(run, "best", "cpu", note=lambda _: None)
    return np.concatenate(
        [
            predictor(torch.from_numpy(np.array(images[i : i + BATCH])).permute(0, 3, 1, 2)).numpy()
            for i in range(0, len(images), BATCH)
        ]
    )


def split_summary(run: Path, cache_dir: Path, split: str) -> dict:
    """The trainer's segmentation summary (``miou``, ``iou`` per class, ...) of the best-val
    checkpoint of ``run`` on ``cache_dir``'s ``split``."""
    meta = json.loads((cache_dir / "meta.json").read_text())
    images = np.load(cache_dir / split / "images.npy", mmap_mode="r")
    labels = np.load(cache_dir / split / "labels.npy")
    shape = np.load(cache_dir / split / "shape.npy")
    pred = class_maps(run, images)
    return score(labels, pred, shape, int(meta["num_classes"]), int(meta["shape_bins"]))


def fit_table(
    root: Path,
    task: str,
    size: tuple[int, int],
    methods: list[str],
    seeds: list[int],
    epochs: int | None = None,
) -> str:
    """Per method (finished runs of ``seeds`` in ``root``; mean over them), train split against
    test: mIoU, the small-object classes' mean IoU and each small class's IoU; a markdown table."""
    cache_dir = Path(cache(task, size))
    if not (cache_dir / "meta.json").is_file():
        raise ValueError(f"fit needs the cache {cache_dir} (python -m data_prep.camvid)")
    meta = json.loads((cache_dir / "meta.json").read_text())
    names = meta.get("class_names") or class_names(int(meta["num_classes"]))
    shown = [c for c in SMALL_CLASSES if c in names]
    rows = []
    for method in methods:
        found: dict[str, list[dict]] = {"train": [], "test": []}
        for _, _, job in jobs(epochs, seeds, [task], [method], size):
            run = root / job.key
            if not (run / "checkpoints" / "best.pt").is_file():
                continue
            for split in found:
                found[split].append(split_summary(run, cache_dir, split))
        if not found["train"]:
            continue
        cells = [method, str(len(found["train"]))]
        for key in ("miou", "small"):
            for split in ("train", "test"):
                values = [
                    s["miou"] if key == "miou" else small_classes(s["iou"], names)
                    for s in found[split]
                ]
                cells.append("n/a" if None in values else f"{np.mean(values):.3f}")
        for c in shown:
            for split in ("train", "test"):
                values = [s["iou"][names.index(c)] for s in found[split]]
                cells.append("n/a" if None in values else f"{np.mean(values):.3f}")
        rows.append(cells)
    header = ["method", "seeds", "mIoU train", "test", "small classes train", "test"]
    header += [
        f"{c} {split}" if split == "train" else "test" for c in shown for split in ("train", "test")
    ]
    return markdown_table(header, rows)


def write_fit(
    root: Path,
    task: str,
    size: tuple[int, int],
    methods: list[str],
    seeds: list[int],
    out: Path,
    epochs: int | None = None,
) -> str:
    """:func:`fit_table` into ``out/segmentation_study_fit_<task>_<H>x<W>.md``, its command
    first; returns the table."""
    text = fit_table(root, task, size, methods, seeds, epochs)
    command = f"python -m benchmarks.segmentation_study fit --tasks {task} --size {size[0]} "
    command += f"{size[1]} --seeds {' '.join(map(str, seeds))} --methods "
    command += " ".join(f'"{m}"' for m in methods)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"segmentation_study_fit_{task}_{size[0]}x{size[1]}.md"
    path.write_text(f"<!-- {command} -->\n{text}\n")
    return text
