"""What part 2 of the comparison compares: the imbalanced MNIST subsets at each positive ratio (the
data), the methods and how each one trains the MLP, the seeds and the budget."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from data_prep.smnist import find_mnist_files, load_mnist
from reparam import ROCAUC, DenseTau, FBetaRegularizer, Inline
from reparam.baselines import LPAUC, LPFBeta, PairwiseAUC, SoftFBeta, libauc_aucm_pesg

BATCH, LR, HIDDEN = 128, 1e-3, 256
RATIOS, SEEDS, ITERATIONS = (0.91, 0.83, 0.71, 0.5), (0, 1, 2), 2000
QUICK_ITERATIONS, QUICK_TRAIN, QUICK_TEST = 100, 3000, 1000  # --quick: the first samples only
PESG = {"lr": 0.1, "epoch_decay": 2e-3, "weight_decay": 1e-5}  # LibAUC's documented settings
PESG_DECAYS = (0.5, 0.75)  # fractions of the run after which update_regularizer(decay_factor=10)

# key -> (label in the tables, what it is trained for)
METHODS: dict[str, tuple[str, str]] = {
    "ce": ("cross-entropy", "AUC, F1"),
    "reparam_auc": ("reparam ROC-AUC (K=10, inline)", "AUC"),
    "lp_auc": ("LP layer, AUC LP", "AUC"),
    "pairwise_auc": ("pairwise squared hinge", "AUC"),
    "libauc_pesg": ("LibAUC AUC-margin + PESG", "AUC"),
    "reparam_fbeta": ("reparam F-beta (inline, 0.1/0.1, capped)", "F1"),
    "reparam_fbeta_fast": ("reparam F-beta (inline, 1.0/1.0, capped)", "F1"),
    "lp_fbeta": ("LP layer, F-score LP (M=100)", "F1"),
    "soft_f1": ("soft-F1 (T=1)", "F1"),
}
PAPER_SECONDS = {"CE": 0.018, "LP layer": 0.069, "PPD-SG": 0.122}  # Meng et al., GPU, per iteration
Records = dict[tuple[float, str], list[dict[str, Any]]]  # (ratio, method) -> records by seed


# --- data -------------------------------------------------------------------------------------------


def official_mnist(mnist_dir: Path) -> bool:
    """Whether the four files are the official MNIST ones (md5 of the ``.gz`` or raw file)."""
    try:
        find_mnist_files(mnist_dir)
    except (FileNotFoundError, ValueError):
        return False
    return True


def imbalanced_subset(digits: np.ndarray, ratio: float, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of the samples kept so that positives (digits 0-4) / all = ``ratio``.

    Negatives are dropped in the order of a permutation from ``rng``; when even all negatives are
    too few (a ratio at or below the natural one), positives are dropped instead, likewise.
    """
    if not 0 < ratio < 1:
        raise ValueError(f"a positive ratio must be in (0, 1), got {ratio}")
    pos, neg = np.flatnonzero(digits <= 4), np.flatnonzero(digits >= 5)
    pos, neg = rng.permutation(pos), rng.permutation(neg)
    n_neg = round(len(pos) * (1 - ratio) / ratio)
    n_pos = len(pos) if n_neg <= len(neg) else round(len(neg) * ratio / (1 - ratio))
    keep = np.concatenate([pos[:n_pos], neg[: min(n_neg, len(neg))]])
    if len(keep) == 0 or n_pos == 0 or n_pos == len(keep):
        raise ValueError(f"ratio {ratio}: the subset needs positives and negatives")
    return np.sort(keep)


_RAW: dict[tuple[str, bool], dict[str, tuple[np.ndarray, np.ndarray]]] = {}


def prepare(
    mnist_dir: Path, ratio: float, data_seed: int, quick: bool
) -> dict[str, tuple[Tensor, Tensor]]:
    """``{split: (x float32 (N, 784) in [0, 1], y int64 (N,) 1 = digits 0-4)}`` at ``ratio``.

    The same ``data_seed`` gives the same subsets for every method and seed; ``quick`` uses the
    first ``QUICK_TRAIN`` / ``QUICK_TEST`` samples of each split. Cached per process.
    """
    key = (str(mnist_dir), quick)
    if key not in _RAW:
        _RAW[key] = load_mnist(Path(mnist_dir), verify=False)[0]  # data_prep.smnist's reader
    out = {}
    for i, split in enumerate(("train", "test")):
        images, digits = _RAW[key][split]
        if quick:
            limit = QUICK_TRAIN if split == "train" else QUICK_TEST
            images, digits = images[:limit], digits[:limit]
        keep = imbalanced_subset(digits, ratio, np.random.default_rng([data_seed, i]))
        x = torch.from_numpy(images[keep].reshape(len(keep), -1).astype(np.float32) / 255.0)
        out[split] = (x, torch.from_numpy((digits[keep] <= 4).astype(np.int64)))
    return out


# --- methods ----------------------------------------------------------------------------------------


@dataclass
class Method:
    """One method's training step pieces: the loss of the batch's scores, the optimizer over the
    network and the method's own parameters, and the hooks after a step and at an epoch end
    (``end_epoch(iterations done, iterations in the run)``)."""

    loss: Callable[[Tensor, Tensor], Tensor]
    opt: torch.optim.Optimizer
    after_step: Callable[[], None]
    end_epoch: Callable[[int, int], None]
    objective: torch.nn.Module | None = None


def _cross_entropy(model: torch.nn.Module, labels: Tensor) -> Method:
    y = labels.float()
    return Method(
        lambda u, idx: torch.nn.functional.binary_cross_entropy_with_logits(u, y[idx]),
        torch.optim.Adam(model.parameters(), lr=LR),
        lambda: None,
        lambda done, total: None,
    )


def _libauc_pesg(model: torch.nn.Module, labels: Tensor) -> Method:
    y = labels.float()
    aucm, pesg = libauc_aucm_pesg(model.parameters(), **PESG, imratio=float(y.mean()), device="cpu")
    pesg.verbose = False  # update_regularizer would print
    pending = list(PESG_DECAYS)

    def end_epoch(done: int, total: int) -> None:
        # At most one call per epoch end: a second one with no step in between divides the
        # (reset) running average by T = 0 and makes the reference point NaN. Decay points
        # passed in the same epoch combine into one factor.
        passed = sum(1 for f in pending if done >= f * total)
        if passed:
            del pending[:passed]
            pesg.update_regularizer(decay_factor=10**passed)

    return Method(
        lambda u, idx: aucm(torch.sigmoid(u), y[idx], auto=False), pesg, lambda: None, end_epoch
    )


def _objective(make: Callable[[Tensor], torch.nn.Module]) -> Callable[..., Method]:
    """A method whose loss is an objective module of the training labels, stepped by Adam with
    the network and following the protocol (``after_step_``, ``end_epoch_``)."""

    def method(model: torch.nn.Module, labels: Tensor) -> Method:
        objective = make(labels)
        opt = torch.optim.Adam([*model.parameters(), *objective.parameters()], lr=LR)

        def end_epoch(done: int, total: int) -> None:
            objective.end_epoch_()

        return Method(objective, opt, objective.after_step_, end_epoch, objective)

    return method


def _fbeta(step: float) -> Callable[[Tensor], FBetaRegularizer]:
    return lambda labels: FBetaRegularizer(
        labels,
        schedule=Inline(),
        tau=DenseTau(),
        dual_lr_lambda=step,
        dual_lr_mu=step,
        cap_scores=True,
    )


BUILDERS: dict[str, Callable[[torch.nn.Module, Tensor], Method]] = {  # key of METHODS -> method
    "ce": _cross_entropy,
    "reparam_auc": _objective(lambda labels: ROCAUC(labels, grid=10, schedule=Inline())),
    "lp_auc": _objective(LPAUC),
    "pairwise_auc": _objective(PairwiseAUC),
    "libauc_pesg": _libauc_pesg,
    "reparam_fbeta": _objective(_fbeta(0.1)),
    "reparam_fbeta_fast": _objective(_fbeta(1.0)),
    "lp_fbeta": _objective(lambda labels: LPFBeta(labels, infeasibility_cost=100.0)),
    "soft_f1": _objective(lambda labels: SoftFBeta(labels, temperature=1.0)),
}


def make_method(key: str, model: torch.nn.Module, labels: Tensor) -> Method:
    """The method ``key`` of ``METHODS`` for ``model``'s score on a training set with ``labels``."""
    return BUILDERS[key](model, labels)


def mlp(seed: int) -> torch.nn.Module:
    """784 -> 256 -> ReLU -> 1, initialized from ``seed``."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(784, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1)
    )
