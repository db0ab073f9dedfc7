r"""The math of the F-beta S-measure regularizer as plain tensor functions (docs/method.md sec. 1-3).

Scale-free LP (3') (docs/method.md sec. 2), for one positive shape class with ``n`` positives ``S+`` and the
negatives ``S-`` (one-vs-rest), scores ``u = w . a(x) + b``:

.. math::
    \min\ \beta^2 \epsilon + \tfrac1n \sum_{j \in S^-} \phi(\epsilon + u_j)
    \quad\text{s.t.}\quad \tau_i \le \epsilon,\ \tau_i \le u_i\ (i \in S^+),\
    \tfrac1n \textstyle\sum_{S^+} \tau_i = 1,\ \epsilon \ge 0.                      \qquad (3')

It has the optimal value of the paper's LP (3) (``sum tau = 1``): multiplying every variable of (3)
by ``n`` maps one onto the other (docs/method.md sec. 2; ``tests/reparam/test_lp.py`` checks it with HiGHS).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

# The negatives' term is ``phi(eps + u_j)`` with the hinge ``phi(z) = max(0, z)``: the LP. (The
# paper's Remark 3 allows a squared hinge or a logistic ``phi``; no measurement of ours favoured
# them, so they are not offered: docs/method.md sec. 1.)


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
    r"""The minibatch estimate ``L_B`` of docs/method.md sec. 3 for one positive class.

    .. math::
        L_B = \beta^2 \epsilon + \frac{N}{nB}\Big[\sum_{i \in B^+} ((\mu + \lambda_i)\tau_i
              - \lambda_i u_i) + \sum_{j \in B^-} \phi(\epsilon + u_j)\Big]

    with ``scale = N / (n B)``. Over the batches of an epoch it averages to the full Lagrangian
    (4') plus ``mu`` (the ``-mu`` of (4') is a constant).
    """
    pos = ((mu + lam_pos) * tau_pos - lam_pos * u_pos).sum()
    neg = torch.relu(eps + u_neg).sum()
    return beta**2 * eps + scale * (pos + neg)


def batch_lagrangian(
    eps: Tensor,
    tau: Tensor,
    u: Tensor,
    lam: Tensor,
    mu: Tensor,
    is_pos: Tensor,
    slots: Tensor,
    *,
    beta: float,
    scale: float,
    clip: bool = False,
    tau_grad_sink: Callable[[Tensor, Tensor, Tensor], None] | None = None,
    terms_fn: Callable[..., tuple[Tensor, Tensor, Tensor, Tensor]] | None = None,
) -> Tensor:
    r"""``minibatch_lagrangian`` on a whole batch in one autograd node (the training hot path).

    Same value as ``minibatch_lagrangian(eps, tau[slots[is_pos]], lam[slots[is_pos]],
    u[is_pos], mu, u[~is_pos])`` without splitting the batch: ``tau`` and ``lam`` are the full
    per-positive vectors, ``slots`` the batch's positions in them (any valid index for negatives).
    The backward is closed form (``g`` = incoming gradient, ``phi' = 1[eps + u > 0]`` the hinge's
    derivative):

    .. math::
        \partial_{u_i} = g s\,[-\lambda_i \text{ if } i \in B^+ \text{ else } \phi'(\epsilon + u_i)],\quad
        \partial_\epsilon = g (\beta^2 + s \textstyle\sum_{B^-} \phi'),\quad
        \partial_{\tau_k} = g s \textstyle\sum_{i \in B^+: slot_i = k} (\mu + \lambda_k).

    ``~15`` tensor ops for forward + backward instead of ``~50`` autograd nodes: the regularizer
    stays a small fraction of a training step even for a linear model (docs/results.md).

    ``tau_grad_sink``: for sparse updates of ``tau`` (``reparam.sparse``; ``tau`` then needs no
    grad): the backward calls ``tau_grad_sink(slots, is_pos, grad)`` with the gradient per batch
    entry (0 for negatives) instead of building a dense ``(n,)`` gradient -- O(B), not O(n).
    ``terms_fn``: the forward math (default :func:`batch_lagrangian_terms`; a compiled copy of it).

    ``clip``: the batch's positives see ``min(tau_k, eps)`` (projection mode ``"clip"``, O(B): the
    exact projection's formula ``Pi_C(eps, tau) = (e, min(tau, e))`` with the threshold ``eps``
    itself). A clipped row passes its term's gradient ``s (mu + lambda_k)`` to ``eps``, and follows
    ``eps``: its own gradient is ``eps``'s total divided by (clipped rows + 1), as in the exact
    projection the active set moves with the threshold (``d e* / d tau_k = 1/(|A| + 1)``, sec. 4)
    -- without it a clipped row never comes back below ``eps`` (measured: docs/method.md sec. 3b).
    Not the derivative of the forward value for those rows, by design.
    """
    return _BatchLagrangian.apply(
        eps,
        tau,
        u,
        lam,
        mu,
        is_pos,
        slots,
        beta**2,
        scale,
        clip,
        tau_grad_sink,
        terms_fn or batch_lagrangian_terms,
    )


def batch_lagrangian_terms(
    eps: Tensor,
    tau: Tensor,
    u: Tensor,
    lam: Tensor,
    mu: Tensor,
    is_pos: Tensor,
    slots: Tensor,
    beta2: float,
    scale: float,
    clip: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The forward math of :func:`batch_lagrangian` as one pure function (what ``reg.compile()``
    hands to ``torch.compile``): ``(L_B, dL/du, dL/dtau per batch entry, dL/deps)``, the
    derivatives per unit of incoming gradient."""
    t, lam_b = tau.index_select(0, slots), lam.index_select(0, slots)
    z = eps + u
    phi, dphi = torch.relu(z), (z > 0).to(z.dtype)
    mu_lam = mu + lam_b
    d_eps_neg = torch.where(is_pos, 0.0, dphi)
    if clip:  # a positive row above eps is eps: its gradient goes to eps
        over = is_pos & (t > eps)
        t = torch.where(over, eps, t)
        d_eps_neg = d_eps_neg + torch.where(over, mu_lam, 0.0)
        is_row = is_pos & ~over
    else:
        is_row = is_pos
    terms = torch.where(is_pos, mu_lam * t - lam_b * u, phi)
    d_u = torch.where(is_pos, -lam_b, dphi) * scale
    d_tau = torch.where(is_row, mu_lam * scale, 0.0)
    d_eps = beta2 + scale * d_eps_neg.sum()
    if clip:  # the clipped rows move with eps, as the active set moves with the projection's e*
        d_tau = torch.where(over, d_eps / (over.sum() + 1), d_tau)
    return beta2 * eps + scale * terms.sum(), d_u, d_tau, d_eps


class _BatchLagrangian(torch.autograd.Function):
    @staticmethod
    def forward(ctx, eps, tau, u, lam, mu, is_pos, slots, beta2, scale, clip, sink, terms_fn):
        loss, d_u, d_tau, d_eps = terms_fn(eps, tau, u, lam, mu, is_pos, slots, beta2, scale, clip)
        ctx.save_for_backward(slots, d_u, d_tau, d_eps, is_pos)
        ctx.n_tau, ctx.sink = tau.shape[0], sink
        return loss

    @staticmethod
    def backward(ctx, g):
        slots, d_u, d_tau, d_eps, is_pos = ctx.saved_tensors
        grad_u = g * d_u if ctx.needs_input_grad[2] else None
        grad_eps = g * d_eps if ctx.needs_input_grad[0] else None
        grad_tau = None
        if ctx.needs_input_grad[1]:
            grad_tau = d_tau.new_zeros(ctx.n_tau).index_add_(0, slots, g * d_tau)
        elif ctx.sink is not None:
            ctx.sink(slots, is_pos, g * d_tau)
        return (grad_eps, grad_tau, grad_u) + (None,) * 9


def best_feasible_eps(u_pos: Tensor) -> Tensor | None:
    """Smallest ``eps >= 0`` with ``mean_i min(eps, u_i) >= 1`` (docs/method.md sec. 2); ``None`` if none.

    ``g(e) = mean min(e, u_i)`` is increasing and piecewise linear with maximum ``mean u`` (at
    ``e >= max u``), so a solution exists iff ``mean u >= 1``. With ``u`` ascending and ``k``
    values below ``e``: ``g(e) = (u_1 + ... + u_k + (n - k) e) / n = 1`` gives
    ``e_k = (n - S_k) / (n - k)``, valid when ``u_k <= e_k <= u_{k+1}``; the smallest valid one.
    """
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


def certified_fbeta_bound(u_pos: Tensor, u_neg: Tensor, beta: float) -> float | None:
    r"""Lower bound on the training F-beta of ``u > 0`` from the best feasible ``eps`` (docs/method.md sec. 2).

    .. math:: F_\beta(u > 0) \ge \frac{1 + \beta^2}{1 + v},\quad
              v = \beta^2 \epsilon + \tfrac1n \sum_{S^-} \max(0, \epsilon + u_j)

    ``None`` (no certificate) when no feasible ``eps > 0`` exists, i.e. ``mean u_pos < 1``.
    """
    eps = best_feasible_eps(u_pos)
    if eps is None or float(eps) <= 0:
        return None
    v = float(lp_objective(eps.double(), u_neg.detach().double(), u_pos.numel(), beta))
    return (1 + beta**2) / (1 + v)


def fbeta_of_decisions(u_pos: Tensor, u_neg: Tensor, beta: float) -> float:
    """Training F-beta of the hard decisions ``u > 0``: (1+b^2) tp / ((1+b^2) tp + b^2 fn + fp)."""
    tp = float((u_pos > 0).sum())
    return fbeta_from_counts(tp, float(u_pos.numel()) - tp, float((u_neg > 0).sum()), beta)


def best_fbeta_threshold(u_pos: Tensor, u_neg: Tensor, beta: float) -> tuple[float, float]:
    """The threshold ``t`` whose decisions ``u > t`` have the highest F-beta on these scores, and
    that F-beta (one sort, O(n log n)): every distinct score is a candidate cut; ``t`` is the
    midpoint between the last score kept and the first dropped (``-inf`` side: below all scores).
    Returns ``(0.0, F-beta of u > 0)`` when there are no positives.

    Keeping the ``k`` highest scores, ``tp`` of them positive, gives
    ``F = (1 + b^2) tp / ((1 + b^2) tp + b^2 (n_pos - tp) + (k - tp)) = (1 + b^2) tp / (k + b^2 n_pos)``.
    The scores are sorted in their own dtype (the order and the ties are those of any wider one)
    and ``tp`` is counted exactly (float64 cumulative count of the positives' positions)."""
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


def fbeta_from_counts(tp: float, fn: float, fp: float, beta: float) -> float:
    """``(1+b^2) tp / ((1+b^2) tp + b^2 fn + fp)``; 0 when the denominator is 0."""
    den = (1 + beta**2) * tp + beta**2 * fn + fp
    return (1 + beta**2) * tp / den if den > 0 else 0.0
