"""Evaluation metrics, each computed from one confusion matrix accumulated over the whole set.

Classification: ``C[t, p]`` = number of samples of true class ``t`` predicted ``p``; accuracy =
``trace(C) / sum(C)`` (micro average over samples). Per shape group (small ``s = 0`` / big
``s = 1``) the same from that group's matrix; ``gap = |acc_small - acc_big|``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def confusion_matrix(target: Tensor, pred: Tensor, num_classes: int) -> Tensor:
    """int64 ``(num_classes, num_classes)``, rows = true class, columns = prediction."""
    if target.shape != pred.shape:
        raise ValueError(
            f"target and pred must have the same shape, got {target.shape} and {pred.shape}"
        )
    flat = target.reshape(-1).long() * num_classes + pred.reshape(-1).long()
    return torch.bincount(flat, minlength=num_classes**2).reshape(num_classes, num_classes)


def accuracy(cm: Tensor) -> float | None:
    """``trace / total``; ``None`` for an empty matrix (e.g. a group with no test sample)."""
    total = int(cm.sum())
    return int(cm.diagonal().sum()) / total if total else None


class GroupedConfusion:
    """Confusion matrices per shape group, accumulated batch by batch."""

    def __init__(self, num_classes: int, num_groups: int = 2) -> None:
        self.num_classes = num_classes
        self.cm = torch.zeros(num_groups, num_classes, num_classes, dtype=torch.int64)

    def update(self, target: Tensor, pred: Tensor, group: Tensor) -> None:
        for g in range(self.cm.shape[0]):
            m = group == g
            self.cm[g] += confusion_matrix(target[m].cpu(), pred[m].cpu(), self.num_classes)

    def matrices(self) -> Tensor:
        return self.cm

    def summary(self) -> dict[str, float | None]:
        small, big = accuracy(self.cm[0]), accuracy(self.cm[-1])
        return {
            "accuracy": accuracy(self.cm.sum(0)),
            "accuracy_small": small,
            "accuracy_big": big,
            "accuracy_gap": None if small is None or big is None else abs(small - big),
        }


# --- segmentation -------------------------------------------------------------------------------


def segmentation_confusion(
    target: Tensor, pred: Tensor, num_classes: int, ignore_index: int = 255
) -> Tensor:
    """int64 ``(C, C)`` over the pixels whose target is not ``ignore_index`` (rows = truth)."""
    if target.shape != pred.shape:
        raise ValueError(
            f"target and pred must have the same shape, got {target.shape} and {pred.shape}"
        )
    valid = target != ignore_index
    return confusion_matrix(target[valid], pred[valid], num_classes)


def segmentation_scores(cm: Tensor) -> dict[str, float | list[float | None] | None]:
    r"""The four COCO-Stuff numbers and the per-class IoU from one pixel confusion matrix ``C``.

    With ``TP_c = C[c, c]``, ``GT_c = \sum_p C[c, p]``, ``P_c = \sum_t C[t, c]``:
    ``IoU_c = TP_c / (GT_c + P_c - TP_c)``, defined for classes present in the ground truth or the
    prediction (``None`` otherwise); ``miou`` = mean over the defined ``IoU_c`` (standard; the
    paper's code divides differently); ``pixel_accuracy = \sum TP / \sum GT``;
    ``mean_class_accuracy`` = mean of ``TP_c / GT_c`` over classes with ``GT_c > 0``;
    ``fw_iou = \sum_c (GT_c / \sum GT) IoU_c`` (frequency-weighted). ``None`` for an empty matrix.
    """
    cm = cm.double()
    tp, gt, pr = cm.diagonal(), cm.sum(1), cm.sum(0)
    union = gt + pr - tp
    total = gt.sum()
    iou = torch.where(union > 0, tp / union.clamp_min(1), torch.nan)
    present = union > 0
    if total == 0:
        return {
            "miou": None,
            "pixel_accuracy": None,
            "mean_class_accuracy": None,
            "fw_iou": None,
            "iou": [None] * len(tp),
        }
    in_gt = gt > 0
    return {
        "miou": float(iou[present].mean()),
        "pixel_accuracy": float(tp.sum() / total),
        "mean_class_accuracy": float((tp[in_gt] / gt[in_gt]).mean()),
        "fw_iou": float((gt[present] / total * iou[present]).sum()),
        "iou": [float(v) if p else None for v, p in zip(iou, present, strict=True)],
    }


class GroupedSegmentationConfusion:
    """Pixel confusion matrices per image group (shape label), accumulated on the logits' device.

    One ``bincount`` per batch over ``group * C^2 + target * C + pred`` of the labelled pixels.
    ``summary()``: the scores of the summed matrix, plus ``miou_small`` / ``miou_big`` (the first /
    last group), their gap and ``miou_per_group`` (docs/method/index.md sec. 7: the task metric per shape group).
    """

    def __init__(self, num_classes: int, num_groups: int = 2, ignore_index: int = 255) -> None:
        self.num_classes, self.num_groups, self.ignore_index = num_classes, num_groups, ignore_index
        self.cm: Tensor | None = None

    def update(self, target: Tensor, pred: Tensor, group: Tensor) -> None:
        """``target``, ``pred``: ``(B, H, W)``; ``group``: ``(B,)`` in ``[0, num_groups)``."""
        if target.shape != pred.shape or target.dim() != 3 or group.shape != target.shape[:1]:
            raise ValueError(
                f"expected target, pred (B, H, W) and group (B,), got {tuple(target.shape)}, "
                f"{tuple(pred.shape)} and {tuple(group.shape)}"
            )
        c = self.num_classes
        g = group.to(target.device).long().clamp(0, self.num_groups - 1).view(-1, 1, 1)
        flat = (g * c + target.long()) * c + pred.long()
        flat = flat[target != self.ignore_index]
        counts = torch.bincount(flat, minlength=self.num_groups * c * c)
        counts = counts.view(self.num_groups, c, c)
        self.cm = counts if self.cm is None else self.cm + counts

    def matrices(self) -> Tensor:
        c = self.num_classes
        if self.cm is None:
            return torch.zeros(self.num_groups, c, c, dtype=torch.int64)
        return self.cm.cpu()

    def summary(self) -> dict[str, float | list[float | None] | None]:
        cm = self.matrices()
        out = segmentation_scores(cm.sum(0))
        per_group = [segmentation_scores(m)["miou"] for m in cm]
        small, big = per_group[0], per_group[-1] if self.num_groups > 1 else None
        out |= {
            "miou_small": small,
            "miou_big": big,
            "miou_per_group": per_group,
            "miou_gap": None if small is None or big is None else abs(small - big),
        }
        return out
