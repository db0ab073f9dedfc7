"""The training loop, read top to bottom: ``run(cfg)`` = data, model, regularizer, epochs.

Per step (spec sec. 3b): ``loss = CE(logits, y) + alpha * L_B(u, idx)``; one optimizer steps the
network and the regularizer's ``(eps, tau)``; ``reg.after_step_()`` projects in mode ``step``.
Per epoch: ``reg.end_epoch_()`` (projection in mode ``epoch`` + dual ascent on the remembered
scores), evaluation on the test split, logging (TensorBoard, ``metrics.json``), an atomic checkpoint.
The same loop trains S-MNIST classification (logits ``(B, 10)``) and COCO-Stuff segmentation
(logits ``(B, C, H, W)``, pixel labels with ignore index 255): only the metrics differ.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from reparam import FBetaRegularizer
from reparam.functional import fbeta_from_counts

from . import checkpoint, distributed
from . import config as config_mod
from .config import Config
from .data import IGNORE_INDEX, load_data, make_loader
from .metrics import GroupedConfusion, GroupedSegmentationConfusion
from .models import build_model


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002  (seeds the legacy global state that libraries use)
    torch.manual_seed(seed)


def resolve_device(name: str, local_rank: int | None = None) -> torch.device:
    """``auto``: CUDA when available; under ``torchrun`` the process's own GPU (``LOCAL_RANK``)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and local_rank is not None:
        name = f"cuda:{local_rank}"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"train.device is {name!r} but CUDA is not available on this machine")
    return device


def build_regularizer(cfg: Config, shape_labels: torch.Tensor) -> FBetaRegularizer | None:
    r = cfg.regularizer
    if r.name == "none":
        return None
    return FBetaRegularizer(
        shape_labels, beta=r.beta, positive_classes=tuple(r.positive_classes),
        projection=r.projection, projection_method=r.projection_method,
        inline_strength=r.inline_strength, negative_loss=r.negative_loss,
        dual_lr_lambda=r.dual_lr_lambda, dual_lr_mu=r.dual_lr_mu, dual_schedule=r.dual_schedule,
        rho=r.rho, mu_init=r.mu_init,
    )  # fmt: skip


def _shape_scores(positive_classes: list[int]) -> int:
    """Columns of the shape head: 1 for one positive class, else one per shape class
    (``FBetaRegularizer`` reads column ``c`` as the one-vs-rest score of class ``c``)."""
    return 1 if len(positive_classes) == 1 else max(positive_classes) + 1


def build_optimizer(cfg: Config, model: nn.Module, reg: nn.Module | None) -> torch.optim.Optimizer:
    o = cfg.optim
    groups = [{"params": list(model.parameters())}]
    if reg is not None:  # (eps, tau) are primal variables: the same optimizer steps them
        groups.append({"params": list(reg.parameters()), "weight_decay": 0.0,
                       "lr": o.lr if o.regularizer_lr is None else o.regularizer_lr})  # fmt: skip
    # fused: one kernel per step instead of ~10 per tensor (the per-sample tau has N_pos entries)
    if o.name == "adam":
        return torch.optim.Adam(groups, lr=o.lr, weight_decay=o.weight_decay, fused=True)
    return torch.optim.SGD(
        groups, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay, fused=True
    )


def build_scheduler(
    cfg: Config, optimizer: torch.optim.Optimizer, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """``poly``: ``lr_t = lr (1 - t / T)^0.9`` per step, ``T`` = all steps (DeepLab's schedule)."""
    if cfg.optim.schedule == "constant":
        return None
    total = cfg.train.epochs * steps_per_epoch
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: max(0.0, 1.0 - t / total) ** 0.9)


def task_loss(logits: Tensor, y: Tensor) -> Tensor:
    """Cross-entropy; pixels labelled ``IGNORE_INDEX`` do not count (a batch with no labelled
    pixel gives 0, not NaN)."""
    if logits.dim() == 2:
        return F.cross_entropy(logits, y)
    total = F.cross_entropy(logits, y, ignore_index=IGNORE_INDEX, reduction="sum")
    return total / (y != IGNORE_INDEX).sum().clamp_min(1)


class NonFiniteLossError(FloatingPointError):
    """A step produced a NaN / inf loss or shape score (``train.nonfinite: stop``)."""


def autocast_dtype(precision: str) -> torch.dtype | None:
    """``None`` for ``fp32``, else the autocast dtype of ``bf16`` / ``fp16``."""
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


@dataclass
class StepControl:
    """What a training pass does besides stepping (all optional; the defaults train plainly).

    ``precision``: autocast dtype for the network (the regularizer always runs in float32 on
    ``u.float()``); ``scaler``: a ``GradScaler`` (fp16); ``skip_nonfinite``: drop a step whose loss
    or scores are not finite (counted) instead of raising ``NonFiniteLossError``; ``skip_batches``:
    resume inside an epoch (the loader's sampler skips that many batches); ``on_step(k)``: called
    after the ``k``-th step of the epoch, returns ``True`` to stop the pass early; ``written``: bool
    ``(N,)`` marking the samples this process scored (multi-process score sync); ``where``: text
    naming the epoch for error messages; ``totals``: float64 ``(4,)`` running sums of the epoch
    (task loss x samples, regularizer loss x samples, samples, skipped steps), updated in place, so
    a mid-epoch checkpoint can save them and a resumed epoch continue them (zeros when ``None``).
    """

    precision: str = "fp32"
    scaler: torch.amp.GradScaler | None = None
    skip_nonfinite: bool = False
    skip_batches: int = 0
    on_step: Callable[[int], bool] | None = None
    written: Tensor | None = None
    where: str = ""
    last_checkpoint: str = "none"
    totals: Tensor | None = None


def train_one_epoch(
    model: nn.Module,
    reg: FBetaRegularizer | None,
    alpha: float,
    optimizer: torch.optim.Optimizer,
    loader: torch.utils.data.DataLoader,
    device: torch.device,
    *,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    control: StepControl | None = None,
    progress: bool = False,
    desc: str = "train",
) -> dict[str, Any]:
    """One pass over ``loader`` then the regularizer's epoch end; returns losses and timings.

    Per step: ``loss = CE + alpha * L_B`` (spec sec. 3b), one finiteness check (the only host
    sync), backward, gradients of ``(eps, tau)`` averaged over processes, optimizer step,
    ``reg.after_step_()``. The epoch end (scores synced over processes, ``reg.end_epoch_()``) runs
    only if the pass was not stopped early (``"completed"``).
    """
    c = control or StepControl()
    dtype = autocast_dtype(c.precision)
    model.train()
    if c.totals is None:
        c.totals = torch.zeros(4, dtype=torch.float64, device=device)
    task_sum, reg_sum, n, skipped = c.totals.unbind()  # views: in-place updates land in c.totals
    k = c.skip_batches
    completed = True
    reg_params = list(reg.parameters()) if reg is not None else []
    if c.skip_batches:
        loader.sampler.skip = c.skip_batches
    start = time.perf_counter()
    bar = tqdm(loader, desc=desc, leave=False, disable=None if progress else True,
               initial=c.skip_batches, total=len(loader))  # fmt: skip
    for k, batch in enumerate(bar, start=c.skip_batches + 1):
        x, y, idx = batch["image"].to(device), batch["label"].to(device).long(), batch["index"]
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            logits, u = model(x)
            task = task_loss(logits, y)
        u = u.float()
        if not bool(torch.isfinite(task) & torch.isfinite(u).all()):  # before L_B sees u
            if not c.skip_nonfinite:
                raise NonFiniteLossError(
                    f"non-finite loss or shape score at {c.where} step {k} (task loss "
                    f"{float(task.detach())}); last good checkpoint: {c.last_checkpoint}. Lower "
                    f"the lr, check the data, or set train.nonfinite=skip to drop such steps"
                )
            skipped += 1
            optimizer.zero_grad(set_to_none=True)
            continue
        loss = task
        if reg is not None:
            reg_loss = reg(u, idx.to(device))
            loss = task + alpha * reg_loss
            if c.written is not None:
                c.written[idx] = True
        optimizer.zero_grad(set_to_none=True)
        if c.scaler is not None:
            c.scaler.scale(loss).backward()
        else:
            loss.backward()
        distributed.average_gradients_(reg_params)
        if c.scaler is not None:
            c.scaler.step(optimizer)
            c.scaler.update()
        else:
            optimizer.step()
        if scheduler is not None:
            scheduler.step()
        if reg is not None:
            reg.after_step_()
            reg_sum += reg_loss.detach() * len(y)
        task_sum += task.detach() * len(y)
        n += len(y)
        if c.on_step is not None and c.on_step(k) and k < len(loader):
            # after the last batch the pass runs out instead: the sampler's generator then
            # advances exactly as in an uninterrupted epoch (RandomSampler draws once more at
            # exhaustion), so the next epoch's order does not depend on where a run stopped
            completed = False
            break
    train_seconds = time.perf_counter() - start
    start = time.perf_counter()
    if reg is not None and completed:
        if c.written is not None:
            distributed.sync_scores_(reg, c.written)
            c.written.zero_()
        reg.end_epoch_()
    epoch_end_seconds = time.perf_counter() - start
    sums = distributed.all_reduce_(c.totals[:3].clone())
    total = max(float(sums[2]), 1.0)
    return {
        "train_loss": float(sums[0]) / total,
        "reg_loss": float(sums[1]) / total if reg is not None else None,
        "train_seconds": train_seconds,
        "epoch_end_seconds": epoch_end_seconds,
        "skipped_steps": int(skipped),
        "steps": k,
        "completed": completed,
    }


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: torch.utils.data.DataLoader, device: torch.device, num_classes: int,
    beta: float = 1.0, positive_class: int = 1, num_groups: int = 2, keep_images: int = 0,
    segmentation: bool = False, precision: str = "fp32",
) -> dict[str, Any]:  # fmt: skip
    """Task metrics overall and per shape group, from confusion matrices accumulated over the
    whole split and summed over processes (classification: accuracy; segmentation: mIoU, pixel
    acc., mean class acc., fwIoU); F-beta of the shape node's decisions ``u > 0`` for
    ``positive_class``. With ``keep_images > 0`` (segmentation) the first images, predictions and
    labels are returned under ``"_images"``."""
    model.eval()
    dtype = autocast_dtype(precision)
    confusion = (GroupedSegmentationConfusion(num_classes, num_groups) if segmentation
                 else GroupedConfusion(num_classes, num_groups))  # fmt: skip
    decisions = torch.zeros(3, dtype=torch.int64)  # tp, fn, fp of u > 0
    kept = []
    for batch in loader:
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            logits, u = model(batch["image"].to(device))
        pred = logits.argmax(1)
        if segmentation:
            confusion.update(batch["label"].to(device), pred, batch["shape"])
            if sum(len(k[0]) for k in kept) < keep_images:
                kept.append((batch["image"][:keep_images], pred[:keep_images].cpu(),
                             batch["label"][:keep_images]))  # fmt: skip
        else:
            confusion.update(batch["label"], pred.cpu(), batch["shape"])
        above = (u if u.dim() == 1 else u[:, positive_class]).float().cpu() > 0
        pos = batch["shape"] == positive_class
        decisions += torch.stack([(above & pos).sum(), (~above & pos).sum(), (above & ~pos).sum()])
    confusion.cm = distributed.all_reduce_(confusion.matrices().to(device)).cpu()
    tp, fn, fp = distributed.all_reduce_(decisions.to(device)).tolist()
    out: dict[str, Any] = confusion.summary()
    out["shape_fbeta"] = fbeta_from_counts(tp, fn, fp, beta)
    if kept:
        out["_images"] = tuple(torch.cat(parts)[:keep_images] for parts in zip(*kept, strict=True))
    return out


def run_folder(cfg: Config) -> Path:
    """``train.out`` (must be new or empty), else ``runs/<experiment>/<tag>[-k]`` (first free)."""
    if cfg.train.out is not None:
        out = Path(cfg.train.out)
        if out.exists() and any(out.iterdir()):
            raise ValueError(
                f"train.out {str(out)!r} exists and is not empty; choose a new folder or delete it"
            )
        out.mkdir(parents=True, exist_ok=True)
        return out
    r = cfg.regularizer
    tag = "baseline" if r.name == "none" else f"fbeta-a{r.alpha:g}-{r.projection}"
    base = Path("runs") / cfg.experiment / f"{tag}-seed{cfg.train.seed}"
    out, k = base, 1
    while out.exists() and any(out.iterdir()):
        k += 1
        out = base.with_name(f"{base.name}-{k}")
    out.mkdir(parents=True, exist_ok=True)
    return out


def run(cfg: Config, log: Callable[..., object] = print, resume: str | Path | None = None
        ) -> dict[str, Any]:  # fmt: skip
    """Train ``cfg`` end to end (or continue the run folder ``resume`` from its latest
    checkpoint); returns what ``metrics.json`` holds. Under ``torchrun`` every process calls this;
    only rank 0 logs and writes files."""
    already = distributed.is_initialized()
    ctx = distributed.init_from_env(cfg.train.device)
    try:
        return _run(cfg, log if ctx.is_main else (lambda *_: None), resume, ctx)
    finally:
        if not already:
            distributed.shutdown()


def _run(cfg: Config, log: Callable[..., object], resume: str | Path | None,
         ctx: distributed.Context) -> dict[str, Any]:  # fmt: skip
    # --- setup: run folder, seeds, data, model, regularizer, optimizer, logger ---------------------
    if cfg.data.batch_size % ctx.world:
        raise ValueError(f"data.batch_size {cfg.data.batch_size} (the global batch) must be "
                         f"divisible by the number of processes {ctx.world}")  # fmt: skip
    state = None
    if resume is not None:
        out = Path(resume)
        found = checkpoint.latest(out)
        if found is None:
            raise ValueError(
                f"--resume {str(out)!r}: no readable checkpoint in {out / 'checkpoints'}"
            )
        log(f"resuming from {found[0]}")
        state = found[1]
    else:
        out = distributed.broadcast_path(run_folder(cfg) if ctx.is_main else None)
        if ctx.is_main:
            config_mod.save(cfg, out / "config.yaml")
    if cfg.train.num_threads is not None:
        torch.set_num_threads(cfg.train.num_threads)
    seed_everything(cfg.train.seed)
    device = resolve_device(cfg.train.device, ctx.local_rank if ctx.enabled else None)
    data = load_data(cfg.data, cfg.train.seed)
    shape_scores = _shape_scores(cfg.regularizer.positive_classes)
    model = build_model(cfg.model, data.image_shape, data.num_classes, shape_scores).to(device)
    reg = build_regularizer(cfg, data.train_shape_labels)
    if reg is not None:
        reg = reg.to(device)
    optimizer = build_optimizer(cfg, model, reg)
    train_loader = make_loader(data.train, cfg.data.batch_size // ctx.world, shuffle=True,
                               seed=cfg.train.seed, num_workers=cfg.data.num_workers,
                               rank=ctx.rank, world=ctx.world, distributed=ctx.enabled)  # fmt: skip
    test_loader = make_loader(data.test, cfg.data.eval_batch_size, shuffle=False,
                              num_workers=cfg.data.num_workers, rank=ctx.rank, world=ctx.world,
                              distributed=ctx.enabled)  # fmt: skip
    scheduler = build_scheduler(cfg, optimizer, len(train_loader))
    scaler = torch.amp.GradScaler(device.type) if cfg.train.precision == "fp16" else None
    net = model
    if ctx.enabled:  # gradients of the network averaged by DDP; of (eps, tau) by the step
        net = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=reg is None,  # the baseline never uses the shape head
        )  # fmt: skip
    segmentation = cfg.data.kind == "cocostuff"
    num_groups = max(2, int(data.train_shape_labels.max()) + 1)
    written = torch.zeros(len(data.train), dtype=torch.bool) if ctx.enabled and reg else None
    history: list[dict[str, Any]] = []
    epochs_done = step_in_epoch = global_step = skipped_total = 0
    epoch_totals: Tensor | None = None  # resuming mid-epoch: that epoch's loss sums so far
    sampler = train_loader.sampler.sampler  # batch_size=None: .sampler is the batch sampler
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if scheduler is not None:
            scheduler.load_state_dict(state["scheduler"])
        if scaler is not None:
            scaler.load_state_dict(state["scaler"])
        if reg is not None:
            reg.load_state_dict(state["regularizer"])
        history = state["history"]
        epochs_done, step_in_epoch = state["epoch"], state["step_in_epoch"]
        global_step, skipped_total = state["global_step"], state["skipped_steps"]
        if hasattr(sampler, "generator") and sampler.generator is not None:
            sampler.generator.set_state(state["sampler_generator"])
        checkpoint.set_rng_state(state["rng"])
        if step_in_epoch and state.get("epoch_totals") is not None:  # the interrupted epoch's sums
            epoch_totals = state["epoch_totals"].to(device, torch.float64)
            if not ctx.is_main:  # they are over all processes already: count them once
                epoch_totals[:3] = 0
    from torch.utils.tensorboard import SummaryWriter  # slow import: only when training

    writer = SummaryWriter(str(out / "tb"), purge_step=epochs_done + 1) if ctx.is_main else None
    alpha = cfg.regularizer.alpha
    log(f"run folder {out}; {len(data.train)} train / {len(data.test)} test samples; device "
        f"{device}; {ctx.world} process(es); precision {cfg.train.precision}")  # fmt: skip
    if reg is not None:
        log(f"regularizer: alpha={alpha:g} {reg.extra_repr()}")

    def save(epoch_done: int, in_epoch: int, epoch_start_state: Tensor | None,
             totals: Tensor | None = None) -> str:  # fmt: skip
        if written is not None and in_epoch:  # mid-epoch: every rank's scores into the state
            distributed.sync_scores_(reg, written)
            written.zero_()
        if totals is not None:  # mid-epoch: the epoch's loss sums so far, over all processes
            totals = totals.clone()
            totals[:3] = distributed.all_reduce_(totals[:3].clone())
        path = checkpoint.path_for(out, global_step)
        if ctx.is_main and cfg.train.checkpoint:
            path.parent.mkdir(exist_ok=True)
            checkpoint.save_atomic({
                "format": 2, "epoch": epoch_done, "step_in_epoch": in_epoch,
                "global_step": global_step, "skipped_steps": skipped_total,
                "config": cfg.to_dict(), "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": None if scheduler is None else scheduler.state_dict(),
                "scaler": None if scaler is None else scaler.state_dict(),
                "regularizer": None if reg is None else reg.state_dict(),
                "rng": checkpoint.rng_state(), "sampler_generator": epoch_start_state,
                "history": history, "epoch_totals": None if totals is None else totals.cpu(),
            }, path)  # fmt: skip
            checkpoint.prune(out, cfg.train.keep_checkpoints)
        return str(path) if cfg.train.checkpoint else "none (train.checkpoint is false)"

    # --- epochs ----------------------------------------------------------------------------------
    last_checkpoint = "none yet" if state is None else str(found[0])
    stop = False
    summary = _final(history, cfg) if history else {}
    for epoch in range(epochs_done + 1, cfg.train.epochs + 1):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)  # DistributedSampler: the epoch's permutation
        generator = getattr(sampler, "generator", None)
        epoch_start = generator.get_state() if generator is not None else None

        control = StepControl(
            precision=cfg.train.precision, scaler=scaler,
            skip_nonfinite=cfg.train.nonfinite == "skip", skip_batches=step_in_epoch,
            written=written, where=f"epoch {epoch}", last_checkpoint=last_checkpoint,
            totals=epoch_totals,
        )  # fmt: skip
        step_in_epoch, epoch_totals = 0, None

        def on_step(k: int, epoch: int = epoch, epoch_start: Tensor | None = epoch_start,
                    control: StepControl = control) -> bool:  # fmt: skip
            nonlocal global_step, last_checkpoint, stop
            global_step += 1
            every, limit = cfg.train.checkpoint_every, cfg.train.stop_after_steps
            stop = limit is not None and global_step >= limit
            if (every and global_step % every == 0) or (stop and k < len(train_loader)):
                last_checkpoint = save(epoch - 1, k, epoch_start, control.totals)
                control.last_checkpoint = last_checkpoint  # named if a later step goes non-finite
            return stop

        control.on_step = on_step
        train_stats = train_one_epoch(net, reg, alpha, optimizer, train_loader, device,
                                      scheduler=scheduler, control=control,
                                      progress=cfg.train.progress and ctx.is_main,
                                      desc=f"epoch {epoch}")  # fmt: skip
        skipped_total += train_stats.pop("skipped_steps")
        if not train_stats.pop("completed"):
            log(f"stopped after global step {global_step} (train.stop_after_steps); "
                f"checkpoint {last_checkpoint}")  # fmt: skip
            break
        start = time.perf_counter()
        test_stats = evaluate(model, test_loader, device, data.num_classes, cfg.regularizer.beta,
                              positive_class=cfg.regularizer.positive_classes[0],
                              num_groups=num_groups, keep_images=cfg.train.log_images,
                              segmentation=segmentation, precision=cfg.train.precision)  # fmt: skip
        eval_seconds = time.perf_counter() - start
        images = test_stats.pop("_images", None)
        row = {"epoch": epoch, **train_stats, "eval_seconds": eval_seconds,
               "skipped_steps_total": skipped_total}  # fmt: skip
        row |= {f"test_{k}": v for k, v in test_stats.items()}
        if reg is not None:
            row |= {f"reg_{k}": v for k, v in reg.stats().items() if not isinstance(v, list)}
        history.append(row)
        summary = _final(history, cfg)
        if ctx.is_main:
            if images is not None:
                log_segmentation_images(writer, *images, data.num_classes, epoch)
            for k, v in row.items():
                if isinstance(v, int | float) and k != "epoch" and math.isfinite(v):
                    writer.add_scalar(k.replace("_", "/", 1), v, epoch)
            writer.flush()
            checkpoint.write_text_atomic(json.dumps(summary, indent=2) + "\n", out / "metrics.json")
        next_start = generator.get_state() if generator is not None else None
        last_checkpoint = save(epoch, 0, next_start)
        log(_epoch_line(row))
        if stop:
            log(f"stopped after global step {global_step} (train.stop_after_steps)")
            break
    if writer is not None:
        writer.close()
    return summary


def colorize(labels: Tensor, num_classes: int) -> Tensor:
    """``(B, H, W)`` class indices -> uint8 ``(B, 3, H, W)``: a fixed color per class (a seeded
    palette, the same in every run), black for the ignore index."""
    palette = torch.randint(40, 256, (num_classes + 1, 3), dtype=torch.uint8,
                            generator=torch.Generator().manual_seed(0))  # fmt: skip
    palette[num_classes] = 0
    labels = labels.long()
    idx = torch.where(labels == IGNORE_INDEX, num_classes, labels.clamp(0, num_classes - 1))
    return palette[idx].permute(0, 3, 1, 2)


def log_segmentation_images(
    writer: Any, image: Tensor, pred: Tensor, label: Tensor, num_classes: int, epoch: int
) -> None:
    """TensorBoard: input | prediction | ground truth, side by side, one row per image."""
    rows = torch.cat([image, colorize(pred, num_classes), colorize(label, num_classes)], dim=3)
    writer.add_images("val/input_prediction_truth", rows, epoch, dataformats="NCHW")


def _final(history: list[dict[str, Any]], cfg: Config) -> dict[str, Any]:
    last = history[-1]
    final = {k: last[k] for k in last if k.startswith("test_") or k.startswith("reg_")}
    final["epochs"] = last["epoch"]
    final["train_seconds_total"] = sum(h["train_seconds"] for h in history)
    final["epoch_end_seconds_total"] = sum(h["epoch_end_seconds"] for h in history)
    return {"config": cfg.to_dict(), "final": final, "history": history}


def _epoch_line(row: dict[str, Any]) -> str:
    def f(v: Any, spec: str = ".4f") -> str:
        return "n/a" if v is None else format(v, spec)

    metric = "miou" if "test_miou" in row else "accuracy"
    line = (
        f"epoch {row['epoch']:3d}  loss {row['train_loss']:.4f}  {metric} "
        f"{f(row[f'test_{metric}'])}  small {f(row[f'test_{metric}_small'])}"
        f"  big {f(row[f'test_{metric}_big'])}"
        f"  shape-F1 {f(row['test_shape_fbeta'], '.3f')}  {row['train_seconds']:.1f}s"
    )
    if "reg_eps" in row:
        line += (
            f"  | eps {row['reg_eps']:.3f} mu {row['reg_mu']:.3f} bound "
            f"{f(row['reg_certified_fbeta'], '.3f')} proj {row['reg_projections']}"
        )
    return line
