"""Build COCO-Stuff segmentation caches with shape labels: the sky task and all classes (spec sec. 6).

Setups (``--setup``):

* ``stuff`` -- the stuff-only annotations ``stuff_{train,val}2017.json``: 92 classes, category
  92..182 -> index 0..90 and 183 ("other": every thing pixel, merged) -> 91; unlabelled -> 255.
  The label map is painted at the original size from the RLE masks (compressed or uncompressed
  counts; start at 255, paint the annotations in id order), then resized.
* ``stuffthing`` -- the official ``stuffthingmaps_trainval2017`` PNGs (value = category id - 1,
  255 = unlabelled): 171 classes, ids 1..182 without the 11 unused COCO thing ids, contiguous in id
  order. The stuff JSON is read here too: it gives the image list (and sizes) and the stuff names.
* ``--only sky-other`` (setup ``stuff``): the paper's sky task, classes {0: rest, 1: sky}
  (category 157); unlabelled pixels stay 255; only images with >= 1 sky pixel after resizing are
  kept (the others are counted in ``meta.json``: ``dropped_no_sky``).

Images and label maps are resized to ``--size H W`` (default 106 x 160, aspect not preserved, as
the paper): images with PIL's box filter (``area``) or ``bilinear`` after conversion to RGB
(grayscale and CMYK JPEGs included), labels with nearest neighbour. Shape labels (spec sec. 6) are
computed on the resized maps:

* sky: ``size`` = ``s'`` = number of sky pixels; ``s = 1[s' > t]`` with ``t`` = the mean training
  ``s'`` (val uses the *training* ``t``). ``--bins P > 2``: ``s`` = number of edges ``s'``
  exceeds, the edges being the training quantiles at ``k/P`` (k = 1..P-1, numpy's linear rule).
* all classes: for each class ``c`` present (>= 1 pixel; 255 is no class, "other" is one),
  ``f_c`` = pixels of ``c`` / (H * W) -- over *all* pixels of the image, unlabelled ones included
  -- and ``s^c = 1[f_c > t]`` (``--threshold``, default 0.05); with ``--thresholds t_1 < ... <
  t_{p-1}`` (p bins) ``s^c`` = number of thresholds ``f_c`` exceeds. ``s`` = the most common
  ``s^c`` over the classes present; **ties go to the smaller bin**: an image with as many small as
  big regions is "small", it has the small regions the regularizer is meant to protect. An image
  without labelled pixels gets ``s = 0`` and is counted (``no_labelled_pixels``). ``size`` = the
  number of labelled pixels.

Cache (``--out DIR``; ``load`` reads it, arrays memory-mapped)::

    DIR/meta.json                 written last, atomically: its presence + validity mark completion
    DIR/{train,val}/images.npy    uint8 (N, H, W, 3)
    DIR/{train,val}/labels.npy    uint8 (N, H, W), class index, 255 = ignore
    DIR/{train,val}/shape.npy     int64 (N,) shape label s
    DIR/{train,val}/size.npy      int64 (N,) s' (sky pixels, or labelled pixels for all classes)
    DIR/{train,val}/fractions.npy float32 (N, C) per-class pixel fraction f_c
    DIR/{train,val}/image_ids.npy int64 (N,), ascending
    DIR/{train,val}/table.csv     image_id, file_name, orig_height, orig_width, size, shape,
                                  classes (the class indices present, space-separated)
    DIR/class_sizes.png           histogram of per-(image, class) f_c (log x) with t (the paper's
                                  Fig. 6); sky: histogram of s' with the threshold

Images are processed in shards (``--shard-size``, 512) by a process pool (``--workers``), each
shard written atomically under ``DIR/.partial/<split>/``; an interrupted run resumes from the
shards whose options and input checksums match. A re-run with the same options and inputs (sha256
of the JSON files, number of files in the image / map folders) does nothing. Missing or unreadable
images (and missing stuffthing PNGs) are skipped and listed in ``meta.json``; inconsistent
annotations raise ``ValueError``. The same inputs and options give identical ``.npy`` bytes.
``meta.json`` holds the classes (names, COCO ids), the options that shaped the output, the edges,
per split the counts (images, shape bins, pixels and images per class, skipped images with their
reason, ``no_labelled_pixels``), the input fingerprint and the sha256 and size of every array.
``--limit N`` keeps the first N images (by id) of each split, for tests and demos.

    python -m data_prep.cocostuff --root data/cocostuff --setup stuff --only sky-other --out data/coco-sky
    python -m data_prep.cocostuff --root data/cocostuff --setup stuffthing --out data/coco-stuffthing
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import itertools
import json
import math
import multiprocessing
import os
import shutil
import sys
import warnings
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import torchvision_compat  # noqa: F401  (before torchvision)
from .atomic import atomic_path
from .smnist import file_digest, write_npz

FORMAT_VERSION = 1
META_NAME, PLOT_NAME, TABLE_NAME = "meta.json", "class_sizes.png", "table.csv"
PARTIAL_NAME = ".partial"  # shards of an unfinished build
SPLITS = ("train", "val")
ARRAYS = ("images", "labels", "shape", "size", "fractions", "image_ids")
SETUPS = ("stuff", "stuffthing")
INTERPOLATIONS = ("area", "bilinear")
IGNORE = 255
SKY_ID, OTHER_ID = 157, 183
STUFF_IDS = tuple(range(92, 184))  # 92..182 stuff, 183 "other" (the stuff-only files)
UNUSED_THING_IDS = (12, 26, 29, 30, 45, 66, 68, 69, 71, 83, 91)  # in 1..91, never annotated
STUFFTHING_IDS = tuple(i for i in range(1, 183) if i not in UNUSED_THING_IDS)  # 171 classes
# The 80 COCO thing categories (the stuffthing maps' ids 1..90 minus the unused ones).
THING_NAMES = {
    1: "person", 2: "bicycle", 3: "car", 4: "motorcycle", 5: "airplane", 6: "bus", 7: "train",
    8: "truck", 9: "boat", 10: "traffic light", 11: "fire hydrant", 13: "stop sign",
    14: "parking meter", 15: "bench", 16: "bird", 17: "cat", 18: "dog", 19: "horse", 20: "sheep",
    21: "cow", 22: "elephant", 23: "bear", 24: "zebra", 25: "giraffe", 27: "backpack",
    28: "umbrella", 31: "handbag", 32: "tie", 33: "suitcase", 34: "frisbee", 35: "skis",
    36: "snowboard", 37: "sports ball", 38: "kite", 39: "baseball bat", 40: "baseball glove",
    41: "skateboard", 42: "surfboard", 43: "tennis racket", 44: "bottle", 46: "wine glass",
    47: "cup", 48: "fork", 49: "knife", 50: "spoon", 51: "bowl", 52: "banana", 53: "apple",
    54: "sandwich", 55: "orange", 56: "broccoli", 57: "carrot", 58: "hot dog", 59: "pizza",
    60: "donut", 61: "cake", 62: "chair", 63: "couch", 64: "potted plant", 65: "bed",
    67: "dining table", 70: "toilet", 72: "tv", 73: "laptop", 74: "mouse", 75: "remote",
    76: "keyboard", 77: "cell phone", 78: "microwave", 79: "oven", 80: "toaster", 81: "sink",
    82: "refrigerator", 84: "book", 85: "clock", 86: "vase", 87: "scissors", 88: "teddy bear",
    89: "hair drier", 90: "toothbrush",
}  # fmt: skip
PREP_HINT = "python -m data_prep.cocostuff --root <COCO-Stuff dir> --setup stuff --out {out}"


def default_workers() -> int:
    return min(4, os.cpu_count() or 1)


@dataclass(frozen=True)
class Options:
    """Where to read and write, and everything that determines the output bytes.

    Only the fields of ``key()`` change the cache (they are saved in ``meta.json``); the input
    locations, ``workers``, ``shard_size`` and ``force`` do not.
    """

    out: str | Path
    setup: str = "stuff"
    root: str | Path | None = None
    annotations: str | Path | None = None  # folder with stuff_{train,val}2017.json
    images: str | Path | None = None  # folder with train2017/, val2017/
    stuffthingmaps: str | Path | None = None  # folder with train2017/, val2017/ PNGs
    only: str | None = None  # None | "sky-other"
    size: tuple[int, int] = (106, 160)
    threshold: float = 0.05
    thresholds: tuple[float, ...] = ()  # p > 2 bins for the all-class shape label
    bins: int = 2  # sky: 2 = mean threshold (the paper), P > 2 = training quantiles
    interpolation: str = "area"
    limit: int | None = None  # first N images (by id) of each split
    workers: int = field(default_factory=default_workers)
    shard_size: int = 512
    force: bool = False

    @property
    def sky(self) -> bool:
        return self.only is not None

    @property
    def shape_thresholds(self) -> tuple[float, ...]:
        return tuple(self.thresholds) or (self.threshold,)

    def key(self) -> dict[str, object]:
        """The options that determine the output (JSON types: compared with ``meta.json``)."""
        return {
            "setup": self.setup,
            "only": self.only,
            "size": [int(v) for v in self.size],
            "interpolation": self.interpolation,
            "limit": self.limit,
            "thresholds": None if self.sky else [float(t) for t in self.shape_thresholds],
            "bins": int(self.bins) if self.sky else None,
        }

    def validate(self) -> None:
        def bad(name: str, expected: str) -> ValueError:
            return ValueError(f"{name} must be {expected}, got {getattr(self, name)!r}")

        def is_int(v: object) -> bool:
            return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

        if self.setup not in SETUPS:
            raise bad("setup", f"one of {SETUPS}")
        if self.only is not None:
            if self.only != "sky-other":
                raise bad("only", "'sky-other' (the paper's sky task) or None (all classes)")
            if self.setup != "stuff":
                raise ValueError(
                    f"only='sky-other' needs setup 'stuff' (sky-other is a class of the stuff-only "
                    f"annotations), got setup {self.setup!r}"
                )
        if len(self.size) != 2 or not all(is_int(v) and v >= 1 for v in self.size):
            raise bad("size", "two integers >= 1 (height, width)")
        if not (isinstance(self.threshold, (int, float)) and 0 < self.threshold < 1):
            raise bad("threshold", "a number in (0, 1) (a fraction of the image's pixels)")
        ts = tuple(self.thresholds)
        if not all(isinstance(t, (int, float)) and 0 < t < 1 for t in ts) or any(
            a >= b for a, b in itertools.pairwise(ts)
        ):
            raise bad("thresholds", "strictly increasing numbers in (0, 1)")
        if not is_int(self.bins) or self.bins < 2:
            raise bad("bins", "an integer >= 2")
        if self.sky and ts:
            raise bad(
                "thresholds", "empty with only='sky-other' (the sky task bins s' with --bins)"
            )
        if not self.sky and self.bins != 2:
            raise bad("bins", "2 without only='sky-other' (all classes: use --thresholds)")
        if self.interpolation not in INTERPOLATIONS:
            raise bad("interpolation", f"one of {INTERPOLATIONS}")
        if self.limit is not None and not (is_int(self.limit) and self.limit >= 1):
            raise bad("limit", "None or an integer >= 1")
        if not is_int(self.workers) or self.workers < 0:
            raise bad("workers", "an integer >= 0 (0 or 1: in this process)")
        if not is_int(self.shard_size) or self.shard_size < 1:
            raise bad("shard_size", "an integer >= 1")


# --- classes --------------------------------------------------------------------------------------


def class_table(options: Options, names: dict[int, str]) -> tuple[list[int], list[str]]:
    """``(class_ids, class_names)`` per class index; sky: ``[-1, 157]`` (-1 = every other id)."""
    if options.sky:
        return [-1, SKY_ID], ["rest", names[SKY_ID]]
    if options.setup == "stuff":
        return list(STUFF_IDS), [names[i] for i in STUFF_IDS]
    return list(STUFFTHING_IDS), [THING_NAMES.get(i) or names[i] for i in STUFFTHING_IDS]


def category_lut(options: Options) -> np.ndarray:
    """``lut[category id]`` -> class index for the stuff JSON (256 entries, 255 elsewhere)."""
    lut = np.full(256, IGNORE, np.uint8)
    for index, cid in enumerate(STUFF_IDS):
        lut[cid] = (cid == SKY_ID) if options.sky else index
    return lut


def stuffthing_lut() -> tuple[np.ndarray, np.ndarray]:
    """``(lut, valid)`` over PNG values: ``lut[id - 1]`` = class index, 255 -> 255."""
    lut, valid = np.full(256, IGNORE, np.uint8), np.zeros(256, bool)
    for index, cid in enumerate(STUFFTHING_IDS):
        lut[cid - 1], valid[cid - 1] = index, True
    valid[IGNORE] = True
    return lut, valid


def describe_stuffthing_values() -> str:
    unused = ", ".join(str(i - 1) for i in UNUSED_THING_IDS)
    return f"0..181 except {unused} (category id - 1), and 255 = unlabelled"


# --- inputs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    """Located input files: per split, the stuff JSON, the JPEG folder, the PNG folder (stuffthing)."""

    annotations: dict[str, Path]
    images: dict[str, Path]
    maps: dict[str, Path] | None


def find_inputs(options: Options) -> Inputs:
    """Locate the inputs (``--root`` layouts or explicit folders); ``ValueError`` lists what is missing.

    Looked for under ``root``: ``annotations/stuff_{split}2017.json`` or ``stuff_{split}2017.json``;
    ``{split}2017/`` or ``images/{split}2017/``; ``stuffthingmaps_trainval2017/{split}2017/`` (or
    ``stuffthingmaps/``). An explicit ``annotations`` / ``images`` / ``stuffthingmaps`` folder
    replaces the root's candidates.
    """
    root = Path(options.root) if options.root is not None else None

    def candidates(explicit: str | Path | None, *under: str) -> list[Path]:
        if explicit is not None:
            return [Path(explicit)]
        return [root / u if u else root for u in under] if root is not None else []

    ann_dirs = candidates(options.annotations, "annotations", "")
    image_dirs = candidates(options.images, "", "images")
    map_dirs = candidates(options.stuffthingmaps, "stuffthingmaps_trainval2017", "stuffthingmaps")
    if not ann_dirs or not image_dirs:
        raise ValueError("root must be given (or both annotations and images folders), got None")
    missing: list[str] = []

    def locate(dirs: list[Path], name: str, what: str, want_dir: bool) -> Path | None:
        for d in dirs:
            p = d / name
            if p.is_dir() if want_dir else p.is_file():
                return p
        looked = ", ".join(str(d / name) for d in dirs) or "nowhere (give root or stuffthingmaps)"
        missing.append(f"{what} {name}: looked for {looked}")
        return None

    ann = {s: locate(ann_dirs, f"stuff_{s}2017.json", "annotation file", False) for s in SPLITS}
    img = {s: locate(image_dirs, f"{s}2017", "image folder", True) for s in SPLITS}
    maps = None
    if options.setup == "stuffthing":
        maps = {s: locate(map_dirs, f"{s}2017", "stuffthingmaps folder", True) for s in SPLITS}
    if missing:
        raise ValueError("missing COCO-Stuff inputs:\n  " + "\n  ".join(missing))
    return Inputs(ann, img, maps)


def fingerprint(inputs: Inputs) -> dict[str, dict[str, object]]:
    """sha256 and size of the JSON files; the number of files in each image / map folder."""
    out: dict[str, dict[str, object]] = {}
    for path in inputs.annotations.values():
        out[path.name] = {"sha256": file_digest(path, "sha256"), "bytes": path.stat().st_size}
    for kind, dirs in (("images", inputs.images), ("stuffthingmaps", inputs.maps or {})):
        for split, d in dirs.items():
            with os.scandir(d) as it:
                out[f"{kind}/{split}2017"] = {"files": sum(1 for e in it if e.is_file())}
    return out


@dataclass
class SplitSource:
    """One split's images (ascending id, after ``limit``) and, for ``stuff``, their segments."""

    records: list[dict[str, object]]  # id, file_name, height, width
    segments: list[list[tuple[int, object]]] | None  # per image: (class index, segmentation)
    names: dict[int, str]  # category id -> name (from the JSON)


def read_split(path: Path, options: Options) -> SplitSource:
    """Parse and check one ``stuff_*2017.json``; ``ValueError`` names the offending entry."""
    try:
        data = json.loads(Path(path).read_bytes())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e
    for key in ("images", "categories"):
        if key not in data:
            raise ValueError(f"{path}: not a COCO annotation file (no {key!r} list)")
    names = {int(c["id"]): str(c["name"]) for c in data["categories"]}
    absent = [i for i in STUFF_IDS if i not in names]
    if absent:
        raise ValueError(
            f"{path}: categories {absent} are missing; the stuff annotation files define 92..183"
        )
    records = sorted(
        (
            {"id": int(r["id"]), "file_name": str(r["file_name"]),
             "height": int(r["height"]), "width": int(r["width"])}
            for r in data["images"]
        ),
        key=lambda r: r["id"],
    )  # fmt: skip
    if not records:
        raise ValueError(f"{path}: the 'images' list is empty")
    if options.limit is not None:
        records = records[: options.limit]
    if options.setup != "stuff":  # stuffthing reads the PNGs; the JSON gives images and names
        return SplitSource(records, None, names)

    known = {int(r["id"]): r for r in data["images"]}
    position = {r["id"]: i for i, r in enumerate(records)}
    lut = category_lut(options)
    segments: list[list[tuple[int, object]]] = [[] for _ in records]
    for a in sorted(data.get("annotations", []), key=lambda a: a["id"]):
        image_id, cid = a["image_id"], a["category_id"]
        if image_id not in known:
            raise ValueError(
                f"{path}: annotation {a['id']} refers to image {image_id}, which is not in the "
                f"file's 'images' list"
            )
        if not (STUFF_IDS[0] <= cid <= STUFF_IDS[-1]):
            raise ValueError(
                f"{path}: annotation {a['id']} (image {image_id}) has category_id {cid}; the stuff "
                f"annotations use 92..183 (92..182 stuff, 183 'other')"
            )
        if image_id not in position:
            continue  # beyond --limit
        seg, rec = a["segmentation"], records[position[image_id]]
        if isinstance(seg, dict) and [int(v) for v in seg["size"]] != [rec["height"], rec["width"]]:
            raise ValueError(
                f"{path}: annotation {a['id']} has a mask of size {seg['size']} but image "
                f"{image_id} is {rec['height']}x{rec['width']}"
            )
        segments[position[image_id]].append((int(lut[cid]), seg))
    return SplitSource(records, segments, names)


# --- one image ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """Everything a worker needs for one image (picklable)."""

    record: dict[str, Any]
    segments: list[tuple[int, object]] | None
    image_path: Path
    map_path: Path | None
    size: tuple[int, int]
    interpolation: str
    num_classes: int


def decode_segmentation(seg: object, height: int, width: int) -> np.ndarray:
    """A COCO segmentation (RLE with string or list counts, or polygons) as a ``(h, w)`` uint8 mask."""
    from pycocotools import mask as mask_utils

    if isinstance(seg, dict) and isinstance(seg.get("counts"), list):
        seg = mask_utils.frPyObjects(seg, *[int(v) for v in seg["size"]])  # uncompressed RLE
    elif isinstance(seg, list):  # polygons
        seg = mask_utils.merge(mask_utils.frPyObjects(seg, height, width))
    with warnings.catch_warnings():  # pycocotools 2.0.x under numpy 2: harmless copy= warning
        warnings.simplefilter("ignore", DeprecationWarning)
        return mask_utils.decode(seg)


def _rel(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def _read_label(job: Job, height: int, width: int) -> np.ndarray | str:
    """The original-size label map (class indices, 255 = unlabelled), or why the image is skipped."""
    from PIL import Image, UnidentifiedImageError

    if job.segments is not None:  # stuff: paint the RLE masks
        label = np.full((height, width), IGNORE, np.uint8)
        for index, seg in job.segments:
            label[decode_segmentation(seg, height, width) > 0] = index
        return label
    try:
        with Image.open(job.map_path) as png:
            values = np.array(png)
    except FileNotFoundError:
        return f"missing stuffthing map {_rel(job.map_path)}"
    except (OSError, SyntaxError, UnidentifiedImageError) as e:
        return f"unreadable stuffthing map {_rel(job.map_path)}: {e}"
    if values.ndim != 2 or values.dtype != np.uint8:
        raise ValueError(
            f"{job.map_path}: a stuffthing map must be single-channel uint8, got {values.dtype} "
            f"{values.shape}"
        )
    if values.shape != (height, width):
        return f"stuffthing map {_rel(job.map_path)} is {values.shape}, image is {(height, width)}"
    lut, valid = stuffthing_lut()
    bad = ~valid[values]
    if bad.any():
        raise ValueError(
            f"{job.map_path}: value(s) {np.unique(values[bad]).tolist()} are not stuffthing "
            f"classes; valid: {describe_stuffthing_values()}"
        )
    return lut[values]


def process_image(job: Job) -> tuple[np.ndarray, np.ndarray, np.ndarray] | str:
    """``(image (H, W, 3), label (H, W), pixels per class (C,))`` resized, or a skip reason."""
    from PIL import Image, UnidentifiedImageError

    height, width = int(job.record["height"]), int(job.record["width"])
    try:
        with Image.open(job.image_path) as im:
            rgb = im.convert("RGB")  # decodes everything: truncated files fail here
    except FileNotFoundError:
        return f"missing image {_rel(job.image_path)}"
    except (OSError, SyntaxError, ValueError, UnidentifiedImageError) as e:
        return f"unreadable image {_rel(job.image_path)}: {e}"
    if rgb.size != (width, height):
        return f"image {_rel(job.image_path)} is {rgb.size[1]}x{rgb.size[0]}, annotations say {height}x{width}"
    label = _read_label(job, height, width)
    if isinstance(label, str):
        return label
    h, w = job.size
    resample = Image.Resampling.BOX if job.interpolation == "area" else Image.Resampling.BILINEAR
    image = np.asarray(rgb.resize((w, h), resample), dtype=np.uint8)
    label = np.asarray(Image.fromarray(label).resize((w, h), Image.Resampling.NEAREST), np.uint8)
    counts = np.bincount(label.ravel(), minlength=256)[: job.num_classes].astype(np.int64)
    return image, label, counts


# --- shape labels (plain functions) ---------------------------------------------------------------


def class_bins(fractions: np.ndarray, thresholds: Iterable[float]) -> np.ndarray:
    """``s^c`` = number of thresholds ``f_c`` exceeds (strictly), elementwise."""
    t = np.asarray(list(thresholds), dtype=np.float64)
    return (np.asarray(fractions, np.float64)[..., None] > t).sum(-1)


def majority_shape(counts: np.ndarray, n_pixels: int, thresholds: Iterable[float]) -> np.ndarray:
    """All-class shape label per image from pixels per class ``counts (N, C)``.

    ``s`` = the most common ``s^c`` over the classes present (``counts > 0``); ties go to the
    smaller bin (``argmax`` returns the first maximum); no class present -> 0.
    """
    thresholds = list(thresholds)
    counts = np.asarray(counts)
    bins = class_bins(counts / n_pixels, thresholds)
    present = counts > 0
    votes = np.stack([(present & (bins == j)).sum(1) for j in range(len(thresholds) + 1)], 1)
    return votes.argmax(1).astype(np.int64)


def size_edges(train_size: np.ndarray, bins: int) -> list[float]:
    """Sky edges: the training mean for 2 bins (spec sec. 6), else the quantiles at ``k / bins``."""
    train_size = np.asarray(train_size, np.float64)
    if bins == 2:
        return [float(train_size.mean())]
    return [float(q) for q in np.quantile(train_size, np.arange(1, bins) / bins)]


def bin_sizes(size: np.ndarray, edges: Iterable[float]) -> np.ndarray:
    """``s`` = number of edges ``s'`` exceeds (strictly): ``1[s' > t]`` for one edge."""
    return (np.asarray(size, np.float64)[:, None] > np.asarray(list(edges))).sum(1).astype(np.int64)


# --- shards ---------------------------------------------------------------------------------------


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


# --- assembly and writing -------------------------------------------------------------------------


def _write_array(path: Path, array: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.lib.format.write_array(f, np.ascontiguousarray(array), allow_pickle=False)


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


def _write_table(path: Path, records: list[dict], size, shape, counts) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(
            ["image_id", "file_name", "orig_height", "orig_width", "size", "shape", "classes"]
        )
        for r, sz, s, cnt in zip(records, size, shape, counts, strict=True):
            classes = " ".join(str(c) for c in np.flatnonzero(cnt))
            writer.writerow(
                [r["id"], r["file_name"], r["height"], r["width"], int(sz), int(s), classes]
            )


def plot_class_sizes(path: Path, options: Options, train: dict[str, np.ndarray], edges) -> None:
    """The paper's Fig. 6: histogram of per-(image, class) fractions (log x) with ``t``; sky: of ``s'``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if options.sky:
        ax.hist(train["size"], bins=40, color="tab:blue")
        ax.set_xlabel("sky pixels s' per image")
        title = "COCO-Stuff sky-other (train): sky size per image"
    else:
        n_pixels = options.size[0] * options.size[1]
        f = train["counts"][train["counts"] > 0] / n_pixels
        ax.hist(f, bins=np.logspace(np.log10(1 / n_pixels), 0, 50), color="tab:blue")
        ax.set_xscale("log")
        ax.set_xlabel("fraction of the image's pixels f_c, per (image, class present)")
        title = f"COCO-Stuff {options.setup} (train): class sizes"
    for e in edges:
        ax.axvline(e, color="tab:red", lw=1)
    ax.set_ylabel("count")
    ax.set_title(f"{title}; red: threshold(s)")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)


def _split_meta(result: dict, no_sky: int | None) -> dict[str, object]:
    counts, shape, size = result["counts"], result["shape"], result["size"]
    meta = {
        "count": len(shape),
        "shape_counts": {
            str(b): int(n) for b, n in enumerate(np.bincount(shape, minlength=result["bins"]))
        },
        "class_pixels": counts.sum(0).astype(np.int64).tolist(),
        "class_images": (counts > 0).sum(0).astype(np.int64).tolist(),
        "size_mean": float(size.mean()),
        "size_min": int(size.min()),
        "size_max": int(size.max()),
        "no_labelled_pixels": int((counts.sum(1) == 0).sum()),
        "skipped": result["skipped"],
        "skipped_count": len(result["skipped"]),
        "edges": result["edges"],
    }
    if no_sky is not None:
        meta["dropped_no_sky"] = no_sky
    return meta


def _inspect(out: Path) -> tuple[dict | None, str | None]:
    """``(meta, None)`` for a complete cache, else ``(None, what is wrong)``."""
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


def is_complete(
    out: str | Path, options: Options | None = None, *, inputs: dict | None = None
) -> bool:
    """True if ``out`` holds a finished cache (built with ``options`` / from ``inputs`` when given).

    ``inputs`` is a ``fingerprint()``; the files' sizes are checked, not their sha256.
    """
    meta, _ = _inspect(Path(out))
    if meta is None:
        return False
    if options is not None and meta.get("options") != options.key():
        return False
    return inputs is None or meta.get("inputs") == inputs


def load(
    out: str | Path, *, verify: bool = False
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, object]]:
    """``({split: {name: memmapped array}}, meta)``; ``verify`` also checks every sha256.

    ``ValueError`` (with the command that builds it) when the cache is missing or incomplete.
    """
    out = Path(out)
    meta, problem = _inspect(out)
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


def _reset_partial(partial: Path, key: str, force: bool) -> None:
    key_file = partial / "key.txt"
    stale = force or not key_file.is_file() or key_file.read_text() != key
    if stale and partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True, exist_ok=True)
    if stale:
        with atomic_path(key_file) as tmp:
            tmp.write_text(key)


def make_jobs(
    split: str, src: SplitSource, inputs: Inputs, options: Options, n_cls: int
) -> list[Job]:
    """One ``Job`` per image of ``src`` (what ``process_image`` needs), in ``src``'s order."""
    maps = inputs.maps[split] if inputs.maps is not None else None
    return [
        Job(
            record=r,
            segments=src.segments[i] if src.segments is not None else None,
            image_path=inputs.images[split] / str(r["file_name"]),
            map_path=maps / f"{Path(str(r['file_name'])).stem}.png" if maps else None,
            size=(int(options.size[0]), int(options.size[1])),
            interpolation=options.interpolation,
            num_classes=n_cls,
        )
        for i, r in enumerate(src.records)
    ]


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
    _write_array(folder / "shape.npy", r["shape"].astype(np.int64))
    _write_array(folder / "size.npy", r["size"].astype(np.int64))
    _write_array(folder / "fractions.npy", (r["counts"] / n_pixels).astype(np.float32))
    _write_array(folder / "image_ids.npy", np.array([x["id"] for x in r["records"]], np.int64))
    _write_table(folder / TABLE_NAME, r["records"], r["size"], r["shape"], r["counts"])
    return {
        f"{folder.name}/{a}.npy": {
            "sha256": file_digest(folder / f"{a}.npy", "sha256"),
            "bytes": (folder / f"{a}.npy").stat().st_size,
        }
        for a in ARRAYS
    }


def _rules(options: Options) -> dict[str, str]:
    if options.sky:
        edges = "the mean" if options.bins == 2 else f"the quantiles k/{options.bins}"
        return {
            "shape_rule": f"s = number of edges s' exceeds; edges = {edges} of the training s'",
            "size_rule": "s' = sky pixels (after resizing)",
        }
    return {
        "shape_rule": "s^c = number of thresholds f_c exceeds, per class c present; s = the most "
        "common s^c, ties -> the smaller bin; no class present -> 0",
        "size_rule": "s' = labelled pixels (after resizing)",
        "fraction_rule": "f_c = pixels of class c / (H * W), unlabelled pixels included",
    }


def prepare(options: Options, *, log: Callable[[str], object] = print) -> Path:
    """Build the cache into ``options.out`` (skipped when complete for these options and inputs)."""
    options.validate()
    out = Path(options.out)
    inputs = find_inputs(options)
    prints = fingerprint(inputs)
    if not options.force and is_complete(out, options, inputs=prints):
        log(f"{out}: complete cache for these options and inputs found; nothing to do")
        return out
    sources = {s: read_split(inputs.annotations[s], options) for s in SPLITS}
    class_ids, class_names = class_table(options, sources["train"].names)

    out.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        (out / META_NAME).unlink()  # from now on the folder is incomplete until meta is back
    key_doc = {"format_version": FORMAT_VERSION, "options": options.key(), "inputs": prints}
    key_doc["shard_size"] = options.shard_size
    key = hashlib.sha256(json.dumps(key_doc, sort_keys=True).encode()).hexdigest()
    partial = out / PARTIAL_NAME
    _reset_partial(partial, key, options.force)
    with _mapper(options.workers) as map_fn:
        shards = {
            s: _process_split(
                s, make_jobs(s, sources[s], inputs, options, len(class_ids)),
                partial / s, key, options.shard_size, map_fn, log,
            )
            for s in SPLITS
        }  # fmt: skip

    results = {s: _select(s, shards[s], sources[s].records, options) for s in SPLITS}
    for s in SPLITS:
        for skip in results[s]["skipped"]:
            log(f"{s}: skipped image {skip['image_id']} ({skip['reason']})")
    h, w = options.size
    if options.sky:  # thresholds from the training split only, for both splits
        edges = size_edges(results["train"]["size"], options.bins)
    else:
        edges = list(options.shape_thresholds)
    files = {}
    for s, r in results.items():
        r["shape"] = (
            bin_sizes(r["size"], edges) if options.sky
            else majority_shape(r["counts"], h * w, edges)
        )  # fmt: skip
        r["bins"], r["edges"], r["image_size"] = len(edges) + 1, edges, (h, w)
        files.update(_write_split(out / s, shards[s], r, h * w))
    with atomic_path(out / PLOT_NAME) as tmp:
        plot_class_sizes(tmp, options, results["train"], edges)

    meta = {
        "format_version": FORMAT_VERSION,
        "dataset": "COCO-Stuff 2017",
        "setup": options.setup,
        "only": options.only,
        "num_classes": len(class_ids),
        "class_names": class_names,
        "class_ids": class_ids,
        "class_ids_note": "COCO category id per class index; -1 = every other labelled category",
        "ignore_index": IGNORE,
        "image_size": [h, w],
        "options": options.key(),
        "shape_bins": len(edges) + 1,
        "edges": edges,
        **_rules(options),
        "splits": {
            s: _split_meta(r, int((~r["keep"]).sum()) if options.sky else None)
            for s, r in results.items()
        },
        "inputs": prints,
        "input_paths": {
            **{f"annotations/{s}": str(p) for s, p in inputs.annotations.items()},
            **{f"images/{s}": str(p) for s, p in inputs.images.items()},
            **{f"stuffthingmaps/{s}": str(p) for s, p in (inputs.maps or {}).items()},
        },
        "files": files,
    }
    with atomic_path(out / META_NAME) as tmp:
        tmp.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(partial, ignore_errors=True)
    sp = meta["splits"]
    log(
        f"{out}: {options.setup}{' / ' + options.only if options.sky else ''}, {len(class_ids)} "
        f"classes, {h}x{w}; train {sp['train']['count']} / val {sp['val']['count']} images "
        f"(skipped {sp['train']['skipped_count']} / {sp['val']['skipped_count']}); shape counts "
        f"train {sp['train']['shape_counts']}; edges {[round(e, 4) for e in edges]}"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m data_prep.cocostuff", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--root", type=Path, help="COCO-Stuff folder (annotations/, train2017/, ...)")
    p.add_argument("--annotations", type=Path, help="folder with stuff_{train,val}2017.json")
    p.add_argument("--images", type=Path, help="folder with train2017/ and val2017/ JPEGs")
    p.add_argument("--stuffthingmaps", type=Path, help="folder with train2017/, val2017/ PNGs")
    p.add_argument("--setup", choices=SETUPS, required=True)
    p.add_argument("--only", default=None, help="'sky-other': the paper's sky task (setup stuff)")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    d = Options(out="")
    p.add_argument("--size", type=int, nargs=2, metavar=("H", "W"), default=list(d.size))
    p.add_argument("--threshold", type=float, default=d.threshold,
                   help="all classes: s^c = 1[f_c > T]")  # fmt: skip
    p.add_argument("--thresholds", type=float, nargs="+", default=[],
                   help="all classes, p > 2 bins: increasing thresholds")  # fmt: skip
    p.add_argument("--bins", type=int, default=d.bins,
                   help="sky: 2 = mean threshold, P > 2 = training quantile bins")  # fmt: skip
    p.add_argument("--interpolation", choices=INTERPOLATIONS, default=d.interpolation)
    p.add_argument("--workers", type=int, default=d.workers, help="processes (0, 1: none)")
    p.add_argument("--shard-size", type=int, default=d.shard_size, help="images per resume shard")
    p.add_argument("--limit", type=int, default=None, help="first N images (by id) per split")
    p.add_argument("--force", action="store_true", help="rebuild from scratch")
    a = p.parse_args(argv)
    options = Options(
        out=a.out, setup=a.setup, root=a.root, annotations=a.annotations, images=a.images,
        stuffthingmaps=a.stuffthingmaps, only=a.only, size=tuple(a.size), threshold=a.threshold,
        thresholds=tuple(a.thresholds), bins=a.bins, interpolation=a.interpolation, limit=a.limit,
        workers=a.workers, shard_size=a.shard_size, force=a.force,
    )  # fmt: skip
    try:
        prepare(options)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
