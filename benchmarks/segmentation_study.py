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
import json
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from data_prep import camvid

from .sweep import Job, mean_sd, metrics, run_jobs

TASKS = {  # task -> (config, cache prefix, data_prep.camvid task, epochs)
    # epochs: where the baseline's val mIoU has levelled off at 60x80 (the figure's left panels)
    "sky": ("configs/camvid_sky.yaml", "data/camvid-sky", "sky", 15),
    "all": ("configs/camvid.yaml", "data/camvid", "all", 25),
}
# method -> overrides: the same data, seeds, epochs and model for every method; one setting each
METHODS = {
    "baseline": (),
    "fbeta defaults": ("regularizer.name=fbeta", "regularizer.fbeta.preset=null"),
    "fbeta paper + lambda_init 1, capped": (
        "regularizer.name=fbeta",
        "regularizer.fbeta.preset=paper",
        "regularizer.fbeta.lambda_init=1.0",
        "regularizer.fbeta.cap_scores=true",
    ),
    "roc_auc": ("regularizer.name=roc_auc",),
    "soft-F1": ("regularizer.name=soft_fbeta",),
    "group-balanced": ("train.group_weighting=balanced",),
    "group DRO": ("train.group_weighting=dro",),  # Sagawa et al.'s step 0.01 (train.dro_step)
}


def cache(task: str, size: tuple[int, int]) -> str:
    """The cache folder of ``task`` at ``size`` (H, W)."""
    return f"{TASKS[task][1]}-{size[0]}x{size[1]}"


def jobs(
    epochs: int | None,
    seeds: list[int],
    tasks: list[str],
    methods: list[str],
    size: tuple[int, int] = (60, 80),
) -> list[tuple[str, str, Job]]:
    """``(task, method, job)`` of every run of the grid, task by task and seed by seed (an
    interrupted sweep has every method at the first seeds of the first task)."""
    out = []
    for task in tasks:
        config, _, _, task_epochs = TASKS[task]
        for seed in seeds:
            for method in methods:
                key = f"{task}-{method.replace(' ', '_').replace(',', '')}-seed{seed}"
                overrides = (
                    *METHODS[method],
                    f"data.path={cache(task, size)}",
                    f"train.epochs={epochs or task_epochs}",
                    f"train.seed={seed}",
                )
                out.append((task, method, Job(key, config, overrides)))
    return out


def _runs(root: Path, grid: list[tuple[str, str, Job]]) -> dict[tuple[str, str], list[dict]]:
    """``{(task, method): [metrics of each finished seed]}``."""
    found: dict[tuple[str, str], list[dict]] = {}
    for task, method, job in grid:
        m = metrics(root / job.key, job)
        if m is not None:
            found.setdefault((task, method), []).append(m | {"_dir": str(root / job.key)})
    return found


def table(root: Path, grid: list[tuple[str, str, Job]], seeds: int, out: Path) -> str:
    runs = _runs(root, grid)
    lines = []
    for task in TASKS:
        names = None
        lines += [
            f"\n### {task}: test at the best-val epoch (mean ± sd over seeds)\n",
            "| method | seeds | mIoU | sky IoU | pixel acc | class-avg acc | mIoU small | "
            "mIoU big | gap | worst group | shape-node F1 | epoch | train s / epoch |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        per_class = []
        for method in METHODS:
            ms = runs.get((task, method))
            if not ms:
                continue
            sel = [m["selected"] for m in ms]
            names = ms[0]["config"]["data"]["path"]
            sky = 1 if task == "sky" else 0  # class index of sky in the cache
            worst = [min(g for g in s["test_miou_per_group"] if g is not None) for s in sel]
            secs = [statistics.median(h["train_seconds"] for h in m["history"]) for m in ms]
            shape = (
                [s["test_shape_fbeta"] for s in sel]
                if method not in ("baseline", "group-balanced", "group DRO")
                else [None]
            )
            lines.append(
                f"| {method} | {len(ms)}/{seeds} | {mean_sd(s['test_miou'] for s in sel)} "
                f"| {mean_sd(s['test_iou'][sky] for s in sel)} "
                f"| {mean_sd(s['test_pixel_accuracy'] for s in sel)} "
                f"| {mean_sd(s['test_mean_class_accuracy'] for s in sel)} "
                f"| {mean_sd(s['test_miou_small'] for s in sel)} "
                f"| {mean_sd(s['test_miou_big'] for s in sel)} "
                f"| {mean_sd(s['test_miou_gap'] for s in sel)} | {mean_sd(worst)} "
                f"| {mean_sd(shape)} | {mean_sd((s['epoch'] for s in sel), '.1f')} "
                f"| {mean_sd(secs, '.0f')} |"
            )
            ious = np.array([[np.nan if v is None else v for v in s["test_iou"]] for s in sel])
            per_class.append((method, ious))
        if per_class and task == "all":
            meta = Path(names) / "meta.json"  # the cache's names; without it, the builder's
            classes = (
                json.loads(meta.read_text())["class_names"]
                if meta.is_file()
                else list(camvid.CLASS_NAMES)
            )
            lines += [
                f"\n### {task}: per-class test IoU (mean over seeds)\n",
                "| method | " + " | ".join(classes) + " |",
                "|---" * (len(classes) + 1) + "|",
            ]
            for method, ious in per_class:
                lines.append(
                    f"| {method} | " + " | ".join(f"{v:.3f}" for v in np.nanmean(ious, 0)) + " |"
                )
    text = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "segmentation_study.md").write_text(
        "<!-- python -m benchmarks.segmentation_study table --runs "
        "docs/figures/segmentation_study_runs (the runs: python -m "
        "benchmarks.segmentation_study run --camvid <CamVid dir>) -->\n" + text
    )
    _plot(runs, out / "segmentation_study.png")
    return text


def _plot(runs: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
    for task, ax in zip(TASKS, axes[:2], strict=True):
        for method in ("baseline", "fbeta defaults", "group DRO"):
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
    for method in ("baseline", "fbeta defaults", "group DRO"):
        xs, ys = [], []
        for m in runs.get(("sky", method), []):
            per = np.load(Path(m["_dir"]) / "per_image_test.npz")
            cache = Path(m["config"]["data"]["path"]) / "test"
            if not (
                cache / "fractions.npy"
            ).is_file():  # tabulating archived runs without the cache
                continue
            fraction = np.load(cache / "fractions.npy")[per["index"], 1]
            xs.append(fraction)
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
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


ARCHIVED = ("metrics.json", "config.yaml", "per_image_test.npz")  # a finished run's figures


def archive(runs: Path, to: Path, grid: list[Job]) -> int:
    """Copy the figures (``ARCHIVED``, no checkpoints) of the finished runs of ``grid`` to ``to``;
    returns how many runs ``to`` holds."""
    for job in grid:
        if metrics(runs / job.key, job) is not None:
            (to / job.key).mkdir(parents=True, exist_ok=True)
            for name in ARCHIVED:
                if (runs / job.key / name).is_file():
                    shutil.copy2(runs / job.key / name, to / job.key / name)
    return sum(metrics(to / job.key, job) is not None for job in grid)


def restore(archived: Path, runs: Path, grid: list[Job]) -> None:
    """Runs finished in an earlier session and archived (``archive``) count as done: their figures
    are copied into ``runs`` unless a finished run is there already."""
    for job in grid:
        if metrics(runs / job.key, job) is None and metrics(archived / job.key, job) is not None:
            shutil.rmtree(runs / job.key, ignore_errors=True)
            shutil.copytree(archived / job.key, runs / job.key)


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
    rows = ["| method | step (s) | / baseline |", "|---|---|---|"]
    for method, ts in times.items():
        rows.append(
            f"| {method} | {statistics.median(ts):.3f} | {statistics.median(ts) / base:.3f} |"
        )
    s = trainers["baseline"][0]
    batch = next(iter(s.train_loader))
    rows += ["", *_weighting_cost(s, batch, base)]
    regs = {m: t[0].reg for m, t in trainers.items() if t[0].reg is not None}
    rows += ["", *_regularizer_cost(regs, batch["index"], base)]
    return (
        f"CamVid {task}, batch 8, {size[0]}x{size[1]}, 2 threads, median of {steps} interleaved steps\n"
        + "\n".join(rows)
    )


def _regularizer_cost(regs: dict, idx, step: float, reps: int = 200) -> list[str]:
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
    rows = ["| objective's own work per step | ms | / baseline step |", "|---|---|---|"]
    for method, ts in times.items():
        ms = statistics.median(ts)
        rows.append(f"| {method} | {ms * 1e3:.2f} | {ms / step * 100:.2f} % |")
    return rows


def _weighting_cost(s, batch: dict, step: float, reps: int = 200) -> list[str]:
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
    plain = statistics.median(times["none"])
    rows = ["| task loss, fwd + bwd | ms | extra ms | extra / baseline step |", "|---|---|---|---|"]
    for mode, ts in times.items():
        extra = statistics.median(ts) - plain
        rows.append(
            f"| {mode} | {statistics.median(ts) * 1e3:.2f} | {extra * 1e3:+.2f} "
            f"| {extra / step * 100:+.2f} % |"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
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
        print(
            f"{archive(a.runs, a.archive, [job for *_, job in grid])} runs archived in {a.archive}"
        )
    full = jobs(a.epochs, a.seeds, list(TASKS), list(METHODS), size)
    print(table(a.runs, full, len(a.seeds), a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
