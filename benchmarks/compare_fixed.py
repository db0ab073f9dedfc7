"""Every F-beta and AUC method of the project on fixed features, against exact references
(docs/comparison.md, part 1).

    python -m benchmarks.compare fixed --jobs 2          # resumable (= python -m benchmarks.compare_fixed)
    python -m benchmarks.compare fixed --table-only      # the tables from finished runs

A linear head ``u = w.x + b`` on fixed Gaussian features is trained by each method alone (Adam lr
1e-2 on the head and the method's own parameters, batch 20, 200 epochs; 3 seeds = initialization
and batch order; the data of each problem are fixed). Every method gets the same tuning effort:
its main knob on a grid of three values (the dual step sizes, the temperature, the margin, the
infeasibility cost), and the tables show its default and its best grid value per problem (chosen on
the training metric, which is what is compared). References: the LP (3') optimum by HiGHS and its
head; the best linear head found (the best training F1 of any run's direction at its own
F1-optimal threshold, logistic regression's included). Measured per run: the training F1 of
``u > 0`` (and at the run's own F1-optimal threshold), the LP gap (the (3') objective at the best
feasible ``eps`` for the final scores, relative to the optimum), time per epoch, and the stability
over the last 20 epochs (sd of the training F1); for the AUC methods the exact training AUC.
Runs are JSON files under ``--runs`` (written atomically; finished ones are skipped).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from reparam import ROCAUC, FBetaRegularizer
from reparam.baselines import LPAUC, CooperFBeta, LibAUCMargin, LPFBeta, PairwiseAUC, SoftFBeta
from train.files import write_text_atomic

from .fbeta_lp import gaussian_toy
from .sweep import run_pool

EPOCHS, BATCH, LR, SEEDS = 200, 20, 1e-2, (0, 1, 2)

# name -> (positives, negatives, dimension, class mean, label noise)
PROBLEMS: dict[str, tuple[int, int, int, float, float]] = {
    "2-D, 40/60": (40, 60, 2, 1.0, 0.0),
    "20-D, 200/300": (200, 300, 20, 0.3, 0.0),
    "10-D, 50/950": (50, 950, 10, 0.5, 0.0),
    "50-D, 200/300": (200, 300, 50, 0.15, 0.0),
    "10-D, 20/980": (20, 980, 10, 0.5, 0.0),
    "20-D, 200/300, 10 % noise": (200, 300, 20, 0.3, 0.1),
}


def problem_data(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Positives ~ N(+mean, I), negatives ~ N(-mean, I) (data seed 0); with label noise, that
    fraction of the labels is flipped (the features stay): the training labels are the noisy ones."""
    n_pos, n_neg, dim, mean, noise = PROBLEMS[name]
    a, s = gaussian_toy(n_pos, n_neg, dim, seed=0, mean=mean)
    if noise:
        rng = np.random.default_rng(1)
        flip = rng.random(len(s)) < noise
        s = np.where(flip, 1 - s, s)
    return a, s


# --- the methods ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """A method and the grid of its main knob: ``make(labels, value)`` is its objective (a module,
    or a loss ``(u, idx) -> tensor``) at knob ``value`` (``None``: the family's only setting)."""

    knob: str
    grid: tuple[Any, ...]
    default: Any
    make: Callable[[Tensor, Any], Any]
    auc: bool = False  # an AUC method (else an F-beta one)


def _fbeta(projection: str, capped: bool = False) -> Callable[[Tensor, Any], FBetaRegularizer]:
    def make(labels: Tensor, step: float) -> FBetaRegularizer:
        return FBetaRegularizer(
            labels, projection=projection, dual_lr_lambda=step, dual_lr_mu=step, cap_scores=capped
        )

    return make


def _soft_f1(newton: str) -> Callable[[Tensor, Any], SoftFBeta]:
    def make(labels: Tensor, temperature: float) -> SoftFBeta:
        return SoftFBeta(labels, temperature=temperature, newton=newton, newton_tikhonov=1.0)

    return make


def _logistic(weighted: bool) -> Callable[[Tensor, Any], Callable[[Tensor, Tensor], Tensor]]:
    """Logistic regression as a loss; ``weighted``: positives weighted by negatives / positives."""

    def make(labels: Tensor, _: None) -> Callable[[Tensor, Tensor], Tensor]:
        y = labels.float()
        weight = (1 - y).sum() / y.sum() if weighted else torch.tensor(1.0)

        def logistic(u: Tensor, idx: Tensor) -> Tensor:
            return F.binary_cross_entropy_with_logits(u, y[idx], pos_weight=weight)

        return logistic

    return make


STEPS, TEMPERATURES = (0.01, 0.1, 1.0), (0.1, 0.3, 1.0)
FAMILIES: dict[str, Family] = {  # the tables' rows, in this order
    "reparam F-beta, inline": Family("dual step", STEPS, 0.1, _fbeta("inline")),
    "reparam F-beta, inline, capped": Family("dual step", STEPS, 0.1, _fbeta("inline", True)),
    "reparam F-beta, epoch": Family("dual step", STEPS, 0.1, _fbeta("epoch")),
    "reparam F-beta, paper preset": Family(
        "-", (None,), None, lambda labels, _: FBetaRegularizer(labels, preset="paper")
    ),
    "LP layer (F-score LP, elastic)": Family(
        "M", (10.0, 100.0, 1000.0), 100.0, lambda labels, m: LPFBeta(labels, infeasibility_cost=m)
    ),
    "soft-F1": Family("T", TEMPERATURES, 1.0, _soft_f1("none")),
    "soft-F1 + Newton (Hessian)": Family("T", TEMPERATURES, 1.0, _soft_f1("hessian")),
    "soft-F1 + Newton (Fisher)": Family("T", TEMPERATURES, 1.0, _soft_f1("fisher")),
    "Cooper, same LP (3')": Family(
        "dual lr", STEPS, 0.1, lambda labels, lr: CooperFBeta(labels, dual_lr=lr)
    ),
    "weighted logistic regression": Family("-", (None,), None, _logistic(weighted=True)),
    "reparam ROC-AUC, inline": Family(
        "nu step",
        (0.1, 1.0, 10.0),
        1.0,
        lambda labels, nu: ROCAUC(labels, grid=10, projection="inline", dual_lr_nu=nu),
        auc=True,
    ),
    "LP layer (AUC LP)": Family(
        "margin", STEPS, 0.01, lambda labels, m: LPAUC(labels, margin=m), auc=True
    ),
    "pairwise squared hinge": Family(
        "margin", (0.1, 0.5, 1.0), 1.0, lambda labels, m: PairwiseAUC(labels, margin=m), auc=True
    ),
    "LibAUC AUC-margin": Family(
        "alpha lr", STEPS, 0.1, lambda labels, lr: LibAUCMargin(labels, alpha_lr=lr), auc=True
    ),
    "logistic regression": Family("-", (None,), None, _logistic(weighted=False), auc=True),
}
# The ablation of F-beta's projection modes (benchmarks/projection_modes.py): the defaults with
# the projection elsewhere. Not rows of this script's tables.
MODE_FAMILIES: dict[str, Family] = {
    f"reparam F-beta, defaults but {label}": Family(
        "-", (None,), None, lambda labels, _, kw=kw: FBetaRegularizer(labels, **kw)
    )
    for label, kw in (
        ("projection step", {"projection": "step"}),
        ("projection epoch", {"projection": "epoch"}),
        ("projection none", {"projection": "none"}),
        ("projection clip", {"projection": "clip"}),
        (
            "projection clip, sparse tau",
            {"projection": "clip", "tau_update": "sparse_adam", "tau_lr": LR},
        ),
        (  # the sparse update at the S-MNIST network's step (1e-3), not the head's: what the
            # trainer gave it before issue 23 (optim.lr)
            "projection clip, sparse tau at tau_lr 1e-3",
            {"projection": "clip", "tau_update": "sparse_adam", "tau_lr": 1e-3},
        ),
        ("projection tracked", {"projection": "tracked"}),
        (
            "projection tracked, sparse tau",
            {"projection": "tracked", "tau_update": "sparse_adam", "tau_lr": LR},
        ),
        ("inline soft 0.05", {"inline_strength": 0.05}),
        ("inline soft 0.2", {"inline_strength": 0.2}),
    )
}
AUC_FAMILIES = tuple(f for f, family in FAMILIES.items() if family.auc)
FBETA_FAMILIES = tuple(f for f, family in FAMILIES.items() if not family.auc)
LEARNED_THRESHOLD = (  # the reparam F-beta heads: a learned decision_threshold
    "reparam F-beta, inline",
    "reparam F-beta, inline, capped",
    "reparam F-beta, epoch",
    "reparam F-beta, paper preset",
)
BATCH_STUDY = ("reparam F-beta, inline", "reparam F-beta, inline, capped", "soft-F1")
BATCH_STUDY_PROBLEM = "10-D, 50/950"  # the study of the "batch ~20 % of the data" advice
MU_FAMILIES = ("reparam F-beta, inline", "Cooper, same LP (3')")  # a multiplier mu in stats()


def make_objective(family: str, value: Any, labels: Tensor) -> Any:
    """The objective of ``family`` at knob ``value`` (``None``: the family's only setting); the
    two logistic regressions are returned as a loss ``(u, idx) -> tensor``."""
    return (FAMILIES | MODE_FAMILIES)[family].make(labels, value)


# --- the sweep --------------------------------------------------------------------------------------


def _key(problem: str, family: str, value: Any, seed: int, batch: int, epochs: int) -> str:
    safe = "".join(
        c if c.isalnum() else "_" for c in f"{problem}-{family}-{value}-b{batch}-e{epochs}"
    )
    return f"{safe}-s{seed}.json"


def jobs(
    problems: list[str], seeds: tuple[int, ...], batch_study: bool, epochs: int
) -> list[tuple]:
    """``(problem, family, value, seed, batch, epochs)`` of every run: each family at each value
    of its grid, and the batch-size study at the default settings."""
    out = [
        (p, f, v, seed, BATCH, epochs)
        for p in problems
        for f, family in FAMILIES.items()
        for v in family.grid
        for seed in seeds
    ]
    if batch_study and BATCH_STUDY_PROBLEM in problems:
        for batch in (100, 200):
            out += [
                (BATCH_STUDY_PROBLEM, f, FAMILIES[f].default, seed, batch, epochs)
                for seed in seeds
                for f in BATCH_STUDY
            ]
    return out


def _save(runs: Path, job: tuple, record: dict[str, Any]) -> None:
    write_text_atomic(json.dumps(record) + "\n", runs / _key(*job))
    print("done", _key(*job), f"F1 {record['f1']:.3f}", flush=True)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=Path, default=Path("runs/compare_fixed"))
    p.add_argument("--out", type=Path, default=Path("docs/figures"))
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=list(PROBLEMS))
    p.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    p.add_argument("--no-batch-study", action="store_true")
    p.add_argument("--epochs", type=int, default=EPOCHS)
    p.add_argument("--quick", action="store_true", help="the 2-D problem, seed 0, 5 epochs")
    p.add_argument("--table-only", action="store_true", help="no training: tabulate finished runs")
    a = p.parse_args(argv)
    if a.quick:
        a.problems, a.seeds, a.epochs, a.no_batch_study = ["2-D, 40/60"], [0], 5, True
    return a


def main(argv: list[str] | None = None) -> int:
    """Run the missing runs (unless ``--table-only``), then write the tables and the plot."""
    from .compare_fixed_run import run_one
    from .compare_fixed_tables import plot, references, tables

    a = _arguments(argv)
    a.runs.mkdir(parents=True, exist_ok=True)
    todo = [
        j
        for j in jobs(a.problems, tuple(a.seeds), not a.no_batch_study, a.epochs)
        if not (a.runs / _key(*j)).is_file()
    ]
    print(f"{len(todo)} runs to do", flush=True)
    if not a.table_only:
        run_pool(run_one, todo, a.jobs, partial(_save, a.runs))
    records = [json.loads(f.read_text()) for f in sorted(a.runs.glob("*.json"))]
    records = [r for r in records if r["problem"] in a.problems and r["epochs"] == a.epochs]
    refs = {pr: references(pr) for pr in a.problems}
    text = tables(records, refs, a.problems)
    a.out.mkdir(parents=True, exist_ok=True)
    cmd = "python -m benchmarks.compare fixed --jobs 2" + (" --quick" if a.quick else "")
    if not a.quick and a.problems != list(PROBLEMS):
        cmd += " --problems " + " ".join(f'"{p}"' for p in a.problems)
    write_text_atomic(f"<!-- {cmd} -->\n{text}", a.out / "compare_fixed.md")
    if records:
        plot(records, refs, a.problems, a.out / "compare_fixed.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
