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

    def summary(self) -> dict[str, float | None]:
        small, big = accuracy(self.cm[0]), accuracy(self.cm[1])
        return {
            "accuracy": accuracy(self.cm.sum(0)),
            "accuracy_small": small,
            "accuracy_big": big,
            "accuracy_gap": None if small is None or big is None else abs(small - big),
        }
