"""The tables and figures of the segmentation study: ``segmentation_study.md`` (per size, task and
method the test figures at the best-val epoch, mean ± sd over seeds, read against the task's 1-pixel
boundary floor; per-class IoU and the small-object classes' mean), ``segmentation_study.png`` (val
mIoU per epoch; per-image sky IoU against the sky fraction) and the picture of the six test images
with the least sky."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np

from .._report import markdown_table, mean_sd, save_figure, subplots
from ..sweep import Job, metrics
from .floor import class_names, floors, small_classes
from .spec import METHODS, TASKS

ARCHIVED = ("metrics.json", "config.yaml", "per_image_test.npz")  # a finished run's figures
Size = tuple[int, int]
Grids = dict[Size, list[tuple[str, str, Job]]]  # size -> its (task, method, job) grid
# (task, size, method) -> the metrics of each finished seed
Runs = dict[tuple[str, Size, str], list[dict]]
HEADER = [
    "method",
    "seeds",
    "mIoU",
    "sky IoU",
    "small classes",
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


def _runs(root: Path, grids: Grids) -> Runs:
    """``{(task, size, method): [metrics of each finished seed]}``."""
    found: Runs = {}
    for size, grid in grids.items():
        for task, method, job in grid:
            m = metrics(root / job.key, job)
            if m is not None:
                found.setdefault((task, size, method), []).append(m | {"_dir": str(root / job.key)})
    return found


def _classes(ms: list[dict]) -> list[str]:
    """The class names of the runs' cache (without it, the builder's 11, or sky's 2)."""
    meta = Path(ms[0]["config"]["data"]["path"]) / "meta.json"
    if meta.is_file():
        return json.loads(meta.read_text())["class_names"]
    n = len(ms[0]["selected"]["test_iou"])
    return class_names(n)


def _row(task: str, method: str, ms: list[dict], seeds: int) -> list[str]:
    """One method's figures at the selected (best-val) epoch of each seed."""
    sel = [m["selected"] for m in ms]
    classes = _classes(ms)
    sky = classes.index("sky")
    worst = [min(g for g in s["test_miou_per_group"] if g is not None) for s in sel]
    secs = [statistics.median(h["train_seconds"] for h in m["history"]) for m in ms]
    shaped = any(o.startswith("regularizer.name=") for o in METHODS[method])  # a shape node
    return [
        method,
        f"{len(ms)}/{seeds}",
        mean_sd(s["test_miou"] for s in sel),
        mean_sd(s["test_iou"][sky] for s in sel),
        mean_sd(small_classes(s["test_iou"], classes) for s in sel),
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
    """The mean test IoU of every class and of the small-object classes, per method."""
    classes = _classes(list(ms_by_method.values())[-1])
    rows = []
    for method, ms in ms_by_method.items():
        sel = [m["selected"] for m in ms]
        ious = np.array([[np.nan if v is None else v for v in s["test_iou"]] for s in sel])
        small = mean_sd(small_classes(s["test_iou"], classes) for s in sel)
        rows.append([method, *(f"{v:.3f}" for v in np.nanmean(ious, 0)), small])
    return markdown_table(["method", *classes, "small classes"], rows)


def _floor_table(fl: dict, classes: list[str]) -> str:
    """The floor's figures, in the run table's terms."""
    rows = []
    for how, name in (
        ("dilation", "dilated by 1 pixel"),
        ("shift", "shifted by 1 pixel (mean of 4)"),
    ):
        s = fl[how]
        small = small_classes(s["iou"], classes)
        rows.append(
            [
                f"ground truth {name}",
                f"{s['miou']:.3f}",
                f"{s['iou'][classes.index('sky')]:.3f}",
                "-" if small is None else f"{small:.3f}",
                f"{s['miou_small']:.3f}",
                f"{s['miou_big']:.3f}",
                f"{s['miou_gap']:.3f}",
            ]
        )
    gaps = [m["miou_gap"] for m in fl["shift_moves"]]
    header = ["1-pixel boundary floor", "mIoU", "sky IoU", "small classes", "small", "big", "gap"]
    return (
        markdown_table(header, rows)
        + f"\n\nThe four 1-pixel shifts' gaps range {min(gaps):.3f}-{max(gaps):.3f}."
    )


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


def table(root: Path, grids: Grids, seeds: int, out: Path, archive: Path) -> str:
    """Write ``segmentation_study.md`` and ``segmentation_study.png`` into ``out``; returns the
    markdown's tables. ``archive``: where the floors of caches absent here are kept."""
    runs = _runs(root, grids)
    fls = floors(archive, list(grids))
    lines = []
    for size in grids:
        for task in TASKS:
            found = {m: runs[(task, size, m)] for m in METHODS if runs.get((task, size, m))}
            if not found and (task, size) not in fls:
                continue
            where = f"{task}, {size[0]}x{size[1]}"
            rows = [_row(task, m, ms, seeds) for m, ms in found.items()]
            lines += [
                f"\n### {where}: test at the best-val epoch (mean ± sd over seeds)\n",
                markdown_table(HEADER, rows) if rows else "No finished run of this task yet.",
            ]
            if (task, size) in fls:
                fl = fls[(task, size)]
                classes = class_names(len(fl["dilation"]["iou"]))
                lines += [f"\n{where}, test:\n", _floor_table(fl, classes)]
            if found.get("baseline"):
                lines.append(f"\nBaseline, {plateau(found['baseline'])}.")
            if found and task == "all":
                lines += [
                    f"\n### {where}: per-class test IoU (mean over seeds)\n",
                    _per_class(found),
                ]
    lines.append(f"\n{_cpu_time(runs)}")
    text = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "segmentation_study.md").write_text(
        "<!-- python -m benchmarks.segmentation_study table --runs "
        "docs/figures/segmentation_study_runs (the runs: python -m "
        "benchmarks.segmentation_study run --camvid <CamVid dir> [--size 120 160]) -->\n" + text
    )
    _plot(runs, fls, out / "segmentation_study.png")
    return text


PLOTTED_CURVES = ("baseline", "U-Net", "per-image F-beta")


def _cpu_time(runs: Runs) -> str:
    """The study's CPU time: every finished run's training, evaluation and epoch-end seconds (one
    thread a run), by size and task."""
    parts, total = [], 0.0
    for size in sorted({s for _, s, _ in runs}):
        for task in TASKS:
            ms = [m for (t, s, _), group in runs.items() if (t, s) == (task, size) for m in group]
            secs = sum(
                h["train_seconds"] + h["eval_seconds"] + h["epoch_end_seconds"]
                for m in ms
                for h in m["history"]
            )
            if ms:
                parts.append(f"{task} {size[0]}x{size[1]} {secs / 3600:.2f} h ({len(ms)} runs)")
                total += secs
    return (
        f"CPU time of the runs in these tables (one thread each): {total / 3600:.2f} h; "
        + ("; ".join(parts) or "none yet")
        + "."
    )


def _plot(runs: Runs, fls: dict, path: Path) -> None:
    """Top: val mIoU per epoch of each (task, size) with runs (``PLOTTED_CURVES``, each seed).
    Bottom: per sky-task size, test sky IoU of each image against its sky fraction, the mean per
    fraction bin of every method (all seeds) and of the ground truth dilated by one pixel."""
    where = sorted({(t, s) for t, s, _ in runs}, key=lambda k: (k[1], k[0]))
    skies = [k for k in where if k[0] == "sky"]
    cols = max(len(where), len(skies), 1)
    fig, axes = subplots(2, cols, figsize=(5.5 * cols, 9), squeeze=False)
    for (task, size), ax in zip(where, axes[0], strict=False):
        for method in PLOTTED_CURVES:
            for i, m in enumerate(runs.get((task, size, method), [])):
                val = [h["val_miou"] for h in m["history"]]
                ax.plot(
                    range(1, len(val) + 1),
                    val,
                    color=_colour(method),
                    alpha=0.7,
                    label=method if i == 0 else None,
                )
        ax.set(
            title=f"{task} {size[0]}x{size[1]}: val mIoU per epoch", xlabel="epoch", ylabel="mIoU"
        )
        _legend(ax)
    for (task, size), ax in zip(skies, axes[1], strict=False):
        edges = np.linspace(0, 0.6, 13)
        centres = (edges[1:] + edges[:-1]) / 2
        fractions = None
        for method in METHODS:
            xs, ys = [], []
            for m in runs.get((task, size, method), []):
                per = np.load(Path(m["_dir"]) / "per_image_test.npz")
                test = Path(m["config"]["data"]["path"]) / "test"
                if not (test / "fractions.npy").is_file():  # archived runs without the cache
                    continue
                fractions = np.load(test / "fractions.npy")[:, 1]
                xs.append(fractions[per["index"]])
                ys.append(per["iou"][:, 1])
            if xs:
                ax.plot(
                    centres,
                    _binned(np.concatenate(xs), np.concatenate(ys), edges),
                    marker=".",
                    color=_colour(method),
                    label=method,
                )
        fl = fls.get((task, size))
        if fl is not None and fractions is not None:
            grown = np.array(
                [np.nan if r[1] is None else r[1] for r in fl["dilation_per_image_iou"]]
            )
            ax.plot(centres, _binned(fractions, grown, edges), "k--", label="GT dilated by 1 px")
        ax.set(
            title=f"sky {size[0]}x{size[1]}, test: mean per-image sky IoU by sky fraction",
            xlabel="sky fraction of the image (bins of 0.05)",
            ylabel="sky IoU",
        )
        _legend(ax)
    for ax in [*axes[0][len(where) :], *axes[1][len(skies) :]]:
        ax.axis("off")
    save_figure(fig, path)


def _binned(x: np.ndarray, y: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Mean of ``y`` in each bin of ``x`` (NaN for an empty bin)."""
    which = np.digitize(x, edges) - 1
    return np.array(
        [np.nanmean(y[which == b]) if (which == b).any() else np.nan for b in range(len(edges) - 1)]
    )


def _colour(method: str) -> str:
    return f"C{list(METHODS).index(method) % 10}"


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
