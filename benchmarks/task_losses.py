"""What each task loss (``train.loss``, train/losses.py) costs: forward + backward of the loss
alone on random logits, against the default cross-entropy, and the focal loss in one call (the
trainer's) against smp's ``FocalLoss`` class, which loops over the classes.

    python -m benchmarks.task_losses            # the table in docs/segmentation/losses.md
    python -m benchmarks.task_losses --quick    # seconds: a smoke run

Batch 8, uniform random labels (every class in every image) with the first 10 rows of every image
unlabelled; medians of ``--repeats`` after one warm-up, the losses alternating.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from train.torchvision_compat import ensure_torchvision_importable

from ._report import markdown_table
from ._timing import machine_line

SETTINGS = ((11, (120, 160)), (92, (106, 160)))  # CamVid's classes and size; COCO-Stuff's
QUICK = ((4, (16, 16)),)
BATCH = 8


def losses(classes: int) -> dict[str, Callable]:
    """The timed losses, by the column they go in."""
    ensure_torchvision_importable()
    from segmentation_models_pytorch.losses import FocalLoss

    from train.loop import task_loss
    from train.losses import IGNORE_INDEX, TaskLoss

    out: dict[str, Callable] = {"cross-entropy": task_loss}
    for name in ("dice", "jaccard", "tversky", "focal", "lovasz"):
        out[f"{name} + CE"] = TaskLoss(name, classes, ce_weight=1.0)
    out["lovasz per image + CE"] = TaskLoss("lovasz", classes, ce_weight=1.0, per_image=True)
    out["focal alone"] = TaskLoss("focal", classes)
    out["smp's FocalLoss alone"] = FocalLoss("multiclass", ignore_index=IGNORE_INDEX)
    return out


def time_losses(classes: int, size: tuple[int, int], repeats: int, device: str) -> dict[str, float]:
    """Median seconds of forward + backward per loss."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(BATCH, classes, *size, generator=g).to(device)
    y = torch.randint(0, classes, (BATCH, *size), generator=g)
    y[:, :10] = 255
    y = y.to(device)
    fns = {name: fn.to(device) if hasattr(fn, "to") else fn for name, fn in losses(classes).items()}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for k in range(repeats + 1):
        for name, fn in fns.items():
            z = logits.clone().requires_grad_()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn(z, y).backward()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            if k:  # the first round warms up
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.task_losses", description=__doc__)
    p.add_argument("--quick", action="store_true", help="one tiny setting, 2 repeats")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    settings, repeats = (QUICK, 2) if a.quick else (SETTINGS, a.repeats)
    rows, header = [], None
    for classes, size in settings:
        medians = time_losses(classes, size, repeats, a.device)
        header = header or ["classes, size", *medians]
        rows.append(
            [f"{classes}, {size[0]}x{size[1]}", *(f"{1e3 * s:.1f} ms" for s in medians.values())]
        )
    print(machine_line(a.device))
    print(f"batch {BATCH}, forward + backward of the loss alone, median of {repeats}")
    print(markdown_table(header, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
