r"""Decision thresholds at a target rate (method note sec. 8): the cut ``t`` whose decisions
``u > t`` meet a recall or a precision with the best other rate, on one process or over several
(``reparam.sharding``). ``reparam.rate_functional`` re-exports them (``R.threshold_at_recall``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from .functional import best_cut
from .sharding import LOCAL, LocalComm


class RateThreshold(NamedTuple):
    """A decision threshold and its rates (returned by ``threshold_at_*`` and ``calibrate``).

    Attributes:
        threshold: ``t``: the decisions are ``u > t``.
        recall: the recall of those decisions on the scores ``t`` was chosen on.
        precision: their precision there.
        met: whether the target holds there.

    Examples:
        >>> import torch
        >>> from reparam import rate_functional as R
        >>> R.threshold_at_recall(torch.tensor([2.0, 1.5, 0.5]), torch.tensor([1.0, -1.0]), 1.0)
        RateThreshold(threshold=-0.25, recall=1.0, precision=0.75, met=True)
    """

    threshold: float
    recall: float
    precision: float
    met: bool


def _cuts(u_pos: Tensor, u_neg: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Every cut between distinct scores, highest first: ``(t, tp, k, n_pos)`` with ``t`` the
    midpoint between the last score kept and the first dropped (below all scores: ``min - 1/2``),
    ``tp`` / ``k`` the positives / samples kept (float64, exact integers)."""
    u = torch.cat([u_pos.detach().reshape(-1), u_neg.detach().reshape(-1)]).double().cpu()
    y = torch.cat([torch.ones(u_pos.numel()), torch.zeros(u_neg.numel())]).double()
    u, order = torch.sort(u, descending=True)
    tp, k = torch.cumsum(y[order], 0), torch.arange(1, u.numel() + 1, dtype=torch.float64)
    last = torch.ones(u.numel(), dtype=torch.bool)  # the last of each run of equal scores
    last[:-1] = u[1:] < u[:-1]
    nxt = torch.cat([u[1:], u[-1:] - 1.0])  # the first dropped score (below all: min - 1)
    t = (u + nxt) / 2
    return t[last], tp[last], k[last], torch.tensor(float(u_pos.numel()), dtype=torch.float64)


def threshold_at_recall(
    u_pos: Tensor, u_neg: Tensor, recall: float, comm: LocalComm = LOCAL
) -> RateThreshold:
    """The best precision subject to recall ``>= recall``: among the cuts whose decisions ``u > t``
    keep at least ``ceil(recall n)`` positives, the one of highest precision (ties: the highest
    cut). Always met (keeping every sample has recall 1). ``O((n + m) log(n + m))``, one sort.
    ``comm`` with several processes (``reparam.sharding``): ``functional.best_cut``'s value-bucket
    search with precision as the value (``-1`` below the floor on ``tp``); the same cut as the sort.

    Examples:
        >>> import torch
        >>> from reparam import rate_functional as R
        >>> u_pos, u_neg = torch.tensor([2.0, 0.5, -0.5]), torch.tensor([-2.0, 0.0, 1.0])
        >>> t = R.threshold_at_recall(u_pos, u_neg, 0.6)  # keeps 2.0, 0.5 and the negative 1.0
        >>> t.threshold, round(t.recall, 4), round(t.precision, 4), t.met
        (0.25, 0.6667, 0.6667, True)
    """
    if comm.world > 1:
        n = comm.total(u_pos.numel())
        if n == 0:
            _need_positives(u_pos[:0])
        floor = math.ceil(recall * float(n) - 1e-9)

        def precision(tp: Tensor, k: Tensor) -> Tensor:
            return torch.where(tp >= floor, tp / k, torch.full_like(tp, -1.0))

        def by_sort(u_pos: Tensor, u_neg: Tensor) -> RateThreshold:
            return threshold_at_recall(u_pos, u_neg, recall)

        cut = best_cut(u_pos, u_neg, precision, comm, by_sort, masked=-2.0)
        if isinstance(cut, RateThreshold):
            return cut
        t, _, tp, k = cut
        return RateThreshold(t, tp / n, tp / k, True)
    _need_positives(u_pos)
    t, tp, k, n = _cuts(u_pos, u_neg)
    feasible = tp >= math.ceil(recall * float(n) - 1e-9)
    precision = torch.where(feasible, tp / k, torch.full_like(tp, -1.0))
    i = int(torch.argmax(precision))  # the first maximum: the highest cut among ties
    return RateThreshold(float(t[i]), float(tp[i] / n), float(tp[i] / k[i]), True)


def threshold_at_precision(
    u_pos: Tensor, u_neg: Tensor, precision: float, comm: LocalComm = LOCAL
) -> RateThreshold:
    """The best recall subject to precision ``>= precision``: among the cuts whose decisions have
    precision ``tp / k >= precision``, the one keeping the most positives (ties: the highest cut).
    When no cut meets the target, the cut of highest precision (ties: the most positives), with
    ``met=False``. ``comm`` with several processes: ``functional.best_cut``'s value-bucket search
    valuing a feasible cut by its recall (``-1`` below the precision), then, if none is feasible,
    by its precision; the same cut as the sort of all the scores.

    Examples:
        >>> import torch
        >>> from reparam import rate_functional as R
        >>> u_pos, u_neg = torch.tensor([2.0, 0.5, -0.5]), torch.tensor([-2.0, 0.0, 1.0])
        >>> R.threshold_at_precision(u_pos, u_neg, 1.0)
        RateThreshold(threshold=1.5, recall=0.3333333333333333, precision=1.0, met=True)
    """
    if comm.world > 1:
        n = comm.total(u_pos.numel())
        if n == 0:
            _need_positives(u_pos[:0])

        def feasible_tp(tp: Tensor, k: Tensor) -> Tensor:
            return torch.where(tp / k >= precision - 1e-12, tp, torch.full_like(tp, -1.0))

        def ranked_precision(tp: Tensor, k: Tensor) -> Tensor:  # ties: the most positives
            return tp / k + tp * 1e-12 / max(float(n), 1.0)

        def by_sort(u_pos: Tensor, u_neg: Tensor) -> RateThreshold:
            return threshold_at_precision(u_pos, u_neg, precision)

        for value in (feasible_tp, ranked_precision):
            cut = best_cut(u_pos, u_neg, value, comm, by_sort, masked=-2.0)
            if isinstance(cut, RateThreshold):
                return cut
            t, best, tp, k = cut
            if value is ranked_precision or best >= 0:
                return RateThreshold(t, tp / n, tp / k, tp / k >= precision - 1e-12)
    _need_positives(u_pos)
    t, tp, k, n = _cuts(u_pos, u_neg)
    prec = tp / k
    feasible = prec >= precision - 1e-12
    if bool(feasible.any()):
        i = int(torch.argmax(torch.where(feasible, tp, torch.full_like(tp, -1.0))))
    else:
        i = int(torch.argmax(prec + tp * 1e-12 / max(float(n), 1.0)))
    return RateThreshold(float(t[i]), float(tp[i] / n), float(prec[i]), bool(feasible[i]))


def _need_positives(u_pos: Tensor) -> None:
    if u_pos.numel() == 0:
        raise ValueError("a rate threshold needs at least one positive score, got none")
