"""CamVid segmentation study: what evens out small- and big-object images on real photos.

    python -m benchmarks.segmentation_study run --camvid <CamVid dir> --jobs 2      # resumable
    python -m benchmarks.segmentation_study table                                    # docs/figures/
    python -m benchmarks.segmentation_study timing --camvid <CamVid dir>             # cost per step
    python -m benchmarks.segmentation_study archive   # finished runs' figures into docs/figures/

``run`` builds the two CamVid caches (``data_prep.camvid``: sky vs rest, the paper's experiment 2;
the 11 classes with experiment 3's shape label) and trains every (task, method, seed) of the grid
with ``configs/camvid_sky.yaml`` / ``configs/camvid.yaml`` (DeepLabV3+ / ResNet-18 from scratch,
batch 8, Adam 1e-3) at ``--size`` (default 60x80: the whole grid at 120x160 would take ~17 CPU-hours
here, 60x80 about 5) for the task's epochs (15 sky, 25 all; ``--epochs`` overrides) through ``benchmarks.sweep`` (one thread per
run, ``--jobs`` at a time, finished runs reused, interrupted ones resumed from their last epoch).
Every run selects its epoch on val (best ``val_miou``) and reports test at that epoch.

``table`` writes ``docs/figures/segmentation_study.md`` (mean +- sd over the seeds: mIoU, sky IoU,
pixel and class-average accuracy, mIoU per shape group, the gap, the worst group, the shape node's
test F1, seconds per epoch; per-class IoU) and ``segmentation_study.png`` (the baseline's val mIoU
per epoch, and per-image sky IoU against the image's sky fraction). ``timing`` measures one training
step of each method against the baseline's, interleaved, on CamVid batches.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

from data_prep import camvid

from ._report import markdown_table
from .segmentation_study_spec import METHODS, SCREEN, TASKS, cache, jobs  # noqa: F401
from .sweep import archive, restore, run_jobs

ARCHIVED = ("metrics.json", "config.yaml", "per_image_test.npz")  # a finished run's figures


def timing(steps: int, task: str, size: tuple[int, int]) -> str:
    """Median step time of each method / the baseline's, steps interleaved, on CamVid batches."""
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        # steps only, no epoch ends: the objectives' "no end_epoch_()" warning is expected here
        warnings.filterwarnings("ignore", "[^:]*: .* since the last end_epoch_", RuntimeWarning)
        return _timing(steps, task, size, tmp)


def _timing(steps: int, task: str, size: tuple[int, int], tmp: str) -> str:
    import torch

    from train import config as config_mod
    from train import distributed
    from train.loop import setup, train_step
    from train.nonfinite import NonFiniteGuard

    torch.set_num_threads(2)
    config = TASKS[task][0]
    trainers = {}
    for method, overrides in METHODS.items():
        cfg = config_mod.load(
            config,
            [
                *overrides,
                f"data.path={cache(task, size)}",
                "train.checkpoint=false",
                f"train.out={tmp}/" + method.replace(" ", "_"),
            ],
        )
        s = setup(cfg, distributed.Context(), None, lambda *_: None)
        guard = NonFiniteGuard("stop", False, "none")
        s.state.begin_epoch(s.device)
        guard.begin_epoch(1, s.state.totals)
        trainers[method] = (s, guard, cfg, iter(s.train_loader))
    times: dict[str, list[float]] = {m: [] for m in METHODS}
    for k in range(steps + 3):
        for method, (s, guard, cfg, it) in trainers.items():
            batch = next(it, None)
            if batch is None:
                it = iter(s.train_loader)
                trainers[method] = (s, guard, cfg, it)
                batch = next(it)
            t0 = time.perf_counter()
            train_step(s, batch, k + 1, guard, cfg.regularizer.alpha, None, check=False)
            if k >= 3:  # warm-up
                times[method].append(time.perf_counter() - t0)
    base = statistics.median(times["baseline"])
    rows = [
        [m, f"{statistics.median(ts):.3f}", f"{statistics.median(ts) / base:.3f}"]
        for m, ts in times.items()
    ]
    s = trainers["baseline"][0]
    batch = next(iter(s.train_loader))
    regs = {m: t[0].reg for m, t in trainers.items() if t[0].reg is not None}
    tables = [
        markdown_table(["method", "step (s)", "/ baseline"], rows),
        _weighting_cost(s, batch, base),
        _regularizer_cost(regs, batch["index"], base),
    ]
    return (
        f"CamVid {task}, batch 8, {size[0]}x{size[1]}, 2 threads, median of {steps} interleaved steps\n"
        + "\n\n".join(tables)
    )


def _regularizer_cost(regs: dict, idx, step: float, reps: int = 200) -> str:
    """Each objective's own work in a step (forward + backward of its loss on the batch's shape
    scores, an Adam step on its parameters, ``after_step_``), interleaved: its share of the
    baseline step."""
    import torch

    times: dict[str, list[float]] = {m: [] for m in regs}
    optimizers = {  # soft-F1 has no parameters of its own
        m: torch.optim.Adam(reg.parameters(), 1e-2) if list(reg.parameters()) else None
        for m, reg in regs.items()
    }
    for k in range(reps):
        u = torch.randn(len(idx), generator=torch.Generator().manual_seed(k))
        for method, reg in regs.items():
            x = u.clone().requires_grad_()
            t0 = time.perf_counter()
            opt = optimizers[method]
            if opt is not None:
                opt.zero_grad()
            reg(x, idx).backward()
            if opt is not None:
                opt.step()
            reg.after_step_()
            times[method].append(time.perf_counter() - t0)
    medians = {method: statistics.median(ts) for method, ts in times.items()}
    return markdown_table(
        ["objective's own work per step", "ms", "/ baseline step"],
        [[m, f"{t * 1e3:.2f}", f"{t / step * 100:.2f} %"] for m, t in medians.items()],
    )


def _weighting_cost(s, batch: dict, step: float, reps: int = 200) -> str:
    """The task loss's forward + backward with each ``train.group_weighting`` against the plain
    loss, on one batch's logits, interleaved: the weighting's own cost, without the step's noise."""
    import torch

    from train.groups import GroupWeighting
    from train.loop import task_loss

    with torch.no_grad():
        logits = s.model(batch["image"])[0]
    y, shape = batch["label"].long(), batch["shape"]
    train_groups = torch.as_tensor(s.data.train_shape_labels)
    weightings = {"none": None}
    weightings |= {m: GroupWeighting(m, train_groups, 2) for m in ("balanced", "dro")}
    times: dict[str, list[float]] = {m: [] for m in weightings}
    for _ in range(reps):
        for mode, gw in weightings.items():
            x = logits.detach().requires_grad_()
            t0 = time.perf_counter()
            task_loss(x, y, gw, shape).backward()
            times[mode].append(time.perf_counter() - t0)
    medians = {mode: statistics.median(ts) for mode, ts in times.items()}
    rows = [
        [
            m,
            f"{t * 1e3:.2f}",
            f"{(t - medians['none']) * 1e3:+.2f}",
            f"{(t - medians['none']) / step * 100:+.2f} %",
        ]
        for m, t in medians.items()
    ]
    header = ["task loss, fwd + bwd", "ms", "extra ms", "extra / baseline step"]
    return markdown_table(header, rows)


def _arguments() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("run", "table", "timing", "archive"))
    p.add_argument("--camvid", type=Path, help="run: the CamVid folder (SegNet layout)")
    p.add_argument("--runs", type=Path, default=Path("runs/segmentation_study"))
    p.add_argument(
        "--archive",
        type=Path,
        default=Path("docs/figures/segmentation_study_runs"),
        help="finished runs' figures, kept in the repository: run restores them, archive adds to it",
    )
    p.add_argument("--out", type=Path, default=Path("docs/figures"))
    p.add_argument("--epochs", type=int, help="epochs of every run (default: the task's)")
    p.add_argument("--size", type=int, nargs=2, default=(60, 80), metavar=("H", "W"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    p.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--steps", type=int, default=20, help="timing: steps per method")
    return p


def main(argv: list[str] | None = None) -> int:
    """``run`` the sweep, ``table`` it, ``archive`` its finished runs or measure the ``timing``."""
    p = _arguments()
    a = p.parse_args(argv)
    size = tuple(a.size)
    grid = jobs(a.epochs, a.seeds, a.tasks, a.methods, size)
    if a.what in ("run", "timing"):
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
    if a.what == "run":
        restore(a.archive, a.runs, [job for *_, job in grid])
        start = time.perf_counter()
        run_jobs([job for *_, job in grid], a.runs, a.jobs)
        print(f"sweep wall time {time.perf_counter() - start:.0f} s", flush=True)
    if a.what == "archive":
        kept = archive(a.runs, a.archive, [job for *_, job in grid], ARCHIVED)
        print(f"{kept} runs archived in {a.archive}")
    from .segmentation_study_tables import table

    full = jobs(a.epochs, a.seeds, list(TASKS), list(METHODS), size)
    print(table(a.runs, full, len(a.seeds), a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
