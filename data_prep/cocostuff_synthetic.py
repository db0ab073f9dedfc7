"""A small synthetic COCO-Stuff 2017 in the official formats: offline demos, tests and benchmarks.

    python -m data_prep.cocostuff_synthetic --out data/coco-synthetic   # then data_prep.cocostuff

The real data cannot be downloaded here (and is ~20 GB); this writes what ``data_prep.cocostuff``
reads, in the same layout and formats, with known ground truth. ``write_synthetic_cocostuff(root)``
writes::

    root/train2017/<id:012d>.jpg, root/val2017/...           JPEGs of varied sizes
    root/annotations/stuff_{train,val}2017.json               stuff-only COCO JSON: RLE masks
    root/stuffthingmaps_trainval2017/{train,val}2017/*.png    uint8, category id - 1, 255 unlabelled
    root/fixture_truth.npz                                    the ground truth (see ``load_truth``)

Every image has a ground-truth map of COCO category ids at its original size (0 = unlabelled):
a "ground" stuff class, a sky band (``sky-other``, 157) in most images, a stuff blob and thing
objects (small or big), and some unlabelled pixels. The stuff JSON has one annotation per stuff
category present plus one "other" (183) for all thing pixels, as the official files; the masks are
``pycocotools.mask.encode`` RLEs with ``counts`` as ``str`` (the images of ``UNCOMPRESSED_ID`` use
uncompressed list counts instead). The JSON lists images and annotations in shuffled order. The
pixels are a colour per category plus noise, so a model can learn something from them.

Special images: ``TIE_ID`` (2 big + 2 small classes: sky, grass, a small tree and a small person),
``UNLABELLED_ID`` (no annotation at all), ``GRAY_ID`` (grayscale JPEG), ``CMYK_ID`` (CMYK JPEG,
in val). Validation skies are drawn bigger than training skies, so a threshold taken from the
validation split would label them differently from the training threshold.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image
from pycocotools import mask as mask_utils

STUFF_NAMES = {
    92: "banner",
    93: "blanket",
    94: "branch",
    95: "bridge",
    96: "building-other",
    97: "bush",
    98: "cabinet",
    99: "cage",
    100: "cardboard",
    101: "carpet",
    102: "ceiling-other",
    103: "ceiling-tile",
    104: "cloth",
    105: "clothes",
    106: "clouds",
    107: "counter",
    108: "cupboard",
    109: "curtain",
    110: "desk-stuff",
    111: "dirt",
    112: "door-stuff",
    113: "fence",
    114: "floor-marble",
    115: "floor-other",
    116: "floor-stone",
    117: "floor-tile",
    118: "floor-wood",
    119: "flower",
    120: "fog",
    121: "food-other",
    122: "fruit",
    123: "furniture-other",
    124: "grass",
    125: "gravel",
    126: "ground-other",
    127: "hill",
    128: "house",
    129: "leaves",
    130: "light",
    131: "mat",
    132: "metal",
    133: "mirror-stuff",
    134: "moss",
    135: "mountain",
    136: "mud",
    137: "napkin",
    138: "net",
    139: "paper",
    140: "pavement",
    141: "pillow",
    142: "plant-other",
    143: "plastic",
    144: "platform",
    145: "playingfield",
    146: "railing",
    147: "railroad",
    148: "river",
    149: "road",
    150: "rock",
    151: "roof",
    152: "rug",
    153: "salad",
    154: "sand",
    155: "sea",
    156: "shelf",
    157: "sky-other",
    158: "skyscraper",
    159: "snow",
    160: "solid-other",
    161: "stairs",
    162: "stone",
    163: "straw",
    164: "structural-other",
    165: "table",
    166: "tent",
    167: "textile-other",
    168: "towel",
    169: "tree",
    170: "vegetable",
    171: "wall-brick",
    172: "wall-concrete",
    173: "wall-other",
    174: "wall-panel",
    175: "wall-stone",
    176: "wall-tile",
    177: "wall-wood",
    178: "water-other",
    179: "waterdrops",
    180: "window-blind",
    181: "window-other",
    182: "wood",
    183: "other",
}
SKY, GRASS, TREE, PERSON = 157, 124, 169, 1
GROUND = (124, 149, 154, 155, 118, 173)  # grass, road, sand, sea, floor-wood, wall-other
BLOBS = (169, 96, 97, 135, 106, 140)  # tree, building-other, bush, mountain, clouds, pavement
THINGS = (1, 3, 18, 44, 59, 62)  # person, car, dog, bottle, pizza, chair
TRUTH_NAME = "fixture_truth.npz"


def image_id(split: str, i: int) -> int:
    """The COCO id of the ``i``-th image of ``split`` (ascending in ``i``)."""
    return {"train": 1000, "val": 5000}[split] + 17 * i


TIE_ID, UNCOMPRESSED_ID, GRAY_ID, UNLABELLED_ID = (image_id("train", i) for i in range(4))
CMYK_ID = image_id("val", 1)


def _rect(truth: np.ndarray, rng: np.random.Generator, value: int, hh: int, ww: int) -> None:
    h, w = truth.shape
    y, x = rng.integers(0, h - hh + 1), rng.integers(0, w - ww + 1)
    truth[y : y + hh, x : x + ww] = value


def ground_truth(split: str, i: int, h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """The category-id map of one image (0 = unlabelled)."""
    iid = image_id(split, i)
    if iid == UNLABELLED_ID:
        return np.zeros((h, w), np.uint8)
    if iid == TIE_ID:  # sky and grass halves (big), a 5x6 tree and a 5x6 person (small)
        truth = np.full((h, w), GRASS, np.uint8)
        truth[: h // 2] = SKY
        truth[h // 2 + 2 : h // 2 + 7, 3:9] = TREE
        truth[h - 8 : h - 3, w - 10 : w - 4] = PERSON
        return truth
    truth = np.full((h, w), GROUND[rng.integers(len(GROUND))], np.uint8)
    has_sky = i % 3 != 2 if split == "train" else i % 4 != 3
    if has_sky:
        frac = rng.uniform(0.05, 0.45) if split == "train" else rng.uniform(0.5, 0.7)
        truth[: max(2, round(frac * h))] = SKY
    big = rng.random() < 0.5
    blob = (h // 2, w // 3) if big else tuple(rng.integers(3, 7, 2))
    _rect(truth, rng, BLOBS[rng.integers(len(BLOBS))], *blob)
    for _ in range(rng.integers(0, 3)):
        big = rng.random() < 0.3
        box = (h // 4, w // 5) if big else tuple(rng.integers(3, 7, 2))
        _rect(truth, rng, THINGS[rng.integers(len(THINGS))], *box)
    if rng.random() < 0.6:
        _rect(truth, rng, 0, *rng.integers(2, 9, 2))
    return truth


def uncompressed_rle(mask: np.ndarray) -> dict:
    """COCO's uncompressed RLE: run lengths over the column-major pixels, starting with zeros."""
    flat = mask.ravel(order="F").astype(bool)
    bounds = np.concatenate([[0], np.flatnonzero(flat[1:] != flat[:-1]) + 1, [flat.size]])
    runs = np.diff(bounds).tolist()
    return {"size": list(mask.shape), "counts": ([0] if flat[0] else []) + runs}


def _annotations(iid: int, truth: np.ndarray, next_id: int) -> list[dict]:
    """One annotation per stuff category present, plus 183 "other" for all thing pixels."""
    out = []
    stuff = sorted(int(c) for c in np.unique(truth) if c >= 92)
    masks = [(c, truth == c) for c in stuff]
    things = (truth > 0) & (truth < 92)
    if things.any():
        masks.append((183, things))
    for cid, m in masks:
        rle = mask_utils.encode(np.asfortranarray(m.astype(np.uint8)))
        seg = (
            uncompressed_rle(m)
            if iid == UNCOMPRESSED_ID
            else {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}
        )
        out.append(
            {
                "segmentation": seg,
                "area": float(mask_utils.area(rle)),
                "iscrowd": 0,
                "image_id": iid,
                "bbox": [float(v) for v in mask_utils.toBbox(rle)],
                "category_id": cid,
                "id": next_id + len(out),
            }
        )
    return out


def _pixels(truth: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    palette = np.random.default_rng(12345).integers(30, 226, (256, 3))
    palette[SKY], palette[0] = (120, 170, 235), (128, 128, 128)
    noisy = palette[truth] + rng.normal(0, 12, (*truth.shape, 3))
    return np.clip(np.rint(noisy), 0, 255).astype(np.uint8)


def write_synthetic_cocostuff(
    root: Path,
    *,
    n_train: int = 8,
    n_val: int = 4,
    size: tuple[int, int] = (48, 72),
    seed: int = 0,
    corrupt: tuple[int, ...] = (),
    missing: tuple[int, ...] = (),
    missing_maps: tuple[int, ...] = (),
) -> Path:
    """Write the fixture under ``root``; returns ``root``.

    Image heights / widths vary in about ``size * [5/6, 5/4]`` (48x72: 40..60 x 60..90). ``corrupt``:
    image ids whose JPEG is truncated; ``missing``: ids without a JPEG; ``missing_maps``: ids
    without a stuffthing PNG (their annotations stay in the JSON).
    """
    root = Path(root)
    truths = {}
    for s_index, (split, n) in enumerate((("train", n_train), ("val", n_val))):
        images_dir = root / f"{split}2017"
        maps_dir = root / "stuffthingmaps_trainval2017" / f"{split}2017"
        images_dir.mkdir(parents=True, exist_ok=True)
        maps_dir.mkdir(parents=True, exist_ok=True)
        images, annotations = [], []
        for i in range(n):
            rng = np.random.default_rng([seed, s_index, i])
            h = size[0] + int(rng.integers(-(size[0] // 6), size[0] // 4 + 1))
            w = size[1] + int(rng.integers(-(size[1] // 6), size[1] // 4 + 1))
            iid, name = image_id(split, i), f"{image_id(split, i):012d}.jpg"
            truth = ground_truth(split, i, h, w, rng)
            truths[str(iid)] = truth
            images.append(
                {
                    "license": 4,
                    "file_name": name,
                    "height": h,
                    "width": w,
                    "id": iid,
                    "coco_url": f"http://images.cocodataset.org/{split}2017/{name}",
                    "date_captured": "2013-11-18 05:33:39",
                    "flickr_url": "",
                }
            )
            annotations += _annotations(iid, truth, 10_000_000 + 100 * len(truths))
            if iid not in missing:
                img = Image.fromarray(_pixels(truth, rng))
                img = img.convert("L" if iid == GRAY_ID else "CMYK" if iid == CMYK_ID else "RGB")
                img.save(images_dir / name, "JPEG", quality=90)
                if iid in corrupt:
                    data = (images_dir / name).read_bytes()
                    (images_dir / name).write_bytes(data[: len(data) * 2 // 5])
            if iid not in missing_maps:
                values = np.where(truth > 0, truth.astype(np.int16) - 1, 255).astype(np.uint8)
                Image.fromarray(values).save(maps_dir / f"{Path(name).stem}.png")
        order = np.random.default_rng([seed, s_index, 99])
        doc = {
            "info": {"description": "COCO 2017 Stuff Dataset (test fixture)", "year": 2017},
            "images": [images[k] for k in order.permutation(len(images))],
            "licenses": [
                {
                    "url": "http://creativecommons.org/licenses/by/2.0/",
                    "id": 4,
                    "name": "Attribution License",
                }
            ],
            "categories": [
                {"supercategory": "other" if cid == 183 else "stuff", "id": cid, "name": name}
                for cid, name in STUFF_NAMES.items()
            ],
            "annotations": [annotations[k] for k in order.permutation(len(annotations))],
        }
        (root / "annotations").mkdir(exist_ok=True)
        (root / "annotations" / f"stuff_{split}2017.json").write_text(json.dumps(doc))
    np.savez(root / TRUTH_NAME, **truths)
    return root


def load_truth(root: Path) -> dict[int, np.ndarray]:
    """``{image id: category-id map (h, w) uint8}`` at the original size, 0 = unlabelled."""
    with np.load(Path(root) / TRUTH_NAME) as z:
        return {int(k): z[k] for k in z.files}


def stuff_labels(truth: np.ndarray) -> np.ndarray:
    """The ``stuff`` setup's label map: 92..182 -> 0..90, things -> 91 ("other"), 0 -> 255."""
    out = np.full(truth.shape, 255, np.uint8)
    out[truth >= 92] = truth[truth >= 92] - 92
    out[(truth > 0) & (truth < 92)] = 91
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m data_prep.cocostuff_synthetic --out DIR``: write the fixture (for the README's tiny run)."""
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m data_prep.cocostuff_synthetic", description=main.__doc__
    )
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--train", type=int, default=24, help="training images")
    p.add_argument("--val", type=int, default=8, help="validation images")
    p.add_argument("--size", type=int, nargs=2, default=(96, 144), metavar=("H", "W"))
    a = p.parse_args(argv)
    write_synthetic_cocostuff(a.out, n_train=a.train, n_val=a.val, size=tuple(a.size))
    print(f"wrote a {a.train} + {a.val} image COCO-Stuff fixture to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
