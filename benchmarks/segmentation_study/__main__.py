"""CamVid segmentation study: what evens out small- and big-object images on real photos.

    python -m benchmarks.segmentation_study run --camvid <CamVid dir> --jobs 2      # resumable
    python -m benchmarks.segmentation_study run --camvid <CamVid dir> --size 120 160 --tasks sky
    python -m benchmarks.segmentation_study table                                    # docs/figures/
    python -m benchmarks.segmentation_study timing --camvid <CamVid dir>             # cost per step
    python -m benchmarks.segmentation_study archive   # finished runs' figures into docs/figures/
    python -m benchmarks.segmentation_study picture --tasks sky --size 120 160 --best U-Net
    python -m benchmarks.segmentation_study floor --camvid <CamVid dir> --tasks sky --size 360 480
    python -m benchmarks.segmentation_study fit --tasks all --size 120 160 --seeds 0 1 --methods ...
    python -m benchmarks.segmentation_study resolution --runs <GPU runs>  # resolution_gpu.sh's runs

``run`` builds the CamVid caches (``data_prep.camvid``: sky vs rest, the paper's experiment 2; the
11 classes with experiment 3's shape label) at ``--size`` and trains every (task, method, seed) of
the grid (``spec``) with ``configs/camvid_sky.yaml`` / ``configs/camvid.yaml`` (DeepLabV3+ /
ResNet-18 from scratch, batch 8, Adam 1e-3; the 11 classes at 120x160 with the recipe of
``spec.RECIPES``) for the task's epochs (``--epochs`` overrides) through ``benchmarks.sweep`` (one
thread per run, ``--jobs`` at a time, finished runs reused, interrupted ones resumed from their last
epoch). Every run selects its epoch on val (best ``val_miou``) and reports test at that epoch.

``table`` writes ``docs/figures/segmentation_study.md`` (per size and task, mean +- sd over the
seeds: mIoU, sky IoU, the small-object classes' mean IoU, pixel and class-average accuracy, mIoU per
shape group, the gap, the worst group, the shape node's test F1, seconds per epoch; the task's
1-pixel boundary floor (``floor``); per-class IoU) and ``segmentation_study.png`` (val mIoU per epoch;
per-image sky IoU against the image's sky fraction). ``archive`` keeps the finished runs' figures and
each cache's floor in the repository. ``timing`` measures one training step of each method against
the baseline's, interleaved, on CamVid batches, and each task loss's and objective's share of it.
``picture`` draws the six test images with the least sky: image, baseline, ``--best``, truth.
``floor`` builds the caches of ``--tasks`` at ``--size``, keeps their 1-pixel boundary floor in
``--archive`` and writes ``segmentation_study_floor.md`` with every floor kept there. ``fit`` scores
each finished run's best-val checkpoint on its cache's train split beside test: what a
model misses on its own training images is not a matter of data. ``resolution`` tables the runs of
``resolution_gpu.sh`` (the 11-class recipe at 120x160 and 360x480 on a GPU) beside the CPU study's.

Modules, imported one way: ``spec`` (what is compared) <- ``floor``, ``timing`` <- ``tables``,
``fit``, ``resolution`` <- ``picture`` <- ``__main__`` (this CLI).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from data_prep import camvid

from ..sweep import archive, restore, run_jobs
from .fit import write_fit
from .floor import floor_report, save_floors
from .picture import picture
from .resolution import write_resolution
from .spec import METHODS, SIZES, TASKS, cache, jobs
from .tables import ARCHIVED, table
from .timing import timing


def _arguments() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "what",
        choices=("run", "table", "timing", "archive", "picture", "floor", "fit", "resolution"),
    )
    p.add_argument("--camvid", type=Path, help="run, timing: the CamVid folder (SegNet layout)")
    p.add_argument("--runs", type=Path, default=Path("runs/segmentation_study"))
    p.add_argument(
        "--archive",
        type=Path,
        default=Path("docs/figures/segmentation_study_runs"),
        help="finished runs' figures and the caches' floors, kept in the repository: run restores "
        "them, archive adds to them, table reads the floors there when a cache is absent",
    )
    p.add_argument("--out", type=Path, default=Path("docs/figures"))
    p.add_argument("--epochs", type=int, help="epochs of every run (default: the task's)")
    p.add_argument("--size", type=int, nargs=2, default=(60, 80), metavar=("H", "W"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    p.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--steps", type=int, default=20, help="timing: steps per method")
    p.add_argument(
        "--best",
        choices=list(METHODS),
        default="U-Net",
        help="picture: the method beside the baseline",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """``run`` the sweep, ``table`` it, ``archive`` its finished runs, measure the ``timing`` or
    draw the ``picture``."""
    p = _arguments()
    a = p.parse_args(argv)
    size = tuple(a.size)
    grid = jobs(a.epochs, a.seeds, a.tasks, a.methods, size)
    if a.what in ("run", "timing", "floor"):
        if a.camvid is None:
            p.error(f"{a.what} needs --camvid <the CamVid folder (SegNet layout)>")
        for task in a.tasks:
            kind = TASKS[task][2]
            camvid.prepare(
                camvid.Options(root=a.camvid, out=cache(task, size), task=kind, size=size)
            )
    if a.what == "timing":
        text = timing(a.steps, a.tasks[0], size)
        a.out.mkdir(parents=True, exist_ok=True)
        command = "python -m benchmarks.segmentation_study timing --camvid <CamVid dir> --tasks "
        command += f"{a.tasks[0]} --size {size[0]} {size[1]} --steps {a.steps}"
        path = a.out / f"segmentation_study_timing_{a.tasks[0]}_{size[0]}x{size[1]}.md"
        path.write_text(f"<!-- {command} -->\n{text}\n")
        print(text)
        return 0
    if a.what == "floor":
        save_floors(a.archive, [size])
        text = floor_report(a.archive)
        a.out.mkdir(parents=True, exist_ok=True)
        command = "python -m benchmarks.segmentation_study floor --camvid <CamVid dir> --tasks "
        command += "sky all --size H W (each size in the table; archive adds the study's)"
        (a.out / "segmentation_study_floor.md").write_text(f"<!-- {command} -->\n{text}\n")
        print(text)
        return 0
    if a.what == "resolution":
        print(write_resolution(a.runs, a.archive, a.out))
        return 0
    if a.what == "fit":
        print(write_fit(a.runs, a.tasks[0], size, a.methods, a.seeds, a.out, a.epochs))
        return 0
    if a.what == "picture":
        path = picture(a.runs, a.tasks[0], size, a.best, a.seeds[0], a.out, a.epochs)
        print(f"wrote {path}")
        return 0
    if a.what == "run":
        restore(a.archive, a.runs, [job for *_, job in grid])
        start = time.perf_counter()
        run_jobs([job for *_, job in grid], a.runs, a.jobs)
        print(f"sweep wall time {time.perf_counter() - start:.0f} s", flush=True)
    sizes = list(dict.fromkeys([*SIZES, size]))  # every size of the study (and --size)
    if a.what == "archive":
        kept = archive(a.runs, a.archive, [job for *_, job in grid], ARCHIVED)
        print(f"{kept} runs archived in {a.archive}")
        save_floors(a.archive, sizes)
    grids = {s: jobs(a.epochs, a.seeds, list(TASKS), list(METHODS), s) for s in sizes}
    print(table(a.runs, grids, len(a.seeds), a.out, a.archive))
    return 0


if __name__ == "__main__":
    sys.exit(main())
