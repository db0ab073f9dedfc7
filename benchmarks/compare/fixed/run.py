"""One run of part 1 of the comparison: a linear head trained by one method on one problem, and the
record of it (training F1 and AUC per epoch, the LP gap, the thresholds, time per epoch), saved as a
JSON file named by ``record_name``."""

from __future__ import annotations

import json
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from reparam import functional as Fn
from reparam import rate_functional as R
from train.files import write_text_atomic

from .spec import LR, make_objective, problem_data


def _train(
    head: torch.nn.Linear,
    objective: Any,
    x: Tensor,
    labels: Tensor,
    seed: int,
    batch: int,
    epochs: int,
) -> dict[str, Any]:
    """Adam on the head and the objective's parameters; per epoch the training F1 of ``u > 0``,
    the AUC, the seconds and ``mu`` (if the objective has one), and the final scores ``u``."""
    params = [*head.parameters(), *getattr(objective, "parameters", lambda: [])()]
    opt = torch.optim.Adam(params, lr=LR)
    gen = torch.Generator().manual_seed(seed)
    protocol = hasattr(objective, "end_epoch_")
    pos = labels == 1
    out: dict[str, Any] = {"f1": [], "auc": [], "seconds": [], "mu": []}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # infeasibility notes etc.: in the record
        for _epoch in range(epochs):
            start = time.perf_counter()
            for idx in torch.randperm(len(x), generator=gen).split(batch):
                loss = objective(head(x[idx])[:, 0], idx)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if protocol:
                    objective.after_step_()
            if protocol:
                objective.end_epoch_()
            out["seconds"].append(time.perf_counter() - start)
            with torch.no_grad():
                u = head(x)[:, 0].double()
            out["f1"].append(Fn.fbeta_of_decisions(u[pos], u[~pos], 1.0))
            out["auc"].append(R.roc_auc(u[pos], u[~pos]))
            if protocol and "mu" in (st := objective.stats()):
                out["mu"].append(st["mu"])
    return out | {"u": u}


def run_one(args: tuple[str, str, Any, int, int, int]) -> dict[str, Any]:
    """Train one head; returns the record saved as JSON."""
    problem, family, value, seed, batch, epochs = args
    torch.set_num_threads(1)
    a, s = problem_data(problem)
    x, labels = torch.tensor(a, dtype=torch.float32), torch.as_tensor(s, dtype=torch.int64)
    torch.manual_seed(seed)
    head = torch.nn.Linear(x.shape[1], 1)
    objective = make_objective(family, value, labels)
    curves = _train(head, objective, x, labels, seed, batch, epochs)
    u, f1s, aucs, mus = curves["u"], curves["f1"], curves["auc"], curves["mu"]
    pos = labels == 1
    threshold, f1_tuned = Fn.best_fbeta_threshold(u[pos], u[~pos], 1.0)
    eps = Fn.best_feasible_eps(u[pos])
    lp_value = None if eps is None else float(Fn.lp_objective(eps, u[~pos], int(pos.sum()), 1.0))
    record = {
        "problem": problem,
        "family": family,
        "value": value,
        "seed": seed,
        "batch": batch,
        "f1": f1s[-1],
        "f1_tuned_threshold": f1_tuned,
        "threshold": threshold,
        "auc": aucs[-1],
        "f1_last20_sd": statistics.pstdev(f1s[-20:]),
        "auc_last20_sd": statistics.pstdev(aucs[-20:]),
        "lp_objective": lp_value,
        "seconds_per_epoch": statistics.median(curves["seconds"]),
        "mu_range": [min(mus), max(mus)] if mus else None,
        "f1_curve": f1s[:: max(1, epochs // 50)],
        "epochs": epochs,
        "head": [*head.weight.detach()[0].tolist(), float(head.bias.detach())],
    }
    if hasattr(objective, "decision_threshold"):
        t = float(objective.decision_threshold[0])
        record["f1_learned_threshold"] = Fn.fbeta_of_decisions(u[pos] - t, u[~pos] - t, 1.0)
    return record


def record_name(problem: str, family: str, value: Any, seed: int, batch: int, epochs: int) -> str:
    """The file name of a run's record under the runs folder."""
    safe = "".join(
        c if c.isalnum() else "_" for c in f"{problem}-{family}-{value}-b{batch}-e{epochs}"
    )
    return f"{safe}-s{seed}.json"


def save_record(runs: Path, job: tuple, record: dict[str, Any]) -> None:
    """Write the record of a finished run (atomically) and say so."""
    write_text_atomic(json.dumps(record) + "\n", runs / record_name(*job))
    print("done", record_name(*job), f"F1 {record['f1']:.3f}", flush=True)
