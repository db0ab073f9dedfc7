"""Build a segmentation cache from CamVid (SegNet's layout), with shape labels (docs/method/shape-labels.md sec. 6).

Input (``--root DIR``): ``DIR/{train,val,test}/*.png`` (RGB frames) and
``DIR/{train,val,test}annot/*.png`` (one-channel labels of the same size and file name): values 0 Sky,
1 Building, 2 Pole, 3 Road, 4 Pavement, 5 Tree, 6 SignSymbol, 7 Fence, 8 Car, 9 Pedestrian,
10 Bicyclist, 11 Unlabelled (-> 255, ignored by the loss and the metrics).

Tasks (``--task``):

* ``sky`` -- the paper's experiment 2 on CamVid: classes {0: rest, 1: sky}; only frames with >= 1
  sky pixel after resizing are kept (the others are counted: ``dropped_no_sky``); ``s'`` = sky
  pixels, ``s = 1[s' > t]`` with ``t`` = the mean training ``s'`` (val and test use the training
  ``t``); ``--bins P > 2``: the training quantiles at ``k / P``.
* ``all`` -- the 11 classes (experiment 3's shape label): per class ``c`` present,
  ``f_c`` = pixels of ``c`` / (H * W) (unlabelled pixels included), ``s^c = 1[f_c > t]``
  (``--threshold``, default 0.05; ``--thresholds`` for p > 2 bins), ``s`` = the most common ``s^c``,
  **ties go to the smaller bin** (the same rules as ``data_prep.cocostuff``). ``s'`` = labelled pixels.

Frames are resized to ``--size H W`` (default 120 x 160, a third of 360 x 480 on each side, the
aspect kept): images with PIL's box filter, labels nearest neighbour. Every frame is read and
checked before anything is written: a missing folder, a frame without its label, a label of another
size than its frame or with values above 11, an unreadable or truncated PNG is a ``ValueError``
naming the file (the CLI prints it on one line and exits 2), and the output folder is left as it
was. The cache (format: ``train.caches.segmentation``; splits train / val / test: select on val,
report on test) is written atomically, ``meta.json`` last; the same inputs and options give the
same ``.npy`` bytes; a re-run with the same options and inputs (names and sizes of every file) does
nothing. ``class_sizes.png`` is the size histogram with the threshold(s).

    python -m data_prep.camvid --root <CamVid dir> --task sky --out data/camvid-sky
    python -m data_prep.camvid --root <CamVid dir> --task all --out data/camvid
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from train.caches.segmentation import FORMAT_VERSION, IGNORE, META_NAME, PLOT_NAME, TABLE_NAME
from train.caches.segmentation import inspect as inspect_cache
from train.files import atomic_path, write_text_atomic

from .cocostuff.shapes import bin_sizes, majority_shape, size_edges
from .segmentation_cache import (
    array_entries,
    save_size_histogram,
    split_counts,
    table_rows,
    write_array,
    write_table,
)

CLASS_NAMES = (
    "sky",
    "building",
    "pole",
    "road",
    "pavement",
    "tree",
    "sign_symbol",
    "fence",
    "car",
    "pedestrian",
    "bicyclist",
)
UNLABELLED = 11  # CamVid's "void"; becomes IGNORE
SPLITS = ("train", "val", "test")  # select on val, report on test
TASKS = ("sky", "all")
SKY = 0


@dataclass(frozen=True)
class Options:
    """What to read, what to write, and everything that determines the output bytes (``key()``)."""

    root: str | Path
    out: str | Path
    task: str = "all"
    size: tuple[int, int] = (120, 160)
    threshold: float = 0.05
    thresholds: tuple[float, ...] = ()
    bins: int = 2
    limit: int | None = None  # first N frames (by file name) of each split
    force: bool = False

    def key(self) -> dict[str, object]:
        return {
            "task": self.task,
            "size": [int(v) for v in self.size],
            "threshold": self.threshold,
            "thresholds": list(self.thresholds),
            "bins": self.bins,
            "limit": self.limit,
        }

    @property
    def edges_given(self) -> list[float]:
        return list(self.thresholds) or [self.threshold]

    def validate(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"--task must be one of {TASKS}, got {self.task!r}")
        if len(self.size) != 2 or min(self.size) < 1:
            raise ValueError(f"--size must be two positive integers H W, got {self.size}")
        if not 0 < self.threshold < 1:
            raise ValueError(f"--threshold must be in (0, 1), got {self.threshold}")
        t = list(self.thresholds)
        if t and (t != sorted(set(t)) or not 0 < t[0] or not t[-1] < 1):
            raise ValueError(f"--thresholds must be increasing values in (0, 1), got {t}")
        if self.bins < 2:
            raise ValueError(f"--bins must be >= 2, got {self.bins}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"--limit must be >= 1, got {self.limit}")


def _split_files(root: Path, split: str, limit: int | None) -> list[tuple[Path, Path]]:
    """``(frame, label)`` pairs of a split, by file name; a missing folder or label is an error."""
    images, labels = root / split, root / f"{split}annot"
    for folder in (images, labels):
        if not folder.is_dir():
            raise ValueError(
                f"{folder}: no such folder (expected CamVid's SegNet layout: "
                f"{{train,val,test}}/ and {{train,val,test}}annot/ under --root)"
            )
    names = sorted(p.name for p in images.glob("*.png"))[:limit]
    if not names:
        raise ValueError(f"{images}: no .png frames")
    for name in names:
        if not (labels / name).is_file():
            raise ValueError(f"{labels / name}: missing (the label of {images / name})")
    return [(images / n, labels / n) for n in names]


def fingerprint(files: dict[str, list[tuple[Path, Path]]]) -> str:
    """sha256 over the names and byte sizes of every input file (cheap; a changed file is caught
    by its size in practice, ``--force`` rebuilds regardless)."""
    h = hashlib.sha256()
    for split, pairs in files.items():
        for image, label in pairs:
            h.update(
                f"{split}/{image.name}:{image.stat().st_size}:{label.stat().st_size}\n".encode()
            )
    return h.hexdigest()


def read_frame(image_path: Path, label_path: Path, size: tuple[int, int]):
    """One frame: ``(image uint8 (H, W, 3), label uint8 (H, W) with 255 = unlabelled, (h0, w0))``
    after resizing; ``ValueError`` naming the file for anything unreadable or inconsistent."""
    from PIL import Image

    h, w = size
    try:
        with Image.open(image_path) as im:
            im.load()  # a truncated PNG fails here, not later
            rgb = im.convert("RGB")
    except (OSError, SyntaxError, ValueError) as e:
        raise ValueError(f"{image_path}: unreadable image ({e})") from None
    try:
        with Image.open(label_path) as lab:
            lab.load()
            if lab.mode not in ("L", "P"):
                raise ValueError(f"mode {lab.mode}, expected a one-channel 8-bit PNG")
            raw = np.asarray(lab)
    except (OSError, SyntaxError, ValueError) as e:
        raise ValueError(f"{label_path}: unreadable label ({e})") from None
    if raw.shape != (rgb.height, rgb.width):
        raise ValueError(
            f"{label_path}: label is {raw.shape[1]}x{raw.shape[0]} (WxH) but its frame "
            f"{image_path.name} is {rgb.width}x{rgb.height}"
        )
    if int(raw.max()) > UNLABELLED:
        raise ValueError(
            f"{label_path}: label value {int(raw.max())} > {UNLABELLED} (CamVid has classes 0..10 "
            f"and 11 = unlabelled)"
        )
    image = np.asarray(rgb.resize((w, h), Image.Resampling.BOX), dtype=np.uint8)
    label = Image.fromarray(raw).resize((w, h), Image.Resampling.NEAREST)
    label = np.asarray(label, dtype=np.uint8).copy()
    label[label == UNLABELLED] = IGNORE
    return image, label, (rgb.height, rgb.width)


def _read_split(pairs, options: Options) -> dict:
    images, labels, records = [], [], []
    for i, (image_path, label_path) in enumerate(pairs):
        image, label, (h0, w0) = read_frame(image_path, label_path, options.size)
        if options.task == "sky":
            label = np.where(label == IGNORE, IGNORE, (label == SKY).astype(np.uint8))
        images.append(image)
        labels.append(label.astype(np.uint8))
        records.append({"id": i, "file_name": image_path.name, "height": h0, "width": w0})
    num_classes = 2 if options.task == "sky" else len(CLASS_NAMES)
    labels_arr = np.stack(labels)
    counts = np.stack([np.bincount(lab[lab != IGNORE], minlength=num_classes) for lab in labels])
    keep = counts[:, 1] >= 1 if options.task == "sky" else np.ones(len(records), bool)
    return {
        "images": np.stack(images)[keep],
        "labels": labels_arr[keep],
        "counts": counts[keep],
        "records": [r for r, k in zip(records, keep, strict=True) if k],
        "dropped_no_sky": int((~keep).sum()),
    }


def is_complete(out: str | Path, options: Options, inputs: str) -> bool:
    meta, _ = inspect_cache(out)
    return (
        meta is not None and meta.get("options") == options.key() and meta.get("inputs") == inputs
    )


def prepare(options: Options, *, log: Callable[[str], object] = print) -> Path:
    """Build the cache into ``options.out`` (nothing to do when complete for these options and
    inputs). Reads and checks every frame first, then writes."""
    options.validate()
    root, out = Path(options.root), Path(options.out)
    if not root.is_dir():
        raise ValueError(f"--root {root}: no such folder")
    files = {s: _split_files(root, s, options.limit) for s in SPLITS}
    inputs = fingerprint(files)
    if not options.force and is_complete(out, options, inputs):
        log(f"{out}: complete cache for these options and inputs found; nothing to do")
        return out
    data = {s: _read_split(files[s], options) for s in SPLITS}  # every error before any write
    for s in SPLITS:
        if not data[s]["records"]:
            raise ValueError(f"{root / s}: no frame contains sky after resizing to {options.size}")
    h, w = options.size
    sky = options.task == "sky"
    for d in data.values():
        d["size"] = d["counts"][:, 1] if sky else d["counts"].sum(1)
    edges = size_edges(data["train"]["size"], options.bins) if sky else options.edges_given
    for d in data.values():
        d["shape"] = (
            bin_sizes(d["size"], edges) if sky else majority_shape(d["counts"], h * w, edges)
        )

    out.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        (out / META_NAME).unlink()  # from now on the folder is incomplete until meta is back
    files_meta, splits_meta = {}, {}
    for s, d in data.items():
        folder = out / s
        folder.mkdir(exist_ok=True)
        write_array(folder / "images.npy", d["images"])
        write_array(folder / "labels.npy", d["labels"])
        write_array(folder / "shape.npy", d["shape"].astype(np.int64))
        write_array(folder / "size.npy", d["size"].astype(np.int64))
        write_array(folder / "fractions.npy", (d["counts"] / (h * w)).astype(np.float32))
        write_array(folder / "image_ids.npy", np.array([r["id"] for r in d["records"]], np.int64))
        write_table(
            folder / TABLE_NAME, table_rows(d["records"], d["size"], d["shape"], d["counts"])
        )
        files_meta |= array_entries(folder)
        splits_meta[s] = split_counts(d["shape"], d["counts"], d["size"], len(edges) + 1)
        splits_meta[s] |= {"edges": edges, "skipped": [], "skipped_count": 0}
        if sky:
            splits_meta[s]["dropped_no_sky"] = d["dropped_no_sky"]
    with atomic_path(out / PLOT_NAME) as tmp:
        plot_sizes(tmp, data["train"], edges, sky, h * w)
    meta = {
        "format_version": FORMAT_VERSION,
        "dataset": "CamVid (SegNet split)",
        "split_names": list(SPLITS),
        "setup": "camvid",
        "only": "sky" if sky else None,
        "num_classes": 2 if sky else len(CLASS_NAMES),
        "class_names": ["rest", "sky"] if sky else list(CLASS_NAMES),
        "ignore_index": IGNORE,
        "image_size": [h, w],
        "options": options.key(),
        "shape_bins": len(edges) + 1,
        "edges": edges,
        "shape_rule": (
            "s = number of edges s' exceeds; edges = the mean (2 bins) or quantiles of the training s'"
            if sky
            else "s^c = number of thresholds f_c exceeds, per class c present; s = the most "
            "common s^c, ties -> the smaller bin"
        ),
        "size_rule": "s' = sky pixels" if sky else "s' = labelled pixels",
        "fraction_rule": "f_c = pixels of class c / (H * W), unlabelled pixels included",
        "splits": splits_meta,
        "inputs": inputs,
        "input_paths": {"root": str(root)},
        "files": files_meta,
    }
    write_text_atomic(json.dumps(meta, indent=2, sort_keys=True) + "\n", out / META_NAME)
    counts = {s: splits_meta[s]["shape_counts"] for s in SPLITS}
    log(
        f"{out}: CamVid {options.task}, {meta['num_classes']} classes, {h}x{w}; "
        + ", ".join(f"{s} {splits_meta[s]['count']}" for s in SPLITS)
        + f" frames; shape counts {counts}; edges {[round(e, 4) for e in edges]}"
    )
    return out


def plot_sizes(path: Path, train: dict, edges: list[float], sky: bool, n_pixels: int) -> None:
    """Histogram of the training sizes with the shape threshold(s) (the paper's Fig. 6)."""
    if sky:
        save_size_histogram(
            path,
            train["size"] / n_pixels,
            [e / n_pixels for e in edges],
            xlabel="sky fraction of the frame",
            title="CamVid sky (train)",
        )
        return
    save_size_histogram(
        path,
        train["counts"][train["counts"] > 0] / n_pixels,
        edges,
        log_from=1 / n_pixels,
        xlabel="fraction of the frame's pixels f_c, per (frame, class present)",
        title="CamVid 11 classes (train)",
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m data_prep.camvid", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--root", type=Path, required=True, help="CamVid folder (train/, trainannot/, ...)"
    )
    p.add_argument("--out", type=Path, required=True, help="output folder")
    d = Options(root="", out="")
    p.add_argument("--task", choices=TASKS, default=d.task, help="sky vs rest, or the 11 classes")
    p.add_argument("--size", type=int, nargs=2, metavar=("H", "W"), default=list(d.size))
    p.add_argument("--threshold", type=float, default=d.threshold, help="all: s^c = 1[f_c > T]")
    p.add_argument(
        "--thresholds",
        type=float,
        nargs="+",
        default=[],
        help="all, p > 2 bins: increasing thresholds",
    )
    p.add_argument("--bins", type=int, default=d.bins, help="sky: 2 = the mean, P > 2 = quantiles")
    p.add_argument("--limit", type=int, default=None, help="first N frames (by name) per split")
    p.add_argument("--force", action="store_true", help="rebuild even if complete")
    a = p.parse_args(argv)
    options = Options(
        root=a.root,
        out=a.out,
        task=a.task,
        size=tuple(a.size),
        threshold=a.threshold,
        thresholds=tuple(a.thresholds),
        bins=a.bins,
        limit=a.limit,
        force=a.force,
    )
    try:
        prepare(options)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
