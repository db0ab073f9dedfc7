"""Processes of tests/reparam/test_differential.py: random examples, each run on ``K`` gloo
processes and, in rank 0, by one eager process fed the same batches; rank 0 writes the
differences.

One group of ``WORLD`` processes serves every example: the sub-groups of the first ``K`` ranks
(``K = 1 .. WORLD``) are made once, and an example on ``K`` processes runs on the first ``K`` ranks
while the others go on to the next one. Every rank draws every example from its seed (``draw``),
so the ranks agree on what runs where with no message.

Two kinds of example:

* ``"stats"``: the epoch end's figures (thresholds, certificates, the AUC, the rate cuts, the
  projection's root) on scores spread unevenly over ``K`` processes against one process on all of
  them: ties, ``+-inf``, constant scores, empty classes;
* ``"train"``: a cell of ``tests/matrix.py`` trains a linear head on ``K`` processes (a sharded
  state, ``owner`` or ``global`` sampling, or ``K`` replicas), in a drawn loop shape (summed
  calls, gradient accumulation, a step with no forward, a resume mid-epoch from the saved state,
  a reshard ``K -> K'`` between epochs); the trajectory (the loss of every step), the state, the
  head and ``stats()`` are compared with one eager process's (tolerance ``TOL``: the sums over
  processes add in another order).

Run: ``python _differential_worker.py MODE FIRST_SEED COUNT PORT OUT`` (``MODE`` stats, train or
both: the draws alternate; ``FIRST_SEED`` may be a comma-separated list of seeds instead, or of
``KIND:SEED``).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import faulthandler
import json
import math
import os
import random
import sys
import traceback
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from reparam import (
    ROCAUC,
    DenseTau,
    EpochEnd,
    FBetaRegularizer,
    Inline,
    PrecisionAtRecall,
    RecallAtPrecision,
    Shard,
    SparseTau,
)
from reparam.resharding import reshard_state

WORLD = 4
HANG_AFTER = 60  # seconds: an example still running is a hang
D = 3  # features
W = 0.5  # the regularizer's weight in the loss
TOL = {"atol": 1e-5, "rtol": 1e-5}  # the sums over processes add in another order
SHARDED = (
    "fbeta-tracked-sparse",
    "fbeta-epoch-sparse",
    "fbeta-classes",
    "fbeta-groups",
    "precision-at-recall-epoch",
    "recall-at-precision-epoch",
    "roc-auc-epoch",
)
CELLS = (
    *SHARDED,
    "fbeta-tracked-dense",
    "fbeta-epoch-dense",
    "fbeta-inline-exact",
    "fbeta-inline-soft",
    "precision-at-recall-inline",
    "recall-at-precision-inline",
    "roc-auc-inline",
)
# the objective's own counters: how often its forward ran (one process: every micro-batch)
NOT_COMPARED = {"batches", "shape_labels", "shard_layout"}
SPARSE_ROWS = ("fbeta-tracked-sparse", "fbeta-epoch-sparse", "fbeta-classes", "fbeta-groups")
PER_ROW = ("tau_param", "lam", "sparse_tau.moments", "sparse_tau.last", "schedule.tau_active")
PER_SAMPLE = ("scores", "score_epoch", "layout.sample_group")
PER_PROBLEM = ("schedule.active_sums",)


# --- the draws ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    seed: int
    kind: str  # "stats" or "train"
    k: int  # processes
    n: int = 0  # samples (train) or scores (stats)
    cell: str = ""
    layout: str = ""  # owner, global (sharded) or replicated
    labels: str = ""
    features: str = ""
    batch: int = 0  # per process
    loop: str = ""  # plain, summed, accumulate, noforward, resume, reshard, skipped, validation
    steps: int = 0
    epochs: int = 0
    k_after: int = 0  # reshard: the processes of the second epoch
    unit: int = 1
    at: int = 0  # the step of the loop's event (a step with no forward, a resume)
    pattern: str = ""  # stats: the scores
    optimizer: str = "adam"  # the optimizer's rule: adam, sgd, nesterov or adamw (_optimizer)
    nu_rule: str = "additive"  # P@R and R@P: their multiplier's rule


def _log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return int(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def draw(seed: int, kind: str) -> Example:
    """The example of ``seed`` (every rank draws the same one)."""
    rng = random.Random(seed)
    k = rng.randint(1, WORLD)
    if kind == "stats":
        return Example(
            seed,
            "stats",
            k,
            n=rng.choice([1, 2, 5, 40, 1000, _log_uniform(rng, 2, 100_000)]),
            pattern=rng.choice(["normal", "ties", "inf", "constant", "outliers", "few_pos"]),
        )
    layout = rng.choice(["owner", "global", "replicated"])
    cell = rng.choice(SHARDED if layout != "replicated" else CELLS)
    unit = rng.choice([2, 3, 5]) if cell == "fbeta-groups" else 1
    n = max(_log_uniform(rng, 8, 100_000), 2 * k * unit, 8)
    n -= n % unit
    loop = rng.choice(["plain", "summed", "accumulate", "noforward", "resume"])
    # (a reshard: the objectives whose per-row state is their own; an optimizer's state of a
    # per-row parameter, the rate objectives' tau with EpochEnd(), is not resharded)
    if layout != "replicated" and cell.startswith("fbeta") and rng.random() < 0.2:
        loop = "reshard"
    # a plain loop may get a step that is skipped after its backward (a NaN loss: the rows keep
    # nothing of it) or a validation forward (no_grad: no state moves), drawn apart so that the
    # other seeds keep their examples
    if loop == "plain" and (side := random.Random(f"side {seed}")).random() < 0.8:
        loop = side.choice(["skipped", "validation"])
    block = max(n // k, 1)
    batch = rng.choice([1, min(block, 1024), min(2 * block, 2048), rng.randint(2, 64)])
    if cell.startswith("fbeta-groups"):
        batch = max(unit, batch - batch % unit)  # whole groups are the rows of per-group batches
    labels = rng.choices(
        ["random", "ordered", "all", "one", "empty_class", "none"],
        weights=[45, 20, 10, 10, 10, 5],
    )[0]
    steps = rng.randint(2, 5)
    features = rng.choice(["normal", "normal", "ties", "constant"])
    # the optimizer's rule, drawn apart (the other seeds keep their examples); not with constant
    # features: there a problem's eps gradient cancels to exactly 0 in one process and to a
    # rounding residue (5e-9 of the others) over several, which the rows' Adam (eps 1e-8) makes
    # a step of 7e-5 once weight decay has set the rows above e* (seed 100060)
    optimizer = random.Random(f"optimizer {seed}").choice(["adam", "sgd", "nesterov", "adamw"])
    if features == "constant":
        optimizer = "adam"
    rates = cell.startswith(("precision", "recall"))
    nu_rule = "normalized" if rates and random.Random(f"nu {seed}").random() < 0.5 else "additive"
    return Example(
        seed,
        "train",
        k,
        n=n,
        cell=cell,
        layout=layout,
        labels=labels,
        features=features,
        batch=batch,
        loop=loop,
        steps=steps,
        epochs=2 if loop == "reshard" else rng.randint(1, 2),
        k_after=rng.randint(1, WORLD) if loop == "reshard" else k,
        unit=unit,
        at=rng.randint(0, steps - 1),
        optimizer=optimizer,
        nu_rule=nu_rule,
    )


# --- the epoch end's figures ------------------------------------------------------------------


def _stats_scores(ex: Example) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(ex.seed)
    n_pos = max(int(ex.n * torch.rand(1, generator=g)), 0)
    if ex.pattern == "few_pos":
        n_pos = min(n_pos, 3)
    n_neg = ex.n - n_pos
    u_pos = torch.randn(n_pos, generator=g, dtype=torch.float64) + 1
    u_neg = torch.randn(n_neg, generator=g, dtype=torch.float64)
    if ex.pattern == "ties":
        u_pos, u_neg = (u_pos * 2).round() / 2, (u_neg * 2).round() / 2
    elif ex.pattern == "inf":
        for u in (u_pos, u_neg):
            if u.numel():
                pick = torch.rand(u.numel(), generator=g)
                u[pick < 0.05] = float("inf")
                u[pick > 0.95] = -float("inf")
    elif ex.pattern == "constant":
        u_pos, u_neg = torch.full_like(u_pos, 0.25), torch.full_like(u_neg, 0.25)
    elif ex.pattern == "outliers" and u_neg.numel():
        u_neg[0] = 1e6
    if ex.seed % 2:
        u_pos, u_neg = u_pos.float(), u_neg.float()
    return u_pos, u_neg


def _split(x: torch.Tensor, rank: int, k: int, seed: int) -> torch.Tensor:
    """Rank ``rank``'s share of ``x``: uneven (drawn), possibly empty."""
    g = torch.Generator().manual_seed(seed + 1)
    cuts = torch.sort(torch.randint(0, x.numel() + 1, (k - 1,), generator=g)).values.tolist()
    bounds = [0, *cuts, x.numel()]
    return x[bounds[rank] : bounds[rank + 1]]


def _figures(u_pos, u_neg, pos_groups, comm) -> dict:
    """Every epoch-end figure of scores ``(u_pos, u_neg)``: its value, or the error it raises."""
    from projections import projection_root
    from projections.collective import root_over
    from reparam import functional as Fn
    from reparam import rate_functional as R

    figures = {
        "threshold": lambda: Fn.best_fbeta_threshold(u_pos, u_neg, 1.0, comm),
        "threshold_b2": lambda: Fn.best_fbeta_threshold(u_pos, u_neg, 2.0, comm),
        "bound": lambda: Fn.certified_fbeta_bound(u_pos, u_neg, 1.0, comm),
        "fbeta": lambda: Fn.fbeta_of_decisions(u_pos, u_neg, 1.0, comm),
        "at_recall": lambda: tuple(R.threshold_at_recall(u_pos, u_neg, 0.9, comm)),
        "at_precision": lambda: tuple(R.threshold_at_precision(u_pos, u_neg, 0.8, comm)),
        "at_precision_unmet": lambda: tuple(R.threshold_at_precision(u_pos, u_neg, 0.999, comm)),
        "auc": lambda: R.roc_auc(u_pos, u_neg, comm),
        "root": lambda: float(root_over(torch.tensor(0.3, dtype=u_pos.dtype), u_pos, comm)),
        "projection_root": lambda: projection_root(
            torch.tensor([0.2, -0.4], dtype=u_pos.dtype), u_pos, groups=pos_groups, comm=comm
        ).tolist(),
    }
    out = {}
    for name, fn in figures.items():
        try:
            out[name] = fn()
        except ValueError as e:
            out[name] = f"ValueError: {e}"
        if comm.world > 1:  # every process takes the same decision (else the next one hangs)
            every = [None] * comm.world
            dist.all_gather_object(every, isinstance(out[name], str), group=comm.group)
            if len(set(every)) > 1:
                raise AssertionError(f"{name}: raised on the processes {every} alone: {out[name]}")
    return out


def run_stats(ex: Example, rank: int, group) -> dict | None:
    from projections.collective import LOCAL, ProcessComm

    u_pos, u_neg = _stats_scores(ex)
    pos_groups = torch.arange(u_pos.numel()) % 2  # two problems over the positives' rows
    mine = (
        _split(u_pos, rank, ex.k, ex.seed),
        _split(u_neg, rank, ex.k, ex.seed + 7),
        _split(pos_groups, rank, ex.k, ex.seed),
    )
    got = _figures(*mine, ProcessComm(group) if ex.k > 1 else LOCAL)
    if rank != 0:
        return None
    want = _figures(u_pos, u_neg, pos_groups, LOCAL)
    diffs = []
    for name, value in want.items():
        if not _same_figure(name, got[name], value):
            diffs.append(f"{name}: {ex.k} processes {got[name]!r}, one {value!r}")
    return {"diffs": diffs}


def _same_figure(name: str, a, b) -> bool:
    if isinstance(a, str) or isinstance(b, str):  # the same error (its values: of the rows seen)
        return (
            isinstance(a, str) and isinstance(b, str) and a.split(", got")[0] == b.split(", got")[0]
        )
    a, b = (list(v) if isinstance(v, list | tuple) else [v] for v in (a, b))
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, bool) or isinstance(y, bool):
            if x != y:
                return False
        elif isinstance(x, float) and math.isnan(x):
            if not (isinstance(y, float) and math.isnan(y)):
                return False
        elif name in ("bound", "root", "projection_root"):  # float64 sums in another order
            if not (x == y or abs(x - y) <= 1e-9 * max(1.0, abs(y))):
                return False
        elif x != y:
            return False
    return True


# --- training ---------------------------------------------------------------------------------


def _data(ex: Example) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Features, labels and (per group) groups of the example's ``n`` samples."""
    g = torch.Generator().manual_seed(ex.seed)
    x = torch.randn(ex.n, D, generator=g)
    if ex.features == "ties":
        x = (x * 2).round() / 2
    elif ex.features == "constant":
        x = torch.zeros_like(x)
    p = 0.05 + 0.6 * float(torch.rand(1, generator=g))
    y = (torch.rand(ex.n, generator=g) < p).long()
    if ex.labels == "ordered":
        y = torch.sort(y).values  # the positives last: the first blocks hold none
    elif ex.labels == "all":
        y = torch.ones_like(y)
    elif ex.labels == "one":
        y = torch.zeros_like(y)
        y[int(torch.randint(0, ex.n, (1,), generator=g))] = 1
    elif ex.labels == "none":
        y = torch.zeros_like(y)
    if ex.cell == "fbeta-classes":
        second = torch.rand(ex.n, generator=g) < 0.5
        y = torch.where((y == 1) & second & (ex.labels != "empty_class"), 2, y)
    groups = None
    if ex.cell == "fbeta-groups":
        groups = torch.arange(ex.n) // ex.unit
        groups = groups.masked_fill(torch.rand(ex.n, generator=g) < 0.2, -1)  # unlabelled
    return x, y, groups


def _build(ex: Example, y, groups, shard: Shard | None, group):
    """The cell's objective: sharded by ``shard``, or the whole state (``group``: the replicas'
    group, or this process alone)."""
    labels = y if shard is None else shard.local_labels(y)
    kw = {"shard": shard} if shard is not None else {"process_group": group}
    cell = ex.cell
    if ex.optimizer != "adam" and cell in SPARSE_ROWS:  # (their own rule: an lr of their own)
        kw["tau"] = SparseTau(lr=0.05)
    if cell == "fbeta-tracked-sparse":
        return FBetaRegularizer(labels, **kw)
    if cell == "fbeta-tracked-dense":
        return FBetaRegularizer(labels, tau=DenseTau(), **kw)
    if cell == "fbeta-epoch-dense":
        return FBetaRegularizer.paper(labels, **kw)
    if cell == "fbeta-epoch-sparse":
        return FBetaRegularizer(labels, schedule=EpochEnd(), **kw)
    if cell == "fbeta-inline-exact":
        return FBetaRegularizer(labels, schedule=Inline(), tau=DenseTau(), **kw)
    if cell == "fbeta-inline-soft":
        return FBetaRegularizer(labels, schedule=Inline(strength=0.1), tau=DenseTau(), **kw)
    if cell == "fbeta-classes":
        return FBetaRegularizer(labels, positive_classes=(1, 2), **kw)
    if cell == "fbeta-groups":
        g = groups if shard is None else shard.local_labels(groups)
        return FBetaRegularizer(labels, groups=g, **kw)
    schedule = {"schedule": EpochEnd()} if cell.endswith("-epoch") else {}
    if ex.nu_rule != "additive" and cell.startswith(("precision", "recall")):  # (the draw's
        schedule["nu_rule"] = ex.nu_rule  # cells: a compiled example may swap in ROC-AUC)
    if cell.startswith("precision-at-recall"):
        return PrecisionAtRecall(labels, recall=0.8, **schedule, **kw)
    if cell.startswith("recall-at-precision"):
        return RecallAtPrecision(labels, precision=0.7, **schedule, **kw)
    return ROCAUC(labels, **schedule, **kw)


def _batches(ex: Example, k: int, epoch: int) -> list[list[torch.Tensor]]:
    """Per step, each of ``k`` processes' batch of dataset indices (owner sampling: from its own
    block; else anywhere, repeats included)."""
    g = torch.Generator().manual_seed(ex.seed * 1000 + epoch)
    steps = []
    for _ in range(ex.steps):
        per = []
        for r in range(k):
            if ex.layout == "owner":
                s = Shard(ex.n, r, k, unit=ex.unit)
                lo, hi = s.bounds()
            else:
                lo, hi = 0, ex.n
            if ex.unit > 1:  # whole groups
                first = torch.randint(
                    lo // ex.unit, hi // ex.unit, (ex.batch // ex.unit,), generator=g
                )
                idx = (first[:, None] * ex.unit + torch.arange(ex.unit)).reshape(-1)
            else:
                idx = torch.randint(lo, hi, (ex.batch,), generator=g)
            per.append(idx)
        steps.append(per)
    return steps


def _calls(ex: Example, idx: torch.Tensor) -> list[torch.Tensor]:
    """A process's batch as the loop's calls: one, or two (summed or accumulated)."""
    if ex.loop not in ("summed", "accumulate") or idx.numel() < 2 * ex.unit:
        return [idx]
    h = idx.numel() // 2
    h -= h % ex.unit
    return [idx[:h], idx[h:]]


def _optimizer(ex: Example, params: list) -> torch.optim.Optimizer:
    """The example's optimizer: Adam at lr 0.05; SGD with momentum, SGD with Nesterov momentum
    and weight decay (which moves the ``eps`` of a problem no batch touched), at lr 0.005; AdamW
    at 0.05 (the rows of a sparse ``tau`` keep their own rule: ``SparseTau(lr=0.05)``)."""
    if ex.optimizer == "sgd":
        return torch.optim.SGD(params, lr=0.005, momentum=0.9)
    if ex.optimizer == "nesterov":
        return torch.optim.SGD(params, lr=0.005, momentum=0.9, nesterov=True, weight_decay=1e-3)
    if ex.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=0.05, weight_decay=1e-2)
    return torch.optim.Adam(params, lr=0.05)


class Run:
    """A head, an objective and their optimizer: one process of the run (or the reference)."""

    def __init__(self, ex: Example, x, y, groups, shard: Shard | None, group) -> None:
        torch.manual_seed(ex.seed)
        self.ex, self.x, self.y = ex, x, y
        self.classes = ex.cell == "fbeta-classes"
        self.head = torch.nn.Linear(D, 3 if self.classes else 1)
        self.reg = _build(ex, y, groups, shard, group)
        self.opt = _optimizer(ex, [*self.head.parameters(), *self.reg.parameters()])
        self.reg.attach(self.opt)

    def scores(self, idx):
        out = self.head(self.x[idx])
        return out if self.classes else out[:, 0]

    def task(self, u, idx):
        if self.classes:
            return F.cross_entropy(u, self.y[idx])
        return F.binary_cross_entropy_with_logits(u, self.y[idx].float())

    def state(self) -> dict:
        return copy.deepcopy(
            {
                "head": self.head.state_dict(),
                "reg": self.reg.state_dict(),
                "opt": self.opt.state_dict(),
            }
        )

    def load(self, state: dict) -> None:
        self.head.load_state_dict(state["head"])
        self.reg.load_state_dict(state["reg"])
        self.opt.load_state_dict(state["opt"])


def _process_step(run: Run, ex: Example, idx: torch.Tensor) -> None:
    """The forward and backward passes of one step of a process of a sharded or replicated
    run."""
    run.opt.zero_grad()
    calls = _calls(ex, idx)
    if ex.loop == "accumulate":
        for c in calls:
            u = run.scores(c)
            (run.task(u, c) / len(calls) + W * run.reg(u, c)).backward()
    else:
        loss = 0
        for c in calls:
            u = run.scores(c)
            loss = loss + run.task(u, c) / len(calls) + W * run.reg(u, c)
        loss.backward()


def _side_pass(run: Run, ex: Example, batches: list[torch.Tensor]) -> None:
    """Before a step, on the step's batches (a process's own; the reference: every process's,
    each as a replica would call it, or their concatenation as routed, and for the rate
    objectives, whose multiplier steps on the global batch's estimate): ``skipped``, a forward
    and a backward of a non-finite loss whose step a guard skips (``zero_grad()``);
    ``validation``, a forward under ``torch.no_grad()`` in ``eval()`` mode. Neither moves any
    state but the skipped forward's remembered scores, alike in both runs."""
    rates = ex.cell.startswith(("precision", "recall", "roc"))  # (as _reference_step calls)
    replicas = (ex.layout == "replicated" and not rates) or len(batches) == 1
    calls = batches if replicas else [torch.cat(batches)]
    if ex.loop == "validation":
        run.reg.eval()
        with torch.no_grad():
            for idx in calls:
                run.reg(run.scores(idx), idx)
        run.reg.train()
        return
    run.opt.zero_grad()
    loss = sum(run.reg(run.scores(idx), idx) for idx in calls) * float("nan")
    loss.backward()
    run.opt.zero_grad()


def _average_head(run: Run, k: int, group) -> None:
    if k > 1:
        for p in run.head.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, group=group)
                p.grad /= k


def _reference_step(run: Run, ex: Example, step: list[torch.Tensor], k: int) -> None:
    """One step of the reference, one process fed the global batch: the task's losses of the
    ``k`` processes' calls weighted ``1/k`` (as DDP averages), and per call the objective's loss
    on the concatenation of the ``k`` processes' batches (its scale ``N / (n k B)`` is what the
    mean of the processes' losses at ``N / (n B)`` comes to)."""
    run.opt.zero_grad()
    per_process = [_calls(ex, idx) for idx in step]
    loss = 0
    for calls in per_process:
        for c in calls:
            loss = loss + run.task(run.scores(c), c) / len(calls) / k
    for c in range(max(len(calls) for calls in per_process)):
        parts = [calls[c] for calls in per_process if c < len(calls)]
        if ex.layout == "replicated" and not ex.cell.startswith(("precision", "recall", "roc")):
            # each replica's call at its own batch's scales (per group: of the groups in it)
            for idx in parts:
                loss = loss + W * run.reg(run.scores(idx), idx) / k
        else:  # the rates' multiplier steps on the global batch's estimate; sharded: routed
            idx = torch.cat(parts)
            loss = loss + W * run.reg(run.scores(idx), idx)
        if ex.loop == "accumulate":
            loss.backward()
            loss = 0
    if not isinstance(loss, int):
        loss.backward()


def _gathered(reg, n: int, group, k: int) -> dict[str, torch.Tensor]:
    """The sharded state of ``k`` processes in the unsharded layout (tests/reparam/
    _sharded_worker.py's ``gathered``, for any ``n``)."""
    out, state = {}, reg.state_dict()
    if reg.shard is None:
        return state
    start = reg.shard.start
    key = state["layout.tau_group"].long() * n + state["layout.pos_index"].long() + start
    held = torch.unique(state["layout.tau_group"].long())
    for name, value in [("row key", key), *state.items()]:
        if name in PER_ROW or name in PER_SAMPLE or name == "row key":
            parts = [None] * k
            dist.all_gather_object(parts, value, group=group)
            out[name] = torch.cat(parts)
        elif name in PER_PROBLEM and reg.grouped:
            parts = [None] * k
            dist.all_gather_object(parts, (held, value), group=group)
            out[name] = value.clone()
            for problems, theirs in parts:
                out[name][problems] = theirs[problems]
        else:
            out[name] = value
    order = torch.argsort(out.pop("row key"))
    for name in PER_ROW:
        if name in out:
            out[name] = out[name][order]
    return out


def _make_run(ex: Example, data, rank: int, k: int, groups_by_k) -> Run:
    x, y, groups = data
    group = groups_by_k[k]
    if ex.layout == "replicated":
        return Run(ex, x, y, groups, None, groups_by_k["reg", k] if k > 1 else group)
    shard = Shard(ex.n, rank, k, sampling=ex.layout, group=group, unit=ex.unit)
    return Run(ex, x, y, groups, shard, None)


def run_train(ex: Example, rank: int, groups_by_k) -> dict | None:
    top = max(ex.k, ex.k_after)
    if rank >= top:
        return None
    data = _data(ex)
    diffs: list[str] = []
    # the processes' run
    error = None
    try:
        run = _make_run(ex, data, rank, ex.k, groups_by_k) if rank < ex.k else None
    except ValueError as e:
        run, error = None, f"ValueError: {e}"
    # the reference
    ref = None
    if rank == 0:
        try:
            ref = Run(ex, *data, None, groups_by_k["self"])
        except ValueError as e:
            ref_error = f"ValueError: {e}"
        else:
            ref_error = None
    errors = [None] * top
    dist.all_gather_object(errors, error, group=groups_by_k[top])
    if any(errors):
        if rank != 0:
            return None
        if ref_error is None:
            return {"diffs": [f"the processes raised {errors}, one process did not"]}
        mine = {e for e in errors[: ex.k] if e}
        return {"diffs": [] if errors[0] else [f"rank 0 raised nothing, others {mine}"]}
    if rank == 0 and ref_error is not None:
        return {"diffs": [f"one process raised {ref_error!r}, the processes did not"]}

    path, ref_path = [], []  # the head's weights after every step: the trajectories
    k = ex.k
    for epoch in range(1, ex.epochs + 1):
        if epoch == 2 and ex.loop == "reshard":
            run = _reshard(ex, run, data, rank, groups_by_k)
            k = ex.k_after
        if rank >= k:
            if ex.loop == "reshard" and epoch < ex.epochs:
                continue
            return None
        group = groups_by_k[k]
        for s, step in enumerate(_batches(ex, k, epoch)):
            if ex.loop == "noforward" and s == ex.at:  # a step with no forward
                run.opt.zero_grad()
                run.opt.step()
                if ref is not None:
                    ref.opt.zero_grad()
                    ref.opt.step()
            if ex.loop in ("skipped", "validation") and s == ex.at:
                _side_pass(run, ex, [step[rank]])
                if ref is not None:
                    _side_pass(ref, ex, step)
            _process_step(run, ex, step[rank])
            _average_head(run, k, group)
            run.opt.step()
            path.append(torch.cat([p.detach().reshape(-1) for p in run.head.parameters()]))
            if ref is not None:
                _reference_step(ref, ex, step, k)
                ref.opt.step()
                ref_path.append(torch.cat([p.detach().reshape(-1) for p in ref.head.parameters()]))
            if ex.loop == "resume" and s == ex.at and epoch == 1:  # a fresh process loads it
                saved = run.state()
                run = _make_run(ex, data, rank, k, groups_by_k)
                run.load(saved)
        run.reg.end_epoch_()
        if ref is not None:
            ref.reg.end_epoch_()
    state = _gathered(run.reg, ex.n, groups_by_k[k], k)
    stats = run.reg.stats()
    every = None
    if ex.layout == "replicated" and k > 1:  # the replicas hold the same state, bit for bit
        every = [None] * k
        dist.all_gather_object(
            every, {"reg": run.reg.state_dict(), "head": run.head.state_dict()}, group=group
        )
    if rank != 0:
        return None
    if every is not None:
        for r, theirs in enumerate(every[1:], 1):
            for part in ("reg", "head"):
                for name, value in theirs[part].items():
                    if not torch.equal(value, every[0][part][name]):
                        diffs.append(f"replica {r}'s {part} {name} differs from rank 0's")
    normwise = ex.optimizer != "adam"
    for s, (a, b) in enumerate(zip(path, ref_path, strict=True)):
        if not _close(a, b, normwise):
            diffs.append(f"trajectory: the head first differs after step {s}: {_worst(a, b)}")
            break
    want = ref.reg.state_dict()
    for name, value in want.items():
        if name in NOT_COMPARED or name.startswith("layout."):
            continue
        if name not in state:
            diffs.append(f"state {name}: missing")
            continue
        got = state[name]
        if got.shape != value.shape:
            diffs.append(
                f"state {name}: shape {tuple(got.shape)}, one process {tuple(value.shape)}"
            )
        elif not _close(got, value, normwise):
            diffs.append(f"state {name}: {_worst(got, value)}")
    for name, value in ref.head.state_dict().items():
        if not _close(run.head.state_dict()[name], value, normwise):
            diffs.append(f"head {name}: {_worst(run.head.state_dict()[name], value)}")
    for key, value in ref.reg.stats().items():
        if not _same_stat(stats.get(key, "missing"), value):
            diffs.append(f"stats {key}: {stats.get(key, 'missing')!r}, one process {value!r}")
    return {"diffs": diffs}


def _reshard(ex: Example, run: Run | None, data, rank: int, groups_by_k) -> Run | None:
    """Every block saved by ``ex.k`` processes, ``ex.k_after`` processes load theirs."""
    top = max(ex.k, ex.k_after)
    saved = [None] * top
    dist.all_gather_object(saved, run.state() if run is not None else None, group=groups_by_k[top])
    if rank >= ex.k_after:
        return None
    new = _make_run(ex, data, rank, ex.k_after, groups_by_k)
    blocks = {r: s["reg"] for r, s in enumerate(saved[: ex.k])}
    new.head.load_state_dict(saved[0]["head"])
    new.reg.load_state_dict(reshard_state(new.reg, blocks))
    new.opt.load_state_dict(copy.deepcopy(saved[0]["opt"]))
    return new


def _close(a: torch.Tensor, b: torch.Tensor, normwise: bool = False) -> bool:
    """``a`` and ``b`` equal to ``TOL``; ``normwise``, each entry to ``TOL`` of the largest: a rule
    that is not scale-free (SGD) lets the head grow with the loss's scale (1e4 with one positive
    among 6e4 samples), and a sum in another order is off by a rounding of its largest term."""
    if a.dtype == torch.bool or b.dtype == torch.bool or not a.is_floating_point():
        return torch.equal(a, b)
    a, b = a.double(), b.double()
    if normwise and b.numel():
        top = float(b.abs().nan_to_num(0, 0, 0).max())
        return bool(((a - b).abs() <= TOL["atol"] + TOL["rtol"] * top).all()) or a.equal(b)
    return torch.allclose(a, b, equal_nan=True, **TOL)


def _worst(a: torch.Tensor, b: torch.Tensor) -> str:
    if a.is_floating_point():
        d = (a.double() - b.double()).abs().nan_to_num(float("inf"))
        i = int(torch.argmax(d))
        return (
            f"worst at {i}: {float(a.reshape(-1)[i])!r} vs one process {float(b.reshape(-1)[i])!r}"
        )
    return f"{a.reshape(-1).tolist()[:8]} vs one process {b.reshape(-1).tolist()[:8]}"


def _same_stat(a, b) -> bool:
    if isinstance(b, float) and isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-5)
    if isinstance(b, list) and isinstance(a, list) and len(a) == len(b):
        return all(_same_stat(x, y) for x, y in zip(a, b, strict=True))
    return a == b


# --- the processes ----------------------------------------------------------------------------


def main(rank: int, mode: str, seeds: list[int | tuple[str, int]], port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=2 * HANG_AFTER)
    )
    torch.set_num_threads(1)
    # (a group of one made by every process, as new_group([0]), leaves the replicas' own group
    # that attach makes later hanging, torch 2.13: each process's group of one is its own)
    groups_by_k: dict = {k: dist.new_group(list(range(k))) for k in range(2, WORLD)}
    # the replicated objectives' own groups (not the one the head's gradients are averaged on)
    groups_by_k.update({("reg", k): dist.new_group(list(range(k))) for k in range(2, WORLD)})
    groups_by_k["reg", WORLD] = None  # attach makes its own
    groups_by_k[WORLD] = dist.group.WORLD
    groups_by_k["self"] = groups_by_k[1] = dist.new_group([rank], use_local_synchronization=True)
    results = []
    for item in seeds:
        if isinstance(item, tuple):  # (kind, seed)
            kind, seed = item
        else:
            seed = item
            kind = mode if mode != "both" else ("stats", "train")[seed % 2]
        ex = draw(seed, kind)
        if os.environ.get("DIFF_OVERRIDE"):  # (to narrow a difference down by hand)
            ex = dataclasses.replace(ex, **json.loads(os.environ["DIFF_OVERRIDE"]))
        # an example that hangs: every process's stack, then the run ends (before gloo's timeout)
        faulthandler.dump_traceback_later(HANG_AFTER, exit=True)
        if rank == 0:
            print(f"example {seed}: {ex}", file=sys.stderr, flush=True)
        try:
            if ex.kind == "stats":
                r = run_stats(ex, rank, groups_by_k[ex.k]) if rank < ex.k else None
            else:
                r = run_train(ex, rank, groups_by_k)
        except Exception:
            r = {"diffs": [f"rank {rank} raised in example {seed}:\n{traceback.format_exc()}"]}
            if rank != 0:  # the other ranks may wait on this one: stop loudly
                print(r["diffs"][0], file=sys.stderr, flush=True)
                os._exit(3)
        if rank == 0 and r is not None:
            results.append({"example": asdict(ex), **r})
    if rank == 0:
        torch.save(results, out)
    dist.barrier()
    os._exit(0)  # no interpreter teardown (a gloo thread winding down hangs it now and then)


if __name__ == "__main__":
    mode, first, count, port, out = sys.argv[1:6]
    # FIRST COUNT: the seeds FIRST .. FIRST + COUNT - 1; or FIRST a comma-separated list of
    # seeds, or of KIND:SEED (MODE is then ignored)
    if ":" in first:
        seeds = [(k, int(v)) for k, v in (item.split(":") for item in first.split(","))]
    elif "," in first:
        seeds = [int(v) for v in first.split(",")]
    else:
        seeds = list(range(int(first), int(first) + int(count)))
    torch.multiprocessing.spawn(main, args=(mode, seeds, int(port), out), nprocs=WORLD)
