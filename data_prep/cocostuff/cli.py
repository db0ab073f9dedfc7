"""Build COCO-Stuff segmentation caches with shape labels: the sky task and all classes (docs/method/shape-labels.md sec. 6).

The command line: ``python -m data_prep.cocostuff --root DIR --setup stuff --out DIR ...``.

Exit code 0 on success, 2 with ``error: <message>`` on stderr for bad options or inputs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .build import prepare
from .options import INTERPOLATIONS, SETUPS, Options


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
    p.add_argument(
        "--threshold", type=float, default=d.threshold, help="all classes: s^c = 1[f_c > T]"
    )
    p.add_argument(
        "--thresholds",
        type=float,
        nargs="+",
        default=[],
        help="all classes, p > 2 bins: increasing thresholds",
    )
    p.add_argument(
        "--bins",
        type=int,
        default=d.bins,
        help="sky: 2 = mean threshold, P > 2 = training quantile bins",
    )
    p.add_argument("--interpolation", choices=INTERPOLATIONS, default=d.interpolation)
    p.add_argument("--workers", type=int, default=d.workers, help="processes (0, 1: none)")
    p.add_argument("--shard-size", type=int, default=d.shard_size, help="images per resume shard")
    p.add_argument("--limit", type=int, default=None, help="first N images (by id) per split")
    p.add_argument("--force", action="store_true", help="rebuild from scratch")
    a = p.parse_args(argv)
    options = Options(
        out=a.out,
        setup=a.setup,
        root=a.root,
        annotations=a.annotations,
        images=a.images,
        stuffthingmaps=a.stuffthingmaps,
        only=a.only,
        size=tuple(a.size),
        threshold=a.threshold,
        thresholds=tuple(a.thresholds),
        bins=a.bins,
        interpolation=a.interpolation,
        limit=a.limit,
        workers=a.workers,
        shard_size=a.shard_size,
        force=a.force,
    )
    try:
        prepare(options)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
