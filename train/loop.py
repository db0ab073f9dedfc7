"""The training loop, read top to bottom: ``run(cfg)`` = setup, then epochs of steps.

The loop trains with what ``train.setup.setup`` builds. Per step (docs/method/dual-ascent.md sec. 3b):
``loss = CE(logits, y) + alpha * L_B(u, idx)``; one optimizer steps the network and the
regularizer's parameters, and its step steps the regularizer's per-row state too (``reg.attach``:
a sparse ``tau``; with several processes the rows' gradients and the scores are exchanged first).
Per epoch: ``reg.end_epoch_()`` (projection in mode ``epoch`` + dual ascent on the
remembered scores), evaluation on the test split, logging (console, TensorBoard, ``metrics.json``)
and an atomic checkpoint of the ``TrainState``. Whether a step was finite is read on the host every
step under ``train.nonfinite=skip``; under ``stop`` (the default) it stays on the device and is read
every ``train.nonfinite_check_every`` steps, before every checkpoint and at the epoch end
(:class:`NonFiniteGuard`). The same loop trains S-MNIST
classification (logits ``(B, 10)``) and COCO-Stuff segmentation (logits ``(B, C, H, W)``, pixel
labels with ignore index 255): only the metrics differ. Under ``torchrun`` every process runs it;
rank 0 logs and writes.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader
from tqdm import tqdm

from reparam.functional import best_fbeta_threshold

from . import checkpoint, distributed, reporting, run_info, sharded_state
from .build import (
    autocast_dtype,
    labelled_pixel_scores,
)
from .config import Config
from .data import IGNORE_INDEX
from .evaluation import evaluate, shape_at_threshold
from .files import atomic_path, write_npz, write_text_atomic
from .losses import task_loss
from .nonfinite import NonFiniteGuard
from .setup import Setup, num_groups, setup
from .state import TrainState


def run(
    cfg: Config, log: Callable[..., object] = print, resume: str | Path | None = None
) -> dict[str, Any]:
    """Train ``cfg`` end to end (or continue the run folder ``resume`` from its latest
    checkpoint); returns what ``metrics.json`` holds. Under ``torchrun`` every process calls this;
    only rank 0 logs and writes files."""
    cfg = copy.deepcopy(cfg)  # the caller's config is left alone
    already = distributed.is_initialized()
    ctx = distributed.init_from_env(cfg.train.device, cfg.train.dist_timeout_s)
    finished = False
    try:
        result = _train(cfg, log if ctx.is_main else (lambda *_: None), resume, ctx)
        finished = True
        return result
    finally:
        if not already:
            distributed.shutdown(finished)


def _train(
    cfg: Config, log: Callable[..., object], resume: str | Path | None, ctx: distributed.Context
) -> dict[str, Any]:
    s = setup(cfg, ctx, resume, log)
    state, reg, device, train_loader, written = s.state, s.reg, s.device, s.train_loader, s.written
    sampler = train_loader.sampler.sampler
    from torch.utils.tensorboard import SummaryWriter  # slow import: only when training

    writer = SummaryWriter(str(s.out / "tb"), purge_step=state.epoch + 1) if ctx.is_main else None
    alpha, autocast = cfg.regularizer.alpha, autocast_dtype(cfg.train.precision)
    every, limit = cfg.train.checkpoint_every, cfg.train.stop_after_steps
    check_every = cfg.train.nonfinite_check_every
    guard = NonFiniteGuard(cfg.train.nonfinite, ctx.enabled, s.last_checkpoint)
    _announce(s, cfg, ctx, log)

    def boundary() -> bool:  # a checkpoint or the stop is due at this global step
        g = state.global_step
        return bool(every and g % every == 0) or (limit is not None and g >= limit)

    # --- epochs ---------------------------------------------------------------------------------------
    for epoch in range(state.epoch + 1, cfg.train.epochs + 1):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)  # DistributedSampler: the epoch's permutation
        state.begin_epoch(device)
        guard.begin_epoch(epoch, state.totals)
        s.net.train()
        k = skip = state.step_in_epoch  # resuming inside the epoch: the batches already taken
        train_loader.sampler.skip = skip
        bar = _progress(train_loader, epoch, skip, cfg.train.progress and ctx.is_main)
        stop = interrupted = False
        start = time.perf_counter()
        for k, batch in enumerate(bar, start=skip + 1):
            state.step_in_epoch = k
            check = guard.skip or k % check_every == 0  # skip: every step is read
            if not train_step(s, batch, k, guard, alpha, autocast, check=check):
                continue  # found non-finite by this step's own check (skip): dropped
            state.global_step += 1

            # -- mid-epoch checkpoint (every N steps, or where train.stop_after_steps stops) --
            if boundary() and guard.unread:  # no state after a non-finite step is ever saved
                guard.read()
            stop = limit is not None and state.global_step >= limit
            # stopping after the last batch lets the epoch run out instead: the sampler's generator
            # then advances exactly as in an uninterrupted epoch, whatever the stopping point
            interrupted = stop and k < len(train_loader)
            if (every and state.global_step % every == 0) or interrupted:
                guard.last_checkpoint = save_checkpoint(state, s.out, cfg, ctx, written)
            if interrupted:
                break
        train_seconds = time.perf_counter() - start
        if interrupted:
            log(
                f"stopped after global step {state.global_step} (train.stop_after_steps); "
                f"checkpoint {guard.last_checkpoint}"
            )
            break
        guard.read()  # stop: raises before the epoch's dual step sees the scores

        epoch_end_seconds = _regularizer_epoch_end(s)
        sums = distributed.all_reduce_(state.totals[:3].clone())

        # -- evaluation and logging --
        start = time.perf_counter()
        evaluated, images, per_image = evaluate_splits(s, cfg)
        seconds = (train_seconds, epoch_end_seconds, time.perf_counter() - start)
        row = _epoch_row(s, epoch, k, sums, seconds) | evaluated
        state.end_epoch(row)
        if ctx.is_main:
            _write_epoch(s, cfg, writer, row, images, per_image)
        guard.last_checkpoint = save_checkpoint(state, s.out, cfg, ctx, written)
        log(reporting.epoch_line(row))
        on_node = s.pixel_classes is None
        for warning in reporting.warnings(row, cfg.regularizer.name if reg else None, on_node):
            log(f"warning: {warning}")
        if stop:
            log(f"stopped after global step {state.global_step} (train.stop_after_steps)")
            break
    if writer is not None:
        writer.close()
    return reporting.summary(state.history, cfg)


def _progress(loader: DataLoader, epoch: int, skip: int, show: bool) -> tqdm:
    """The epoch's batches behind a progress bar (from batch ``skip``; hidden unless ``show``)."""
    return tqdm(
        loader,
        desc=f"epoch {epoch}",
        leave=False,
        initial=skip,
        total=len(loader),
        disable=None if show else True,
    )


def _regularizer_epoch_end(s: Setup) -> float:
    """The regularizer's epoch end (its projection and dual step on the remembered scores, merged
    over processes first); returns its seconds."""
    start = time.perf_counter()
    if s.reg is not None:
        if s.written is not None:
            s.reg._merge_scores_(s.written, distributed.all_reduce_)
            s.written.zero_()
        s.reg.end_epoch_()
    return time.perf_counter() - start


def _announce(s: Setup, cfg: Config, ctx: distributed.Context, log: Callable[..., object]) -> None:
    """The run on the console, and (rank 0) in ``run.json``: what ``train.predict`` needs besides
    ``config.yaml`` (train/run_info.py)."""
    if ctx.is_main:
        run_info.write(s.out, s.data, cfg)
    log(
        f"run folder {s.out}; {len(s.data.train)} train / {len(s.data.test)} test samples; "
        f"device {s.device}; {ctx.world} process(es); precision {cfg.train.precision}"
        + ("; compiled" if cfg.train.compile else "")
    )
    if s.reg is not None:
        log(f"regularizer: alpha={cfg.regularizer.alpha:g} {s.reg.extra_repr()}")
    if s.criterion is not None:
        log(f"task loss: {s.criterion.extra_repr()}")


def _epoch_row(
    s: Setup, epoch: int, steps: int, sums: Tensor, seconds: tuple[float, float, float]
) -> dict[str, Any]:
    """The epoch's figures but the evaluation's: mean losses (``sums``: task, regularizer, count,
    over all processes), ``seconds`` (training, epoch end, evaluation), the regularizer's and the
    group weighting's state."""
    state, reg = s.state, s.reg
    total = max(float(sums[2]), 1.0)
    row = {
        "epoch": epoch,
        "train_loss": float(sums[0]) / total,
        "reg_loss": float(sums[1]) / total if reg is not None else None,
        "train_seconds": seconds[0],
        "epoch_end_seconds": seconds[1],
        "steps": steps,
        "eval_seconds": seconds[2],
        "skipped_steps_total": state.skipped_steps + int(state.totals[3]),
    }
    if reg is not None:
        row |= {f"reg_{name}": v for name, v in reg.stats().items() if not isinstance(v, list)}
    if s.groups is not None:
        row |= s.groups.stats()
    return row


def _write_epoch(
    s: Setup,
    cfg: Config,
    writer: Any,
    row: dict[str, Any],
    images: tuple | None,
    per_image: dict | None,
) -> None:
    """Rank 0: TensorBoard (scalars, images), the selected epoch's per-image IoUs, metrics.json."""
    epoch = row["epoch"]
    if images is not None:
        reporting.log_segmentation_images(writer, *images, s.data.num_classes, epoch)
    if per_image is not None and reporting.selected_epoch(s.state.history) == epoch:
        with atomic_path(s.out / "per_image_test.npz") as tmp:  # the selected epoch's
            write_npz(tmp, {**per_image, "epoch": torch.tensor([epoch]).numpy()})
    run_info.save_best(s.state, s.out, cfg)  # checkpoints/best.pt: the selected epoch's weights
    reporting.log_scalars(writer, row, epoch)
    writer.flush()
    metrics = reporting.summary(s.state.history, cfg)
    write_text_atomic(json.dumps(metrics, indent=2) + "\n", s.out / "metrics.json")


def train_step(
    s: Setup,
    batch: dict[str, Tensor],
    k: int,
    guard: NonFiniteGuard,
    alpha: float,
    autocast: torch.dtype | None,
    check: bool,
) -> bool:
    """Step ``k`` of the epoch: forward, the finiteness flag, the regularized loss, backward, the
    optimizer (whose step steps the regularizer's per-row state: ``reg.attach``) and the lr
    schedule. ``check``: the flag is read first
    (``stop`` raises; under ``skip``, which checks every step, a non-finite step is dropped:
    ``False`` is returned and nothing is updated). Unchecked (``stop`` between its periodic reads)
    the step runs with no host read; a non-finite one corrupts the state, which the next read,
    before any checkpoint, turns into the error (docs/robustness.md)."""
    state, reg, optimizer, scaler, device = s.state, s.reg, s.optimizer, s.scaler, s.device
    # host -> device copies need no synchronization; non_blocking: the blocking form waits for the
    # stream (torch.cuda.set_sync_debug_mode flags it)
    x, y, idx = (batch[key].to(device, non_blocking=True) for key in ("image", "label", "index"))
    with torch.autocast(device.type, dtype=autocast or torch.float32, enabled=autocast is not None):
        logits, u = s.net(x)
        task = task_loss(logits, y.long(), s.groups, batch["shape"], s.criterion)
    u = u.float()
    ok = guard.record(k, task, u)
    if check and not guard.read(ok):
        optimizer.zero_grad(set_to_none=True)
        return False
    guard.unread += not check
    loss, reg_loss = task, None
    if reg is not None:
        if s.pixel_classes is not None:  # pixels' margins; unlabelled, padded ones dropped
            pixels = batch["pixel"].to(device, non_blocking=True)
            u, idx = labelled_pixel_scores(logits, s.pixel_classes, y, pixels, IGNORE_INDEX)
        # unchecked (stop): finite placeholder scores, so the error is the guard's, at its read
        reg_loss = reg(u if check else torch.where(ok, u, 0.0), idx)
        loss = task + alpha * reg_loss
        if s.written is not None:
            s.written.index_fill_(0, idx, True)
    optimizer.zero_grad(set_to_none=True)
    if scaler is not None:
        scaler.scale(loss).backward()
    else:
        loss.backward()
    distributed.average_gradients_(s.reg_params)
    # the optimizer's step steps the regularizer's per-row state too (reg.attach, train/setup.py)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    if s.scheduler is not None:
        s.scheduler.step()
    n = len(y)
    losses = torch.stack((task, reg_loss if reg is not None else torch.zeros_like(task))).detach()
    state.totals[:3].add_(torch.cat((losses * n, losses.new_ones(1) * n)))
    return True


def save_checkpoint(
    state: TrainState, out: Path, cfg: Config, ctx: distributed.Context, written: Tensor | None
) -> str:
    """Write ``state`` to ``out/checkpoints/step-<global step>.pt`` atomically (rank 0; the newest
    ``train.keep_checkpoints`` are kept) and return its path for error messages.

    Every process must call it: inside an epoch, the remembered scores of all processes are merged
    into the regularizer and the epoch's loss sums are summed over processes first."""
    totals = None
    if state.step_in_epoch:
        if written is not None:
            state.regularizer._merge_scores_(written, distributed.all_reduce_)
            written.zero_()
        totals = state.totals.clone()
        totals[:3] = distributed.all_reduce_(totals[:3].clone())
    if not cfg.train.checkpoint:
        return "none (train.checkpoint is false)"
    path = checkpoint.path_for(out, state.global_step)
    if getattr(state.regularizer, "sharded", False):  # each rank's block, before rank 0's file
        sharded_state.save_shards(
            state.regularizer, out, state.global_step, ctx, cfg.train.keep_checkpoints
        )
    if ctx.is_main:
        ckpt = state.state_dict()
        if totals is not None:
            ckpt["epoch_totals"] = totals.cpu()
        path.parent.mkdir(exist_ok=True)
        checkpoint.save_atomic(ckpt, path)
        checkpoint.prune(out, cfg.train.keep_checkpoints)
    return str(path)


def evaluate_splits(s: Setup, cfg: Config) -> tuple[dict[str, Any], tuple | None, dict | None]:
    """The epoch's evaluation: the reported split (``test_*``, with the images for TensorBoard and
    the per-image IoUs of segmentation) and, when the data set has one, the selection split
    (``val_*``). The shape node is also reported at a decision threshold
    (``test_shape_threshold``, ``*_shape_*_at_threshold``): the objective's learned one, or with
    ``train.shape_threshold=val`` the one its target picks on the val split (evaluated first)."""
    kwargs = dict(
        device=s.device,
        num_classes=s.data.num_classes,
        beta=cfg.regularizer.fbeta.beta,
        positive_class=cfg.regularizer.positive_classes()[0],
        num_groups=num_groups(s.data),
        segmentation=cfg.data.segmentation,
        precision=cfg.train.precision,
        threshold=_learned_threshold(s.reg) if s.pixel_classes is None else None,
    )
    val = None
    if s.val_loader is not None:
        chosen_on_val = cfg.train.shape_threshold == "val"
        val = evaluate(s.model, s.val_loader, return_shape=chosen_on_val, **kwargs)
        val.pop("_per_image", None)
        if chosen_on_val:
            u, positive = val.pop("_shape")
            kwargs["threshold"] = t = val_threshold(s.reg, u, positive, cfg.regularizer.fbeta.beta)
            val |= shape_at_threshold(u[positive], u[~positive], t, cfg.regularizer.fbeta.beta)
    test = evaluate(s.model, s.test_loader, keep_images=cfg.train.log_images, **kwargs)
    images, per_image = test.pop("_images", None), test.pop("_per_image", None)
    out = {f"test_{name}": v for name, v in test.items()}
    if val is not None:
        out |= {f"val_{name}": v for name, v in val.items()}
    if kwargs["threshold"] is not None:
        out["test_shape_threshold"] = kwargs["threshold"]
    return out, images, per_image


def val_threshold(reg: nn.Module, scores: Tensor, positive: Tensor, beta: float) -> float:
    """The shape node's threshold chosen on the val split's ``scores`` (``positive``: bool): the
    rate objectives' ``calibrate`` (the target met with the best other rate), F-beta's best cut."""
    if hasattr(reg, "calibrate"):
        return reg.calibrate(scores, positive.long()).threshold
    return best_fbeta_threshold(scores[positive], scores[~positive], beta)[0]


def _learned_threshold(reg: nn.Module | None) -> float | None:
    """The objective's learned decision threshold (F-beta's of the first positive class, the rate
    objectives'; None for the objectives that learn none)."""
    threshold = getattr(reg, "decision_threshold", None)
    return None if threshold is None else float(threshold[0])
