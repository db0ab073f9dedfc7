"""The autograd composition ``reparam.lagrangian`` replaced (issue 31): the reference its tests
compare with, not a production path.

Until then ``L_B`` was ``batch_lagrangian`` below -- one ``autograd.Function`` around
``batch_lagrangian_terms`` (~30 tensor operations) -- and ``cap_scores`` was applied outside it, as
autograd nodes on the scores (:func:`capped_batch_lagrangian`, the regularizer's ``_loss`` then).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def capped_batch_lagrangian(eps, tau, u, lam, mu, is_pos, slots, *, cap=False, **kw) -> Tensor:
    """``cap``: the positives see ``min(u, eps)`` (``eps`` detached) through autograd, then
    :func:`batch_lagrangian`; the shapes the old ``_loss`` passed (0-dim ``eps``, ``mu`` and
    ``share`` for one problem)."""
    problem = kw.get("problem")
    if cap:
        eps_e = eps if problem is None else eps.index_select(0, problem.clamp_min(0))
        u = torch.where(is_pos, torch.minimum(u, eps_e.detach()), u)
    if problem is None:
        eps, mu = eps.view(()), mu.view(())
    return batch_lagrangian(eps, tau, u, lam, mu, is_pos, slots, **kw)


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
    scale: float | Tensor,
    clip: bool = False,
    tau_grad_sink: Callable[[Tensor, Tensor, Tensor], None] | None = None,
    terms_fn: Callable[..., tuple[Tensor, Tensor, Tensor, Tensor]] | None = None,
    share: Tensor | None = None,
    problem: Tensor | None = None,
    eps_weight: Tensor | None = None,
    columns: bool = False,
) -> Tensor:
    """``columns``: the production form's reshape of the per-problem sums (the same sums here).
    The pre-issue-31 ``reparam.functional.batch_lagrangian``, verbatim; ``slots`` ``None``
    (``tau`` and ``lam`` are the batch's rows) as the identity."""
    if slots is None:
        slots = torch.arange(tau.numel(), device=tau.device)
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
        share,
        problem,
        eps_weight,
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
    scale: float | Tensor,
    clip: bool = False,
    share: Tensor | None = None,
    problem: Tensor | None = None,
    eps_weight: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The forward math of :func:`batch_lagrangian` as one pure function (what ``reg.compile()``
    hands to ``torch.compile``): ``(L_B, dL/du, dL/dtau per batch entry, dL/deps)``, the
    derivatives per unit of incoming gradient."""
    t, lam_b = tau.index_select(0, slots), lam.index_select(0, slots)
    if problem is None:  # one problem: scalars
        eps_e, mu_e, scale_e = eps, mu, scale
    else:  # each entry its problem's; an entry of no problem (-1) weighs 0
        k = problem.clamp_min(0)
        eps_e, mu_e = eps.index_select(0, k), mu.index_select(0, k)
        scale_e = torch.where(problem >= 0, scale.index_select(0, k), 0.0)
    z = eps_e + u
    phi, dphi = torch.relu(z), (z > 0).to(z.dtype)
    mu_lam = mu_e + lam_b
    d_eps_neg = torch.where(is_pos, 0.0, dphi)
    if clip:  # a positive row above eps is eps: its gradient goes to eps
        over = is_pos & (t > eps_e)
        t = torch.where(over, eps_e, t)
        d_eps_neg = d_eps_neg + torch.where(over, mu_lam, 0.0)
        is_row = is_pos & ~over
    else:
        is_row = is_pos
    terms = torch.where(is_pos, mu_lam * t - lam_b * u, phi)
    d_u = torch.where(is_pos, -lam_b, dphi) * scale_e
    d_tau = torch.where(is_row, mu_lam * scale_e, 0.0)
    if problem is None:
        d_eps = beta2 + scale * d_eps_neg.sum()
        loss = beta2 * eps + scale * terms.sum()
    else:
        d_eps = beta2 * eps_weight + torch.zeros_like(eps).index_add_(0, k, scale_e * d_eps_neg)
        loss = beta2 * (eps_weight * eps).sum() + (scale_e * terms).sum()
    if clip:  # the clipped rows move with eps, as the active set moves with the projection's e*
        if problem is None:
            follow = d_eps / (over.sum() + 1) if share is None else d_eps * share
        else:
            counted = over & (problem >= 0)
            n_over = torch.zeros_like(eps).index_add_(0, k, counted.to(eps.dtype))
            follow = (d_eps / (n_over + 1) if share is None else d_eps * share).index_select(0, k)
        d_tau = torch.where(over, follow, d_tau)
    return loss, d_u, d_tau, d_eps


class _BatchLagrangian(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        eps,
        tau,
        u,
        lam,
        mu,
        is_pos,
        slots,
        beta2,
        scale,
        clip,
        sink,
        terms_fn,
        share,
        problem,
        eps_weight,
    ):
        loss, d_u, d_tau, d_eps = terms_fn(
            eps, tau, u, lam, mu, is_pos, slots, beta2, scale, clip, share, problem, eps_weight
        )
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
        return (grad_eps, grad_tau, grad_u) + (None,) * 12
