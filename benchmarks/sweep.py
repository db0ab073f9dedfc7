"""A small resumable sweep harness for studies that train through ``python -m train``'s loop.

A job is a key (its run folder name) and a config plus ``key=value`` overrides. ``run_jobs`` trains
the jobs whose run folder holds no complete ``metrics.json``, ``jobs`` at a time, each in its own
process with one thread; a job interrupted after an epoch's checkpoint continues from it
(``--resume``), so killing a sweep loses at most one epoch per running job, and a run of the job
with fewer epochs is extended to the job's (resumed from its last checkpoint with the larger
``train.epochs``: the same training as a run of the longer job, since a resume is exact and the
constant lr schedule does not depend on the number of epochs); ``archive`` keeps the
figures of finished runs elsewhere and ``restore`` brings them back, so a sweep also resumes across
machines and restarts. ``run_pool`` is the process pool under it, also for the scripts whose runs
are not trainer runs or not resumed (each skips its finished runs itself, ``finished``, and hands
``run_pool`` the rest, e.g. ``train_once``: one trainer run from the start).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Job:
    key: str  # the run folder's name under the sweep's root
    config: str  # configs/<x>.yaml
    overrides: tuple[str, ...] = field(default_factory=tuple)


def metrics(out: Path, job: Job | None = None) -> dict[str, Any] | None:
    """The run's ``metrics.json`` if the run finished (all its epochs) and, given the ``job``, was
    trained with the job's settings (every override agrees with the saved config: a run of an
    earlier grid, e.g. with fewer epochs, is not taken for this one), else ``None``."""
    try:
        m = json.loads((out / "metrics.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    config = m.get("config", {})
    done = m.get("final", {}).get("epochs") == config.get("train", {}).get("epochs")
    return m if done and (job is None or agrees(config, job.overrides)) else None


def finished(folders: list[Path]) -> list[dict[str, Any]]:
    """The ``metrics.json`` of the runs in ``folders`` that finished all their epochs."""
    return [m for f in folders if (m := metrics(f)) is not None]


def seconds_per_epoch(metrics: dict) -> float:
    """Training seconds per epoch (training pass + epoch end) of a run's ``metrics.json``, mean
    over the run."""
    h = metrics["history"]
    return sum(r["train_seconds"] + r["epoch_end_seconds"] for r in h) / len(h)


def agrees(config: dict[str, Any], overrides: Iterable[str]) -> bool:
    """Whether the resolved ``config`` has the value of every ``key=value`` override (YAML-typed,
    as ``python -m train`` reads them)."""
    import yaml

    for override in overrides:
        key, _, value = override.partition("=")
        node: Any = config
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        if node != yaml.safe_load(value):
            return False
    return True


def _train(job: Job, root: Path) -> str:
    import torch

    from train import config as config_mod
    from train.loop import run

    torch.set_num_threads(1)
    out = str(root / job.key)
    quiet = ["train.progress=false", "train.log_images=0", "train.keep_checkpoints=1"]
    epochs = config_mod.load(job.config, list(job.overrides)).train.epochs
    if _resumable(Path(out), job, epochs):  # an interrupted or shorter run of this job: go on
        resume = ["train.stop_after_steps=null", f"train.epochs={epochs}"]
        cfg = config_mod.load(Path(out) / "config.yaml", resume)
        run(cfg, log=lambda *_: None, resume=out)
    else:
        shutil.rmtree(out, ignore_errors=True)
        cfg = config_mod.load(job.config, [*job.overrides, *quiet, f"train.out={out}"])
        run(cfg, log=lambda *_: None)
    return out


def train_once(args: tuple[str, list[str], str]) -> str:
    """Train ``(config, overrides, run folder)`` from the start, one thread, no checkpoints: the
    job of ``run_pool`` for the studies that skip their finished runs themselves."""
    config_path, overrides, out = args
    import torch

    from train import config as config_mod
    from train.loop import run

    torch.set_num_threads(1)
    cfg = config_mod.load(
        config_path,
        [*overrides, f"train.out={out}", "train.progress=false", "train.checkpoint=false"],
    )
    run(cfg, log=lambda *_: None)
    return out


def _resumable(out: Path, job: Job, epochs: int) -> bool:
    """Whether ``out`` holds a checkpoint of a run with ``job``'s settings (``epochs`` of them), or
    with the same ones but fewer epochs and a constant lr schedule (it is extended); else the job
    starts anew."""
    import yaml

    from train import checkpoint

    try:
        config = yaml.safe_load((out / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return False
    if checkpoint.latest(out) is None:
        return False
    others = [o for o in job.overrides if not o.startswith("train.epochs=")]
    trained = config.get("train", {}).get("epochs", epochs + 1)
    if trained < epochs and config.get("optim", {}).get("schedule") != "constant":
        return False
    return agrees(config, others) and trained <= epochs


def run_jobs(jobs: Sequence[Job], root: Path, workers: int) -> None:
    """Train the unfinished ``jobs`` into ``root/<key>``, ``workers`` processes at a time."""
    todo = [j for j in jobs if metrics(root / j.key, j) is None]
    print(f"{len(todo)} of {len(jobs)} runs to do", flush=True)
    if todo:
        root.mkdir(parents=True, exist_ok=True)
    run_pool(
        partial(_train, root=root), todo, workers, lambda _, out: print("done", out, flush=True)
    )


def archive(runs: Path, to: Path, jobs: Sequence[Job], files: Sequence[str]) -> int:
    """Copy the ``files`` (a finished run's figures, say: no checkpoints) of the finished runs of
    ``jobs`` to ``to``; returns how many runs ``to`` holds."""
    for job in jobs:
        if metrics(runs / job.key, job) is not None:
            (to / job.key).mkdir(parents=True, exist_ok=True)
            for name in files:
                if (runs / job.key / name).is_file():
                    shutil.copy2(runs / job.key / name, to / job.key / name)
    return sum(metrics(to / job.key, job) is not None for job in jobs)


def restore(archived: Path, runs: Path, jobs: Sequence[Job]) -> None:
    """Runs finished and archived (``archive``) count as done: their files
    are copied into ``runs`` unless a finished run is there already."""
    for job in jobs:
        if metrics(runs / job.key, job) is None and metrics(archived / job.key, job) is not None:
            shutil.rmtree(runs / job.key, ignore_errors=True)
            shutil.copytree(archived / job.key, runs / job.key)


def run_pool(
    fn: Callable[[T], R], todo: Sequence[T], workers: int, done: Callable[[T, R], None]
) -> None:
    """``fn(item)`` for every item of ``todo``, each in a process of a pool of ``workers``;
    ``done(item, result)`` runs here as each one finishes (records are saved there, so an
    interrupted sweep keeps every finished run). A run that fails raises here."""
    if not todo:
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(fn, item): item for item in todo}
        for future in as_completed(futures):
            done(futures[future], future.result())
