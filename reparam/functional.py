r"""The math of the F-beta S-measure regularizer as plain tensor functions (method note sec. 1-3).

Scale-free LP (3') (method note sec. 2), for one positive shape class with ``n`` positives ``S+`` and the
negatives ``S-`` (one-vs-rest), scores ``u = w . a(x) + b``:

$$
\min\ \beta^2 \epsilon + \tfrac1n \sum_{j \in S^-} \phi(\epsilon + u_j)
\quad\text{s.t.}\quad \tau_i \le \epsilon,\ \tau_i \le u_i\ (i \in S^+),\
\tfrac1n \textstyle\sum_{S^+} \tau_i = 1,\ \epsilon \ge 0.                      \qquad (3')
$$

It has the optimal value of the paper's LP (3) (``sum tau = 1``): multiplying every variable of (3)
by ``n`` maps one onto the other (method note sec. 2; ``tests/reparam/test_lp.py`` checks it with HiGHS).

Examples:
    >>> import torch
    >>> from reparam import functional as F
    >>> u_pos, u_neg = torch.tensor([2.0, 1.5, 1.0]), torch.tensor([-2.0, -1.5, 0.5])
    >>> round(F.fbeta_of_decisions(u_pos, u_neg, beta=1.0), 4)  # the F-1 of u > 0
    0.8571
    >>> round(F.certified_fbeta_bound(u_pos, u_neg, beta=1.0), 4)  # (3')'s bound, below it
    0.8
"""

from __future__ import annotations

import torch
from torch import Tensor

from .sharding import LOCAL, LocalComm

# The negatives' term is ``phi(eps + u_j)`` with the hinge ``phi(z) = max(0, z)``: the LP. (The
# paper's Remark 3 allows a squared hinge or a logistic ``phi``; no measurement of ours favoured
# them, so they are not offered: method note sec. 1.)


def minibatch_lagrangian(
    eps: Tensor,
    tau_pos: Tensor,
    lam_pos: Tensor,
    u_pos: Tensor,
    mu: Tensor,
    u_neg: Tensor,
    *,
    beta: float,
    scale: float,
) -> Tensor:
    r"""The minibatch estimate ``L_B`` of method note sec. 3 for one positive class.

    $$
    L_B = \beta^2 \epsilon + \frac{N}{nB}\Big[\sum_{i \in B^+} ((\mu + \lambda_i)\tau_i
          - \lambda_i u_i) + \sum_{j \in B^-} \phi(\epsilon + u_j)\Big]
    $$

    with ``scale = N / (n B)``. Over the batches of an epoch it averages to the full Lagrangian
    (4') plus ``mu`` (the ``-mu`` of (4') is a constant).
    """
    pos = ((mu + lam_pos) * tau_pos - lam_pos * u_pos).sum()
    neg = torch.relu(eps + u_neg).sum()
    return beta**2 * eps + scale * (pos + neg)


def best_feasible_eps(u_pos: Tensor, comm: LocalComm = LOCAL) -> Tensor | None:
    r"""Smallest ``eps >= 0`` with ``mean_i min(eps, u_i) >= 1`` (method note sec. 2); ``None`` if none.

    ``g(e) = sum_i min(e, u_i)`` is increasing and piecewise linear with maximum ``sum u`` (at
    ``e >= max u``), so a solution of ``g(e) = n`` exists iff ``mean u >= 1``. With ``u`` ascending
    and ``k`` values below ``e``: ``g(e) = u_1 + ... + u_k + (n - k) e = n`` gives
    ``e_k = (n - S_k) / (n - k)``, valid when ``u_k <= e_k <= u_{k+1}``; the smallest valid one
    (``_best_feasible_eps_sorted`` evaluates every ``k`` after one sort).

    Expected O(n) without a sort: the values go to ``M`` value buckets (``_bucket_index``,
    monotone, so each bucket is a range of consecutive sorted positions); one pass counts each
    bucket and sums it in float64, which gives ``k`` and ``S_k`` before every bucket. Bucket ``c``
    holds values in ``[lb_c, ub_c]`` (its value range widened by half a bucket against the index's
    rounding), so ``g`` at its largest value is at most ``S_{<=c} + ub_c (n - k_{<=c})`` and at its
    smallest at least ``S_{<c} + lb_c (n - k_{<c})``. Only the buckets from the first whose upper
    bound reaches ``n - delta_c`` to the last whose lower bound stays below ``n + delta_c`` can
    hold a valid ``k``: below them ``e_k - u_k = (n - g(u_k)) / (n - k) > delta_c / n``, above them
    ``u_{k-1} - e_k = (g(u_{k-1}) - n) / (n - k) > delta_c / n``, with
    ``delta_c = 1e-6 (n (1 + max(|lb_c|, |ub_c|)) + sum_{u <= ub_c} |u|)`` far above the validity
    tolerance ``1e-12 (1 + |u_k|)`` and the float64 sums' rounding. For the same reason the checks
    against the values just outside that window always pass: the window is solved alone, sorted,
    with its exact offsets ``k`` and ``S_k``; one larger than ``_SCAN_AT`` values is bucketed
    again over its own range (a few huge values put almost everything in one bucket). The same
    result as the sort up to the rounding of the float64 sums (the same when they are exact, e.g.
    integer scores).

    ``comm`` (``reparam.sharding``): the scores are spread over processes; the bucket counts and
    sums are summed over them, and the window left is gathered (the same result on every process).
    """
    n = comm.total(u_pos.numel())
    if n == 0:
        return None
    u = u_pos.detach().reshape(-1)
    bounds = _bucket_range([u], comm) if n >= _SORT_BELOW else None
    if bounds is None:  # small, degenerate or non-finite: the sort
        return _best_feasible_eps_sorted(comm.cat(u_pos.detach().reshape(-1)))
    lo, hi = bounds
    top = u.new_tensor(hi, dtype=torch.float64)  # g(max u) = sum u: no valid k left is rounding
    # the values left, and the count, sum and (a bound on the) sum of |u| of those below them
    window, k0, s0, a0 = u, 0.0, 0.0, 0.0
    size = n  # the window's values on every process: the bucket count is the same everywhere
    for level in range(_LEVELS):
        m = _n_buckets(size)
        lo_t = u.new_tensor([lo])
        scale = _scales(lo_t, u.new_tensor([hi]), m)
        counts = torch.zeros(m, dtype=torch.int64, device=u.device)
        sums = torch.zeros(m, dtype=torch.float64, device=u.device)
        for x in window.split(_CHUNK):
            b = _bucket_index(x, lo_t, scale, m)
            counts += torch.bincount(b, minlength=m)
            sums.index_add_(0, b, x.double())
        counts, sums = comm.sum(counts), comm.sum(sums)
        if level == 0 and float(sums.sum()) / n < 1.0:
            return None
        cnt = counts.double()
        k_le, s_le = k0 + cnt.cumsum(0), s0 + sums.cumsum(0)
        k_lt, s_lt = k_le - cnt, s_le - sums
        # each bucket's value range, widened by half a bucket each side (_bucket_index's rounding)
        c = torch.arange(m, dtype=torch.float64, device=u.device)
        step = 1 / float(scale[0])
        lb = (lo + (c - 0.5) * step).clamp_(min=lo)
        ub = (lo + (c + 1.5) * step).clamp_(max=hi)
        mag = torch.maximum(lb.abs(), ub.abs())
        # sum |u| per bucket: |its sum| unless its values may have both signs
        absolute = torch.where((lb < 0) & (ub > 0), cnt * mag, sums.abs())
        a_le = a0 + absolute.cumsum(0)
        delta = 1e-6 * (n * (1 + mag) + a_le)
        nonempty = cnt > 0
        reaches = nonempty & (s_le + ub * (n - k_le) >= n - delta)  # g(max of c) may reach n
        if not bool(reaches.any()):  # g < n at every value here: the cut above them all
            window, k0, s0 = window[:0], float(k_le[-1]), float(s_le[-1])
            break
        first = int(reaches.to(torch.int8).argmax())
        short = nonempty & (c >= first) & (s_lt + lb * (n - k_lt) <= n + delta)  # g(min) may be < n
        last = (
            m - 1 - int(short.flip(0).to(torch.int8).argmax()) if bool(short.any()) else first - 1
        )
        k0, s0, a0 = float(k_lt[first]), float(s_lt[first]), float(a_le[first] - absolute[first])
        if last < first:  # the root lies in the gap below bucket `first`: k0 alone
            window = window[:0]
            break
        kept = []
        for x in window.split(_CHUNK):
            b = _bucket_index(x, lo_t, scale, m)
            kept.append(x[(b >= first) & (b <= last)])
        window = torch.cat(kept) if kept else window
        kept_size = comm.total(window.numel())
        if kept_size <= _SCAN_AT or kept_size == size:
            break
        size = kept_size
        lo, hi = _bucket_range([window], comm) or (0.0, 0.0)
        if lo == hi:
            break
    return _feasible_eps_scan(comm.cat(window), k0, s0, n, top).to(u_pos.dtype)


def _feasible_eps_scan(window: Tensor, k0: float, s0: float, n: int, top: Tensor) -> Tensor:
    """``_best_feasible_eps_sorted``'s candidates ``e_k`` for the ``k`` of ``window`` (all
    values at sorted positions ``k0 ..``, ``s0`` the sum of those below) and the cut just above it;
    the checks against the values outside it pass (``best_feasible_eps``): ``-inf``, ``inf``."""
    w = torch.sort(window).values.double()
    m = w.numel()
    size = m + 1 if k0 + m < n else m  # k = n is no cut (e >= max u: g = sum u)
    s = torch.cat([w.new_zeros(1), torch.cumsum(w, 0)])[:size].add_(s0)
    k = torch.arange(size, dtype=w.dtype, device=w.device).add_(k0)
    e = (n - s) / (n - k)
    inf = w.new_full((1,), float("inf"))
    lower, upper = torch.cat([-inf, w])[:size], torch.cat([w, inf])[:size]
    valid = (e >= lower - 1e-12 * (1 + lower.abs())) & (e <= upper + 1e-12 * (1 + upper.abs()))
    if not bool(valid.any()):  # only through rounding at the very top: g(max u) = mean u ~ 1
        return top.clamp_min(0)
    return e[valid].min().clamp_min(0)


def _best_feasible_eps_sorted(u_pos: Tensor) -> Tensor | None:
    """``best_feasible_eps`` by one sort, O(n log n): every ``e_k`` checked (the reference of
    the bucket path, and its fallback for small or degenerate inputs)."""
    n = u_pos.numel()
    if n == 0:
        return None
    u = torch.sort(u_pos.detach()).values.double()  # sorted in its own dtype: the same order
    if float(u.mean()) < 1.0:
        return None
    s = torch.cat([u.new_zeros(1), torch.cumsum(u, 0)[:-1]])  # S_k, k = 0..n-1
    k = torch.arange(n, dtype=u.dtype, device=u.device)
    e = (n - s) / (n - k)
    lower = torch.cat([u.new_full((1,), -float("inf")), u[:-1]])
    valid = (e >= lower - 1e-12 * (1 + lower.abs())) & (e <= u + 1e-12 * (1 + u.abs()))
    if not bool(valid.any()):  # only through rounding at the very top: g(max u) = mean u ~ 1
        return u[-1].clamp_min(0).to(u_pos.dtype)
    return e[valid].min().clamp_min(0).to(u_pos.dtype)


def lp_objective(eps: Tensor, u_neg: Tensor, n_pos: int, beta: float) -> Tensor:
    """The objective of (3') for the hinge: ``beta^2 eps + (1/n) sum_{S-} max(0, eps + u_j)``."""
    return beta**2 * eps + torch.relu(eps + u_neg).sum() / n_pos


def certified_fbeta_bound(
    u_pos: Tensor, u_neg: Tensor, beta: float, comm: LocalComm = LOCAL
) -> float | None:
    r"""Lower bound on the training F-beta of ``u > 0`` from the best feasible ``eps`` (method note sec. 2).

    $$
    F_\beta(u > 0) \ge \frac{1 + \beta^2}{1 + v},\quad
          v = \beta^2 \epsilon + \tfrac1n \sum_{S^-} \max(0, \epsilon + u_j)
    $$

    ``None`` (no certificate) when no feasible ``eps > 0`` exists, i.e. ``mean u_pos < 1``.
    ``comm``: the scores spread over processes (``reparam.sharding``).

    Args:
        u_pos: the positives' scores ``(n,)``.
        u_neg: the negatives' scores ``(m,)``.
        beta: the ``beta`` of F-beta (``> 0``).
        comm: the processes the scores are spread over (``LOCAL``: all of them here).

    Examples:
        >>> import torch
        >>> from reparam import functional as F
        >>> u_pos, u_neg = torch.tensor([2.0, 1.5, 1.0]), torch.tensor([-2.0, -1.5, 0.5])
        >>> round(F.certified_fbeta_bound(u_pos, u_neg, beta=1.0), 4)
        0.8
        >>> F.certified_fbeta_bound(torch.tensor([0.5, 0.5]), u_neg, beta=1.0) is None
        True
    """
    eps = best_feasible_eps(u_pos, comm)
    if eps is None or float(eps) <= 0:
        return None
    if comm.world == 1:
        v = float(lp_objective(eps.double(), u_neg.detach().double(), u_pos.numel(), beta))
    else:
        hinge = comm.sum(torch.relu(eps.double() + u_neg.detach().double()).sum().reshape(1))
        v = beta**2 * float(eps) + float(hinge) / comm.total(u_pos.numel())
    return (1 + beta**2) / (1 + v)


def fbeta_of_decisions(u_pos: Tensor, u_neg: Tensor, beta: float, comm: LocalComm = LOCAL) -> float:
    """Training F-beta of the hard decisions ``u > 0``.

    F-beta is ``(1+b^2) tp / ((1+b^2) tp + b^2 fn + fp)`` (``comm``: counted over processes).

    Examples:
        >>> import torch
        >>> from reparam import functional as F
        >>> u_pos, u_neg = torch.tensor([2.0, 1.5, 1.0]), torch.tensor([-2.0, -1.5, 0.5])
        >>> round(F.fbeta_of_decisions(u_pos, u_neg, beta=1.0), 4)  # tp = 3, fp = 1, fn = 0
        0.8571
    """
    counts = torch.stack([(u_pos > 0).sum(), (u_neg > 0).sum()]).cpu()
    counts = comm.sum(torch.cat([counts, torch.tensor([u_pos.numel()])]))
    tp, fp, n_pos = (float(c) for c in counts)
    return fbeta_from_counts(tp, n_pos - tp, fp, beta)


def best_fbeta_threshold(
    u_pos: Tensor, u_neg: Tensor, beta: float, comm: LocalComm = LOCAL
) -> tuple[float, float]:
    r"""The threshold ``t`` whose decisions ``u > t`` have the highest F-beta, and that F-beta.

    On these scores, every distinct score is a candidate cut; ``t`` is the midpoint between the last
    score kept and the first dropped (``-inf`` side: below all scores, ``t = min - 1/2``); among
    equal F-betas the highest cut. Returns ``(0.0, F-beta of u > 0)`` when there are no positives.

    Keeping the ``k`` highest scores, ``tp`` of them positive, gives
    ``F = (1 + b^2) tp / ((1 + b^2) tp + b^2 (n_pos - tp) + (k - tp)) = (1 + b^2) tp / (k + b^2 n_pos)``
    (``tp`` and ``k`` exact integers in float64; ``_best_fbeta_threshold_sorted`` evaluates
    every cut after one sort).

    Expected O(n) without a sort: the scores go to ``M`` value buckets (``_bucket_index``,
    monotone: equal scores share a bucket, buckets are ordered as their scores, so each is a
    range of consecutive cuts). One pass counts each bucket's positives and negatives; the counts
    above each bucket give ``F`` exactly at every bucket's lowest cut (keep it whole), ``F_best``
    the largest. Keeping ``j`` of bucket ``c``'s scores, ``t <= pos_c`` of them positive, gives at
    most ``(1 + b^2)(tp_> + pos_c) / (k_> + pos_c + b^2 n_pos)`` (``F`` grows with ``t`` at
    ``j = t``, since ``k >= tp``; and falls with ``j``), so only buckets whose bound reaches
    ``F_best`` (less a 1e-9 margin against rounding) can hold the best cut or one that ties it.
    Their scores alone are sorted and scanned with the exact counts above them -- the same
    ``F`` values as the full sort's at the same cuts, the same maximum and the same tie-break,
    hence the same threshold: the bucket of the next score below the best cut is a candidate too
    (its bound is at least the ``F`` of that cut, the maximum), so that score is scanned.
    When more than ``_SCAN_AT`` scores remain (e.g. a few huge scores put almost all in one
    bucket) the candidate buckets are bucketed again, each over its own range.

    ``comm`` (``reparam.sharding``): the scores are spread over processes; the bucket counts are
    summed over them and the candidates left are gathered (the same result on every process, and
    the same as one process's on all the scores).

    Examples:
        >>> import torch
        >>> from reparam import functional as F
        >>> u_pos, u_neg = torch.tensor([2.0, 1.5, 1.0]), torch.tensor([-2.0, -1.5, 0.5])
        >>> F.best_fbeta_threshold(u_pos, u_neg, beta=1.0)
        (0.75, 1.0)
    """
    n_pos = comm.total(u_pos.numel())
    if n_pos == 0:
        return 0.0, fbeta_of_decisions(u_pos, u_neg, beta, comm)
    b2 = beta**2

    def fbeta(tp: Tensor, k: Tensor) -> Tensor:  # the sort's expression: the same rounding
        return tp * (1 + b2) / (k + b2 * n_pos)

    def by_sort(u_pos: Tensor, u_neg: Tensor) -> tuple[float, float]:
        return _best_fbeta_threshold_sorted(u_pos, u_neg, beta)

    return best_cut(u_pos, u_neg, fbeta, comm, by_sort)[:2]


def best_cut(u_pos: Tensor, u_neg: Tensor, value, comm: LocalComm, by_sort, masked: float = 0.0):
    """The bucket search of ``best_fbeta_threshold`` for any monotone ``value(tp, k)``.

    ``value`` (of float64 tensors: the positives and the scores kept) grows with ``tp`` at a fixed
    count of negatives kept and falls with ``k`` at a fixed ``tp`` (F-beta; precision with a floor
    on ``tp``, which is ``-1`` below it): ``(t, value, tp, k)`` of the best cut, or what
    ``by_sort(u_pos, u_neg)`` returns for small or degenerate inputs (every process's scores,
    gathered). ``masked``: the value of a cut between equal scores (below every real value); it is
    also the value returned, with a NaN threshold, when no cut is valued 0 or more (every value
    negative: R@P's precision met nowhere)."""
    n_all = comm.total(u_pos.numel() + u_neg.numel())
    dtype = torch.promote_types(u_pos.dtype, u_neg.dtype)  # as the sort of their concatenation
    parts = [u_pos.detach().reshape(-1).to(dtype), u_neg.detach().reshape(-1).to(dtype)]
    bounds = _bucket_range(parts, comm) if n_all >= _SORT_BELOW else None
    if bounds is None:  # small, degenerate or non-finite: the sort
        return by_sort(comm.cat(parts[0]), comm.cat(parts[1]))
    lo, hi = (parts[0].new_tensor([v]) for v in bounds)
    groups: list[Tensor | None] = [None, None]  # bucket group of each kept score (None: group 0)
    k0 = tp0 = torch.zeros(1, dtype=torch.float64, device=parts[0].device)  # scores above a group
    best, size = 0.0, n_all
    for level in range(_LEVELS):
        m = max(2, _n_buckets(size) // k0.numel())
        scale = _scales(lo, hi, m)
        counts = torch.zeros(2, k0.numel() * m, dtype=torch.int64, device=k0.device)
        for row, (x, g) in enumerate(zip(parts, groups, strict=True)):
            for xc, gc in _slices(x, g):
                b = _bucket_index(xc, lo, scale, m, gc)
                counts[row] += torch.bincount(b, minlength=counts.shape[1])
        counts = comm.sum(counts)
        n_groups = k0.numel()
        cand, k0, tp0, best = _fbeta_candidates(counts, k0, tp0, m, value, best)
        if k0.numel() == 0:  # no cut valued 0 or more (R@P: none meets the precision)
            return float("nan"), masked, 0.0, 0.0
        new_group = torch.cumsum(cand, 0) - 1  # candidate buckets, in order, are the new groups
        for row, (x, g) in enumerate(zip(parts, groups, strict=True)):
            kept, kept_group = [], []
            for xc, gc in _slices(x, g):
                b = _bucket_index(xc, lo, scale, m, gc)
                keep = cand.index_select(0, b)  # ~5x faster than cand[b] (torch 2.13, CPU)
                kept.append(xc[keep])
                kept_group.append(new_group.index_select(0, b[keep]))
            parts[row], groups[row] = torch.cat(kept), torch.cat(kept_group)
        kept_size = comm.total(parts[0].numel() + parts[1].numel())
        stuck = kept_size == size and k0.numel() == n_groups  # each group one bucket: no split
        if kept_size <= _SCAN_AT or stuck or level == _LEVELS - 1:
            break
        size = kept_size
        x, g = torch.cat(parts), torch.cat(groups)  # each group's range, for its own buckets
        lo = comm.min(x.new_full(k0.shape, float("inf")).scatter_reduce_(0, g, x, "amin"))
        hi = comm.max(x.new_full(k0.shape, -float("inf")).scatter_reduce_(0, g, x, "amax"))
    if comm.world > 1:  # every process's candidates (few: at most _SCAN_AT but for ties)
        parts, groups = [comm.cat(p) for p in parts], [comm.cat(g) for g in groups]
    return _fbeta_scan(parts, groups, k0, tp0, value, masked)


def _fbeta_scan(
    parts: list[Tensor], groups: list[Tensor], k0: Tensor, tp0: Tensor, value, masked: float
) -> tuple[float, float, float, float]:
    """``_best_fbeta_threshold_sorted``'s scan on the candidate scores (positives, negatives)
    in their groups -- ordered value ranges holding all the scores of their range, with ``k0``,
    ``tp0`` scores above each: the threshold and its F-beta. The score below the best cut is a
    candidate too (``best_fbeta_threshold``), so it is the next one here."""
    x, g = torch.cat(parts), torch.cat(groups)
    is_pos = torch.arange(x.numel(), device=x.device) < parts[0].numel()
    x, order = torch.sort(x, descending=True)  # by group too: the groups are ordered value ranges
    is_pos, g = is_pos[order], g[order]
    size = torch.bincount(g, minlength=k0.numel()).double()
    pos_size = torch.bincount(g[is_pos], minlength=k0.numel()).double()
    before, pos_before = _above(size), _above(pos_size)  # candidates in the groups above
    rank = torch.arange(1, x.numel() + 1, dtype=torch.float64, device=x.device)
    k = k0[g] + (rank - before[g])
    tp = tp0[g] + (torch.cumsum(is_pos, 0, dtype=torch.float64) - pos_before[g])
    f = value(tp, k)
    distinct = torch.cat([x[:-1] > x[1:], x.new_ones(1, dtype=torch.bool)])  # a cut between values
    f = f.masked_fill_(~distinct, masked)
    i = int(torch.argmax(f))  # the first maximum: the fewest scores kept, as the sort's
    below = float(x[i + 1]) if i + 1 < x.numel() else float(x[i]) - 1.0
    return (float(x[i]) + below) / 2, float(f[i]), float(tp[i]), float(k[i])


def _best_fbeta_threshold_sorted(u_pos: Tensor, u_neg: Tensor, beta: float) -> tuple[float, float]:
    """``best_fbeta_threshold`` by one sort, O(n log n): every cut evaluated (the reference of
    the bucket path, and its fallback for small or degenerate inputs). The scores are sorted in
    their own dtype (the order and the ties are those of any wider one) and ``tp`` is counted
    exactly (float64 cumulative count of the positives' positions)."""
    if u_pos.numel() == 0:
        return 0.0, fbeta_of_decisions(u_pos, u_neg, beta)
    n_pos = u_pos.numel()
    u, order = torch.sort(torch.cat([u_pos.detach(), u_neg.detach()]), descending=True)
    tp = torch.cumsum(order < n_pos, 0, dtype=torch.float64)
    b2 = beta**2
    k = torch.arange(1, u.numel() + 1, dtype=torch.float64, device=u.device)
    f = tp.mul_(1 + b2).div_(k.add_(b2 * n_pos))
    distinct = torch.cat([u[:-1] > u[1:], u.new_ones(1, dtype=torch.bool)])  # a cut between values
    f = f.masked_fill_(~distinct, 0.0)
    k = int(torch.argmax(f))
    below = float(u[k + 1]) if k + 1 < u.numel() else float(u[k]) - 1.0
    return (float(u[k]) + below) / 2, float(f[k])


def _fbeta_candidates(
    counts: Tensor, k0: Tensor, tp0: Tensor, m: int, value, best: float
) -> tuple[Tensor, Tensor, Tensor, float]:
    """One bucketing round of ``best_fbeta_threshold``: from the positives' and negatives'
    counts ``(2, G m)`` (``m`` buckets per group, ascending) and the scores above each group
    (``k0``, ``tp0``), the candidate buckets (mask), the scores above each of them (the next
    round's ``k0``, ``tp0``) and ``F_best`` raised by the cuts below whole buckets."""
    pos = counts[0].double().view(-1, m)
    size = pos + counts[1].double().view(-1, m)
    k_above = k0[:, None] + _above(size)  # exact integers in float64
    tp_above = tp0[:, None] + _above(pos)
    nonempty = size > 0
    # F of the cut below each whole bucket: the sort's expression, so the same rounding
    whole = value(tp_above + pos, k_above + size)
    best = max(best, float(whole[nonempty].max()))
    bound = value(tp_above + pos, k_above + pos)
    cand = (nonempty & (bound >= best * (1 - 1e-9))).view(-1)
    return cand, k_above.view(-1)[cand], tp_above.view(-1)[cand], best


def _above(counts: Tensor) -> Tensor:
    """Per entry, the sum of the entries after it along the last dimension (the higher buckets)."""
    return counts.flip(-1).cumsum(-1).flip(-1) - counts


def fbeta_from_counts(tp: float, fn: float, fp: float, beta: float) -> float:
    """``(1+b^2) tp / ((1+b^2) tp + b^2 fn + fp)``; 0 when the denominator is 0."""
    den = (1 + beta**2) * tp + beta**2 * fn + fp
    return (1 + beta**2) * tp / den if den > 0 else 0.0


# --- value buckets: the O(n) statistics of best_feasible_eps and best_fbeta_threshold -------------

_BUCKETS = 1 << 16  # at most this many buckets per round (their counts stay in cache)
_PER_BUCKET = 16  # scores per bucket (measured: 4-64 within 2x; fewer buckets, less O(M) work)
_CHUNK = 1 << 18  # scores per slice of an O(n) pass: the bucket indices stay small (1 MB)
_SORT_BELOW = 1 << 14  # fewer scores than this: one sort is faster (measured, 2^13-2^14)
_SCAN_AT = 1 << 16  # at most this many candidate scores are sorted; more are bucketed again
_LEVELS = 4  # bucketing rounds before the candidates are sorted, however many


def _n_buckets(n: int) -> int:
    """Buckets for ``n`` scores: about ``n / _PER_BUCKET``, a power of two in ``[2^8, _BUCKETS]``."""
    return min(_BUCKETS, max(1 << 8, 1 << max(n // _PER_BUCKET, 1).bit_length()))


def _bucket_range(parts: list[Tensor], comm: LocalComm = LOCAL) -> tuple[float, float] | None:
    """``(min, max)`` of the scores for the bucket path; ``None`` (sort instead) when they are all
    equal, not finite (a NaN fails every comparison), so large that ``x - min`` could overflow, or
    neither float32 nor float64 (the index's rounding bound assumes one of them)."""
    if any(x.dtype not in (torch.float32, torch.float64) for x in parts):
        return None
    limit = torch.finfo(parts[0].dtype).max / 4
    parts = [x for x in parts if x.numel()]
    ranges = [torch.aminmax(x) for x in parts]
    lo = min((float(r.min) for r in ranges), default=float("inf"))
    hi = max((float(r.max) for r in ranges), default=-float("inf"))
    if comm.world > 1:  # NaN survives min/max as inf-free sums would not: check it apart
        nan = any(bool(torch.isnan(x).any()) for x in parts)
        lo, hi, nan = (
            float(v)
            for v in (
                comm.min(torch.tensor([lo])),
                comm.max(torch.tensor([hi])),
                comm.max(torch.tensor([float(nan)])),
            )
        )
        return (lo, hi) if nan == 0 and -limit < lo < hi < limit else None
    return (lo, hi) if -limit < lo < hi < limit else None


def _scales(lo: Tensor, hi: Tensor, m: int) -> Tensor:
    """``m / (hi - lo)`` per group in the scores' dtype; 0 for a group of equal scores (one
    bucket), at most the dtype's largest value (a finite product: no ``0 * inf``)."""
    width = hi.double() - lo.double()
    scale = torch.where(width > 0, m / width, 0.0).clamp_(max=torch.finfo(lo.dtype).max)
    return scale.to(lo.dtype)


def _bucket_index(
    x: Tensor, lo: Tensor, scale: Tensor, m: int, group: Tensor | None = None
) -> Tensor:
    """``group m + min(m - 1, floor((x - lo_g) scale_g))`` (``x >= lo_g``; ``group`` None: one
    group). A subtraction and a multiplication, each correctly rounded, so monotone: within a
    group the index never decreases with ``x`` (equal scores share a bucket, buckets are ordered
    as their scores). The rounding moves it by at most ``3 * 2^-24 m <= 2^-6`` of a bucket."""
    if group is None:
        return (x - lo).mul_(scale).clamp_(0, m - 1).to(torch.int32)  # int32: a faster bincount
    b = (x - lo[group]).mul_(scale[group]).clamp_(0, m - 1).to(torch.int64)
    return b.add_(group * m)


def _slices(x: Tensor, group: Tensor | None):
    """``x`` and its groups in slices of ``_CHUNK`` scores (one empty slice when ``x`` is empty)."""
    for start in range(0, max(x.numel(), 1), _CHUNK):
        stop = start + _CHUNK
        yield x[start:stop], None if group is None else group[start:stop]
