"""Validation at the public boundary of ``reparam.baselines``: bad input becomes a ``ValueError`` naming it."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from projections._checks import check_finite, check_float_tensor

__all__ = [
    "check_choice",
    "check_finite",
    "check_float_tensor",
    "check_labels",
    "check_positive",
    "check_scores",
    "check_steps",
]


def check_positive(name: str, value: object, *, allow_zero: bool = False) -> float:
    """A finite real number ``> 0`` (``>= 0`` with ``allow_zero``)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        expected = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {expected}, got {value!r}")
    return float(value)  # type: ignore[arg-type]


def check_steps(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def check_choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value  # type: ignore[return-value]


def check_scores(scores: object) -> Tensor:
    """A finite floating-point tensor of shape ``(B,)`` (a ``(B, 1)`` column is flattened)."""
    scores = check_float_tensor("scores", scores)
    if scores.dim() == 2 and scores.shape[1] == 1:
        scores = scores[:, 0]
    if scores.dim() != 1:
        raise ValueError(f"scores must have shape (B,) or (B, 1), got {tuple(scores.shape)}")
    check_finite("scores", scores)
    return scores


def check_labels(labels: object, scores: Tensor, *, need_both: bool) -> Tensor:
    """Binary labels (bool or integer 0/1) of shape ``(B,)``, returned as a bool mask of positives.

    ``need_both``: at least one positive and one negative (a pairwise or ratio objective needs
    them); otherwise at least one positive.
    """
    if not isinstance(labels, Tensor):
        raise ValueError(f"labels must be a torch.Tensor, got {type(labels).__name__}")
    if labels.shape != scores.shape[:1] and labels.shape != scores.shape:
        raise ValueError(
            f"labels must have shape (B,) = {tuple(scores.shape[:1])}, got {tuple(labels.shape)}"
        )
    if labels.device != scores.device:
        raise ValueError(
            f"labels must be on the scores' device {scores.device}, got {labels.device}"
        )
    if labels.dtype == torch.bool:
        pos = labels.reshape(-1)
    elif not labels.is_floating_point() and not labels.is_complex():
        if labels.numel() and bool(((labels != 0) & (labels != 1)).any()):
            bad = labels[(labels != 0) & (labels != 1)][:3].tolist()
            raise ValueError(f"labels must be 0 or 1, got values such as {bad}")
        pos = labels.reshape(-1) == 1
    else:
        raise ValueError(
            f"labels must be a bool or integer tensor of 0/1, got dtype {labels.dtype}"
        )
    n_pos = int(pos.sum())
    n_neg = pos.numel() - n_pos
    if n_pos == 0 or (need_both and n_neg == 0):
        what = "at least one positive and one negative" if need_both else "at least one positive"
        raise ValueError(f"labels must contain {what}, got {n_pos} positives, {n_neg} negatives")
    return pos
