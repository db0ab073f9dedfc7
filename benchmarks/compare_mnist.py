"""The LP-layer paper's imbalanced binary MNIST protocol (Meng et al., NeurIPS 2021, Table 1) with
every AUC and F1 method of the project, each trained alone as the loss of one MLP's score.

    python -m benchmarks.compare mnist --mnist-dir data/mnist --jobs 2              # the full sweep
    python -m benchmarks.compare mnist --mnist-dir data/mnist --table-only          # tables only
    python -m benchmarks.compare mnist --mnist-dir data/mnist --quick --out /tmp/c  # smoke test

Data: the four official MNIST files (idx, ``.gz`` or raw) in ``--mnist-dir``, read by
``data_prep.smnist.load_mnist`` (md5 not required: a test passes a stand-in).
Digits 0-4 are the positive class (label 1), 5-9 the negative one. As in the paper, samples are
dropped so that the positive ratio (positives / all) is 91 %, 83 %, 71 % or 50 %: negatives, in the
order of a fixed permutation drawn from ``--data-seed`` (at 50 % MNIST has fewer negatives than
positives, so there positives are dropped instead, likewise). The TEST split is imbalanced the same
way as the training split: ROC-AUC does not depend on the class prior, F1 and accuracy do, so they
are measured at the prior the model was trained at.

Protocol (the same for every method): an MLP 784 -> 256 -> ReLU -> 1 (the score ``u``) on inputs
scaled to [0, 1]; seeds 0, 1, 2 (a seed fixes the initialization and the batch order); Adam, lr
1e-3, on the network and the method's own parameters; batch 128 drawn uniformly (epochs over a
permutation from a ``torch.Generator``; ``end_epoch_()`` at every epoch end; the dataset indices are
positions in the imbalanced training set); 2000 iterations. The one exception is LibAUC's AUC-margin
loss, trained with its own optimizer PESG at LibAUC's documented settings (lr 0.1, epoch_decay 2e-3,
weight_decay 1e-5, momentum 0.9) and, as LibAUC's examples do (epochs 50 and 75 of 100),
``update_regularizer(decay_factor=10)`` at the first epoch ends past 50 % and 75 % of the run (one
call with factor 100 if both fall into one epoch: two calls in a row would divide by zero); its
loss sees ``sigmoid(u)`` and the training set's positive ratio as ``p``.

Measured on the test split: ROC-AUC of ``u`` (exact, Mann-Whitney), F1 and accuracy of ``u > 0``
(for the F-beta regularizer also of ``u > reg.decision_threshold``, its learned F1-optimal
threshold), the share predicted positive, and the seconds per iteration: the median over the run of
the wall time of forward + loss + backward + optimizer step (+ ``after_step_()``), the batch gather
and the epoch ends not included. Each run is its own process with ``torch.set_num_threads(1)``, so
``--jobs 2`` runs two at a time on two cores without them competing for threads; ratios to
cross-entropy are per (ratio, seed) within the same sweep. Every run is a JSON file under ``--runs``
(written atomically; a finished run with the same settings is skipped, so an interrupted sweep
resumes). Writes ``compare_mnist.md`` and ``compare_mnist.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from data_prep.smnist import find_mnist_files, load_mnist
from reparam import ROCAUC, FBetaRegularizer
from reparam.baselines import LPAUC, LPFBeta, PairwiseAUC, SoftFBeta, libauc_aucm_pesg

from .sweep import run_pool

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
        labels, projection="inline", dual_lr_lambda=step, dual_lr_mu=step, cap_scores=True
    )


BUILDERS: dict[str, Callable[[torch.nn.Module, Tensor], Method]] = {  # key of METHODS -> method
    "ce": _cross_entropy,
    "reparam_auc": _objective(lambda labels: ROCAUC(labels, grid=10, projection="inline")),
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


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mnist-dir", type=Path, default=Path("data/mnist"))
    p.add_argument("--ratios", type=float, nargs="+", default=list(RATIOS))
    p.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    p.add_argument("--iterations", type=int, default=ITERATIONS)
    p.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    p.add_argument("--data-seed", type=int, default=0, help="the permutation of dropped samples")
    p.add_argument("--runs", type=Path, default=Path("runs/compare_mnist"))
    p.add_argument("--out", type=Path, default=Path("docs/figures"))
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"1 ratio, 1 seed, {QUICK_ITERATIONS} iterations, the first "
        f"{QUICK_TRAIN}/{QUICK_TEST} samples (a smoke test)",
    )
    p.add_argument("--table-only", action="store_true", help="no training: tabulate finished runs")
    a = p.parse_args(argv)
    if a.quick:
        a.ratios, a.seeds, a.iterations = a.ratios[:1], a.seeds[:1], QUICK_ITERATIONS
    return a


def main(argv: list[str] | None = None) -> int:
    """Run the missing runs of the grid (unless ``--table-only``) and write the tables and plot."""
    from .compare_mnist_run import Job, finished, run_one, run_path, saved
    from .compare_mnist_tables import plot, report

    a = _arguments(argv)
    settings = (a.iterations, a.quick, a.data_seed)
    jobs = [
        Job(str(a.mnist_dir), r, m, s, *settings, str(run_path(a.runs, r, m, s)))
        for r in a.ratios
        for m in a.methods
        for s in a.seeds
    ]
    records, todo = saved(jobs)
    todo = [] if a.table_only else todo
    print(f"{len(todo)} runs to do ({len(jobs)} in the grid)", flush=True)
    if todo:
        a.runs.mkdir(parents=True, exist_ok=True)
    run_pool(run_one, todo, a.jobs, partial(finished, records))
    for recs in records.values():
        recs.sort(key=lambda r: r["settings"]["seed"])
    official = official_mnist(a.mnist_dir)
    command = (
        f"python -m benchmarks.compare mnist --mnist-dir "
        f"{'data/mnist' if official else a.mnist_dir} --jobs {a.jobs} --ratios "
        f"{' '.join(f'{r:g}' for r in a.ratios)} --seeds {' '.join(map(str, a.seeds))} "
        f"--iterations {a.iterations} --data-seed {a.data_seed}" + (" --quick" if a.quick else "")
    )
    text = report(records, a.ratios, a.seeds, command, official)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "compare_mnist.md").write_text(text)
    plot(records, a.ratios, a.out / "compare_mnist.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
