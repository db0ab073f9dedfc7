"""One image: its job description, the decoded label map (RLE masks or stuffthing PNG), and the
resized image, label and pixels per class (``process_image``, run by the workers)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from train.caches.segmentation import IGNORE

from .classes import describe_stuffthing_values, stuffthing_lut


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
