r"""The math of the rate objectives as plain tensor functions (method note sec. 8).

Scores ``u`` of a linear head; positives ``S+`` (``n`` of them) and negatives ``S-`` (``m``). The
hinge bounds of Eban et al. hold for every ``u``:

$$
\begin{aligned} tp(u) &= \sum_{S^+} 1[u_i > 0] \ge tp^-(u) := \sum_{S^+} \min(1, u_i),\\
fp(u) &= \sum_{S^-} 1[u_j > 0] \le fp^+(u) := \sum_{S^-} \max(0, 1 + u_j). \end{aligned}
$$

Recall and precision are monotone in ``tp`` and ``fp``: the certified bounds below are sound.

Examples:
    >>> import torch
    >>> from reparam import rate_functional as R
    >>> u_pos, u_neg = torch.tensor([2.0, 0.5, -0.5]), torch.tensor([-2.0, 0.0, 1.0])
    >>> R.certified_precision(u_pos, u_neg), round(R.recall_precision(u_pos, u_neg)[1], 4)
    (0.25, 0.6667)
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .rate_thresholds import RateThreshold, threshold_at_precision, threshold_at_recall
from .sharding import LOCAL, LocalComm

__all__ = ["RateThreshold", "threshold_at_precision", "threshold_at_recall"]  # (re-exported)

_GOLDEN = (5**0.5 - 1) / 2  # best_rescaled_precision_margin's golden-section search


def hinge_fp(u_neg: Tensor) -> Tensor:
    """``max(0, 1 + u)`` elementwise: the upper bound of ``1[u > 0]``.

    Examples:
        >>> import torch
        >>> from reparam import rate_functional as R
        >>> R.hinge_fp(torch.tensor([-2.0, 0.0, 1.0])).tolist()
        [0.0, 1.0, 2.0]
    """
    return torch.relu(1 + u_neg)


def capped(u: Tensor) -> Tensor:
    """``min(u, 1)``: with ``tau <= 1`` the dualized ``tau_i <= u_i`` is the same constraint as
    ``tau_i <= min(u_i, 1)``, whose Lagrangian term ``-lambda_i min(u_i, 1)`` stops pulling a
    positive's score up once it reaches 1 (method note sec. 8).

    Examples:
        >>> import torch
        >>> from reparam import rate_functional as R
        >>> R.capped(torch.tensor([2.0, 0.5, -0.5])).tolist()
        [1.0, 0.5, -0.5]
    """
    return torch.clamp(u, max=1)


def tp_lower(u_pos: Tensor) -> Tensor:
    """``sum min(1, u_i)``: the lower bound of the true positives.

    Examples:
        >>> import torch
        >>> from reparam import rate_functional as R
        >>> R.tp_lower(torch.tensor([2.0, 0.5, -0.5])).item()  # 1 + 0.5 - 0.5
        1.0
    """
    return capped(u_pos).sum()


def fp_upper(u_neg: Tensor) -> Tensor:
    """``sum max(0, 1 + u_j)``: the upper bound of the false positives.

    Examples:
        >>> import torch
        >>> from reparam import rate_functional as R
        >>> R.fp_upper(torch.tensor([-2.0, 0.0, 1.0])).item()  # 0 + 1 + 2
        3.0
    """
    return hinge_fp(u_neg).sum()


def certified_recall(u_pos: Tensor, comm: LocalComm = LOCAL) -> float | None:
    """``max(0, mean min(1, u_i)) <= recall(u > 0)``; ``None`` without positives (``comm``: the
    scores spread over processes, ``reparam.sharding``).

    Examples:
        >>> import torch
        >>> from reparam import rate_functional as R
        >>> round(R.certified_recall(torch.tensor([2.0, 0.5, -0.5])), 4)  # tp- / n = 1 / 3
        0.3333
    """
    n = comm.total(u_pos.numel())
    if n == 0:
        return None
    return max(0.0, float(comm.sum(tp_lower(u_pos.double()).reshape(1))) / n)


def certified_precision(u_pos: Tensor, u_neg: Tensor, comm: LocalComm = LOCAL) -> float | None:
    """``tp- / (tp- + fp+) <= precision(u > 0)`` when ``tp- > 0``, else ``None`` (no certificate).

    Examples:
        >>> import torch
        >>> from reparam import rate_functional as R
        >>> u_pos, u_neg = torch.tensor([2.0, 0.5, -0.5]), torch.tensor([-2.0, 0.0, 1.0])
        >>> R.certified_precision(u_pos, u_neg)  # tp- = 1, fp+ = 3
        0.25
    """
    sums = torch.stack([tp_lower(u_pos.double()), fp_upper(u_neg.double())]).cpu()
    tp, fp = (float(v) for v in comm.sum(sums))
    if tp <= 0:
        return None
    return tp / (tp + fp)


def recall_precision(
    u_pos: Tensor, u_neg: Tensor, comm: LocalComm = LOCAL
) -> tuple[float | None, float | None]:
    """True recall and precision of the decisions ``u > 0`` (``None`` where undefined).

    Examples:
        >>> import torch
        >>> from reparam import rate_functional as R
        >>> u_pos, u_neg = torch.tensor([2.0, 0.5, -0.5]), torch.tensor([-2.0, 0.0, 1.0])
        >>> [round(v, 4) for v in R.recall_precision(u_pos, u_neg)]  # tp = 2, fp = 1
        [0.6667, 0.6667]
    """
    counts = torch.stack([(u_pos > 0).sum(), (u_neg > 0).sum()]).cpu()
    counts = comm.sum(torch.cat([counts, torch.tensor([u_pos.numel()])]))
    tp, fp, n = (float(c) for c in counts)
    recall = tp / n if n else None
    precision = tp / (tp + fp) if tp + fp > 0 else None
    return recall, precision


def roc_auc(u_pos: Tensor, u_neg: Tensor, comm: LocalComm = LOCAL) -> float | None:
    """Exact ROC-AUC (Mann-Whitney): ``P(u_pos > u_neg) + P(u_pos = u_neg) / 2`` over all pairs,
    from average ranks (O((n + m) log(n + m))); ``None`` without positives or negatives.
    ``comm`` with several processes: ``_roc_auc_over`` (a sample sort, O((n + m) / K) each).

    Examples:
        >>> import torch
        >>> from reparam import rate_functional as R
        >>> u_pos, u_neg = torch.tensor([2.0, 0.5, -0.5]), torch.tensor([-2.0, 0.0, 1.0])
        >>> round(R.roc_auc(u_pos, u_neg), 4)  # 6 of the 9 pairs ordered right
        0.6667
    """
    if comm.world > 1:
        return _roc_auc_over(u_pos, u_neg, comm)
    n, m = u_pos.numel(), u_neg.numel()
    if n == 0 or m == 0:
        return None
    allu = torch.cat([u_pos.detach().double().flatten(), u_neg.detach().double().flatten()])
    _, inverse, counts = torch.unique(allu, sorted=True, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()  # 1-based rank of the last element of each value
    avg_rank = ends - (counts.double() - 1) / 2  # ties share the mean of their ranks
    rank_sum = float(avg_rank[inverse[:n]].sum())
    return (rank_sum - n * (n + 1) / 2) / (n * m)


def _roc_auc_over(u_pos: Tensor, u_neg: Tensor, comm: LocalComm) -> float | None:
    """``roc_auc`` over processes, exactly: value ranges of about equal counts (a 4096-bucket
    histogram summed over the processes; ties share a bucket) are routed one to each process
    (``comm.route``, O((n + m) / K) each), which counts, for its positives, the negatives below
    them: those of the lower ranges and its own, ties a half."""
    n, m = comm.total(u_pos.numel()), comm.total(u_neg.numel())
    if n == 0 or m == 0:
        return None
    x = torch.cat([u_pos.detach().double().flatten(), u_neg.detach().double().flatten()])
    is_pos = torch.arange(x.numel()) < u_pos.numel()
    lo, hi = float(comm.min_of(x)), float(comm.max_of(x))
    buckets = 4096
    scale = buckets / (hi - lo) if hi > lo else 0.0
    bucket = ((x - lo) * scale).long().clamp(0, buckets - 1)
    counts = comm.sum(torch.bincount(bucket, minlength=buckets)).cumsum(0)
    # process r takes the buckets whose running count passes r / K of all the scores
    cuts = torch.tensor([(r * (n + m)) // comm.world for r in range(1, comm.world)])
    first_bucket = torch.searchsorted(counts, cuts, right=True)
    dest = torch.searchsorted(first_bucket, bucket, right=True)
    got = comm.route(torch.stack([x, is_pos.double()], 1), dest)
    values, pos = got[:, 0], got[:, 1] > 0
    _, inverse = torch.unique(values, sorted=True, return_inverse=True)
    size = int(inverse.max()) + 1 if inverse.numel() else 0
    pos_v = torch.zeros(size, dtype=torch.float64).index_add_(0, inverse, pos.double())
    neg_v = torch.zeros(size, dtype=torch.float64).index_add_(0, inverse, (~pos).double())
    below = torch.cumsum(neg_v, 0) - neg_v  # this range's negatives below each value
    here = torch.tensor([float(neg_v.sum())], dtype=torch.float64)
    negatives = comm.cat(here)  # every range's negatives, in rank order
    lower = float(negatives[: comm.rank].sum())
    u = float((pos_v * (below + lower + neg_v / 2)).sum())
    return float(comm.sum(torch.tensor([u], dtype=torch.float64))) / (n * m)


def fpr_grid(k: int) -> Tensor:
    """The midpoint grid of false-positive rates ``t_k = (k - 1/2) / K``, ``k = 1..K``.

    Examples:
        >>> import torch
        >>> from reparam import rate_functional as R
        >>> R.fpr_grid(4).tolist()
        [0.125, 0.375, 0.625, 0.875]
    """
    return (torch.arange(1, k + 1, dtype=torch.float64) - 0.5) / k


def certified_auc(tpr_lower: Tensor, fpr_upper: Tensor) -> float:
    r"""A lower bound on the ROC-AUC from points known to lie below-right of the ROC curve.

    For each threshold ``k`` the curve passes through ``(F_k, T_k)`` with ``F_k <= fpr_upper_k``
    and ``T_k >= tpr_lower_k``; the curve is non-decreasing, so ``R(f) >= max{tpr_lower_k :
    fpr_upper_k <= f}`` and ``AUC = int_0^1 R >= `` the area under that staircase.

    Examples:
        >>> import torch
        >>> from reparam import rate_functional as R
        >>> tpr_lower, fpr_upper = torch.tensor([0.5, 0.75, 1.0]), torch.tensor([0.0, 0.25, 0.5])
        >>> R.certified_auc(tpr_lower, fpr_upper)
        0.8125
    """
    f = fpr_upper.detach().double().clamp(0, 1)
    t = tpr_lower.detach().double().clamp(0, 1)
    order = torch.argsort(f)
    f, t = f[order], torch.cummax(t[order], 0).values
    widths = torch.diff(torch.cat([f, f.new_ones(1)]))
    return float((t * widths).sum())


# --- minibatch Lagrangians (the training losses) ---------------------------------------------------
def precision_at_recall_minibatch(
    tau_b: Tensor | None,
    lam_b: Tensor,
    nu: Tensor,
    u: Tensor,
    is_pos: Tensor,
    scale: float,
    recall: float,
) -> Tensor:
    r"""``L_B`` of (8a) on a batch: ``scale [sum_{B-} max(0, 1 + u_j) + sum_{B+} ((lambda_i - nu)
    tau_i - lambda_i min(u_i, 1))] + nu r`` with ``scale = N / (n B)``; ``tau_b``, ``lam_b`` are the
    rows of the batch's samples (any value for negatives; ``lam_b`` may be one value for all),
    ``is_pos`` marks the positives. ``tau_b=None``: the blocks are at their saddle, ``lambda_i =
    nu``, where the ``tau`` term is 0 (the same value, bit for bit, as any finite ``tau_b``).

    Examples:
        >>> import torch
        >>> from reparam import rate_functional as R
        >>> tau_b, lam_b, nu = torch.tensor([0.5, 0.0]), torch.tensor([1.0, 0.0]), torch.tensor(0.5)
        >>> u, is_pos = torch.tensor([2.0, -0.5]), torch.tensor([True, False])
        >>> round(R.precision_at_recall_minibatch(tau_b, lam_b, nu, u, is_pos, 1.0, 0.8).item(), 4)
        0.15
    """
    pulled = -(lam_b * capped(u)) if tau_b is None else (lam_b - nu) * tau_b - lam_b * capped(u)
    terms = torch.where(is_pos, pulled, hinge_fp(u))
    return scale * terms.sum() + nu * recall


def recall_at_precision_minibatch(
    tau_b: Tensor,
    lam_b: Tensor,
    nu: Tensor,
    u: Tensor,
    is_pos: Tensor,
    scale: float,
    precision: float,
) -> Tensor:
    r"""``L_B`` of (8b): ``scale [sum_{B+} ((lambda_i - 1 - nu (1 - a)) tau_i - lambda_i min(u_i, 1))
    + nu a sum_{B-} max(0, 1 + u_j)]``.

    Examples:
        >>> import torch
        >>> from reparam import rate_functional as R
        >>> tau_b, lam_b, nu = torch.tensor([0.5, 0.0]), torch.tensor([1.0, 0.0]), torch.tensor(0.5)
        >>> u, is_pos = torch.tensor([2.0, -0.5]), torch.tensor([True, False])
        >>> round(R.recall_at_precision_minibatch(tau_b, lam_b, nu, u, is_pos, 1.0, 0.8).item(), 4)
        -0.85
    """
    a = precision
    pos = (lam_b - 1 - nu * (1 - a)) * tau_b - lam_b * capped(u)
    return scale * torch.where(is_pos, pos, nu * a * hinge_fp(u)).sum()


def roc_auc_minibatch(
    tau_b: Tensor,
    lam_b: Tensor,
    nu: Tensor,
    z: Tensor,
    is_pos: Tensor,
    scale_pos: float,
    scale_neg: float,
    grid: Tensor,
) -> Tensor:
    r"""``L_B`` of (8c): ``(1/K) sum_k [scale_pos sum_{B+} ((lambda_ik - 1) tau_ik - lambda_ik
    min(z_ik, 1)) + nu_k scale_neg sum_{B-} max(0, 1 + z_jk) - nu_k t_k]`` with ``z = u + b`` ``(B, K)``,
    ``scale_pos = N / (n B)``, ``scale_neg = N / (m B)``.

    Examples:
        >>> import torch
        >>> from reparam import rate_functional as R
        >>> tau, lam = torch.tensor([[1.0, 0.5], [0.0, 0.0]]), torch.tensor([[0.5, 0.5], [0.0, 0.0]])
        >>> z, is_pos = torch.tensor([[2.0, 0.5], [-1.0, -0.5]]), torch.tensor([True, False])
        >>> nu, grid = torch.tensor([0.5, 0.5]), R.fpr_grid(2)
        >>> round(R.roc_auc_minibatch(tau, lam, nu, z, is_pos, 1.0, 1.0, grid).item(), 4)
        -0.875
    """
    pos = scale_pos * ((lam_b - 1) * tau_b - lam_b * capped(z))
    terms = torch.where(is_pos[:, None], pos, scale_neg * nu * hinge_fp(z))
    return (terms.sum() - (nu * grid).sum()) / grid.numel()


# --- full Lagrangians (references for the minibatch estimates) ----------------------------------
def precision_at_recall_lagrangian(
    tau: Tensor, lam: Tensor, nu: Tensor, u_pos: Tensor, u_neg: Tensor, recall: float
) -> Tensor:
    r"""(8a): ``(1/n) fp+(u) + (1/n) sum lambda_i (tau_i - min(u_i, 1)) + nu (r - mean tau)``.

    Examples:
        >>> import torch
        >>> from reparam import rate_functional as R
        >>> tau, lam, nu = torch.tensor([1.0, 0.5]), torch.tensor([0.5, 0.5]), torch.tensor(0.5)
        >>> u_pos, u_neg = torch.tensor([2.0, 0.5]), torch.tensor([-2.0, 0.0])
        >>> round(R.precision_at_recall_lagrangian(tau, lam, nu, u_pos, u_neg, 0.8).item(), 4)
        0.525
    """
    n = u_pos.numel()
    return (
        fp_upper(u_neg) / n + (lam * (tau - capped(u_pos))).sum() / n + nu * (recall - tau.mean())
    )


def recall_at_precision_lagrangian(
    tau: Tensor, lam: Tensor, nu: Tensor, u_pos: Tensor, u_neg: Tensor, precision: float
) -> Tensor:
    r"""(8b): ``-mean tau + (1/n) sum lambda_i (tau_i - min(u_i, 1)) + nu (a fp+(u)/n - (1 - a)
    mean tau)``.

    Examples:
        >>> import torch
        >>> from reparam import rate_functional as R
        >>> tau, lam, nu = torch.tensor([1.0, 0.5]), torch.tensor([0.5, 0.5]), torch.tensor(0.5)
        >>> u_pos, u_neg = torch.tensor([2.0, 0.5]), torch.tensor([-2.0, 0.0])
        >>> round(R.recall_at_precision_lagrangian(tau, lam, nu, u_pos, u_neg, 0.8).item(), 4)
        -0.625
    """
    n, a = u_pos.numel(), precision
    constraint = a * fp_upper(u_neg) / n - (1 - a) * tau.mean()
    return -tau.mean() + (lam * (tau - capped(u_pos))).sum() / n + nu * constraint


def roc_auc_lagrangian(
    tau: Tensor,
    lam: Tensor,
    nu: Tensor,
    offsets: Tensor,
    u_pos: Tensor,
    u_neg: Tensor,
    grid: Tensor,
) -> Tensor:
    r"""(8c), the mean over grid points ``k`` of
    ``-mean_i tau_ik + (1/n) sum_i lambda_ik (tau_ik - min(u_i + b_k, 1)) + nu_k (fp+(u + b_k)/m - t_k)``.
    ``tau``, ``lam``: ``(n, K)``; ``nu``, ``offsets``, ``grid``: ``(K,)``.

    Examples:
        >>> import torch
        >>> from reparam import rate_functional as R
        >>> tau, lam = torch.tensor([[1.0, 0.5], [0.5, 0.5]]), torch.full((2, 2), 0.5)
        >>> nu, offsets, grid = torch.tensor([0.5, 0.5]), torch.tensor([0.0, 0.5]), R.fpr_grid(2)
        >>> u_pos, u_neg = torch.tensor([2.0, 0.5]), torch.tensor([-2.0, 0.0])
        >>> round(R.roc_auc_lagrangian(tau, lam, nu, offsets, u_pos, u_neg, grid).item(), 4)
        -0.6875
    """
    n, m = u_pos.numel(), u_neg.numel()
    z_pos = u_pos[:, None] + offsets[None, :]
    fpr_bound = hinge_fp(u_neg[:, None] + offsets[None, :]).sum(0) / m
    per_k = -tau.mean(0) + (lam * (tau - capped(z_pos))).sum(0) / n + nu * (fpr_bound - grid)
    return per_k.mean()


def best_rescaled_precision_margin(
    u_pos: Tensor,
    u_neg: Tensor,
    precision: float,
    *,
    n_pos: int | None = None,
    n_neg: int | None = None,
    comm: LocalComm = LOCAL,
) -> float | None:
    r"""How well the *direction* of the current scores can certify precision ``a``: the largest
    margin over rescalings ``c > 0`` and shifts ``d`` of the scores.

    $$
    g(c, d) = \big[(1 - a)\, tp^-(c u + d) - a\, fp^+(c u + d)\big] / n
    $$

    is the LP (8b) restricted to the heads ``c (w, b) + (0, d)``. ``g >= 0`` iff some rescaled
    head meets the precision under the hinge bounds; when (8b) itself is infeasible, ``g < 0`` for
    every direction. ``g`` and ``G(c) = max_d g(c, d)`` are concave: ``G`` is maximized on a log
    grid of ``c``, refined by ternary search, each ``max_d`` by ternary search over the
    breakpoints' range; ``g`` costs ``O(log N)`` (sorted scores, prefix sums). Accurate to ~1e-6 (checked against HiGHS).
    ``n_pos`` / ``n_neg``: the whole set's counts when the scores are a subset. ``None`` without
    positives or negatives. ``comm`` with several processes: each ``g`` sums the processes' ``tp``
    and ``fp`` (one all-reduce of the lanes, ~1,400 per call), over every process's scores.

    Examples:
        >>> import torch
        >>> from reparam import rate_functional as R
        >>> u_pos, u_neg = torch.tensor([2.0, 1.5]), torch.tensor([-2.0, -1.0])
        >>> round(R.best_rescaled_precision_margin(u_pos, u_neg, 0.5), 4)  # separable: g >= 0
        0.5
        >>> round(R.best_rescaled_precision_margin(-u_pos, -u_neg, 0.5), 4)  # reversed: g < 0
        -0.5
    """
    p = np.sort(u_pos.detach().double().cpu().numpy().ravel())
    q = np.sort(u_neg.detach().double().cpu().numpy().ravel())
    n_here, m_here = p.size, q.size
    n, m = (comm.total(n_here), comm.total(m_here)) if comm.world > 1 else (n_here, m_here)
    if n == 0 or m == 0:
        return None
    wp, wq, norm = (n_pos or n) / n, (n_neg or m) / m, float(n_pos or n)
    sp, sq = np.concatenate([[0.0], np.cumsum(p)]), np.concatenate([[0.0], np.cumsum(q)])
    if comm.world > 1:  # every process's extremes (an empty part: +-inf, neutral)
        inf = float("inf")
        edges = [p[-1] if n_here else -inf, q[-1] if m_here else -inf]
        edges += [-p[0] if n_here else -inf, -q[0] if m_here else -inf]
        p_max, q_max, p_min, q_min = comm.max(torch.tensor(edges, dtype=torch.float64)).tolist()
        p_min, q_min = -p_min, -q_min
        sums = comm.sum(torch.tensor([sp[-1] + sq[-1], (p * p).sum() + (q * q).sum()]))
        mean = float(sums[0]) / (n + m)
        spread = max(float(sums[1]) / (n + m) - mean * mean, 0.0) ** 0.5 or 1.0
    else:
        p_max, q_max, p_min, q_min = p[-1], q[-1], p[0], q[0]
        spread = float(np.concatenate([p, q]).std()) or 1.0

    def g(c: np.ndarray, d: np.ndarray) -> np.ndarray:
        k = np.searchsorted(p, (1 - d) / c)  # positives below the cap of min(1, c u + d)
        tp = c * sp[k] + d * k + (n_here - k)
        j = np.searchsorted(q, (-1 - d) / c, side="right")  # negatives with 1 + c u + d <= 0
        fp = (m_here - j) * (1 + d) + c * (sq[-1] - sq[j])
        if comm.world > 1:
            tp, fp = comm.sum(torch.from_numpy(np.stack([tp, fp]))).numpy()
        return ((1 - precision) * wp * tp - precision * wq * fp) / norm

    def best_over_d(c: np.ndarray) -> np.ndarray:
        """Golden-section search per lane (one new evaluation per iteration)."""
        lo = np.minimum(1 - c * p_max, -1 - c * q_max)  # the breakpoints bracket the optimum
        hi = np.maximum(1 - c * p_min, -1 - c * q_min)
        x1, x2 = hi - _GOLDEN * (hi - lo), lo + _GOLDEN * (hi - lo)
        g1, g2 = g(c, x1), g(c, x2)
        for _ in range(60):
            right = g1 < g2  # the maximum is in [x1, hi], else in [lo, x2]
            lo, hi = np.where(right, x1, lo), np.where(right, hi, x2)
            kept_x, kept_g = np.where(right, x2, x1), np.where(right, g2, g1)
            new_x = np.where(right, lo + _GOLDEN * (hi - lo), hi - _GOLDEN * (hi - lo))
            new_g = g(c, new_x)
            x1, g1 = np.where(right, kept_x, new_x), np.where(right, kept_g, new_g)
            x2, g2 = np.where(right, new_x, kept_x), np.where(right, new_g, kept_g)
        return np.maximum(g1, g2)

    log_c = np.linspace(-4, 6, 81) - np.log10(spread)
    values = best_over_d(10.0**log_c)
    i = int(np.argmax(values))
    lo, hi = log_c[max(i - 1, 0)], log_c[min(i + 1, log_c.size - 1)]
    for _ in range(20):  # G is concave in c, hence unimodal in log c
        m1, m2 = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        v = best_over_d(10.0 ** np.array([m1, m2]))
        lo, hi = (m1, hi) if v[0] < v[1] else (lo, m2)
    refined = best_over_d(np.array([10.0 ** ((lo + hi) / 2)]))[0]
    # c = 0 (a constant head): g is piecewise linear in d with kinks at -1 and 1
    flat = max(
        ((1 - precision) * wp * n * min(1.0, d) - precision * wq * m * max(0.0, 1 + d)) / norm
        for d in (-1.0, 1.0)
    )
    return float(max(values[i], refined, flat))
