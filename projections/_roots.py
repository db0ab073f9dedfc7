r"""Root finders for the threshold of Pi_C (method note sec. 4). Pure tensor functions, no autograd.

Pi_C maps (delta, gamma) to (e*, min(gamma, e*)) with e* = max(0, r) and r the unique root of

$$
h(e) = e - \delta - \sum_i \max(\gamma_i - e, 0),
$$

an increasing, concave, piecewise-linear function. Everything here computes r only; the
differentiable projection is rebuilt from r's active set in ``projections.exact``.

Two exact methods:

* ``root_sort`` -- sort descending, cumsum, one comparison (O(n log n), batched over rows):
  ``r = (delta + g_(1) + ... + g_(k)) / (k + 1)`` with ``k`` the largest index such that
  ``g_(k) > (delta + g_(1) + ... + g_(k-1)) / k`` (equivalently ``> (delta + S_k)/(k+1)``).
* ``root_linear`` -- no sort, expected O(n) on any input: Newton steps on ``h`` alternate
  with quickselect-style random pivots, and every decided coordinate is dropped (compaction).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

_ACC = torch.float64  # accumulation dtype of the linear method's running sums


def _top_averages(delta: Tensor, g_desc: Tensor) -> Tensor:
    """Top-i averages ``A_k = (delta + g_(1) + ... + g_(k)) / (k + 1)``, k = 1..m, of sorted rows."""
    k1 = _arange(2, g_desc.shape[-1] + 2, g_desc.dtype, g_desc.device)
    return torch.cumsum(g_desc, dim=-1).add_(delta.unsqueeze(-1)).div_(k1)


@functools.lru_cache(maxsize=64)
def _arange(start: int, end: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    return torch.arange(start, end, dtype=dtype, device=device)  # read-only: never modified


@torch.no_grad()
def root_sort(delta: Tensor, gamma: Tensor) -> Tensor:
    """Root ``r`` of ``h`` per row: delta (...,), gamma (..., n) -> (...,), by sort + cumsum.

    ``r = max_{k=0..n} A_k`` with the top-i averages ``A_k`` (``A_0 = delta``): ``A_k - A_{k-1} =
    D_k / (k (k+1))`` with ``D_k = k g_(k) - delta - S_{k-1}`` non-increasing in ``k``, so ``A``
    rises up to ``k*`` (the largest ``k`` with ``g_(k) > A_{k-1}``, method note sec. 4) and then falls.
    """
    if gamma.shape[-1] == 0:
        return delta.clone()
    g = torch.sort(gamma, dim=-1, descending=True).values
    return torch.maximum(delta, _top_averages(delta, g).amax(dim=-1))


@torch.no_grad()
def root_top_prefix(delta: Tensor, gamma: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """``root_sort`` on the ``m`` largest coordinates only (``topk``, no full sort).

    delta (B,), gamma (B, n) -> (r, exact), both (B,). If the maximum of ``A_0..A_m`` is reached
    before ``A_m``, then ``k* < m`` and ``r`` is the exact root. Otherwise ``r = A_m``, a lower
    bound of the root (``r = max_k A_k``) whose ``m`` coordinates all lie above it: the Newton
    iteration of ``root_linear`` starts there with ``k_lo = m``.
    """
    g = torch.topk(gamma, m, dim=-1, sorted=True).values
    avgs = _top_averages(delta, g)
    r = torch.maximum(delta, avgs.amax(dim=-1))
    return r, avgs[..., -1] < r


@torch.no_grad()
def root_sort_grouped(delta: Tensor, gamma: Tensor, groups: Tensor) -> Tensor:
    """Root per group: delta (G,), gamma (n,), groups (n,) -> (G,).

    One sort by (group ascending, gamma descending) -- two stable sorts -- then ``r_g = max(delta_g,
    max_k A_k)`` as in ``root_sort``, with a segmented cumsum accumulated in float64 (so a
    group of huge values does not swamp the running sum of the next one).
    """
    num_groups, n = delta.shape[0], gamma.shape[0]
    if n == 0:
        return delta.clone()
    order = torch.sort(gamma, descending=True, stable=True).indices
    order = order[torch.sort(groups[order], stable=True).indices]
    g = gamma[order].to(_ACC)
    grp = groups[order]
    counts = torch.bincount(grp, minlength=num_groups)
    start = torch.cumsum(counts, 0) - counts  # first position of every group
    rank = torch.arange(1, n + 1, device=g.device) - start[grp]  # 1-based rank within group
    s = torch.cumsum(g, 0)
    s_local = s - (s - g)[start.clamp_max(n - 1)][grp]  # S_rank within the group
    d = delta.to(_ACC)
    avgs = (d[grp] + s_local) / (rank + 1)
    r = d.clone().scatter_reduce_(0, grp, avgs, reduce="amax")  # include_self: max with delta
    return r.to(delta.dtype)


class _GroupOps:
    """Per-group bookkeeping of ``root_linear`` on float64 tensors (G,), for G groups."""

    def __init__(self, grp: Tensor, num_groups: int) -> None:
        self.grp, self.num_groups = grp, num_groups

    def seg_sum(self, x: Tensor) -> Tensor:  # index_add_ sums sequentially: accumulate in float64
        return torch.zeros(self.num_groups, dtype=_ACC, device=x.device).index_add_(
            0, self.grp, x.to(_ACC)
        )

    def expand(self, x: Tensor) -> Tensor:  # per-group value -> per-candidate value
        return x[self.grp]

    def compact(self, keep: Tensor) -> None:
        self.grp = self.grp[keep]

    def random_pivot(self, v: Tensor, fallback: Tensor, gen: torch.Generator) -> Tensor:
        """A uniformly random remaining candidate per group (``fallback`` where there is none)."""
        keys = torch.rand(v.numel(), generator=gen, device=v.device)
        best = torch.full_like(fallback, -1.0, dtype=keys.dtype)
        best.scatter_reduce_(0, self.grp, keys, reduce="amax")
        sel = keys == best[self.grp]
        return fallback.clone().index_put_((self.grp[sel],), v[sel].to(_ACC))

    where, maximum = staticmethod(torch.where), staticmethod(torch.maximum)
    lnot = staticmethod(torch.logical_not)
    any = staticmethod(lambda x: bool(x.any()))
    full = staticmethod(torch.full_like)


class _ScalarOps:
    """The same bookkeeping for a single group on Python floats (float64): a 1-element tensor op
    costs ~2 us of dispatch, a float op ~50 ns, and a pass needs ~20 of them."""

    @staticmethod
    def seg_sum(x: Tensor) -> float:
        return float(x.sum())  # pairwise sum in x's dtype

    @staticmethod
    def expand(x: float) -> float:
        return x

    @staticmethod
    def compact(keep: Tensor) -> None:
        pass

    @staticmethod
    def random_pivot(v: Tensor, fallback: float, gen: torch.Generator) -> float:
        return float(v[torch.randint(v.numel(), (1,), generator=gen, device=v.device)])

    where = staticmethod(lambda c, a, b: a if c else b)
    maximum = staticmethod(max)
    lnot = staticmethod(lambda x: not x)
    any = staticmethod(bool)
    full = staticmethod(lambda like, value: value)


# Newton passes before random pivots join in. Newton needs 5-15 passes on every distribution we
# tried (n = 1e6); random pivots only guard against inputs made to defeat it.
NEWTON_PASSES = 24


@torch.no_grad()
def root_linear(
    delta: Tensor,
    gamma: Tensor,
    groups: Tensor | None = None,
    *,
    lo: Tensor | None = None,
    k_lo: Tensor | None = None,
    seed: int = 0,
) -> Tensor:
    r"""Root of ``h`` per group without a full sort: delta (G,), gamma (n,), groups (n,) or None.

    ``groups=None`` means one group (G = 1). State per group: a lower bound ``lo <= r``, and the
    sum ``S`` / count ``K`` of coordinates known to be active (``gamma_i >= r``); the candidates
    are the undecided coordinates. One pass over the candidates at a pivot ``p`` gives ``s_p, c_p``
    (sum/count of candidates above ``p``) and with them

    * ``h(p) = p - delta - (S + s_p - (K + c_p) p)``: if ``h(p) >= 0`` then ``p >= r`` and those
      candidates are active (moved into ``S, K``);
    * the Newton iterate ``(delta + S + s_p) / (K + c_p + 1)``, a lower bound of ``r`` from either
      side because ``h`` is concave (its tangents lie above it): candidates ``<= lo`` are inactive.

    The pivot is ``lo`` (Newton from the left, i.e. the Michelot iteration). A group is done when
    its Newton step no longer increases ``lo`` or the count above ``lo`` equals the count whose
    Newton step produced ``lo`` (stable active set). After ``NEWTON_PASSES`` passes, a uniformly
    random candidate is the pivot every other pass (quickselect: a constant fraction of the
    candidates is decided in expectation, and the pivot itself always), so the expected work is
    O(n) on any input -- e.g. a geometric sequence, where Newton alone decides one coordinate per
    pass. Decided coordinates are dropped (compaction) once they are the majority, since a
    compaction costs more than a pass. A fixed-seed private generator picks the pivots: results
    are deterministic and the global RNG is untouched.

    ``lo`` (G,) optionally gives a known lower bound to start from (default: the Newton step from
    -inf, i.e. the mean-like ``(delta + sum gamma)/(n + 1)``), and ``k_lo`` the count of the
    coordinate set whose Newton step it is (or -1).
    """
    v = gamma
    if groups is None:  # one group: the bookkeeping on Python floats
        ops = _ScalarOps
        d = float(delta.reshape(()))
        lo = None if lo is None else float(lo.reshape(()))
        k_lo = None if k_lo is None else float(k_lo.reshape(()))
    else:
        ops = _GroupOps(groups, delta.shape[0])
        v = v.to(_ACC)
        d = delta.to(_ACC)
        lo = None if lo is None else lo.to(_ACC)
        k_lo = None if k_lo is None else k_lo.to(_ACC)
    s_act, k_act = ops.full(d, 0.0), ops.full(d, 0.0)
    if lo is None:  # Newton step from -inf (every coordinate active)
        k_lo = ops.seg_sum(torch.ones_like(v))  # the count whose Newton step gave lo
        lo = (d + ops.seg_sum(v)) / (k_lo + 1)
    elif k_lo is None:
        k_lo = ops.full(d, -1.0)
    live = ops.full(d, True) if groups is None else torch.ones_like(d, dtype=torch.bool)
    gen: torch.Generator | None = None
    for it in range(1, 2 * v.numel() + 2 * NEWTON_PASSES):
        newton = it <= NEWTON_PASSES or it % 2 == 1
        if newton:
            p = lo
            above = torch.relu(v - ops.expand(p))  # v - p on the candidates above p, else 0
            excess = ops.seg_sum(above)
            c = ops.seg_sum(torch.sign(above))
        else:
            if gen is None:
                gen = torch.Generator(device=v.device).manual_seed(seed)
            p = ops.random_pivot(v, lo, gen)
            ge = v >= ops.expand(
                p
            )  # >=: a right pivot leaves together with the coordinates above it
            excess = ops.seg_sum(torch.where(ge, v - ops.expand(p), 0))
            c = ops.seg_sum(ge.to(v.dtype))
        s_tot = s_act + excess + c * p  # S + s_p
        k_tot = k_act + c
        step = (d + s_tot) / (k_tot + 1)  # Newton iterate from p
        if newton:  # p = lo <= r
            done = live & ((step <= lo) | (k_tot == k_lo))
            moved = done
            k_lo = ops.where(step > lo, k_tot, k_lo)
            lo = ops.maximum(lo, step)
        else:
            right = p - d - (s_tot - k_tot * p) >= 0  # h(p) >= 0  <=>  p >= r
            done = False if groups is None else torch.zeros_like(live)
            moved = live & right
            new_lo = ops.where(right, step, ops.maximum(step, p))
            k_lo = ops.where(new_lo > lo, ops.where(new_lo == step, k_tot, -1.0), k_lo)
            lo = ops.maximum(lo, new_lo)
        s_act = ops.where(moved, s_tot, s_act)
        k_act = ops.where(moved, k_tot, k_act)
        live = live & ops.lnot(done)
        if not ops.any(live):
            break
        if newton and 2 * float(c if groups is None else c.sum()) > v.numel():
            continue  # most candidates still undecided: another pass beats a compaction
        keep = v > ops.expand(lo)
        if groups is not None:
            keep &= ops.expand(live)
        if not newton:
            keep &= ~(ge & ops.expand(moved))
        v = v[keep]
        ops.compact(keep)
        if not v.numel():  # every remaining coordinate decided: the active set is S, K
            break
    r = (d + s_act) / (k_act + 1)
    if groups is None:
        return torch.full_like(delta, r)
    return r.to(delta.dtype)
