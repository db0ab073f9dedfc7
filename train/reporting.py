"""What the loop reports: the epoch's console line, TensorBoard scalars and images, ``metrics.json``."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from .caches.segmentation import IGNORE
from .config import Config


def selected_epoch(history: list[dict[str, Any]]) -> int | None:
    """The epoch a run reports: the best ``val_miou`` (``val_accuracy``) when the data set has a
    selection split (ties: the earlier epoch), else the last epoch."""
    if not history:
        return None
    key = next((k for k in ("val_miou", "val_accuracy") if history[-1].get(k) is not None), None)
    if key is None:
        return history[-1]["epoch"]
    best = max(history, key=lambda h: (-math.inf if h.get(key) is None else h[key], -h["epoch"]))
    return best["epoch"]


def summary(history: list[dict[str, Any]], cfg: Config) -> dict[str, Any]:
    """What ``metrics.json`` holds: the config, the last epoch's test, val and regularizer numbers
    with total times (``final``), the same numbers at the selected epoch (``selected``: the best
    val epoch where the data set has a val split besides test, else the last), and every epoch's row
    (``history``)."""
    if not history:
        return {}

    def figures(row: dict[str, Any]) -> dict[str, Any]:
        return {k: row[k] for k in row if k.startswith(("test_", "val_", "reg_", "group_"))}

    last = history[-1]
    final = figures(last)
    final["epochs"] = last["epoch"]
    final["train_seconds_total"] = sum(h["train_seconds"] for h in history)
    final["epoch_end_seconds_total"] = sum(h["epoch_end_seconds"] for h in history)
    chosen = selected_epoch(history)
    selected = figures(next(h for h in history if h["epoch"] == chosen)) | {"epoch": chosen}
    return {"config": cfg.to_dict(), "final": final, "selected": selected, "history": history}


def epoch_line(row: dict[str, Any]) -> str:
    """One console line per epoch: loss, the task metric overall / small / big, the shape node's
    test F1 / precision / recall / AUC, the training time, and the regularizer's own figures."""

    def f(v: Any, spec: str = ".4f") -> str:
        return "n/a" if v is None else format(v, spec)

    metric = "miou" if "test_miou" in row else "accuracy"
    line = (
        f"epoch {row['epoch']:3d}  loss {row['train_loss']:.4f}  {metric} "
        f"{f(row[f'test_{metric}'])}  small {f(row[f'test_{metric}_small'])}"
        f"  big {f(row[f'test_{metric}_big'])}  shape F1/P/R/AUC "
        + "/".join(
            f(row.get(f"test_shape_{k}"), ".3f") for k in ("fbeta", "precision", "recall", "auc")
        )
        + f"  {row['train_seconds']:.1f}s"
    )
    if row.get(f"val_{metric}") is not None:
        line += f"  val {row[f'val_{metric}']:.4f}"
    figures = (
        ("reg_eps", "eps", ".3f"),
        ("reg_mu", "mu", ".3f"),
        ("reg_nu", "nu", ".3f"),
        ("reg_certified_fbeta", "bound", ".3f"),
        ("reg_certified_recall", "cert. R", ".3f"),
        ("reg_certified_precision", "cert. P", ".3f"),
        ("reg_train_auc", "train AUC", ".3f"),
        ("reg_certified_auc", "cert. AUC", ".3f"),
    )
    shown = [f"{name} {f(row[key], spec)}" for key, name, spec in figures if key in row]
    if shown:
        line += "  | " + " ".join(shown)
    if "reg_projections" in row:
        line += f" proj {row['reg_projections']}"
    return line


def warnings(row: dict[str, Any], regularizer: str | None, on_shape_node: bool = True) -> list[str]:
    """What the epoch's figures say is wrong with the regularizer (``regularizer``: its name, or
    ``None`` without one): its own inertness diagnosis (``reg_inert``, from ``stats()``), else a
    shape node that decides one group for every test sample (only when the regularizer trains
    the shape node: ``on_shape_node``)."""
    if regularizer is None:
        return []
    if row.get("reg_inert"):
        return [f"the regularizer looks inert: {row['reg_inert']}"]
    if not on_shape_node:
        return []
    rate = row.get("test_shape_positive_rate")
    if rate in (0.0, 1.0):
        side = "big" if rate else "small"
        return [
            f"the shape node decides {side!r} for every test sample: the regularizer "
            f"({regularizer}) has not trained it to separate the groups (see its reg_* figures; "
            "a larger alpha, more epochs, or another objective)"
        ]
    return []


def log_scalars(writer: Any, row: dict[str, Any], epoch: int) -> None:
    """Every finite number of the row, as ``train/loss``, ``test/accuracy``, ``reg/eps``, ..."""
    for k, v in row.items():
        if isinstance(v, int | float) and k != "epoch" and math.isfinite(v):
            writer.add_scalar(k.replace("_", "/", 1), v, epoch)


def class_palette(num_classes: int) -> Tensor:
    """uint8 ``(num_classes + 1, 3)``: a fixed colour per class (a seeded palette, the same in every
    run and for every data set), then black (the ignore index's)."""
    palette = torch.randint(
        40, 256, (num_classes + 1, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )
    palette[num_classes] = 0
    return palette


def colorize(labels: Tensor, num_classes: int) -> Tensor:
    """``(B, H, W)`` class indices -> uint8 ``(B, 3, H, W)``: a fixed color per class
    (:func:`class_palette`), black for the ignore index."""
    palette = class_palette(num_classes)
    labels = labels.long()
    idx = torch.where(labels == IGNORE, num_classes, labels.clamp(0, num_classes - 1))
    return palette[idx].permute(0, 3, 1, 2)


def log_segmentation_images(
    writer: Any, image: Tensor, pred: Tensor, label: Tensor, num_classes: int, epoch: int
) -> None:
    """TensorBoard: input | prediction | ground truth, side by side, one row per image."""
    rows = torch.cat([image, colorize(pred, num_classes), colorize(label, num_classes)], dim=3)
    writer.add_images("val/input_prediction_truth", rows, epoch, dataformats="NCHW")
