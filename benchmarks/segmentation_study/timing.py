"""The time of a training step of every arm of the segmentation study, interleaved on CamVid
batches, and the share of it that each task loss and each objective's own work take."""

from __future__ import annotations

import statistics
import tempfile
import time
import warnings

from .._report import markdown_table
from .spec import METHODS, TASKS, method_overrides


def timing(steps: int, task: str, size: tuple[int, int]) -> str:
    """Median step time of each method / the baseline's, steps interleaved, on CamVid batches."""
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        # steps only, no epoch ends: the objectives' "no end_epoch_()" warning is expected here
        warnings.filterwarnings("ignore", "[^:]*: .* since the last end_epoch_", RuntimeWarning)
        return _timing(steps, task, size, tmp)


def _timing(steps: int, task: str, size: tuple[int, int], tmp: str) -> str:
    import torch

    from train import config as config_mod
    from train import distributed
    from train.loop import setup, train_step
    from train.nonfinite import NonFiniteGuard

    torch.set_num_threads(2)
    config = TASKS[task][0]
    trainers = {}
    for method in METHODS:
        cfg = config_mod.load(
            config,
            [
                *method_overrides(task, method, size),  # what the study's run of it trains
                "train.checkpoint=false",
                f"train.out={tmp}/" + method.replace(" ", "_"),
            ],
        )
        s = setup(cfg, distributed.Context(), None, lambda *_: None)
        guard = NonFiniteGuard("stop", False, "none")
        s.state.begin_epoch(s.device)
        guard.begin_epoch(1, s.state.totals)
        trainers[method] = (s, guard, cfg, iter(s.train_loader))
    times: dict[str, list[float]] = {m: [] for m in METHODS}
    for k in range(steps + 3):
        for method, (s, guard, cfg, it) in trainers.items():
            batch = next(it, None)
            if batch is None:
                it = iter(s.train_loader)
                trainers[method] = (s, guard, cfg, it)
                batch = next(it)
            t0 = time.perf_counter()
            train_step(s, batch, k + 1, guard, cfg.regularizer.alpha, None, check=False)
            if k >= 3:  # warm-up
                times[method].append(time.perf_counter() - t0)
    base = statistics.median(times["baseline"])
    rows = [
        [m, f"{statistics.median(ts):.3f}", f"{statistics.median(ts) / base:.3f}"]
        for m, ts in times.items()
    ]
    tables = [
        markdown_table(["method", "step (s)", "/ baseline"], rows),
        _loss_cost(trainers, base),
        _regularizer_cost(trainers, base),
    ]
    return (
        f"CamVid {task}, batch 8, {size[0]}x{size[1]}, 2 threads, median of {steps} interleaved steps\n"
        + "\n\n".join(tables)
    )


def _batch(s) -> dict:
    """One training batch of trainer ``s``'s own loader (the pixel objective's carries ``pixel``)."""
    return next(iter(s.train_loader))


def _loss_cost(trainers: dict, step: float, reps: int = 100) -> str:
    """Each method's task loss, forward + backward on one batch's logits (``train.loss``,
    ``train.class_weights``, ``train.group_weighting``; the baseline: cross-entropy), interleaved:
    its time, its share of the baseline step and its extra over cross-entropy."""
    import torch

    from train.loop import task_loss

    s = trainers["baseline"][0]
    batch = _batch(s)
    with torch.no_grad():
        logits = s.model(batch["image"])[0]
    y, shape = batch["label"].long(), batch["shape"]
    losses = {"baseline": trainers["baseline"][0]}
    losses |= {
        m: t[0]
        for m, t in trainers.items()
        if t[0].criterion is not None or t[0].groups is not None
    }
    times: dict[str, list[float]] = {m: [] for m in losses}
    for _ in range(reps):
        for method, own in losses.items():
            x = logits.detach().requires_grad_()
            t0 = time.perf_counter()
            task_loss(x, y, own.groups, shape, own.criterion).backward()
            times[method].append(time.perf_counter() - t0)
    medians = {m: statistics.median(ts) for m, ts in times.items()}
    ce = medians["baseline"]
    rows = [
        [
            "cross-entropy (baseline)" if m == "baseline" else m,
            f"{t * 1e3:.2f}",
            f"{t / step * 100:.2f} %",
            f"{(t - ce) * 1e3:+.2f}",
            f"{(t - ce) / step * 100:+.2f} %",
        ]
        for m, t in medians.items()
    ]
    header = ["task loss, fwd + bwd", "ms", "/ baseline step", "extra ms", "extra / baseline step"]
    return markdown_table(header, rows)


def _regularizer_cost(trainers: dict, step: float, reps: int = 100) -> str:
    """Each objective's own work in a step, interleaved: forward + backward of its loss (on random
    shape scores of the batch's images; for ``target: pixels`` on the batch's pixel margins, their
    computation from the logits and the choice of the labelled pixels included), an Adam step on
    its parameters, ``after_step_``; its share of the baseline step. An objective on the pixels is
    also timed as ``train.compile: true`` runs it (``reg.compile()``: the L_B forward one fused
    kernel; compiled before the timed steps)."""
    import torch

    from train.build import labelled_pixel_scores
    from train.data import IGNORE_INDEX

    regs, inputs = _objectives(trainers)
    optimizers = {  # soft-F1 has no parameters of its own
        m: torch.optim.Adam(reg.parameters(), 1e-2) if list(reg.parameters()) else None
        for m, (reg, _) in regs.items()
    }
    times: dict[str, list[float]] = {m: [] for m in regs}
    for k in range(-2, reps):  # 2 untimed rounds: the compiled objectives compile
        u = torch.randn(8, generator=torch.Generator().manual_seed(k + 2))
        for method, (reg, classes) in regs.items():
            t0 = time.perf_counter()
            if classes is None:
                idx = inputs[method][1]
                x = u[: len(idx)].clone().requires_grad_()
            else:
                logits, labels, pixels = inputs[method]
                x, idx = labelled_pixel_scores(
                    logits.detach().requires_grad_(), classes, labels, pixels, IGNORE_INDEX
                )
            opt = optimizers[method]
            if opt is not None:
                opt.zero_grad()
            reg(x, idx).backward()
            if opt is not None:
                opt.step()
            reg.after_step_()
            if k >= 0:
                times[method].append(time.perf_counter() - t0)
    medians = {method: statistics.median(ts) for method, ts in times.items()}
    return markdown_table(
        ["objective's own work per step", "ms", "/ baseline step"],
        [[m, f"{t * 1e3:.2f}", f"{t / step * 100:.2f} %"] for m, t in medians.items()],
    )


def _objectives(trainers: dict) -> tuple[dict, dict]:
    """``method -> (regularizer, pixel classes)`` and ``method -> its batch`` of every objective,
    an objective on the pixels also compiled (``train.compile``'s ``reg.compile()``)."""
    import copy

    import torch

    regs, inputs = {}, {}
    for method, (s, *_) in trainers.items():
        if s.reg is None:
            continue
        batch = _batch(s)
        regs[method] = (s.reg, s.pixel_classes)
        if s.pixel_classes is None:
            inputs[method] = (None, batch["index"])
            continue
        with torch.no_grad():
            logits = s.model(batch["image"])[0]
        inputs[method] = (logits, batch["label"], batch["pixel"])
        compiled = copy.deepcopy(s.reg)
        compiled.compile()
        regs[f"{method}, compiled"] = (compiled, s.pixel_classes)
        inputs[f"{method}, compiled"] = inputs[method]
    return regs, inputs
