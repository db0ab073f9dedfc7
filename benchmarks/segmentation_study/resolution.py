"""What bounds CamVid's small-object classes: the same 11-class recipe at 120x160 and at 360x480.

The study's 11-class task ran at 120x160 on the 2-core CPU (1/9 of CamVid's pixels), where a pole is
one or two pixels wide. ``resolution_gpu.sh`` (beside this file) trains the recipe's baseline
(DeepLabV3+ / cross-entropy) and its best small-class arm at 120x160 (U-Net + median-frequency CE)
at both sizes on one GPU, from the same CamVid copy, so that only the resolution differs between a
row at 120x160 and one at 360x480. This module reads those runs (folders
``all-<H>x<W>-<arm>-seed<S>``) and writes ``docs/figures/segmentation_study_resolution.md``: per size
and arm, test figures at the epoch chosen on val (mean ± sd over seeds), beside the CPU study's
120x160 runs of the same arms and each size's 1-pixel boundary floor.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from .._report import markdown_table, mean_sd
from ..sweep import metrics
from .floor import class_names, small_classes
from .spec import SMALL_CLASSES, jobs
from .tables import plateau

ARMS = {  # folder name of the GPU runs -> the study's method
    "baseline": "baseline",
    "unet_mfce": "U-Net + median-frequency CE",
}
FOLDER = re.compile(r"all-(\d+)x(\d+)-(\w+)-seed(\d+)")
COMMAND = "python -m benchmarks.segmentation_study resolution --runs <the GPU runs' folder>"


def gpu_runs(root: Path) -> dict[tuple[tuple[int, int], str], list[dict]]:
    """``{(size, method): [metrics.json of each finished seed]}`` of the runs in ``root``, in seed
    order; a run that did not finish its epochs is left out (a ValueError naming ``root`` if no run
    there finished)."""
    found: dict[tuple[tuple[int, int], str], list[tuple[int, dict]]] = {}
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        match = FOLDER.fullmatch(folder.name)
        if match is None or match.group(3) not in ARMS or (m := metrics(folder)) is None:
            continue
        size = (int(match.group(1)), int(match.group(2)))
        found.setdefault((size, ARMS[match.group(3)]), []).append((int(match.group(4)), m))
    if not found:
        raise ValueError(f"--runs {root}: no finished run folder named all-<H>x<W>-<arm>-seed<S>")
    order = list(ARMS.values())
    keys = sorted(found, key=lambda k: (k[0], order.index(k[1])))  # by size, the baseline first
    return {k: [m for _, m in sorted(found[k], key=lambda x: x[0])] for k in keys}


def cpu_runs(archive: Path, methods: list[str], seeds: range = range(3)) -> dict[str, list[dict]]:
    """The CPU study's finished 120x160 runs of ``methods`` kept in ``archive`` (``spec.jobs``'
    keys, each run trained with its job's settings)."""
    out: dict[str, list[dict]] = {}
    for _, method, job in jobs(None, list(seeds), ["all"], methods, (120, 160)):
        if (m := metrics(archive / job.key, job)) is not None:
            out.setdefault(method, []).append(m)
    return out


def _row(where: str, size: tuple[int, int], method: str, ms: list[dict]) -> list[str]:
    sel = [m["selected"] for m in ms]
    classes = class_names(len(sel[0]["test_iou"]))
    small = [classes.index(c) for c in SMALL_CLASSES]
    secs = [statistics.median(h["train_seconds"] for h in m["history"]) for m in ms]
    return [
        where,
        f"{size[0]}x{size[1]}",
        method,
        str(len(ms)),
        mean_sd(s["test_miou"] for s in sel),
        mean_sd(small_classes(s["test_iou"], classes) for s in sel),
        *(mean_sd(s["test_iou"][i] for s in sel) for i in small),
        mean_sd(s["test_miou_gap"] for s in sel),
        mean_sd(s["val_miou"] for s in sel),
        mean_sd(secs, ".1f"),
    ]


def resolution_table(runs: Path, archive: Path) -> str:
    """The markdown of ``segmentation_study_resolution.md`` (without its command line)."""
    gpu = gpu_runs(runs)
    methods = list(dict.fromkeys(method for _, method in gpu))
    device = {m["config"]["train"]["device"] for ms in gpu.values() for m in ms}
    rows = [_row("CPU study", (120, 160), k, ms) for k, ms in cpu_runs(archive, methods).items()]
    rows += [_row("GPU", size, method, ms) for (size, method), ms in gpu.items()]
    header = [
        "where",
        "size",
        "method",
        "seeds",
        "test mIoU",
        "small classes",
        *SMALL_CLASSES,
        "gap",
        "val mIoU",
        "train s/epoch",
    ]
    floors = []
    for size in dict.fromkeys(size for size, _ in gpu):
        path = archive / f"floor-all-{size[0]}x{size[1]}.json"
        if path.is_file():
            fl = json.loads(path.read_text())
            classes = class_names(len(fl["dilation"]["iou"]))
            vals = [small_classes(fl[how]["iou"], classes) for how in ("dilation", "shift")]
            floors.append(f"{size[0]}x{size[1]}: {min(vals):.3f}-{max(vals):.3f}")
    curves = [f"{s[0]}x{s[1]} {method}: {plateau(ms)}" for (s, method), ms in gpu.items()]
    return "\n".join(
        [
            markdown_table(header, rows),
            "",
            f"GPU runs: train.device {sorted(device)}; runs of a call share one GPU, so train "
            "s/epoch is a shared GPU's (the CPU study's: 2 runs on 2 cores).",
            "",
            "The small classes' 1-pixel boundary floor (the test ground truth scored against itself "
            "dilated / shifted by one pixel): " + "; ".join(floors) + ".",
            "",
            *(f"- {c}" for c in curves),
        ]
    )


def write_resolution(runs: Path, archive: Path, out: Path) -> str:
    """Write ``segmentation_study_resolution.md`` into ``out``; returns its table."""
    text = resolution_table(runs, archive)
    out.mkdir(parents=True, exist_ok=True)
    (out / "segmentation_study_resolution.md").write_text(f"<!-- {COMMAND} -->\n{text}\n")
    return text
