"""One run of part 2 of the comparison: one method trains the MLP at one positive ratio and
seed; its record (the test metrics, the seconds per iteration, the loss curve) is a JSON file."""

from __future__ import annotations

import json
import statistics
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from benchmarks._timing import machine_line
from reparam import functional as Fn
from reparam import rate_functional as R
from train.files import write_text_atomic

from .spec import BATCH, HIDDEN, LR, Method, Records, make_method, mlp, prepare


@dataclass(frozen=True)
class Job:
    """One (ratio, method, seed) run and where its record goes."""

    mnist_dir: str
    ratio: float
    method: str
    seed: int
    iterations: int
    quick: bool
    data_seed: int
    path: str

    def settings(self) -> dict[str, Any]:
        """What a saved record must match to be reused."""
        return {
            "ratio": self.ratio,
            "method": self.method,
            "seed": self.seed,
            "iterations": self.iterations,
            "quick": self.quick,
            "data_seed": self.data_seed,
            "batch": BATCH,
            "lr": LR,
            "hidden": HIDDEN,
        }


def run_path(runs: Path, ratio: float, method: str, seed: int) -> Path:
    """Where the record of one run lives."""
    return runs / f"ratio{ratio:g}-{method}-seed{seed}.json"


def load_record(job: Job) -> dict[str, Any] | None:
    """The saved record of ``job`` if it is complete and has ``job``'s settings, else ``None``."""
    try:
        record = json.loads(Path(job.path).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return record if record.get("settings") == job.settings() else None


def saved(jobs: list[Job]) -> tuple[Records, list[Job]]:
    """The saved records of ``jobs`` by (ratio, method), and the jobs that have none."""
    records: Records = {}
    todo = []
    for job in jobs:
        record = load_record(job)
        if record is None:
            todo.append(job)
        else:
            records.setdefault((job.ratio, job.method), []).append(record)
    return records, todo


def finished(records: Records, job: Job, record: dict[str, Any]) -> None:
    """Add the record of a run that has just finished to ``records`` and say so."""
    records.setdefault((job.ratio, job.method), []).append(record)
    print(
        f"done ratio {job.ratio:g} {job.method} seed {job.seed}: "
        f"AUC {record['test']['auc']}, F1 {record['test']['f1']}, "
        f"{record['seconds_per_iteration'] * 1e3:.2f} ms/iter",
        flush=True,
    )


def evaluate(u: Tensor, y: Tensor, threshold: float = 0.0) -> dict[str, float | None]:
    """ROC-AUC of ``u``; F1, accuracy and the share predicted positive of ``u > threshold``."""
    u, pos = u.detach().double(), y == 1
    if not torch.isfinite(u).all():
        return {"auc": None, "f1": None, "accuracy": None, "predicted_positive": None}
    decided = u > threshold
    return {
        "auc": R.roc_auc(u[pos], u[~pos]),
        "f1": Fn.fbeta_of_decisions(u[pos] - threshold, u[~pos] - threshold, 1.0),
        "accuracy": float((decided == pos).double().mean()),
        "predicted_positive": float(decided.double().mean()),
    }


def _train(job: Job, model: torch.nn.Module, method: Method, x: Tensor) -> dict[str, Any]:
    """``job.iterations`` steps on batches of epochs over a permutation (an epoch end after every
    full epoch), stopping at a non-finite loss: the timed steps, the loss curve, the counts and
    the warnings raised."""
    gen = torch.Generator().manual_seed(job.seed)
    seconds: list[float] = []
    curve: list[tuple[int, float]] = []
    every, done, epochs, nonfinite = max(1, job.iterations // 40), 0, 0, 0
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        while done < job.iterations and not nonfinite:
            batches = torch.randperm(len(x), generator=gen).split(BATCH)
            for i, idx in enumerate(batches):
                xb = x[idx]
                t0 = time.perf_counter()
                loss = method.loss(model(xb)[:, 0], idx)
                method.opt.zero_grad(set_to_none=True)
                loss.backward()
                method.opt.step()
                method.after_step()
                seconds.append(time.perf_counter() - t0)
                done += 1
                if not torch.isfinite(loss):
                    nonfinite += 1
                    break
                if done % every == 0 or done == 1:
                    curve.append((done, float(loss)))
                if done == job.iterations and i < len(batches) - 1:
                    break  # mid-epoch: no epoch end
            else:
                epochs += 1
                method.end_epoch(done, job.iterations)
    return {
        "seconds": seconds,
        "curve": curve,
        "done": done,
        "epochs": epochs,
        "nonfinite": nonfinite,
        "train_seconds": time.perf_counter() - start,
        "warnings": sorted({str(w.message)[:200] for w in caught}),
    }


def run_one(job: Job) -> dict[str, Any]:
    """Train one (ratio, method, seed), write its JSON record atomically and return it."""
    torch.set_num_threads(1)
    data = prepare(Path(job.mnist_dir), job.ratio, job.data_seed, job.quick)
    (x, y), (x_test, y_test) = data["train"], data["test"]
    model = mlp(job.seed)
    method = make_method(job.method, model, y)
    run = _train(job, model, method, x)
    with torch.no_grad():
        u_test = model(x_test)[:, 0]
    record: dict[str, Any] = {
        "settings": job.settings(),
        "n_train": len(y),
        "n_train_pos": int(y.sum()),
        "n_test": len(y_test),
        "n_test_pos": int(y_test.sum()),
        "epochs_completed": run["epochs"],
        "iterations_done": run["done"],
        "diverged": bool(run["nonfinite"]),
        "test": evaluate(u_test, y_test),
        "seconds_per_iteration": statistics.median(run["seconds"]),
        "train_seconds": run["train_seconds"],
        "loss_curve": run["curve"],
        "warnings": run["warnings"],
        "machine": machine_line(),
    }
    objective = method.objective
    if objective is not None and hasattr(objective, "decision_threshold"):
        t = float(objective.decision_threshold[0])
        record["threshold"] = t
        record["test_at_threshold"] = evaluate(u_test, y_test, t)
    if objective is not None:
        record["objective_stats"] = {
            k: v
            for k, v in objective.stats().items()
            if isinstance(v, int | float | bool) or v is None
        }
    write_text_atomic(json.dumps(record, indent=1) + "\n", job.path)
    return record
