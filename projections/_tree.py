r"""The root of h for one long vector at about the cost of one pass (docs/projection.md, method "tree").

Same problem as ``projections._roots``: the root ``r`` of

$$
h(e) = e - \delta - \sum_i \max(\gamma_i - e, 0),
$$

given by the top-i averages ``A_k = (delta + g_(1) + ... + g_(k)) / (k + 1)`` of the values sorted
descending: ``r = max(delta, max_k A_k)``. Two facts make a search without a full sort exact:

* any set ``V`` of coordinates gives a lower bound: with ``V`` sorted descending,
  ``L(V) = max(delta, max_k A_k(V)) <= r`` (each ``A_k(V)`` is at most ``A_k`` of the whole vector);
* if ``V`` holds *every* coordinate above a lower bound ``lo <= r``, then ``L(V) = r`` exactly
  (the active set ``{gamma_i > r}`` lies in ``V``), and ``L(V) >= lo`` confirms it.

**Short vectors on the CPU** (``n <= SMALL_N``): ``V`` = every coordinate above ``A_1 = L({max})``,
found by one comparison; exact on any input and the fewest calls.

**Max tree** (few clipped coordinates). One reduction writes the maxima of consecutive blocks of
``LEAF`` coordinates, smaller ones the maxima of ``FANOUT`` consecutive nodes of those, until at
most ``TOP_NODES`` remain; the last block of each level may be shorter, so every level covers every
coordinate (the top level's maximum is ``gamma``'s, and a +inf makes the root +inf, which the
projection's fast path reads as its check). Every node is one coordinate, so ``L(top level)`` is a lower bound
``lo``. Going down, only the children of nodes above ``lo`` can be above ``lo``: their blocks are
gathered, and every level raises ``lo`` again. At the bottom the gathered coordinates are every
coordinate above ``lo``, and ``r = L(them)``. Cost: one pass that reads ``gamma`` (the first
reduction, over contiguous blocks: as fast as a sum, where a strided one is ~1.3x slower, measured);
the rest touches ``O(LEAF * |{gamma_i > lo}|)`` values, copied block by block. When too many
coordinates lie above ``lo`` (many are clipped), the descent stops and hands its ``lo`` on.

**Verified Newton** (many clipped coordinates). A stratified sample of ``SAMPLE`` coordinates,
each standing for ``w = n / SAMPLE``, estimates the root as ``max_j (delta + w s_1 + ... + w s_j) /
(w j + 1)`` (sample sorted descending). From a point ``p``, one pass counts ``c(p) = |{gamma_i >
p}|`` and one sums ``S(p) = sum_{gamma_i > p} gamma_i``; the Newton step ``r' = (delta + S(p)) /
(c(p) + 1)`` is a lower bound of ``r`` from either side (``h`` is concave), and it *is* ``r``
exactly when ``c(r') = c(p)`` (no coordinate between ``p`` and ``r'``, so ``h`` is linear there).
So every step costs a count, and the last count proves the result. The counts keep their boolean
masks (CPU): where two masks differ are the values between two points, gathered instead of a
second sum pass -- ``S(r') = S(p) - (their sum)`` -- and if the first point lay above the root
(``r' < p``) the root lies among them, with every coordinate above ``p`` known: ``r = L`` of those
values after ``c(p)`` larger ones. From the sample this takes one sum and two to five counts;
after ``NEWTON_STEPS`` the randomized linear method of ``projections._roots`` finishes from the
last lower bound, so inputs made to defeat Newton stay linear.

Counts on CPU use numpy (``np.count_nonzero(a > p)``: boolean output is several times faster
there than in torch); other devices (CUDA) count with torch and sum every step. Sums are
``torch.threshold(gamma, p, 0).sum()``: a sum of the active values, accumulated as torch
accumulates (no cancellation against ``n p``). Small arrays (tree levels near the top, gathered
values) go through numpy in float64. The sample positions come from a private generator with a
fixed seed: results are deterministic and the global RNG is untouched.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from torch import Tensor

from ._roots import root_linear

SMALL_N = 1 << 15  # on CPU, up to this n: sort every coordinate above half the largest one
LEAF = 1024  # coordinates per node of level 1 (one reduction over an (n/1024, 1024) view)
FANOUT = 64  # children per node on the levels above
TOP_NODES = 2048  # the tree stops at the first level with at most this many nodes
PY_MAX_VALUES = 32  # lower_bound first loops in Python over the largest 32 values
# the descent copies at most max(MIN_GATHER_CAP, n // GATHER_DIVISOR) values per level: a copy of
# contiguous blocks costs less than the Newton path's passes up to half the vector (measured at 1e6
# and 1e7 with 20 to 1e5 coordinates clipped), and sorts at most max(MIN_SORTED, n // 64) of them
MIN_GATHER_CAP = 1 << 15
GATHER_DIVISOR = 2
MIN_SORTED = 1 << 14
SAMPLE = 4096  # sample size of the Newton start
NEWTON_STEPS = 8  # verified Newton steps before the randomized linear method takes over
_SEED = 20240515

_NP_DTYPE = {torch.float32: np.float32, torch.float64: np.float64}


def as_dtype(dtype: torch.dtype, value: float) -> np.floating:
    """``value`` rounded to ``dtype`` (float32 or float64), as a numpy scalar."""
    return _NP_DTYPE[dtype](value)


@functools.lru_cache(maxsize=32)
def _counts_plus_one(m: int) -> np.ndarray:
    return np.arange(2, m + 2, dtype=np.float64)  # read-only: never modified


def lower_bound(delta: float, values: np.ndarray, k0: int = 0) -> float:
    """``L(V) = max(delta, max_k A_k(V))`` for the values ``V`` (any order and float dtype; sums in
    float64): a lower bound of the root for any set of coordinates, the root itself when ``V``
    holds every coordinate above some ``lo <= L(V)``.

    With ``k0 > 0``, ``delta`` stands for ``delta + (sum of k0 larger coordinates)``, which come
    first in the sorted order: ``A_k = (delta + V_(1) + ... + V_(k)) / (k0 + k + 1)``, ``k >= 0``.
    """
    m = values.size
    if m > PY_MAX_VALUES:  # usually the maximum comes early: try the largest few first
        top = np.partition(values, m - PY_MAX_VALUES)[m - PY_MAX_VALUES :]
        r, early = _rising_top_averages(delta, top, k0)
        if early:
            return r
        avgs = np.cumsum(np.sort(values)[::-1], dtype=np.float64)
        avgs += delta
        if k0:
            avgs /= np.arange(k0 + 2, k0 + m + 2, dtype=np.float64)
        else:
            avgs /= _counts_plus_one(1 << (m - 1).bit_length())[:m]
        return max(delta / (k0 + 1), float(avgs.max()))
    return _rising_top_averages(delta, values, k0)[0]


def _rising_top_averages(delta: float, values: np.ndarray, k0: int = 0) -> tuple[float, bool]:
    """``(L(V), stopped)`` by a Python loop over ``V`` sorted descending: ``A_k`` rises while the
    next value exceeds it and falls after, so the loop stops at the first value that does not
    (``stopped``: before the last value, so ``L`` of any superset of larger values is the same)."""
    s, k = delta, k0 + 1
    for v in sorted(values.tolist(), reverse=True):
        if v * k <= s:
            return s / k, True
        s += v
        k += 1
    return s / k, False


class _Passes:
    """Full passes over ``x`` and gathers of few of its values: numpy on CPU, else torch.

    Levels of the max tree are numpy arrays on the numpy path (zero-copy views of tensors) and
    tensors on the torch path; gathered values come back as numpy arrays either way.
    """

    def __init__(self, x: Tensor, workspace: Tensor | None, use_numpy: bool) -> None:
        self.x, self.n, self.use_numpy = x, x.numel(), use_numpy
        self.a = x.numpy() if use_numpy else None
        self._ws = workspace
        # thresholds are rounded to x's dtype first, so that every pass compares alike
        self.round = _NP_DTYPE[x.dtype]

    @property
    def workspace(self) -> Tensor:
        if self._ws is None:
            self._ws = torch.empty_like(self.x)
        return self._ws

    def max_tree(self) -> list:
        """``[x, level 1, ...]``: node ``j`` of a level is the maximum of the nodes ``B j, ...,
        B j + B - 1`` (``B = LEAF`` on level 1, ``FANOUT`` above) of the level below, the last
        node of whatever is left (fewer than ``B``): every level covers every coordinate, so the
        top level's maximum is ``x``'s. Level 1 is one reduction that reads ``x`` once over
        contiguous blocks; the rest is small."""
        x, n = self.x, self.n
        if n <= TOP_NODES:
            return [self.a if self.use_numpy else x]
        level = _block_max(x, LEAF)  # torch on both paths: its reduction is the one pass over x
        levels = [self.a, level.numpy()] if self.use_numpy else [x, level]
        while len(levels[-1]) > TOP_NODES:
            levels.append(_block_max(levels[-1], FANOUT))
        return levels

    def values(self, level) -> np.ndarray:
        return level if self.use_numpy else level.cpu().numpy()

    def take(self, level, idx: np.ndarray) -> np.ndarray:
        if self.use_numpy:
            return level[idx]
        return level[torch.from_numpy(idx).to(level.device)].cpu().numpy()

    def take_blocks(self, level, idx: np.ndarray, size: int) -> np.ndarray:
        """The values of the children of the nodes ``idx`` (ascending) of the level above
        ``level``: blocks of ``size`` consecutive nodes of ``level``, the last one shorter; flat."""
        g = len(level) // size
        short = idx.size > 0 and idx[-1] == g  # the last, shorter block
        head = idx[:-1] if short else idx
        if self.use_numpy:
            vals = level[: g * size].reshape(g, size)[head].ravel()
            return np.concatenate((vals, level[g * size :])) if short else vals
        rows = torch.from_numpy(head).to(level.device)
        vals = level[: g * size].view(g, size)[rows].reshape(-1)
        if short:
            vals = torch.cat((vals, level[g * size :]))
        return vals.cpu().numpy()

    def children(self, level, idx: np.ndarray, size: int) -> np.ndarray:
        """The positions in ``level`` of what ``take_blocks`` returns, in its order."""
        g = len(level) // size
        short = idx.size > 0 and idx[-1] == g
        child = ((idx[:-1] if short else idx)[:, None] * size + np.arange(size)).ravel()
        return np.concatenate((child, np.arange(g * size, len(level)))) if short else child

    def count_above(self, p: float, slot: int = 0) -> tuple[int, np.ndarray | None]:
        """``(|{x_i > p}|, mask)``; on the numpy path the boolean mask is kept in ``slot`` (0 or 1)
        of the workspace's bytes (n each), else None."""
        if self.use_numpy:
            mask = self.workspace.numpy().view(np.bool_)[slot * self.n : (slot + 1) * self.n]
            return int(np.count_nonzero(np.greater(self.a, p, out=mask))), mask
        return int(torch.count_nonzero(self.x > p)), None

    def between(self, mask: np.ndarray | None, other: np.ndarray, count: int) -> np.ndarray | None:
        """The ``count`` values where two masks differ (``mask`` is overwritten), or None when the
        masks are gone (None) or so many values differ that a sum pass is cheaper."""
        if mask is None or count > self.n // 8:
            return None
        return self.a[np.not_equal(mask, other, out=mask)]

    def sum_above(self, p: float) -> float:
        """``sum_{x_i > p} x_i`` in one pass; overwrites the workspace (and the masks in it)."""
        return float(torch.threshold(self.x, p, 0.0, out=self.workspace).sum())


def _block_max(level: Tensor | np.ndarray, size: int) -> Tensor | np.ndarray:
    """The maxima of consecutive blocks of ``size`` entries of ``level`` (a tensor or an array),
    the last block of whatever is left (fewer than ``size``)."""
    g = len(level) // size
    if isinstance(level, np.ndarray):
        out = level[: g * size].reshape(g, size).max(1)
        return np.append(out, level[g * size :].max()) if g * size < len(level) else out
    out = level[: g * size].view(g, size).amax(1)
    return torch.cat((out, level[g * size :].amax().reshape(1))) if g * size < len(level) else out


def _above_half_max(delta: float, a: np.ndarray) -> float:
    """The root from every coordinate above ``A_1 = max(delta, (delta + max_i gamma_i) / 2)``, the
    lower bound of the largest coordinate alone: exact on any input, cheap when few lie above.
    +inf when ``a`` holds +inf."""
    if not a.size:
        return delta
    top = float(a.max())
    if not math.isfinite(top):
        return top
    lo = np.float64(max(delta, (delta + top) / 2))  # float64: compares exactly
    return lower_bound(delta, a[a > lo])


def _descend(delta: float, levels: list, io: _Passes, cap: int) -> tuple[float, bool]:
    """``(r, True)`` from the max tree, or ``(lo, False)`` with a lower bound ``lo`` of ``r`` when
    more than ``cap`` values would have to be gathered. ``r`` is +inf when ``x`` holds +inf: the
    top level holds ``x``'s maximum."""
    vals = io.values(levels[-1])
    if len(levels) == 1:  # vals: every coordinate
        return lower_bound(delta, vals), True
    lo = np.float64(lower_bound(delta, vals))  # the nodes are coordinates; float64 compares exactly
    if not np.isfinite(lo):
        return float(lo), True
    idx = np.flatnonzero(vals > lo)
    for level in range(len(levels) - 1, 0, -1):
        branch, below = (LEAF if level == 1 else FANOUT), levels[level - 1]
        if idx.size * branch > cap:
            return float(lo), False
        vals = io.take_blocks(below, idx, branch)
        keep = vals > lo  # every node above lo on this level (its parent is above lo too)
        if level == 1:  # every coordinate above lo <= r: their L is r
            return _root_of_kept(delta, vals[keep], float(lo), max(MIN_SORTED, io.n // 64))
        idx, vals = io.children(below, idx, branch)[keep], vals[keep]
        if idx.size > 8 * PY_MAX_VALUES:  # many nodes above lo: raise it with all of them
            lo = np.float64(lower_bound(delta, vals))
            idx = idx[vals > lo]
    raise AssertionError("unreachable: the loop returns at level 1")


def _root_of_kept(delta: float, kept: np.ndarray, lo: float, max_sorted: int) -> tuple[float, bool]:
    """``(L(kept), True)`` where ``kept`` holds every coordinate above ``lo <= r``; when that needs
    a sort of more than ``max_sorted`` values (more than ``PY_MAX_VALUES`` of them clipped), the
    Newton path's passes are cheaper: ``(lower bound, False)``."""
    m = kept.size
    if m <= max(max_sorted, PY_MAX_VALUES):
        root = lower_bound(delta, kept)
        return root, root >= lo
    top = np.partition(kept, m - PY_MAX_VALUES)[m - PY_MAX_VALUES :]
    root, stopped = _rising_top_averages(delta, top)
    return (root, root >= lo) if stopped else (max(lo, root), False)


@functools.lru_cache(maxsize=16)
def _sample_index(n: int, m: int) -> np.ndarray:
    """One position in each of ``m`` consecutive stretches of ``n // m`` coordinates."""
    gen = torch.Generator().manual_seed(_SEED)
    step = n // m
    return np.arange(m, dtype=np.int64) * step + torch.randint(step, (m,), generator=gen).numpy()


def sample_estimate(delta: float, io: _Passes) -> float:
    """The root of h on a stratified sample of ``SAMPLE`` coordinates, each weighted ``n / SAMPLE``."""
    n = io.n
    m = min(SAMPLE, n)
    s = np.sort(io.take(io.a if io.use_numpy else io.x, _sample_index(n, m)))[::-1]
    w = n / m
    avgs = (delta + w * np.cumsum(s, dtype=np.float64)) / (w * np.arange(1, m + 1) + 1)
    return max(delta, float(avgs.max()))


def _newton(delta: float, p: float, io: _Passes) -> tuple[float, bool]:
    """Verified Newton steps from ``p``: ``(r, True)``, or ``(lo, False)`` after ``NEWTON_STEPS``.

    After the first step ``p`` is a lower bound, so a step that does not rise means that ``p`` is
    the root to the rounding of the sums (float32 sums of 1e6 values err by ~1e-7 relative, more
    than the gap between neighbouring coordinates): that ends the iteration too.

    On the numpy path the masks of two successive points give the values between them without a
    sum pass: the next sum is the last one minus theirs, and if the first point lay above the
    root, the root lies among them (every coordinate above the Newton point is known) -- ``L``.
    """
    p = float(io.round(p))
    s = io.sum_above(p)
    c, mask = io.count_above(p, 0)
    for step in range(NEWTON_STEPS):
        r = (delta + s) / (c + 1)  # lower bound of the root, exact iff c(r) == c(p)
        if step and r <= p:
            return r, True
        q = float(io.round(r))
        c_q, mask_q = io.count_above(q, (step + 1) % 2)  # the other slot than mask's
        if c_q == c:
            return r, True
        band = io.between(mask, mask_q, abs(c_q - c))
        if band is None:
            s = io.sum_above(q)
        elif q < p:  # p lay above the root: (q, p] holds it, and every coordinate above p is known
            return lower_bound(delta + s, band, c), True
        else:
            s -= float(band.sum(dtype=np.float64))
        p, c, mask = q, c_q, (None if band is None else mask_q)
    return (delta + s) / (c + 1), False


def root_tree_value(
    delta: float, x: Tensor, *, workspace: Tensor | None = None, use_numpy: bool | None = None
) -> tuple[float, Tensor | None]:
    """``(r, workspace)``: the root of h as a Python float (float64) for ``x`` (n,) float32/float64,
    contiguous, and the scratch tensor the passes wrote (``workspace``, or one they allocated;
    None if they needed none)."""
    if use_numpy is None:
        use_numpy = x.device.type == "cpu"
    n = x.numel()
    if use_numpy and n <= SMALL_N:
        return _above_half_max(delta, x.numpy()), workspace
    io = _Passes(x, workspace, use_numpy)
    r, exact = _descend(delta, io.max_tree(), io, cap=max(MIN_GATHER_CAP, n // GATHER_DIVISOR))
    if not exact:
        r, exact = _newton(delta, max(r, sample_estimate(delta, io)), io)
    if not exact:  # Newton is slow on inputs made to defeat it: the randomized method from r
        d = torch.tensor([delta], dtype=torch.float64, device=x.device)
        r = float(root_linear(d, x, lo=torch.full_like(d, r)))
    return r, io._ws


@torch.no_grad()
def root_tree(
    delta: Tensor,
    x: Tensor,
    *,
    workspace: Tensor | None = None,
    use_numpy: bool | None = None,
) -> Tensor:
    """Root ``r`` of ``h`` for one vector: delta (1 element), x (..., n) -> ``r`` with delta's shape.

    ``workspace`` (optional: like ``x``, contiguous, as many elements) is scratch memory for the
    passes, e.g. the output buffer of the projection; it is allocated only when needed.
    ``use_numpy`` (default: when ``x`` is on the CPU) selects numpy for the counts and gathers.
    """
    x = x.detach().reshape(-1)
    if x.dtype not in _NP_DTYPE:  # half precision: computed in float32, as project_onto_c does
        x = x.float()
    r, _ = root_tree_value(
        float(delta.reshape(())), x.contiguous(), workspace=workspace, use_numpy=use_numpy
    )
    return torch.full_like(delta, r)
