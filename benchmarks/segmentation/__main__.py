"""COCO-Stuff: what the cache buys the loader, and what the regularizer costs a training step.

    python -m benchmarks.segmentation --out docs/figures      # builds its own official-format data

Writes ``segmentation.md`` and ``segmentation.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from train.torchvision_compat import ensure_torchvision_importable

from .run import config_step_times, loader_throughput, step_overhead
from .tables import plot, report


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.segmentation", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--root", type=Path, default=None, help="a COCO-Stuff root (default: generated)")
    p.add_argument("--images", type=int, default=128, help="training images for the loader test")
    p.add_argument("--photo-size", type=int, nargs=2, default=(480, 640), metavar=("H", "W"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--loader-batch", type=int, default=120, help="the paper's regularized batch")
    p.add_argument("--loader-epochs", type=int, default=3, help="timed passes (median)")
    p.add_argument("--batch", type=int, default=8, help="training batch for the step timing")
    p.add_argument("--steps", type=int, default=30, help="timed steps per trainer")
    p.add_argument("--classes", type=int, default=92)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="tiny sizes, no config timings (smoke)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    a = p.parse_args(argv)
    if a.quick:
        a.images, a.photo_size, a.loader_batch, a.loader_epochs = 8, (60, 80), 4, 1
        a.batch, a.steps = 2, 1
    return a


def main(argv: list[str] | None = None) -> int:
    """Measure the loader and the step; write ``segmentation.md`` and ``segmentation.png``."""
    ensure_torchvision_importable()  # before smp, timm and torchvision are imported
    a = _arguments(argv)
    with tempfile.TemporaryDirectory() as tmp:
        lo = loader_throughput(
            a.root,
            a.images,
            tuple(a.photo_size),
            a.workers,
            a.loader_batch,
            a.loader_epochs,
            Path(tmp),
        )
    print(
        f"loader: cache {lo['cache']:.0f} img/s, decode {lo['decode']:.1f} img/s, "
        f"ratio {lo['ratio']:.1f}",
        flush=True,
    )
    st = step_overhead(a.batch, a.steps, a.classes, a.threads)
    print(f"step: ratio {st['ratio']:.4f} (sparse tau {st['sparse_ratio']:.4f})", flush=True)
    configs = [] if a.quick else config_step_times(a.threads)
    text, table, steps_table = report(a, lo, st, configs)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "segmentation.md").write_text(text)
    plot(lo, st, a.out / "segmentation.png")
    print(table)
    print(steps_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
