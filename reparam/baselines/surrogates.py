r"""Smooth minibatch surrogates of F-beta and AUC (method note sec. 9): plain functions.

Both are minibatch quantities (a ratio, resp. a mean over the batch's pairs), so like the LP layer
they estimate the data-set objective with a bias; neither keeps state across batches.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_labels, check_positive, check_scores


def soft_fbeta_loss(
    scores: Tensor, labels: Tensor, *, beta: float = 1.0, temperature: float = 1.0
) -> Tensor:
    r"""``1 - soft F-beta`` of one minibatch, with sigmoid counts.

    $$
    p_i = \sigma(u_i / T),\quad tp = \sum_{B^+} p_i,\quad fp = \sum_{B^-} p_j,\quad fn = |B^+| - tp,
    $$

    $$
    \ell = 1 - \frac{(1 + \beta^2)\, tp}{(1 + \beta^2)\, tp + \beta^2 fn + fp}
    $$

    As ``T -> 0`` the counts become those of the decisions ``u > 0`` (method note sec. 1). The
    denominator is ``> 0`` whenever the batch has a positive (``tp > 0``), which is required.

    Args:
        scores: ``(B,)`` float scores ``u`` of the batch.
        labels: ``(B,)`` 0/1 labels (1: positive), at least one positive.
        beta: the ``beta`` of F-beta (``> 0``).
        temperature: ``T`` of the sigmoid counts (``> 0``).

    Raises:
        ValueError: scores not a finite float ``(B,)`` tensor, labels not 0/1 of shape ``(B,)`` or
            without a positive, ``beta`` or ``temperature`` not ``> 0``.

    Examples:
        >>> import torch
        >>> from reparam.baselines import soft_fbeta_loss
        >>> u, y = torch.tensor([2.0, -1.0, 0.5, 1.0]), torch.tensor([1, 0, 1, 0])
        >>> round(soft_fbeta_loss(u, y).item(), 4)
        0.3324
        >>> round(soft_fbeta_loss(u, y, temperature=0.01).item(), 4)  # 1 - F-1 of u > 0: 1 - 4/5
        0.2
    """
    scores = check_scores(scores)
    pos = check_labels(labels, scores, need_both=False)
    b2 = check_positive("beta", beta) ** 2
    p = torch.sigmoid(scores / check_positive("temperature", temperature))
    tp = p[pos].sum()
    fp = p[~pos].sum()
    fn = pos.sum().to(p.dtype) - tp
    return 1 - (1 + b2) * tp / ((1 + b2) * tp + b2 * fn + fp)


def pairwise_squared_hinge_auc_loss(
    scores: Tensor, labels: Tensor, *, margin: float = 1.0
) -> Tensor:
    r"""Mean over the batch's (positive, negative) pairs of the squared hinge on the score gap.

    $$
    \ell = \frac{1}{|B^+||B^-|}\sum_{i \in B^+}\sum_{j \in B^-} \max(0, m - (u_i - u_j))^2
    $$

    (the pairwise surrogate of ``1 - AUC``; LibAUC's AUC-margin loss is its min-max reformulation
    with class means, docs/baselines.md). ``O(|B+| |B-|)`` memory.

    Args:
        scores: ``(B,)`` float scores ``u`` of the batch.
        labels: ``(B,)`` 0/1 labels (1: positive), at least one positive and one negative.
        margin: the hinge's margin ``m`` (``>= 0``).

    Raises:
        ValueError: bad scores/labels (no positive or no negative), ``margin`` not ``>= 0``.

    Examples:
        >>> import torch
        >>> from reparam.baselines import pairwise_squared_hinge_auc_loss
        >>> u, y = torch.tensor([2.0, -1.0, 0.5, 1.0]), torch.tensor([1, 0, 1, 0])
        >>> pairwise_squared_hinge_auc_loss(u, y).item()  # (0 + 0 + 0 + 1.5^2) / 4 pairs
        0.5625
    """
    scores = check_scores(scores)
    pos = check_labels(labels, scores, need_both=True)
    margin = check_positive("margin", margin, allow_zero=True)
    gap = scores[pos].unsqueeze(1) - scores[~pos].unsqueeze(0)
    return torch.relu(margin - gap).square().mean()
