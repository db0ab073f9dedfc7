"""Small read-only tensors made once per value, shape, dtype and device: the per-step math takes
them as operands (a vector of ones for a sum as a matrix-vector product, a 0-dim zero for
``torch.where``) instead of building them at every step, one dispatched tensor operation each."""

from __future__ import annotations

import functools

import torch
from torch import Tensor


def constant(value: float | tuple[float, ...], like: Tensor, shape: tuple[int, ...] = ()) -> Tensor:
    """``value`` in ``like``'s dtype and device: a float filled into ``shape``, or a tuple as a
    vector. Shared: never write to it. Inside ``torch.compile`` a fresh one (the compiler folds
    it into its kernel; it does not trace the cache)."""
    if torch.compiler.is_compiling():
        return _make.__wrapped__(value, shape, like.dtype, like.device)
    return _make(value, shape, like.dtype, like.device)


@functools.lru_cache(maxsize=128)
def _make(value, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    if isinstance(value, tuple):  # filled on the device: torch.tensor(...).to(cuda) is a host copy,
        # which synchronizes (tests/train/test_sync.py, on CUDA)
        parts = [torch.full((), float(v), dtype=torch.float64, device=device) for v in value]
        return torch.stack(parts).to(dtype)
    return torch.full(shape, value, dtype=dtype, device=device)
