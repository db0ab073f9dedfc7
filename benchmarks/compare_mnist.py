"""The LP-layer paper's imbalanced binary MNIST protocol (Meng et al., NeurIPS 2021, Table 1) with
every AUC and F1 method of the project, each trained alone as the loss of one MLP's score.

    python -m benchmarks.compare mnist --mnist-dir data/mnist --jobs 2              # the full sweep
    python -m benchmarks.compare mnist --mnist-dir data/mnist --table-only          # tables only
    python -m benchmarks.compare mnist --mnist-dir data/mnist --quick --out /tmp/c  # smoke test

Data: the four official MNIST files (idx, ``.gz`` or raw) in ``--mnist-dir``, read with numpy.
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
import gzip
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ._timing import machine_line, markdown_table

BATCH, LR, HIDDEN = 128, 1e-3, 256
RATIOS, SEEDS, ITERATIONS = (0.91, 0.83, 0.71, 0.5), (0, 1, 2), 2000
QUICK_ITERATIONS, QUICK_TRAIN, QUICK_TEST = 100, 3000, 1000  # --quick: the first samples only
PESG = {"lr": 0.1, "epoch_decay": 2e-3, "weight_decay": 1e-5}  # LibAUC's documented settings
PESG_DECAYS = (0.5, 0.75)  # fractions of the run after which update_regularizer(decay_factor=10)
IDX_FILES = {
    ("train", "images"): "train-images-idx3-ubyte",
    ("train", "labels"): "train-labels-idx1-ubyte",
    ("test", "images"): "t10k-images-idx3-ubyte",
    ("test", "labels"): "t10k-labels-idx1-ubyte",
}

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


# --- data -------------------------------------------------------------------------------------------


def read_idx(path: Path) -> np.ndarray:
    """An idx file (``.gz`` or raw) as a uint8 array of the shape its header gives.

    The header: two zero bytes, the type code 0x08 (unsigned byte), the number of dimensions, then
    each dimension as a big-endian uint32. Raises ``ValueError`` on anything else.
    """
    with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte idx file (header {data[:4]!r})")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(shape)):
        raise ValueError(f"{path}: header says {shape}, found {body.size} values")
    return body.reshape(shape)


def load_mnist_idx(mnist_dir: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{split: (images uint8 (N, 28, 28), digit labels int64 (N,))}`` from the four files."""
    found: dict[tuple[str, str], np.ndarray] = {}
    for key, name in IDX_FILES.items():
        path = next((p for p in (mnist_dir / f"{name}.gz", mnist_dir / name) if p.is_file()), None)
        if path is None:
            raise FileNotFoundError(
                f"--mnist-dir {mnist_dir}: {name}[.gz] not found "
                f"(expected the four official MNIST files)"
            )
        found[key] = read_idx(path)
    out = {}
    for split in ("train", "test"):
        images, labels = found[(split, "images")], found[(split, "labels")].astype(np.int64)
        if images.ndim != 3 or len(images) != len(labels):
            raise ValueError(f"{split}: {images.shape} images for {labels.shape} labels")
        out[split] = (images, labels)
    return out


def official_mnist(mnist_dir: Path) -> bool:
    """Whether the four files are the official MNIST ones (md5 of the ``.gz`` or raw file)."""
    from data_prep.smnist import find_mnist_files

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
        _RAW[key] = load_mnist_idx(Path(mnist_dir))
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


def make_method(key: str, model: torch.nn.Module, labels: Tensor) -> Method:
    """The method ``key`` of ``METHODS`` for ``model``'s score on a training set with ``labels``."""
    from reparam import ROCAUC, FBetaRegularizer
    from reparam.baselines import LPAUC, LPFBeta, PairwiseAUC, SoftFBeta, libauc_aucm_pesg

    y = labels.float()
    if key == "ce":
        return Method(
            lambda u, idx: torch.nn.functional.binary_cross_entropy_with_logits(u, y[idx]),
            torch.optim.Adam(model.parameters(), lr=LR),
            lambda: None,
            lambda done, total: None,
        )
    if key == "libauc_pesg":
        aucm, pesg = libauc_aucm_pesg(
            model.parameters(), **PESG, imratio=float(y.mean()), device="cpu"
        )
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
    objective = {
        "reparam_auc": lambda: ROCAUC(labels, grid=10, projection="inline"),
        "lp_auc": lambda: LPAUC(labels),
        "pairwise_auc": lambda: PairwiseAUC(labels),
        "reparam_fbeta": lambda: FBetaRegularizer(
            labels, projection="inline", dual_lr_lambda=0.1, dual_lr_mu=0.1, cap_scores=True
        ),
        "reparam_fbeta_fast": lambda: FBetaRegularizer(
            labels, projection="inline", dual_lr_lambda=1.0, dual_lr_mu=1.0, cap_scores=True
        ),
        "lp_fbeta": lambda: LPFBeta(labels, infeasibility_cost=100.0),
        "soft_f1": lambda: SoftFBeta(labels, temperature=1.0),
    }[key]()
    opt = torch.optim.Adam([*model.parameters(), *objective.parameters()], lr=LR)
    return Method(
        objective, opt, objective.after_step_, lambda done, total: objective.end_epoch_(), objective
    )


def mlp(seed: int) -> torch.nn.Module:
    """784 -> 256 -> ReLU -> 1, initialized from ``seed``."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(784, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1)
    )


# --- one run ----------------------------------------------------------------------------------------


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


def evaluate(u: Tensor, y: Tensor, threshold: float = 0.0) -> dict[str, float | None]:
    """ROC-AUC of ``u``; F1, accuracy and the share predicted positive of ``u > threshold``."""
    from reparam import functional as Fn
    from reparam import rate_functional as R

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


def run_one(job: Job) -> dict[str, Any]:
    """Train one (ratio, method, seed), write its JSON record atomically and return it."""
    from train.files import write_text_atomic

    torch.set_num_threads(1)
    data = prepare(Path(job.mnist_dir), job.ratio, job.data_seed, job.quick)
    (x, y), (x_test, y_test) = data["train"], data["test"]
    model = mlp(job.seed)
    method = make_method(job.method, model, y)
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
    train_seconds = time.perf_counter() - start
    with torch.no_grad():
        u_test = model(x_test)[:, 0]
    record: dict[str, Any] = {
        "settings": job.settings(),
        "n_train": len(y),
        "n_train_pos": int(y.sum()),
        "n_test": len(y_test),
        "n_test_pos": int(y_test.sum()),
        "epochs_completed": epochs,
        "iterations_done": done,
        "diverged": bool(nonfinite),
        "test": evaluate(u_test, y_test),
        "seconds_per_iteration": statistics.median(seconds),
        "train_seconds": train_seconds,
        "loss_curve": curve,
        "warnings": sorted({str(w.message)[:200] for w in caught}),
        "machine": machine_line(),
    }
    if method.objective is not None and hasattr(method.objective, "decision_threshold"):
        t = float(method.objective.decision_threshold[0])
        record["threshold"] = t
        record["test_at_threshold"] = evaluate(u_test, y_test, t)
    if method.objective is not None:
        record["objective_stats"] = {
            k: v
            for k, v in method.objective.stats().items()
            if isinstance(v, int | float | bool) or v is None
        }
    write_text_atomic(json.dumps(record, indent=1) + "\n", job.path)
    return record


# --- the sweep and its tables -------------------------------------------------------------------------


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


def _cell(xs: list[float | None], n_seeds: int, scale: float = 100.0, fmt: str = ".2f") -> str:
    """``mean ± sd`` of the finite values (``n/a`` without any); ``(k/n)`` when seeds are missing."""
    vals = [x * scale for x in xs if x is not None]
    if not vals:
        return "n/a"
    sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
    missing = f" ({len(vals)}/{n_seeds})" if len(vals) < n_seeds else ""
    return f"{statistics.mean(vals):{fmt}} ± {sd:{fmt}}{missing}"


Records = dict[tuple[float, str], list[dict[str, Any]]]


def metric_rows(
    records: Records, ratios: list[float], n_seeds: int, metrics: list[str]
) -> list[list[str]]:
    """One row per method (for the threshold-dependent metrics two for the F-beta regularizer:
    ``u > 0`` and its learned threshold), per ratio one cell per metric of ``metrics`` (keys of a
    record's ``test``)."""
    rows = []
    for key, (label, target) in METHODS.items():
        variants = [("test", label)]
        if key == "reparam_fbeta" and metrics != ["auc"]:  # AUC does not depend on a threshold
            variants = [("test", f"{label}, u > 0"), ("test_at_threshold", f"{label}, u > t")]
        for field, name in variants:
            row = [name, target]
            for ratio in ratios:
                recs = records.get((ratio, key), [])
                row += [_cell([r.get(field, {}).get(m) for r in recs], n_seeds) for m in metrics]
            rows.append(row)
    return rows


def timing_rows(records: Records, ratios: list[float], n_seeds: int) -> list[list[str]]:
    """Per method and ratio: median ms per iteration (mean ± sd over seeds) and the ratio to
    cross-entropy's of the same seed."""
    rows = []
    for key, (label, _) in METHODS.items():
        row = [label]
        for ratio in ratios:
            ce = {
                r["settings"]["seed"]: r["seconds_per_iteration"]
                for r in records.get((ratio, "ce"), [])
            }
            recs = records.get((ratio, key), [])
            rel = [
                r["seconds_per_iteration"] / ce[r["settings"]["seed"]]
                for r in recs
                if r["settings"]["seed"] in ce
            ]
            row.append(_cell([r["seconds_per_iteration"] for r in recs], n_seeds, 1e3, ".3g"))
            row.append(_cell(rel, n_seeds, 1.0, ".2f"))
        rows.append(row)
    return rows


def report(
    records: Records, ratios: list[float], seeds: list[int], command: str, official: bool
) -> str:
    """The markdown of ``compare_mnist.md``."""
    n = len(seeds)
    pct = [f"{r:.0%}" for r in ratios]
    auc = markdown_table(["method", "trained for", *pct], metric_rows(records, ratios, n, ["auc"]))
    f1 = markdown_table(
        ["method", "trained for", *[f"{p} {m}" for p in pct for m in ("F1", "acc")]],
        metric_rows(records, ratios, n, ["f1", "accuracy"]),
    )
    share = markdown_table(
        ["method", "trained for", *pct], metric_rows(records, ratios, n, ["predicted_positive"])
    )
    timing = markdown_table(
        ["method", *[f"{p} {m}" for p in pct for m in ("ms / iter", "x CE")]],
        timing_rows(records, ratios, n),
    )
    first = next((rs[0] for rs in records.values() if rs), None)
    sizes = []
    for r in ratios:
        rec = next((rs[0] for (rr, _), rs in records.items() if rr == r and rs), None)
        if rec is not None:
            sizes.append(
                f"{r:.0%}: {rec['n_train']} train ({rec['n_train_pos']} pos), "
                f"{rec['n_test']} test ({rec['n_test_pos']} pos), "
                f"{rec['epochs_completed']} full epochs"
            )
    paper = ", ".join(
        f"{k} {v} s ({v / PAPER_SECONDS['CE']:.1f}x)" for k, v in PAPER_SECONDS.items()
    )
    diverged = sorted(
        {
            f"{METHODS[k][0]} at {r:.0%}"
            for (r, k), rs in records.items()
            for x in rs
            if x["diverged"]
        }
    )
    return "\n".join(
        [
            f"<!-- {command} -->",
            "# Imbalanced binary MNIST (Meng et al., NeurIPS 2021, Table 1 protocol)",
            "",
            f"Digits 0-4 positive, 5-9 negative; samples dropped (a fixed permutation) so that positives "
            f"/ all is the column's ratio, in the training and the test split alike: ROC-AUC is "
            f"prior-free, F1 and accuracy are not, so they are measured at the training prior. "
            f"{'Official MNIST files (md5 checked).' if official else 'NOT the official MNIST files.'} "
            f"Sizes: {'; '.join(sizes) or 'n/a'}.",
            "",
            f"Every method alone trains an MLP 784-256-1 (its score `u`): Adam lr {LR:g}, batch {BATCH}, "
            f"{first['settings']['iterations'] if first else 'n/a'} iterations, seeds "
            f"{', '.join(map(str, seeds))} (initialization and batch order); mean ± sd over seeds. "
            f"Exception: LibAUC's AUC-margin loss with its own optimizer PESG (lr {PESG['lr']}, "
            f"epoch_decay {PESG['epoch_decay']:g}, weight_decay {PESG['weight_decay']:g}, "
            f"`update_regularizer(decay_factor=10)` at the first epoch ends past 50 % and 75 % of the "
            f"run, as LibAUC's examples do at epochs 50 and 75 of 100; its loss sees `sigmoid(u)`). "
            f"The per-sample multipliers of the reparameterized objectives take one dual step per "
            f"epoch (`end_epoch_()`), so the number of full epochs matters.",
            "",
            "## Test ROC-AUC (%) of `u`",
            "",
            auc,
            "",
            "## Test F1 (%) and accuracy (%) of `u > 0`",
            "",
            "`u > t`: the F-beta regularizer's learned F1-optimal threshold `reg.decision_threshold`.",
            "",
            f1,
            "",
            "## Share of the test set predicted positive (%); the true share is the column's ratio",
            "",
            share,
            "",
            "## Seconds per iteration",
            "",
            "Median over each run of forward + loss + backward + step (+ `after_step_()`), one thread "
            "per run, two runs at a time (`--jobs 2`); `x CE`: per seed, relative to cross-entropy's "
            f"run in the same sweep. Meng et al. (GPU): {paper}. "
            f"Machine: {first['machine'] if first else 'n/a'}.",
            "",
            timing,
            "",
            f"Diverged (non-finite loss): {', '.join(diverged) if diverged else 'none'}.",
            "",
        ]
    )


def plot(records: Records, ratios: list[float], path: Path) -> None:
    """Test AUC and F1 (mean ± sd over seeds) against the positive ratio, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5.8))
    xs = sorted(ratios)
    for ax, metric, title in ((axes[0], "auc", "test ROC-AUC (%)"), (axes[1], "f1", "test F1 (%)")):
        for i, (key, (label, _)) in enumerate(METHODS.items()):
            fields = [("test", label)]
            if key == "reparam_fbeta" and metric == "f1":
                fields.append(("test_at_threshold", f"{label}, u > t"))
            for field, name in fields:
                pts = []
                for r in xs:
                    vals = [
                        v * 100
                        for rec in records.get((r, key), [])
                        if (v := rec.get(field, {}).get(metric)) is not None
                    ]
                    if vals:
                        sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
                        pts.append((r * 100, statistics.mean(vals), sd))
                if pts:
                    px, py, pe = zip(*pts, strict=True)
                    ax.errorbar(
                        px,
                        py,
                        yerr=pe,
                        marker="o",
                        capsize=3,
                        label=name,
                        color=f"C{i}",
                        linestyle="--" if field == "test_at_threshold" else "-",
                    )
        ax.set(title=title, xlabel="positive ratio (%)", ylabel="%")
        ax.grid(alpha=0.3)
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Run the missing runs of the grid (unless ``--table-only``) and write the tables and plot."""
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
    jobs = [
        Job(
            str(a.mnist_dir),
            r,
            m,
            s,
            a.iterations,
            a.quick,
            a.data_seed,
            str(run_path(a.runs, r, m, s)),
        )
        for r in a.ratios
        for m in a.methods
        for s in a.seeds
    ]
    records: Records = {}
    todo = []
    for job in jobs:
        rec = load_record(job)
        if rec is not None:
            records.setdefault((job.ratio, job.method), []).append(rec)
        elif not a.table_only:
            todo.append(job)
    print(f"{len(todo)} runs to do ({len(jobs)} in the grid)", flush=True)
    if todo:
        a.runs.mkdir(parents=True, exist_ok=True)
        with ProcessPoolExecutor(max_workers=a.jobs) as pool:
            futures = {pool.submit(run_one, job): job for job in todo}
            for fut in as_completed(futures):
                job, rec = futures[fut], fut.result()
                records.setdefault((job.ratio, job.method), []).append(rec)
                print(
                    f"done ratio {job.ratio:g} {job.method} seed {job.seed}: "
                    f"AUC {rec['test']['auc']}, F1 {rec['test']['f1']}, "
                    f"{rec['seconds_per_iteration'] * 1e3:.2f} ms/iter",
                    flush=True,
                )
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
