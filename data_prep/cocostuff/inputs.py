"""The inputs: locating the files (``--root`` layouts or explicit folders), their fingerprint, and
one split's stuff JSON parsed and checked."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from train.caches.segmentation import SPLITS
from train.files import file_digest

from .classes import STUFF_IDS, category_lut
from .options import Options


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
            {
                "id": int(r["id"]),
                "file_name": str(r["file_name"]),
                "height": int(r["height"]),
                "width": int(r["width"]),
            }
            for r in data["images"]
        ),
        key=lambda r: r["id"],
    )
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
