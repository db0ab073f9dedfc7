"""Validation at the public boundary of ``reparam``: bad input is a ``ValueError`` naming the
argument, its value and what was expected."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from .compiling import eager_on_cpu


def describe(x: object) -> str:
    if isinstance(x, Tensor):
        return f"tensor of dtype {x.dtype} and shape {tuple(x.shape)}"
    if isinstance(x, np.ndarray):
        return f"numpy array of dtype {x.dtype} and shape {x.shape}"
    return type(x).__name__


def shape_labels(x: object) -> Tensor:
    """The shape labels as an int64 CPU tensor ``(N,)``: accepts a tensor or numpy array of any
    integer (or bool) dtype, or a sequence of ints; rejects floats, empty and multi-dim input."""
    t = _int_vector("shape_labels", x, "class ids")
    if int(t.min()) < 0:
        raise ValueError(f"shape_labels must be >= 0, got values down to {int(t.min())}")
    return t


def groups(x: object, n: int) -> Tensor:
    """The group of every sample as an int64 CPU tensor ``(N,)`` (``-1``: in no group), as
    ``shape_labels`` accepts them; ``N`` must match the shape labels' and some sample must be
    in a group."""
    t = _int_vector("groups", x, "group ids")
    if t.numel() != n:
        raise ValueError(f"groups must have one entry per shape label ({n}), got {t.numel()}")
    lo, hi = (int(v) for v in t.aminmax())
    if lo < -1 or hi < 0:
        raise ValueError(
            f"groups must hold group ids >= 0 (-1: a sample of no group) with at least one "
            f"sample in a group, got values in [{lo}, {hi}]"
        )
    return t


def _int_vector(name: str, x: object, what: str) -> Tensor:
    if isinstance(x, Tensor):
        t = x.detach()
    elif isinstance(x, np.ndarray):
        if not (np.issubdtype(x.dtype, np.integer) or x.dtype == np.bool_):
            raise ValueError(f"{name} must hold integer {what}, got {describe(x)}")
        t = torch.from_numpy(np.ascontiguousarray(x))
    elif isinstance(x, Sequence) and not isinstance(x, str):
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in x):
            raise ValueError(f"{name} must hold integer {what}, got {list(x)[:5]}...")
        t = torch.tensor(list(x), dtype=torch.int64)
    else:
        raise ValueError(
            f"{name} must be integer {what} (a tensor, numpy array or sequence of ints), "
            f"got {describe(x)}"
        )
    if t.is_floating_point() or t.is_complex():
        raise ValueError(f"{name} must hold integer {what}, got {describe(t)}")
    if t.dim() != 1 or t.numel() == 0:
        raise ValueError(f"{name} must have shape (N,) with N > 0, got {tuple(t.shape)}")
    return t.cpu().long()


def number(
    name: str,
    x: object,
    lo: float = -math.inf,
    *,
    strict: bool = False,
    hi: float = math.inf,
    strict_hi: bool = False,
) -> float:
    """A finite real number in ``[lo, hi]`` (open ends with ``strict`` / ``strict_hi``)."""
    ok = isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)
    ok = ok and math.isfinite(x) and (x > lo if strict else x >= lo)
    ok = ok and (x < hi if strict_hi else x <= hi)
    if not ok:
        bounds = []
        if lo > -math.inf:
            bounds.append(f"{'>' if strict else '>='} {lo:g}")
        if hi < math.inf:
            bounds.append(f"{'<' if strict_hi else '<='} {hi:g}")
        raise ValueError(
            f"{name} must be a finite number {' and '.join(bounds)}, got {x!r}".strip()
        )
    return float(x)


def choice(name: str, x: object, allowed: Sequence[str]) -> str:
    if x not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {x!r}")
    return x  # type: ignore[return-value]


def positive_classes(classes: object) -> tuple[int, ...]:
    try:
        out = tuple(int(c) for c in classes)  # type: ignore[union-attr]
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"positive_classes must be a sequence of class ids, got {classes!r}"
        ) from e
    if not out or len(set(out)) != len(out):
        raise ValueError(f"positive_classes must be distinct class ids, got {out!r}")
    if min(out) < 0:
        raise ValueError(f"positive_classes must be >= 0, got {out!r}")
    return out


def batch(
    scores: object, idx: object, classes: tuple[int, ...], n_total: int, device: torch.device
) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor] | None]:
    """``(u, idx int64 (B,) on device, ok)`` from the shape head's scores: ``(B,)`` or ``(B, 1)``
    for one positive class, else ``(B, K)`` with column ``c`` for class ``c``. ``u`` is float32,
    ``(B,)`` for one positive class (a ``(B,)`` input itself: no view for autograd to undo),
    else ``(B, P)``, column ``j`` the score of ``classes[j]``.

    Types, dtypes and shapes are checked here (at trace time under ``torch.compile``). Values are
    data: in eager mode on the CPU they are checked here too (a ``ValueError`` before anything is
    written; ``ok`` is ``None``). Inside ``torch.compile`` or on an accelerator, reading them would
    break the graph or wait for the device every step, so ``ok`` is ``(finite, in_range)``: two
    bool ``(B,)`` masks computed on the device, the entries with a finite score and those with an
    index in ``[0, n_total)``; ``idx`` is clamped into range, and the caller masks the others out
    of its state and reports them at the epoch end (``ShapeObjective``)."""
    if not isinstance(scores, Tensor) or not scores.is_floating_point():
        raise ValueError(f"scores must be a floating-point tensor, got {describe(scores)}")
    if not isinstance(idx, Tensor) or idx.dtype != torch.int64 or idx.dim() != 1:
        raise ValueError(f"idx must be an int64 tensor of shape (B,), got {describe(idx)}")
    b, p = idx.numel(), len(classes)
    if scores.dim() == 1 and p == 1:
        u = scores
    elif scores.dim() == 2 and scores.shape[1] == 1 and p == 1:
        u = scores[:, 0]
    elif scores.dim() == 2 and scores.shape[1] > max(classes) and p > 1:
        u = scores[:, list(classes)]
    elif scores.dim() == 2 and scores.shape[1] > max(classes):
        u = scores[:, classes[0]]
    else:
        expected = "(B,) or (B, 1), or " if p == 1 else ""
        raise ValueError(
            f"scores must have shape {expected}(B, K) with K > {max(classes)} "
            f"(one column per shape class), got {tuple(scores.shape)}"
        )
    if u.shape[0] != b:
        raise ValueError(f"scores and idx must have the same batch size, got {u.shape[0]} and {b}")
    if b and eager_on_cpu(u, "checks"):
        # One reduction instead of an elementwise test: a NaN/inf anywhere makes the sum
        # non-finite; under no_grad, no autograd node and no detach.
        with torch.no_grad():
            if not math.isfinite(u.sum().item()) and not bool(torch.isfinite(u).all()):
                raise ValueError(
                    "scores must be finite, got NaN or inf (check the network's outputs)"
                )
        if idx.device.type == "cpu" and device.type != "cpu":  # on the CPU: rows() checks
            _index_range(idx, n_total)
        return u.float(), idx.to(device), None
    idx = idx.to(device)
    with torch.no_grad():
        finite = torch.isfinite(u) if u.dim() == 1 else torch.isfinite(u).all(1)
        in_range = (idx >= 0) & (idx < n_total)
    return u.float(), idx.clamp(0, n_total - 1), (finite, in_range)


def fault_message(faults: Sequence[int], n_total: int) -> str | None:
    """The error for the masked entries counted by ``ShapeObjective`` (``faults``:
    ``[non-finite scores, indices out of range, first forward call with one]``), or ``None``."""
    bad_scores, bad_idx, first = faults
    if bad_scores == 0 and bad_idx == 0:
        return None
    parts = []
    if bad_scores:
        parts.append(f"scores must be finite, got {bad_scores} NaN or inf entries")
    if bad_idx:
        parts.append(f"idx must hold dataset indices in [0, {n_total}), got {bad_idx} outside")
    return (
        "; ".join(parts) + f" (first in forward call {first}, counting from 0). These entries "
        "were masked: they reached no state (score memory, tau, lambda) and their loss term "
        "was 0 (check the network's outputs and the sampler's indices)"
    )


def held_out(scores: object, labels: object, columns: int, positives: Sequence[int]) -> tuple:
    """``calibrate``'s input: ``scores`` ``(M,)`` (one column) or ``(M, columns)``, finite, and
    their ``(M,)`` integer ``labels``, with a sample of each class of ``positives``. Returns the
    scores ``(M, columns)`` (detached) and the labels; a ``ValueError`` naming what is wrong."""
    if isinstance(scores, np.ndarray):
        scores = torch.from_numpy(scores)
    if not isinstance(scores, Tensor) or not scores.is_floating_point():
        raise ValueError(f"scores must be a floating tensor (M,), got {describe(scores)}")
    u = scores.detach()
    if u.dim() == 1 and columns == 1:
        u = u.unsqueeze(1)
    if u.dim() != 2 or u.shape[1] != columns or u.numel() == 0:
        want = "(M,) or (M, 1)" if columns == 1 else f"(M, {columns})"
        raise ValueError(f"scores must have shape {want} with M > 0, got {tuple(scores.shape)}")
    y = _int_vector("labels", labels, "class ids")
    if y.numel() != u.shape[0]:
        raise ValueError(f"labels must have one entry per score ({u.shape[0]}), got {y.numel()}")
    if not bool(torch.isfinite(u).all()):
        raise ValueError(f"scores must be finite, got {int((~torch.isfinite(u)).sum())} non-finite")
    missing = [c for c in positives if not bool((y == c).any())]
    if missing:
        raise ValueError(
            f"labels must contain positives (positive classes {missing}) to calibrate on, got "
            f"labels {sorted(set(y.tolist()))[:10]}"
        )
    return u, y.to(u.device)


def rows(slot: Tensor, idx: Tensor) -> Tensor:
    """``slot[idx]``: the batch's rows of ``tau`` (``-1``: a negative). On the CPU the gather's
    own bounds check is the check of ``idx``'s range (no extra operation per step): an index out
    of range is a ``ValueError`` before anything is written."""
    try:
        return slot.index_select(0, idx)
    except IndexError:
        _index_range(idx, slot.numel())
        raise


def _index_range(idx: Tensor, n_total: int) -> None:
    lo, hi = (int(v) for v in idx.aminmax())
    if lo < 0 or hi >= n_total:
        raise ValueError(
            f"idx must hold dataset indices in [0, {n_total}), got values in [{lo}, {hi}]"
        )
