"""The evaluation of a split: task metrics overall and per shape group, the shape node's metrics,
per-image IoUs (segmentation), summed or gathered over processes."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from reparam.functional import fbeta_from_counts, fbeta_of_decisions
from reparam.rate_functional import recall_precision, roc_auc

from . import distributed
from .build import autocast_dtype
from .data import IGNORE_INDEX
from .metrics import GroupedConfusion, GroupedSegmentationConfusion


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: torch.utils.data.DataLoader,
    device: torch.device,
    num_classes: int,
    beta: float = 1.0,
    positive_class: int = 1,
    num_groups: int = 2,
    keep_images: int = 0,
    segmentation: bool = False,
    precision: str = "fp32",
    threshold: float | None = None,
    return_shape: bool = False,
) -> dict[str, Any]:
    """Task metrics overall and per shape group, from confusion matrices accumulated over the
    whole split and summed over processes (classification: accuracy; segmentation: mIoU, pixel
    acc., mean class acc., fwIoU); the shape node's metrics for ``positive_class`` against the
    rest: F-beta, precision and recall of its decisions ``u > 0`` (the learned threshold) and the
    ROC-AUC of its scores; with a ``threshold`` (the objective's learned ``decision_threshold``, or
    one chosen on val) also the F-beta, precision and recall of ``u > threshold``
    (``shape_*_at_threshold``). With ``return_shape`` the shape scores and positives are returned under ``"_shape"``.
    With ``keep_images > 0`` (segmentation) the first images, predictions
    and labels are returned under ``"_images"``."""
    model.eval()
    dtype = autocast_dtype(precision)
    confusion = (
        GroupedSegmentationConfusion(num_classes, num_groups)
        if segmentation
        else GroupedConfusion(num_classes, num_groups)
    )
    shape_scores, shape_positive = [], []
    kept, per_image, indices = [], [], []
    for batch in loader:
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            logits, u = model(batch["image"].to(device))
        pred = logits.argmax(1)
        if segmentation:
            label = batch["label"].to(device)
            confusion.update(label, pred, batch["shape"])
            per_image.append(per_image_iou(label, pred, num_classes).cpu())
            indices.append(batch["index"])
            if sum(len(k[0]) for k in kept) < keep_images:
                kept.append(
                    (
                        batch["image"][:keep_images],
                        pred[:keep_images].cpu(),
                        batch["label"][:keep_images],
                    )
                )
        else:
            confusion.update(batch["label"], pred.cpu(), batch["shape"])
        shape_scores.append((u if u.dim() == 1 else u[:, positive_class]).float().cpu())
        shape_positive.append(batch["shape"] == positive_class)
    confusion.cm = distributed.all_reduce_(confusion.matrices().to(device)).cpu()
    scores = distributed.all_gather_cat(torch.cat(shape_scores))  # every process's, for the AUC
    positive = distributed.all_gather_cat(torch.cat(shape_positive))
    u_pos, u_neg = scores[positive], scores[~positive]
    tp, fn, fp = int((u_pos > 0).sum()), int((u_pos <= 0).sum()), int((u_neg > 0).sum())
    out: dict[str, Any] = confusion.summary()
    out["shape_fbeta"] = fbeta_from_counts(tp, fn, fp, beta)
    recall, prec = recall_precision(u_pos, u_neg)
    out |= {"shape_precision": prec, "shape_recall": recall, "shape_auc": roc_auc(u_pos, u_neg)}
    out["shape_positive_rate"] = float((scores > 0).float().mean()) if len(scores) else None
    if threshold is not None:
        out |= shape_at_threshold(u_pos, u_neg, threshold, beta)
    if return_shape:  # for a threshold chosen on this split (train.loop)
        out["_shape"] = (scores, positive)
    if kept:
        out["_images"] = tuple(torch.cat(parts)[:keep_images] for parts in zip(*kept, strict=True))
    if per_image:  # in data-set order (the processes' shards interleave)
        index = distributed.all_gather_cat(torch.cat(indices))
        iou = distributed.all_gather_cat(torch.cat(per_image))
        order = torch.argsort(index)
        out["_per_image"] = {"index": index[order].numpy(), "iou": iou[order].numpy()}
    return out


def shape_at_threshold(u_pos: Tensor, u_neg: Tensor, threshold: float, beta: float) -> dict:
    """The F-beta, precision and recall of the shape node's decisions ``u > threshold``."""
    recall, prec = recall_precision(u_pos - threshold, u_neg - threshold)
    return {
        "shape_fbeta_at_threshold": fbeta_of_decisions(u_pos - threshold, u_neg - threshold, beta),
        "shape_precision_at_threshold": prec,
        "shape_recall_at_threshold": recall,
    }


def per_image_iou(label: Tensor, pred: Tensor, num_classes: int) -> Tensor:
    """float64 ``(B, C)``: IoU of each class in each image over its labelled pixels (NaN where the
    class is in neither the image's ground truth nor its prediction)."""
    b, c = label.shape[0], num_classes
    valid = label != IGNORE_INDEX
    image = torch.arange(b, device=label.device).view(-1, 1, 1).expand_as(label)
    flat = (image * c + label.long().clamp(0, c - 1)) * c + pred.long()
    cm = torch.bincount(flat[valid], minlength=b * c * c).view(b, c, c).double()
    tp = cm.diagonal(dim1=1, dim2=2)
    union = cm.sum(2) + cm.sum(1) - tp
    return torch.where(union > 0, tp / union.clamp_min(1), torch.nan)
