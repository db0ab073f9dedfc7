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
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from reparam import FBetaRegularizer
from reparam.functional import fbeta_of_decisions

from . import checkpoint
from . import config as config_mod
from .config import Config
from .data import IGNORE_INDEX, load_data, make_loader
from .metrics import GroupedConfusion, GroupedSegmentationConfusion
from .models import build_model


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002  (seeds the legacy global state that libraries use)
    torch.manual_seed(seed)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
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


def train_one_epoch(
    model: nn.Module,
    reg: FBetaRegularizer | None,
    alpha: float,
    optimizer: torch.optim.Optimizer,
    loader: torch.utils.data.DataLoader,
    device: torch.device,
    *,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    progress: bool = False,
    desc: str = "train",
) -> dict[str, float]:
    """One pass over ``loader`` then the regularizer's epoch end; returns losses and timings."""
    model.train()
    task_sum = reg_sum = 0.0
    n = 0
    start = time.perf_counter()
    for batch in tqdm(loader, desc=desc, leave=False, disable=None if progress else True):
        x, y = batch["image"].to(device), batch["label"].to(device)
        logits, u = model(x)
        task = task_loss(logits, y)
        loss = task
        if reg is not None:
            reg_loss = reg(u, batch["index"].to(device))
            loss = task + alpha * reg_loss
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite loss {float(loss)} (task {float(task)})")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        if reg is not None:
            reg.after_step_()
            reg_sum += float(reg_loss.detach()) * len(y)
        task_sum += float(task.detach()) * len(y)
        n += len(y)
    train_seconds = time.perf_counter() - start
    start = time.perf_counter()
    if reg is not None:
        reg.end_epoch_()
    epoch_end_seconds = time.perf_counter() - start
    return {
        "train_loss": task_sum / max(n, 1),
        "reg_loss": reg_sum / max(n, 1) if reg is not None else None,
        "train_seconds": train_seconds,
        "epoch_end_seconds": epoch_end_seconds,
    }


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: torch.utils.data.DataLoader, device: torch.device, num_classes: int,
    beta: float = 1.0, positive_class: int = 1, num_groups: int = 2, keep_images: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """Task metrics overall and per shape group, from confusion matrices accumulated over the
    whole split (classification: accuracy; segmentation: mIoU, pixel acc., mean class acc.,
    fwIoU); F-beta of the shape node's decisions ``u > 0`` for ``positive_class``. With
    ``keep_images > 0`` (segmentation) the first images, predictions and labels are returned
    under ``"_images"``."""
    model.eval()
    confusion: GroupedConfusion | GroupedSegmentationConfusion | None = None
    u_all, s_all, kept = [], [], []
    for batch in loader:
        logits, u = model(batch["image"].to(device))
        pred = logits.argmax(1)
        if confusion is None:
            confusion = (GroupedSegmentationConfusion(num_classes, num_groups) if pred.dim() == 3
                         else GroupedConfusion(num_classes, num_groups))  # fmt: skip
        if pred.dim() == 3:
            confusion.update(batch["label"].to(device), pred, batch["shape"])
            if sum(len(k[0]) for k in kept) < keep_images:
                kept.append((batch["image"][:keep_images], pred[:keep_images].cpu(),
                             batch["label"][:keep_images]))  # fmt: skip
        else:
            confusion.update(batch["label"], pred.cpu(), batch["shape"])
        u_all.append((u if u.dim() == 1 else u[:, 0]).float().cpu())
        s_all.append(batch["shape"])
    u, s = torch.cat(u_all), torch.cat(s_all)
    out: dict[str, Any] = confusion.summary()
    pos = s == positive_class
    out["shape_fbeta"] = float(fbeta_of_decisions(u[pos], u[~pos], beta))
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


def run(cfg: Config, log=print) -> dict[str, Any]:
    """Train ``cfg`` end to end; returns what ``metrics.json`` holds."""
    # --- setup: run folder, seeds, data, model, regularizer, optimizer, logger ---------------------
    out = run_folder(cfg)
    config_mod.save(cfg, out / "config.yaml")
    if cfg.train.num_threads is not None:
        torch.set_num_threads(cfg.train.num_threads)
    seed_everything(cfg.train.seed)
    device = resolve_device(cfg.train.device)
    data = load_data(cfg.data)
    shape_scores = len(cfg.regularizer.positive_classes)
    model = build_model(cfg.model, data.image_shape, data.num_classes, shape_scores).to(device)
    reg = build_regularizer(cfg, data.train_shape_labels)
    if reg is not None:
        reg = reg.to(device)
    optimizer = build_optimizer(cfg, model, reg)
    train_loader = make_loader(data.train, cfg.data.batch_size, shuffle=True,
                               seed=cfg.train.seed, num_workers=cfg.data.num_workers)  # fmt: skip
    test_loader = make_loader(data.test, cfg.data.eval_batch_size, shuffle=False,
                              num_workers=cfg.data.num_workers)  # fmt: skip
    scheduler = build_scheduler(cfg, optimizer, len(train_loader))
    num_groups = max(2, int(data.train_shape_labels.max()) + 1)
    from torch.utils.tensorboard import SummaryWriter  # slow import: only when training

    writer = SummaryWriter(str(out / "tb"))
    alpha = cfg.regularizer.alpha
    log(
        f"run folder {out}; {len(data.train)} train / {len(data.test)} test samples; device {device}"
    )
    if reg is not None:
        log(f"regularizer: alpha={alpha:g} {reg.extra_repr()}")

    # --- epochs ----------------------------------------------------------------------------------
    history: list[dict[str, Any]] = []
    for epoch in range(1, cfg.train.epochs + 1):
        train_stats = train_one_epoch(model, reg, alpha, optimizer, train_loader, device,
                                      scheduler=scheduler, progress=cfg.train.progress,
                                      desc=f"epoch {epoch}")  # fmt: skip
        start = time.perf_counter()
        test_stats = evaluate(model, test_loader, device, data.num_classes, cfg.regularizer.beta,
                              positive_class=cfg.regularizer.positive_classes[0],
                              num_groups=num_groups, keep_images=cfg.train.log_images)  # fmt: skip
        eval_seconds = time.perf_counter() - start
        images = test_stats.pop("_images", None)
        if images is not None:
            log_segmentation_images(writer, *images, data.num_classes, epoch)
        row = {"epoch": epoch, **train_stats, "eval_seconds": eval_seconds}
        row |= {f"test_{k}": v for k, v in test_stats.items()}
        if reg is not None:
            row |= {f"reg_{k}": v for k, v in reg.stats().items() if not isinstance(v, list)}
        history.append(row)

        for k, v in row.items():
            if isinstance(v, int | float) and k != "epoch" and math.isfinite(v):
                writer.add_scalar(k.replace("_", "/", 1), v, epoch)
        writer.flush()
        summary = _final(history, cfg)
        checkpoint.write_text_atomic(json.dumps(summary, indent=2) + "\n", out / "metrics.json")
        if cfg.train.checkpoint:
            checkpoint.save_atomic(
                {"epoch": epoch, "config": cfg.to_dict(), "model": model.state_dict(),
                 "optimizer": optimizer.state_dict(),
                 "scheduler": None if scheduler is None else scheduler.state_dict(),
                 "regularizer": None if reg is None else reg.state_dict()},
                out / "checkpoint.pt",
            )  # fmt: skip
        log(_epoch_line(row))
    writer.close()
    return summary


def colorize(labels: Tensor, num_classes: int) -> Tensor:
    """``(B, H, W)`` class indices -> uint8 ``(B, 3, H, W)``: a fixed color per class (a seeded
    palette, the same in every run), black for the ignore index."""
    palette = torch.randint(40, 256, (num_classes + 1, 3), dtype=torch.uint8,
                            generator=torch.Generator().manual_seed(0))  # fmt: skip
    palette[num_classes] = 0
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
