"""What the training loop trains with: :func:`setup` builds it from the config, in order (the
checkpoint to resume from, seeds, device, data, task loss, model, regularizer, optimizer, loaders,
group weighting, schedule, compilation, data parallelism, the train state restored from the
checkpoint, and last the new run's folder), into one :class:`Setup`. A start that fails on its
inputs (no data, a model that cannot be built, no readable checkpoint) has written nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from reparam import ReparamRegularizer

from . import checkpoint, distributed, sharded_state
from . import config as config_mod
from .build import (
    build_optimizer,
    build_regularizer,
    build_scheduler,
    resolve_device,
    run_folder,
    seed_everything,
    shape_score_columns,
)
from .config import Config
from .data import DataBundle, load_data, make_loader
from .groups import GroupWeighting
from .losses import TaskLoss, build_task_loss
from .models import build_model
from .state import TrainState, check_format


@dataclass
class Setup:
    """What the loop trains with: built by :func:`setup` from the config (and a checkpoint)."""

    out: Path
    device: torch.device
    data: DataBundle
    model: nn.Module  # the network; ``net`` is what the steps call (DDP-wrapped under torchrun)
    net: nn.Module
    reg: nn.Module | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    scaler: torch.amp.GradScaler | None
    train_loader: DataLoader
    test_loader: DataLoader
    val_loader: DataLoader | None  # the selection split, when it is not the reported one
    groups: GroupWeighting | None  # train.group_weighting
    state: TrainState
    written: Tensor | None  # bool (N,): samples whose score this process wrote since the last merge
    pixel_classes: list[int] | None  # target pixels: the classes whose margins the objective scores
    last_checkpoint: str
    reg_params: list[nn.Parameter]  # their gradients are averaged over processes after backward
    criterion: TaskLoss | None = None  # train.loss / class_weights; None: task_loss's cross-entropy


def setup(
    cfg: Config, ctx: distributed.Context, resume: str | Path | None, log: Callable[..., object]
) -> Setup:
    """Seeds, data, model, regularizer, optimizer, loaders and the train state (restored from the
    newest readable checkpoint of ``resume``), in that order; then, for a new run, its folder
    (created once all of that worked: a failed start leaves nothing on disk)."""
    if cfg.data.batch_size % ctx.world:
        raise ValueError(
            f"data.batch_size {cfg.data.batch_size} (the global batch) must be "
            f"divisible by the number of processes {ctx.world}"
        )
    found = _resume_point(resume, log) if resume is not None else None
    if resume is None and ctx.is_main:
        run_folder(cfg, create=False)  # train.out not empty: the error before the data is read
    if cfg.train.num_threads is not None:
        torch.set_num_threads(cfg.train.num_threads)
    seed_everything(cfg.train.seed)
    device = resolve_device(cfg.train.device, ctx.local_rank if ctx.enabled else None)
    pixels = cfg.regularizer.target == "pixels" and cfg.regularizer.name != "none"
    data = load_data(cfg.data, cfg.train.seed, pixel_index=pixels)
    _check_threshold_split(cfg, data)
    criterion = build_task_loss(cfg, data)
    shape_columns = shape_score_columns(cfg.regularizer.positive_classes())
    model = build_model(cfg.model, data.image_shape, data.num_classes, shape_columns).to(device)
    # target pixels: the samples are the training pixels, each image a group (grouped F-beta)
    labels, groups = data.train.pixel_problem() if pixels else (data.train_shape_labels, None)
    # regularizer.shard: this process holds the state of its block of the samples only
    # (target pixels: blocks of whole images, so that no image's problem is split)
    unit = len(labels) // len(data.train) if pixels else 1
    shard = sharded_state.regularizer_shard(cfg, ctx, len(labels), unit)
    if shard is not None:
        labels = shard.local_labels(labels)
        groups = None if groups is None else shard.local_labels(groups)
    reg = build_regularizer(cfg.regularizer, labels, groups, shard)
    del labels, groups  # (target pixels: O(pixels), held by the regularizer's shard only)
    reg = reg.to(device) if reg is not None else None
    optimizer = build_optimizer(cfg, model, reg)
    if reg is not None:  # its per-row state steps with the optimizer (and, with several
        reg.attach(optimizer)  # processes, a reparameterized objective stays equal on each)
    train_loader, test_loader, val_loader = _loaders(cfg, data, ctx, shard)
    weighting = _group_weighting(cfg, data, ctx, device)
    scheduler = build_scheduler(cfg, optimizer, len(train_loader))
    scaler = torch.amp.GradScaler(device.type) if cfg.train.precision == "fp16" else None
    if cfg.train.compile:
        compile_(model, reg)
    # gradients of the network averaged by DDP; of (eps, tau) after backward
    net = _data_parallel(model, ctx, device, find_unused=reg is None or pixels)
    sampler = train_loader.sampler.sampler  # batch_size=None: .sampler is the batch sampler
    generator = getattr(sampler, "generator", None)
    state = TrainState(
        cfg.to_dict(), model, optimizer, scheduler, scaler, reg, generator, groups=weighting
    )
    if found is not None:
        resharded = sharded_state.restore(found[0], found[1], ctx, shard, reg)  # this rank's
        if resharded is not None and ctx.is_main:  # block, from another number of processes
            log(resharded)
        for path in sharded_state.unfinished(found[0]) if shard is not None and ctx.is_main else ():
            log(f"skipped {path.name}: a checkpoint whose write did not finish (removed)")
            path.unlink(missing_ok=True)
        state.load_state_dict(found[1])
        if state.totals is not None and not ctx.is_main:
            state.totals[:3] = 0  # the saved sums are over all processes already: count them once
    # each process remembers the scores of its own samples; they are merged before a dual step
    # (sharded: each process holds and writes its own samples' scores; nothing to merge)
    # (a reparameterized objective exchanges its gradients and scores in attach's hook)
    merged = ctx.enabled and reg is not None and shard is None
    merged = merged and not isinstance(reg, ReparamRegularizer)
    out = Path(resume) if resume is not None else _new_run_folder(cfg, ctx)
    return Setup(
        out=out,
        device=device,
        data=data,
        model=model,
        net=net,
        reg=reg,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=scaler,
        train_loader=train_loader,
        test_loader=test_loader,
        val_loader=val_loader,
        groups=weighting,
        state=state,
        written=torch.zeros(reg.n_samples, dtype=torch.bool, device=device) if merged else None,
        pixel_classes=cfg.regularizer.positive_classes() if pixels else None,
        last_checkpoint="none yet" if found is None else str(found[0]),
        reg_params=list(reg.parameters()) if merged else [],
        criterion=criterion.to(device) if criterion is not None else None,
    )


def _resume_point(resume: str | Path, log: Callable[..., object]) -> tuple[Path, dict]:
    """The newest usable checkpoint of the run folder ``resume`` (path, state); each file skipped
    (truncated, corrupt, not a checkpoint of this project) is one ``warning:`` line of ``log``."""
    out, skipped = Path(resume), []

    def skip(line: str) -> None:
        skipped.append(line)
        log(f"warning: {line}")

    found = checkpoint.latest(out, check=check_format, skipped=skip)
    if found is None:
        why = f" ({len(skipped)} unusable, each named in a warning)" if skipped else ""
        raise ValueError(
            f"--resume {str(out)!r}: no readable checkpoint in {out / 'checkpoints'}{why}"
        )
    log(f"resuming from {found[0]}")
    return found


def _new_run_folder(cfg: Config, ctx: distributed.Context) -> Path:
    """A new run's folder (rank 0 chooses and creates it, and saves the resolved config in it)."""
    out = distributed.broadcast_path(run_folder(cfg) if ctx.is_main else None)
    if ctx.is_main:
        config_mod.save(cfg, out / "config.yaml")
    return out


def _check_threshold_split(cfg: Config, data: DataBundle) -> None:
    """``train.shape_threshold=val`` needs a val split with a positive of the shape class."""
    if cfg.train.shape_threshold != "val":
        return
    if data.val is None:
        raise ValueError(
            "train.shape_threshold=val needs a val split: set data.val_fraction (S-MNIST), or "
            "use a segmentation cache with a test split (CamVid), whose val split selects"
        )
    positive = cfg.regularizer.positive_classes()[0]
    if not bool((data.val.shape_labels == positive).any()):
        raise ValueError(
            f"train.shape_threshold=val: the val split ({len(data.val)} samples) has no "
            f"sample of shape class {positive}, so no threshold can meet the target there"
        )


def _loaders(
    cfg: Config, data: DataBundle, ctx: distributed.Context, shard: object
) -> tuple[DataLoader, DataLoader | None, DataLoader | None]:
    """The training loader (this process's share of the global batch; a sharded state with
    owner sampling: from this process's block) and the test and val loaders."""
    owner = shard is not None and shard.sampling == "owner"
    train = make_loader(
        data.train,
        cfg.data.batch_size // ctx.world,
        shuffle=True,
        seed=cfg.train.seed,
        num_workers=cfg.data.num_workers,
        rank=ctx.rank,
        world=ctx.world,
        distributed=ctx.enabled,
        block=tuple(b // shard.unit for b in shard.bounds()) if owner else None,  # (images)
    )
    test, val = (
        None
        if ds is None
        else make_loader(
            ds,
            cfg.data.eval_batch_size,
            shuffle=False,
            num_workers=cfg.data.num_workers,
            rank=ctx.rank,
            world=ctx.world,
            distributed=ctx.enabled,
        )
        for ds in (data.test, data.val)
    )
    return train, test, val


def _group_weighting(
    cfg: Config, data: DataBundle, ctx: distributed.Context, device: torch.device
) -> GroupWeighting | None:
    """``train.group_weighting``'s weights of the shape groups (``None``: none)."""
    if cfg.train.group_weighting == "none":
        return None
    return GroupWeighting(
        cfg.train.group_weighting,
        data.train_shape_labels,
        num_groups(data),
        cfg.train.dro_step,
        distributed.all_reduce_ if ctx.enabled else None,
        ctx.world,
    ).to(device)


def _data_parallel(
    model: nn.Module, ctx: distributed.Context, device: torch.device, find_unused: bool
) -> nn.Module:
    """What the steps call: the model, wrapped in DDP under several processes (the shape head is
    unused by the baseline and by an objective on the pixels: ``find_unused``)."""
    if not ctx.enabled:
        return model
    return nn.parallel.DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        find_unused_parameters=find_unused,
    )


def num_groups(data: DataBundle) -> int:
    """Shape groups: at least small / big, more with p > 2 shape bins."""
    return max(2, int(data.train_shape_labels.max()) + 1)


def compile_(model: nn.Module, reg: nn.Module | None) -> None:
    """``train.compile``: ``torch.compile`` the network in place (``nn.Module.compile``: the
    ``state_dict`` keys stay the eager ones, no ``_orig_mod.``; called before DDP wraps it, the order
    the torch.compile docs recommend), and a reparameterized objective with its ``compile()``: its
    whole per-step path, forward (with its backward) and ``after_step_``, one graph each
    (docs/method/cost.md sec. 11b). The minibatch baselines stay eager (``nn.Module.compile`` would trace
    their solvers). The optimizer stays eager: torch's optimizers break the graph around their step,
    and the lr schedule changes the lr every step."""
    model.compile()
    if isinstance(reg, ReparamRegularizer):
        reg.compile()
