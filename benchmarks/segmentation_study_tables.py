"""The table and the figure of ``benchmarks.segmentation_study`` (``segmentation_study.md``: per
task and method the test figures at the best-val epoch, mean ± sd over seeds; per-class IoU)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np

from data_prep import camvid

from ._report import markdown_table, mean_sd, save_figure, subplots
from .segmentation_study_spec import METHODS, TASKS
from .sweep import Job, metrics

Runs = dict[tuple[str, str], list[dict]]  # (task, method) -> the metrics of each finished seed
HEADER = [
    "method",
    "seeds",
    "mIoU",
    "sky IoU",
    "pixel acc",
    "class-avg acc",
    "mIoU small",
    "mIoU big",
    "gap",
    "worst group",
    "shape-node F1",
    "epoch",
    "train s / epoch",
]
PLOTTED = ("baseline", "fbeta defaults", "group DRO")


def _runs(root: Path, grid: list[tuple[str, str, Job]]) -> Runs:
    """``{(task, method): [metrics of each finished seed]}``."""
    found: Runs = {}
    for task, method, job in grid:
        m = metrics(root / job.key, job)
        if m is not None:
            found.setdefault((task, method), []).append(m | {"_dir": str(root / job.key)})
    return found


def _row(task: str, method: str, ms: list[dict], seeds: int) -> list[str]:
    """One method's figures at the selected (best-val) epoch of each seed."""
    sel = [m["selected"] for m in ms]
    sky = 1 if task == "sky" else 0  # class index of sky in the cache
    worst = [min(g for g in s["test_miou_per_group"] if g is not None) for s in sel]
    secs = [statistics.median(h["train_seconds"] for h in m["history"]) for m in ms]
    shaped = any(o.startswith("regularizer.name=") for o in METHODS[method])  # a shape node
    return [
        method,
        f"{len(ms)}/{seeds}",
        mean_sd(s["test_miou"] for s in sel),
        mean_sd(s["test_iou"][sky] for s in sel),
        mean_sd(s["test_pixel_accuracy"] for s in sel),
        mean_sd(s["test_mean_class_accuracy"] for s in sel),
        mean_sd(s["test_miou_small"] for s in sel),
        mean_sd(s["test_miou_big"] for s in sel),
        mean_sd(s["test_miou_gap"] for s in sel),
        mean_sd(worst),
        mean_sd([s["test_shape_fbeta"] for s in sel] if shaped else [None]),
        mean_sd((s["epoch"] for s in sel), ".1f"),
        mean_sd(secs, ".0f"),
    ]


def _per_class(ms_by_method: dict[str, list[dict]]) -> str:
    """The mean test IoU of every class (the cache's class names; without it, the builder's)."""
    last = list(ms_by_method.values())[-1][0]
    meta = Path(last["config"]["data"]["path"]) / "meta.json"
    classes = (
        json.loads(meta.read_text())["class_names"] if meta.is_file() else list(camvid.CLASS_NAMES)
    )
    rows = []
    for method, ms in ms_by_method.items():
        sel = [m["selected"] for m in ms]
        ious = np.array([[np.nan if v is None else v for v in s["test_iou"]] for s in sel])
        rows.append([method, *(f"{v:.3f}" for v in np.nanmean(ious, 0))])
    return markdown_table(["method", *classes], rows)


def plateau(ms: list[dict], window: int = 5) -> str:
    """Has the val mIoU levelled off? Its mean over seeds and ``window``-epoch blocks, and the
    slope of a least-squares line through the last ``2 window`` epochs (per epoch, mean ± sd over
    seeds): a slope within its sd of 0 is a plateau up to the epoch-to-epoch noise."""
    curves = np.array([[h["val_miou"] for h in m["history"]] for m in ms])
    epochs = curves.shape[1]
    blocks = [
        f"{lo + 1}-{min(lo + window, epochs)}: {curves[:, lo : lo + window].mean():.3f}"
        for lo in range(0, epochs, window)
    ]
    x = np.arange(max(0, epochs - 2 * window), epochs)
    slopes = [float(np.polyfit(x, c[x], 1)[0]) for c in curves] if len(x) > 1 else [None]
    return (
        f"val mIoU by epochs (mean over {len(ms)} seeds) {'; '.join(blocks)}; slope over the last "
        f"{len(x)} epochs {mean_sd(slopes, '+.4f')} per epoch"
    )


def table(root: Path, grid: list[tuple[str, str, Job]], seeds: int, out: Path) -> str:
    """Write ``segmentation_study.md`` and ``segmentation_study.png`` into ``out``; returns the
    markdown's tables."""
    runs = _runs(root, grid)
    lines = []
    for task in TASKS:
        found = {m: runs[(task, m)] for m in METHODS if runs.get((task, m))}
        rows = [_row(task, m, ms, seeds) for m, ms in found.items()]
        lines += [
            f"\n### {task}: test at the best-val epoch (mean ± sd over seeds)\n",
            markdown_table(HEADER, rows) if rows else "No finished run of this task yet.",
        ]
        if found.get("baseline"):
            lines.append(f"\nBaseline, {plateau(found['baseline'])}.")
        if found and task == "all":
            lines += [f"\n### {task}: per-class test IoU (mean over seeds)\n", _per_class(found)]
    text = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "segmentation_study.md").write_text(
        "<!-- python -m benchmarks.segmentation_study table --runs "
        "docs/figures/segmentation_study_runs (the runs: python -m "
        "benchmarks.segmentation_study run --camvid <CamVid dir>) -->\n" + text
    )
    _plot(runs, out / "segmentation_study.png")
    return text


def _plot(runs: Runs, path: Path) -> None:
    fig, axes = subplots(1, 3, figsize=(17, 4.5))
    for task, ax in zip(TASKS, axes[:2], strict=True):
        for method in PLOTTED:
            for i, m in enumerate(runs.get((task, method), [])):
                val = [h["val_miou"] for h in m["history"]]
                ax.plot(
                    range(1, len(val) + 1),
                    val,
                    color=f"C{list(METHODS).index(method)}",
                    alpha=0.7,
                    label=method if i == 0 else None,
                )
        ax.set(
            title=f"CamVid {task}: val mIoU per epoch (each seed)", xlabel="epoch", ylabel="mIoU"
        )
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    ax = axes[2]
    for method in PLOTTED:
        xs, ys = [], []
        for m in runs.get(("sky", method), []):
            per = np.load(Path(m["_dir"]) / "per_image_test.npz")
            cache = Path(m["config"]["data"]["path"]) / "test"
            if not (cache / "fractions.npy").is_file():  # archived runs without the cache
                continue
            xs.append(np.load(cache / "fractions.npy")[per["index"], 1])
            ys.append(per["iou"][:, 1])
        if xs:
            ax.scatter(
                np.concatenate(xs),
                np.concatenate(ys),
                s=4,
                alpha=0.4,
                label=method,
                color=f"C{list(METHODS).index(method)}",
            )
    ax.set(
        title="sky task, test: per-image sky IoU vs the image's sky fraction (all seeds)",
        xlabel="sky fraction of the image",
        ylabel="sky IoU",
    )
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    save_figure(fig, path)
