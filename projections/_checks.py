"""Validation of the public projection API: bad input becomes a ValueError naming the argument."""

from __future__ import annotations

import math

import torch
from torch import Tensor

# the exact projection methods (public as projections.PROJECTION_METHODS)
METHODS = ("auto", "sort", "linear", "tree")
"""The names ``project_onto_c`` and ``projection_root`` take as ``method``.

``"sort"`` (O(n log n): a sort, a cumsum and the max of the top-i averages), ``"linear"`` (expected
O(n), no full sort), ``"tree"`` (one row: a max tree of the coordinates, else verified Newton steps
from a sample) and ``"auto"``, the default, which picks one of them by the shape and the device
(``AUTO_SORT_MAX_N``). All four give the same projection (method note sec. 4)."""


def check_float_tensor(name: str, x: object) -> Tensor:
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    return x


def check_finite(name: str, x: Tensor) -> None:
    # Fast path: a finite sum means no NaN/inf (one reduction, ~30x cheaper than isfinite().all());
    # a non-finite sum may also be an overflow, so only then look at the values themselves.
    if x.requires_grad:
        x = x.detach()
    if not x.numel() or math.isfinite(float(x) if x.numel() == 1 else float(x.sum())):
        return
    if not bool(torch.isfinite(torch.stack(torch.aminmax(x))).all()):  # aminmax propagates NaN
        bad = x[~torch.isfinite(x)].flatten()[:3].tolist()
        raise ValueError(f"{name} must be finite (no NaN or inf), got values such as {bad}")


def check_pair(eps: object, tau: object) -> tuple[Tensor, Tensor]:
    """Checks (eps, tau) for the ungrouped, batched form: eps (...,), tau (..., n)."""
    eps = check_float_tensor("eps", eps)
    tau = check_float_tensor("tau", tau)
    if tau.dim() < 1:
        raise ValueError(
            f"tau must have at least one dimension (..., n), got shape {tuple(tau.shape)}"
        )
    if eps.shape != tau.shape[:-1]:
        raise ValueError(
            f"eps must have shape tau.shape[:-1] = {tuple(tau.shape[:-1])}, got {tuple(eps.shape)}"
        )
    _check_same(eps, tau)
    check_finite("eps", eps)
    check_finite("tau", tau)
    return eps, tau


def check_grouped(eps: object, tau: object, groups: object) -> tuple[Tensor, Tensor, Tensor]:
    """Checks the grouped form: eps (G,), tau (n,), groups int64 (n,) with values in [0, G)."""
    eps = check_float_tensor("eps", eps)
    tau = check_float_tensor("tau", tau)
    if not isinstance(groups, Tensor):
        raise ValueError(
            f"groups must be a torch.Tensor of dtype int64, got {type(groups).__name__}"
        )
    if groups.dtype != torch.int64:
        raise ValueError(f"groups must have dtype torch.int64, got {groups.dtype}")
    if eps.dim() != 1:
        raise ValueError(f"with groups, eps must have shape (G,), got {tuple(eps.shape)}")
    if tau.dim() != 1:
        raise ValueError(f"with groups, tau must have shape (n,), got {tuple(tau.shape)}")
    if groups.shape != tau.shape:
        raise ValueError(
            f"groups must have the shape of tau {tuple(tau.shape)}, got {tuple(groups.shape)}"
        )
    if groups.device != tau.device:
        raise ValueError(f"groups must be on tau's device {tau.device}, got {groups.device}")
    _check_same(eps, tau)
    if groups.numel():
        lo, hi = int(groups.min()), int(groups.max())
        if lo < 0 or hi >= eps.shape[0]:
            raise ValueError(
                f"groups must take values in [0, G) = [0, {eps.shape[0]}) (G = len(eps)), "
                f"got values in [{lo}, {hi}]"
            )
    check_finite("eps", eps)
    check_finite("tau", tau)
    return eps, tau, groups


def check_method(method: object, allowed: tuple[str, ...] = METHODS) -> str:
    if method not in allowed:
        raise ValueError(f"method must be one of {allowed}, got {method!r}")
    return method  # type: ignore[return-value]


def _check_same(eps: Tensor, tau: Tensor) -> None:
    if eps.dtype != tau.dtype:
        raise ValueError(f"eps and tau must have the same dtype, got {eps.dtype} and {tau.dtype}")
    if eps.device != tau.device:
        raise ValueError(
            f"eps and tau must be on the same device, got {eps.device} and {tau.device}"
        )
