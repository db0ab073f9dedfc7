"""What part 1 of the comparison compares: the problems (fixed Gaussian features, data seed 0), the
methods with the grid of their main knob, the seeds and the budget; ``jobs`` is the grid of runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from benchmarks.fbeta_lp import gaussian_toy
from reparam import ROCAUC, DenseTau, EpochEnd, FBetaRegularizer, Inline, SparseTau, Tracked
from reparam.baselines import LPAUC, CooperFBeta, LibAUCMargin, LPFBeta, PairwiseAUC, SoftFBeta

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


def _fbeta(
    schedule: Inline | EpochEnd, capped: bool = False
) -> Callable[[Tensor, Any], FBetaRegularizer]:
    def make(labels: Tensor, step: float) -> FBetaRegularizer:
        return FBetaRegularizer(
            labels,
            schedule=schedule,
            tau=DenseTau(),
            dual_lr_lambda=step,
            dual_lr_mu=step,
            cap_scores=capped,
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
    "reparam F-beta, inline": Family("dual step", STEPS, 0.1, _fbeta(Inline())),
    "reparam F-beta, inline, capped": Family("dual step", STEPS, 0.1, _fbeta(Inline(), True)),
    "reparam F-beta, epoch": Family("dual step", STEPS, 0.1, _fbeta(EpochEnd())),
    "reparam F-beta, paper preset": Family(
        "-", (None,), None, lambda labels, _: FBetaRegularizer.paper(labels)
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
        lambda labels, nu: ROCAUC(labels, grid=10, schedule=Inline(), dual_lr_nu=nu),
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
# The ablation of F-beta's projection modes (benchmarks/projection_modes.py): the defaults' dual
# steps with the projection elsewhere, a dense tau but in the sparse arm. Not rows of this part's
# tables.
MODE_FAMILIES: dict[str, Family] = {
    f"reparam F-beta, defaults but {label}": Family(
        "-", (None,), None, lambda labels, _, kw=kw: FBetaRegularizer(labels, **kw)
    )
    for label, kw in (
        ("projection epoch", {"schedule": EpochEnd(), "tau": DenseTau()}),
        ("projection tracked", {"schedule": Tracked(), "tau": DenseTau()}),
        ("projection tracked, sparse tau ahead", {"schedule": Tracked(), "tau": SparseTau(lr=LR)}),
        ("inline soft 0.05", {"schedule": Inline(strength=0.05), "tau": DenseTau()}),
        ("inline soft 0.2", {"schedule": Inline(strength=0.2), "tau": DenseTau()}),
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
