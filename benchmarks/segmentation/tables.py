"""The report and the plot of the segmentation benchmark: the measurements against their targets,
the paper configs' step times."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks._report import markdown_table, save_figure, subplots
from benchmarks._timing import machine_line

from .spec import COCO_TRAIN_IMAGES


def rows(a: argparse.Namespace, lo: dict[str, float], st: dict[str, float]) -> list[list[str]]:
    """The measurements against their targets: the loader, the step (dense and sparse ``tau``),
    the epoch end."""
    src = "generated " + "x".join(map(str, a.photo_size)) if a.root is None else str(a.root)
    return [
        [
            f"loader, {lo['images']} images ({src}), {a.workers} workers, batch {a.loader_batch}",
            f"cache {lo['cache']:.0f} img/s",
            f"decode + resize {lo['decode']:.1f} img/s",
            f"**{lo['ratio']:.1f}x**",
            "≥ 10x",
        ],
        [
            f"DeepLabV3+ resnet18 step, batch {a.batch}, 106x160, {a.classes} classes, CPU "
            f"{a.threads} threads",
            f"regularized {st['reg_s']:.3f} s",
            f"baseline {st['base_s']:.3f} s",
            f"**{st['ratio']:.4f}**",
            "≤ 1.02",
        ],
        [
            "the same, tau=SparseTau()",
            f"regularized {st['sparse_s']:.3f} s",
            f"baseline {st['base_s']:.3f} s",
            f"**{st['sparse_ratio']:.4f}**",
            "≤ 1.02",
        ],
        [
            f"epoch end (projection of {COCO_TRAIN_IMAGES // 2} tau + dual step)",
            f"{st['end_s'] * 1e3:.1f} ms",
            f"epoch ≈ {st['reg_s'] * COCO_TRAIN_IMAGES / a.batch / 60:.0f} min",
            f"**{100 * st['end_fraction']:.5f} %**",
            "-",
        ],
    ]


def report(
    a: argparse.Namespace,
    lo: dict[str, float],
    st: dict[str, float],
    configs: list[tuple[str, float]],
) -> tuple[str, str, str]:
    """The markdown of ``segmentation.md``, and its two tables (printed)."""
    table = markdown_table(["measurement", "with", "without", "ratio", "target"], rows(a, lo, st))
    steps_table = markdown_table(
        ["model, CPU, 106x160, regularized", "seconds per training step"],
        [[name, f"{t:.2f}"] for name, t in configs],
    )
    cmd = "python -m benchmarks.segmentation" + ("" if a.root is None else f" --root {a.root}")
    text = (
        f"<!-- {cmd} --images {a.images} --steps {a.steps} --batch {a.batch} -->\n"
        f"{machine_line()}; cache prep of the loader set: {lo['prep_s']:.1f} s; step medians "
        f"of {a.steps} interleaved steps (extra {st['extra_ms']:.1f} ms/step)\n\n{table}\n\n"
        f"{steps_table}\n"
    )
    return text, table, steps_table


def plot(lo: dict[str, float], st: dict[str, float], path: Path) -> None:
    fig, (ax1, ax2) = subplots(1, 2, figsize=(9, 3))
    ax1.bar(["decode per sample", "cache"], [lo["decode"], lo["cache"]], color=["gray", "tab:blue"])
    ax1.set_yscale("log")
    ax1.set_ylabel("images / s")
    ax1.set_title(f"loader: {lo['ratio']:.0f}x")
    ax2.bar(["baseline", "regularized"], [st["base_s"], st["reg_s"]], color=["gray", "tab:blue"])
    ax2.set_ylabel("s / step")
    ax2.set_title(f"DeepLabV3+ r18 step: {st['ratio']:.3f}x")
    save_figure(fig, path)
