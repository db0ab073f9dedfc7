r"""The minibatch Lagrangian ``L_B`` (method note sec. 3) of a whole batch as one
``autograd.Function`` with its closed-form gradient: the training hot path (sec. 11, "One autograd
node"; sec. 12 for several problems).

For one problem, with ``scale = N / (n B)``, ``phi(z) = max(0, z)`` and ``phi'(z) = 1[z > 0]``:

$$
L_B = \beta^2 \epsilon + s\Big[\sum_{i \in B^+} ((\mu + \lambda_i)\tau_i - \lambda_i u_i)
      + \sum_{j \in B^-} \phi(\epsilon + u_j)\Big],
$$

$$
\partial_{u_i} = -s\lambda_i\ (i \in B^+),\quad \partial_{u_j} = s\,\phi'(\epsilon + u_j)\
(j \in B^-),\quad \partial_\epsilon = \beta^2 + s \textstyle\sum_{B^-} \phi',\quad
\partial_{\tau_k} = s \textstyle\sum_{i \in B^+: slot_i = k} (\mu + \lambda_k).
$$

The forward computes the value and these derivatives per unit of incoming gradient in 16 tensor
operations on ``B``-long vectors (one problem, method note sec. 11); the backward multiplies them by the incoming gradient (and, for a
dense ``tau``, adds the batch's rows into an ``(n,)`` zero vector). The projection modes that reach
this path and ``cap_scores`` change the formula as documented at ``batch_lagrangian``.
``tests/reparam/test_lagrangian.py`` checks value and gradients against the autograd composition of
the same formula and runs ``gradcheck`` in float64.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .layout import run_sums

Terms = tuple[Tensor, Tensor, Tensor, Tensor, float]  # L_B, d_u, d_tau, dL/deps, their factor


def batch_lagrangian(
    eps: Tensor,
    tau: Tensor,
    u: Tensor,
    lam: Tensor,
    mu: Tensor,
    is_pos: Tensor,
    slots: Tensor | None,
    *,
    beta: float,
    scale: float | Tensor,
    cap: bool = False,
    share: Tensor | None = None,
    problem: Tensor | None = None,
    eps_weight: Tensor | None = None,
    columns: bool = False,
) -> Tensor:
    r"""``L_B`` of a whole batch (module docstring) in one autograd node; a 0-dim tensor.

    Same value as ``functional.minibatch_lagrangian(eps, tau[slots[is_pos]], lam[slots[is_pos]],
    u[is_pos], mu, u[~is_pos])`` without splitting the batch: ``tau`` and ``lam`` are the full
    per-positive vectors, ``slots`` the batch's positions in them (any valid index for a
    negative). ``eps`` and ``mu``: 0-dim or ``(1,)`` (the gradient of ``eps`` has its shape),
    ``scale = N / (n B)`` a float.

    ``cap``: the positives' score is ``min(u_i, eps)`` (``eps`` detached; ``cap_scores``,
    method note sec. 10): its derivative is ``-s lambda_i`` below ``eps``, ``0`` above and half
    of it at a tie (``torch.minimum``'s rule).

    ``share`` (a 0-dim tensor, or ``(K,)``; projection mode ``"tracked"``, where ``eps`` is the
    threshold ``e*`` of the tracked active set ``A``): the batch's positives see ``min(tau_k, eps)``,
    the exact projection's formula ``Pi_C(eps, tau) = (e*, min(tau, e*))`` (O(B)). A clipped row
    passes its term's gradient ``s (mu + lambda_k)`` to ``eps``, and follows ``eps``: its own
    gradient is ``share * dL/deps``, ``share = d e*/d tau_k = 1[r > 0] / (|A| + 1)`` -- the
    projection's own derivative: the active set moves with the threshold (method note sec. 4).
    Not the derivative of the forward value for those rows, by design.

    **Several problems at once** (``problem`` given; method note sec. 12: several positive
    classes, or one problem per (class, group)): ``eps``, ``mu``, ``scale`` and ``eps_weight``
    are per problem ``(K,)`` and entry ``e`` of the batch belongs to problem ``problem[e]``
    (``-1``: it counts nowhere). The value is

    $$
    \sum_k \beta^2 w_k \epsilon_k + \sum_e s_{k(e)}\,\ell_e(\epsilon_{k(e)}, \mu_{k(e)})
    $$

    (``w = eps_weight``, ``\ell_e`` the entry's term above), with the same closed-form
    derivatives per problem; with one problem, ``w = 1`` and a scalar ``s``, it is the form above.

    ``columns``: the entries are ``(B, K)`` flattened, entry ``(b, j)`` in problem ``j`` (several
    classes, no groups): the per-problem sums are then a reshape.

    ``slots`` ``None``: ``tau`` and ``lam`` are the batch's rows themselves, ``(B,)`` (the O(B)
    modes: a sparse ``tau``, ``"tracked"``); ``tau``'s gradient is then ``(B,)`` too.
    """
    step = _Step(
        lam,
        mu,
        is_pos,
        slots,
        beta**2,
        scale,
        cap,
        share,
        problem,
        eps_weight,
        columns,
    )
    return _BatchLagrangian.apply(eps, tau, u, step)


class _Step(NamedTuple):
    """What ``_BatchLagrangian`` takes besides the differentiable ``eps``, ``tau``, ``u``."""

    lam: Tensor
    mu: Tensor
    is_pos: Tensor
    slots: Tensor | None
    beta2: float
    scale: float | Tensor
    cap: bool
    share: Tensor | None
    problem: Tensor | None
    eps_weight: Tensor | None
    columns: bool


class _BatchLagrangian(torch.autograd.Function):
    """Forward: ``lagrangian_terms``' value and derivatives; backward: those times the
    incoming gradient."""

    @staticmethod
    def forward(ctx, eps: Tensor, tau: Tensor, u: Tensor, step: _Step) -> Tensor:
        loss, d_u, d_tau, d_eps, factor = lagrangian_terms(
            eps,
            tau,
            u,
            step.lam,
            step.mu,
            step.is_pos,
            step.slots,
            step.beta2,
            step.scale,
            step.cap,
            step.share,
            step.problem,
            step.eps_weight,
            step.columns,
        )
        # intermediates, not inputs or outputs: kept on ctx (no saved-variable bookkeeping)
        ctx.d_u, ctx.d_tau, ctx.d_eps, ctx.factor = d_u, d_tau, d_eps, factor
        ctx.slots, ctx.n_tau = step.slots, len(tau)
        return loss

    @staticmethod
    def backward(ctx, g: Tensor):
        needs_eps, needs_tau, needs_u, _ = ctx.needs_input_grad
        grad_eps = ctx.d_eps * g if needs_eps else None
        if ctx.factor != 1.0:  # per unit of which d_u and d_tau are
            g = g * ctx.factor
        grad_u = ctx.d_u * g if needs_u else None
        grad_tau = None
        if needs_tau and ctx.slots is None:  # tau is the batch's rows
            grad_tau = ctx.d_tau * g
        elif needs_tau:
            grad_tau = ctx.d_tau.new_zeros(ctx.n_tau).index_add_(0, ctx.slots, ctx.d_tau * g)
        return grad_eps, grad_tau, grad_u, None


def lagrangian_terms(
    eps: Tensor,
    tau: Tensor,
    u: Tensor,
    lam: Tensor,
    mu: Tensor,
    is_pos: Tensor,
    slots: Tensor,
    beta2: float,
    scale: float | Tensor,
    cap: bool = False,
    share: Tensor | None = None,
    problem: Tensor | None = None,
    eps_weight: Tensor | None = None,
    columns: bool = False,
) -> Terms:
    """The forward math of ``batch_lagrangian`` as one pure function: ``(L_B, d_u, d_tau, dL/deps, f)``: per unit of incoming
    gradient ``g``, ``dL/deps`` (shaped like ``eps``), and ``dL/du = f d_u``, ``dL/dtau = f d_tau``
    per batch entry (``f``: a float, ``scale`` or 1; one multiplication of ``g``)."""
    if problem is None:
        return _one_problem(eps, tau, u, lam, mu, is_pos, slots, beta2, scale, cap, share)
    return _problems(
        eps, tau, u, lam, mu, is_pos, slots, beta2, scale, cap, share, problem, eps_weight, columns
    )


def _rows(tau: Tensor, lam: Tensor, slots: Tensor | None) -> tuple[Tensor, Tensor]:
    """The batch's ``tau`` and ``lambda`` (``slots`` ``None``: they are the rows already)."""
    if slots is None:
        return tau, lam
    return tau.index_select(0, slots), lam.index_select(0, slots)


def _one_problem(eps, tau, u, lam, mu, is_pos, slots, beta2, scale, cap, share):
    """``lagrangian_terms`` for one problem (``eps``, ``mu`` 0-dim or ``(1,)``, ``scale`` a
    float): about 20 operations on ``B``-long float vectors; without clipping (``share``
    ``None``), ``d_u`` and ``d_tau`` per unit of ``scale`` (the backward multiplies the incoming
    gradient by it once). The positives and negatives are told apart by multiplying with 0/1
    floats, not by ``torch.where`` on a bool mask: the same values (every score is finite here),
    and on the CPU a bool select costs about ten float operations."""
    clip = share is not None
    t, lam_b = _rows(tau, lam, slots)
    p = as_float(is_pos, u.dtype)  # 1 for a positive, 0 for a negative
    z = u + eps
    dphi = greater(z, 0.0)  # the hinge's derivative
    mu_lam = lam_b + mu  # a positive row's dL/dtau per unit of s
    if cap:  # a positive's score is min(u, eps): d/du = 1, 1/2, 0 below, at, above eps
        u_pos = torch.minimum(u, eps)
        d_pos = lam_b * torch.sign(eps - u).add_(1).mul_(0.5)  # (heaviside with 1/2 at a tie)
    else:
        u_pos, d_pos = u, lam_b
    counts = torch.addcmul(dphi, dphi, p, value=-1)  # phi' of the negatives, 0 for positives
    d_u = torch.addcmul(counts, d_pos, p, value=-1)  # -d_pos (positives), phi' (negatives)
    if clip:  # a positive row above eps is eps: its gradient goes to eps
        over = greater(t, eps).mul_(p)
        t = torch.minimum(t, eps)  # a negative's t is not used
        counts = counts.addcmul_(mu_lam, over)
    pos_terms = torch.addcmul(mu_lam * t, lam_b, u_pos, value=-1)
    hinge = torch.relu(z)
    terms = torch.addcmul(hinge, hinge, p, value=-1).addcmul_(pos_terms, p)  # (exact selects)
    ones = terms.new_ones(1, terms.shape[0])
    # beta^2 eps + s sum(terms) and beta^2 + s sum(counts) as matrix-vector products: one op each
    loss = torch.addmv(eps, ones, terms, beta=beta2, alpha=scale).view(())
    d_eps = torch.addmv(eps.new_ones(1), ones, counts, beta=beta2, alpha=scale)
    if eps.dim() == 0:
        d_eps = d_eps.view(())
    d_tau = mu_lam * p
    if not clip:
        return loss, d_u, d_tau, d_eps, scale
    # the clipped rows move with eps, as the active set moves with the projection's e*
    d_tau = torch.addcmul((d_tau * scale).mul_(1 - over), d_eps * share, over)
    return loss, d_u * scale, d_tau, d_eps, 1.0


def as_float(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A bool ``mask`` as 0/1 floats (through its bytes: on the CPU a third of ``mask.to(dtype)``'s
    time)."""
    return mask.view(torch.uint8).to(dtype)


def greater(a: Tensor, b: Tensor | float) -> Tensor:
    """``a > b`` as 0/1 floats of ``a``'s dtype and shape, in one operation (a bool result and
    its conversion take two, and the bool one is the slower on the CPU)."""
    return torch.gt(a, b, out=torch.empty_like(a))


def _problems(eps, tau, u, lam, mu, is_pos, slots, beta2, scale, cap, share, problem, w, columns):
    """``lagrangian_terms`` for ``K`` problems: entry ``e`` in problem ``problem[e]`` (``-1``:
    none, weight 0), ``eps``, ``mu``, ``scale``, ``eps_weight`` (``w``) per problem ``(K,)``.
    ``columns``: the entries are ``(B, K)`` flattened, entry ``(b, j)`` in problem ``j`` (no
    groups). The per-problem sums are a reshape then (``columns``) or sums over runs of equal
    problems (``reparam.layout.run_sums``), not a scatter of every entry into few places."""
    clip = share is not None
    t, lam_b = _rows(tau, lam, slots)
    k = problem.clamp_min(0)
    eps_e, mu_e = eps.index_select(0, k), mu.index_select(0, k)
    scale_e = scale.index_select(0, k).mul_(as_float(problem >= 0, u.dtype))
    p = as_float(is_pos, u.dtype)  # 1 for a positive, 0 for a negative
    q = 1 - p
    z = eps_e + u
    dphi = greater(z, 0.0)
    mu_lam = mu_e + lam_b
    d_eps_neg = dphi * q
    if cap:  # a positive's score is min(u, eps): d/du = 1, 1/2, 0 below, at, above eps
        u_pos = torch.minimum(u, eps_e)
        d_pos = lam_b * torch.sign(eps_e - u).add_(1).mul_(-0.5)  # (-heaviside, 1/2 at a tie)
    else:
        u_pos, d_pos = u, -lam_b
    if clip:  # a positive row above eps is eps: its gradient goes to eps
        over = greater(t, eps_e).mul_(p)
        t = torch.minimum(t, eps_e)  # a negative's t is not used
        d_eps_neg = d_eps_neg.addcmul_(mu_lam, over)
        is_row = p * (1 - over)
    else:
        is_row = p
    terms = torch.addcmul((mu_lam * t - lam_b * u_pos).mul_(p), torch.relu(z), q)
    d_u = torch.addcmul(dphi * q, d_pos, p).mul_(scale_e)
    d_tau = (mu_lam * scale_e).mul_(is_row)
    counts = scale_e * d_eps_neg
    if columns:
        sums = counts.view(-1, eps.shape[0]).sum(0)
    else:
        sums = run_sums(counts, k, eps.shape[0]).to(eps.dtype)
    d_eps = beta2 * w + sums
    loss = beta2 * (w * eps).sum() + (scale_e * terms).sum()
    if clip:  # the clipped rows move with eps, as the active set moves with the projection's e*
        d_tau = torch.addcmul(d_tau.mul_(1 - over), (d_eps * share).index_select(0, k), over)
    return loss, d_u, d_tau, d_eps, 1.0
