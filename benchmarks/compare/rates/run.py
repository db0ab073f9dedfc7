"""One run of part 4: a model trained by one arm at one target and seed; its record (the test
recall and precision at each decision, the objective's figures, the seconds per epoch)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import torch
from torch import Tensor

from benchmarks._timing import machine_line
from reparam import PrecisionAtRecall, RecallAtPrecision
from reparam import rate_functional as R

from .spec import (
    ALONE,
    BATCH,
    COOPERS,
    HIDDEN,
    NORMALIZED,
    SCHEDULES,
    STEPS,
    TARGETS,
    Job,
    Split,
    budget,
    load,
)


def objective(
    target: str, labels: Tensor, **options: float
) -> PrecisionAtRecall | RecallAtPrecision:
    """The library's objective for ``target`` (``par0.95``: P@R r = 0.95), its defaults."""
    value = float(target[3:])
    if target.startswith("par"):
        return PrecisionAtRecall(labels, recall=value, **options)
    return RecallAtPrecision(labels, precision=value, **options)


def val_violation(target: str, u: Tensor, positive: Tensor) -> Tensor:
    """The rate constraint's violation on a val batch (hinge bounds, normalized by its positives):
    P@R ``r - mean_+ min(u, 1)``; R@P ``(a fp+ - (1 - a) tp-) / n+``."""
    value, n_pos = float(target[3:]), positive.sum().clamp_min(1)
    tp = torch.where(positive, R.capped(u), 0).sum()
    if target.startswith("par"):
        return value - tp / n_pos
    fp = torch.where(positive, 0, R.hinge_fp(u)).sum()
    return (value * fp - (1 - value) * tp) / n_pos


def at_target(target: str, val: Split, test: Split, u_val: Tensor, u_test: Tensor) -> dict:
    """Test recall / precision at the threshold that meets ``target`` on val with the best other
    rate, and whether the target holds on test there."""
    pos = val[1] == 1
    chooser = R.threshold_at_recall if target.startswith("par") else R.threshold_at_precision
    t = chooser(u_val[pos], u_val[~pos], float(target[3:])).threshold
    return decision(target, test, u_test, t)


def decision(target: str, test: Split, u_test: Tensor, t: float) -> dict:
    pos = test[1] == 1
    recall, precision = R.recall_precision(u_test[pos] - t, u_test[~pos] - t)
    recall, precision = recall or 0.0, precision or 0.0
    held = (
        recall >= float(target[3:]) if target.startswith("par") else precision >= float(target[3:])
    )
    return {"threshold": t, "recall": recall, "precision": precision, "held": held}


def run(job: Job) -> dict[str, Any]:
    """Train ``job``'s model with its arm and return its record."""
    torch.set_num_threads(1)
    data = load(job.dataset, job.mnist_dir)
    y = data["train"][1]
    torch.manual_seed(job.seed)
    dim = data["train"][0].shape[1]
    model = (
        torch.nn.Linear(dim, 1)
        if job.model == "linear"
        else torch.nn.Sequential(
            torch.nn.Linear(dim, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1)
        )
    )
    if job.arm == "logistic":
        return logistic_record(job, data)
    if job.arm in COOPERS:
        seconds = train_cooper(job, data, model, COOPERS[job.arm])
        return record_of(job, data, model, None, seconds)
    options = (SCHEDULES | STEPS | NORMALIZED).get(job.arm, {})
    reg = None if job.arm == "ce" else objective(job.target, y, **options)
    val_step = 0.0
    if job.arm == "rate, nu on val":  # the training batches step no nu (per step nor per epoch)
        val_step, reg.dual_lr_nu_step, reg.dual_lr_nu = reg.dual_lr_nu_step, 0.0, 0.0
    try:
        seconds = train(job, data, model, reg, val_step)
    except ValueError as e:  # (the head's scores went non-finite: a diverged run counts 0)
        if "must be finite" not in str(e):
            raise
        return diverged(job, str(e))
    return record_of(job, data, model, reg, seconds)


def diverged(job: Job, reason: str) -> dict[str, Any]:
    """The record of a run whose head diverged: every decision recall 0, precision 0, unmet."""
    none = {"threshold": None, "recall": 0.0, "precision": 0.0, "held": False}
    points = {p: {job.target: none} for p in ("at_zero", "at_val", "at_test", "at_own")}
    return (
        {"job": asdict(job) | {"mnist_dir": None}, "seconds_per_epoch": None}
        | points
        | {"diverged": reason}
    )


LOGISTIC_C = (0.01, 0.1, 1.0, 10.0, 100.0)


def logistic_record(job: Job, data: dict[str, Split]) -> dict[str, Any]:
    """scikit-learn's ``LogisticRegression`` tuned over ``C`` and the class weights (none,
    balanced) on the val split (the test precision or recall at the val threshold of the target
    is the criterion), then read at its val threshold as every arm is."""
    from sklearn.linear_model import LogisticRegression

    (x, y), x_val = data["train"], data["val"][0]
    best = None
    start = time.perf_counter()
    for c in LOGISTIC_C:
        for weight in (None, "balanced"):
            fit = LogisticRegression(C=c, class_weight=weight, max_iter=2000).fit(x, y)
            u_val = torch.from_numpy(fit.decision_function(x_val)).float()
            d = at_target(job.target, data["val"], data["val"], u_val, u_val)
            score = d["precision"] if job.target.startswith("par") else d["recall"]
            if best is None or score > best[0]:
                best = (score, fit, {"C": c, "class_weight": weight})
    seconds = time.perf_counter() - start
    _, fit, chosen = best
    scores = {s: torch.from_numpy(fit.decision_function(data[s][0])).float() for s in data}
    record = record_of(job, data, None, None, seconds, scores=scores)
    return record | {"chosen": chosen}


def epochs_of_batches(n: int, epochs: int, g: torch.Generator) -> Iterator[tuple[Tensor, ...]]:
    """Each epoch's batches of ``BATCH`` indices, a fresh permutation of ``n`` from ``g`` drawn
    when the epoch starts (the order every arm trains in)."""
    for _ in range(epochs):
        yield torch.randperm(n, generator=g).split(BATCH)


def train_cooper(job: Job, data: dict[str, Split], model: torch.nn.Module, dual_lr: float) -> float:
    """Cooper's hinge Lagrangian of the target (``reparam.baselines.cooper_rate_problem``), its
    one multiplier stepped first at every batch by SGD at ``dual_lr``, then Adam on the model at
    the same learning rate and batches as every arm; the seconds per epoch."""
    from reparam.baselines import cooper_optimizer, cooper_rate_problem

    x, y = data["train"]
    value = float(job.target[3:])
    kind = {"recall": value} if job.target.startswith("par") else {"precision": value}
    cmp = cooper_rate_problem(y, **kind)
    opt = cooper_optimizer(
        cmp,
        model.parameters(),
        primal_lr=budget(job.dataset)[1],
        dual_lr=dual_lr,
        alternation="dual_primal",
    )
    g = torch.Generator().manual_seed(job.seed)
    start = time.perf_counter()
    for batches in epochs_of_batches(len(y), job.epochs, g):
        for idx in batches:
            opt.roll(compute_cmp_state_kwargs={"scores": model(x[idx]).squeeze(1), "idx": idx})
    return (time.perf_counter() - start) / job.epochs


def train(
    job: Job, data: dict[str, Split], model: torch.nn.Module, reg: Any, val_step: float = 0.0
) -> float:
    """Adam on the model (and the objective's parameters), ``job.epochs`` epochs of shuffled
    batches; the seconds per epoch. ``val_step``: the arm ``nu`` on val steps ``nu`` by it on the
    violation of a val batch after every step (the objective's own default step)."""
    (x, y), (x_val, y_val) = data["train"], data["val"]
    alone = job.arm in ALONE
    ce_weight, alpha = (0.0, 1.0) if alone else (1.0, float(job.arm.partition("@")[2] or 0))
    params = [*model.parameters(), *(reg.parameters() if reg is not None else [])]
    opt = torch.optim.Adam(params, lr=budget(job.dataset)[1])
    if reg is not None:
        reg.attach(opt)
    g = torch.Generator().manual_seed(job.seed)
    start = time.perf_counter()
    for batches in epochs_of_batches(len(y), job.epochs, g):
        for idx in batches:
            u = model(x[idx]).squeeze(1)
            loss = ce_weight * torch.nn.functional.binary_cross_entropy_with_logits(
                u, y[idx].float()
            )
            if reg is not None:
                loss = loss + alpha * reg(u, idx)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if job.arm == "rate, nu on val":  # Cotter et al.: nu sees the second data set
                pick = torch.randint(len(y_val), (BATCH,), generator=g)
                with torch.no_grad():
                    u_val = model(x_val[pick]).squeeze(1)
                    violation = val_violation(job.target, u_val, y_val[pick] == 1)
                    reg.nu.copy_((reg.nu + val_step * violation).clamp_min(0))
        if reg is not None:
            reg.end_epoch_()
    return (time.perf_counter() - start) / job.epochs


STATS = (
    "certified_recall",
    "certified_precision",
    "train_recall",
    "train_precision",
    "train_recall_at_threshold",
    "train_precision_at_threshold",
    "nu",
)


def record_of(
    job: Job,
    data: dict[str, Split],
    model: torch.nn.Module | None,
    reg: Any,
    seconds: float,
    scores: dict[str, Tensor] | None = None,
) -> dict[str, Any]:
    """The test recall / precision at each decision, the objective's figures (the data folder
    is not recorded: it is the user's); ``scores``: the splits' scores of a model that is not
    a torch module."""
    if scores is not None:
        u_val, u_test = scores["val"], scores["test"]
    else:
        with torch.no_grad():
            u_val, u_test = (model(data[s][0]).squeeze(1) for s in ("val", "test"))
    record: dict[str, Any] = {
        "job": asdict(job) | {"mnist_dir": None},
        "seconds_per_epoch": seconds,
    }
    record["machine"] = machine_line()
    targets = TARGETS if job.target is None else (job.target,)
    record["at_zero"] = {t: decision(t, data["test"], u_test, 0.0) for t in targets}
    record["at_val"] = {t: at_target(t, data["val"], data["test"], u_val, u_test) for t in targets}
    # the diagnostic: the cut chosen on test itself (the precision at the matched test recall)
    record["at_test"] = {
        t: at_target(t, data["test"], data["test"], u_test, u_test) for t in targets
    }
    if reg is not None:
        s = reg.stats()
        own = float(reg.decision_threshold[0])
        record["at_own"] = {job.target: decision(job.target, data["test"], u_test, own)}
        record["stats"] = {k: s[k] for k in STATS}
        record["nu_step"] = reg.dual_lr_nu_step
        record["nu_rule"] = reg.nu_rule
    return record
