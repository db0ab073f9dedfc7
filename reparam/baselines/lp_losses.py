r"""Minibatch objectives as LPs solved by the Newton LP layer (method note sec. 9).

Both losses take the scores ``u`` of one minibatch and binary labels, build a standard-form LP
``min c^T z s.t. A z <= b, z >= 0`` whose data depend on ``u`` (through ``b`` only), solve it with
``reparam.baselines.solve_lp``, and return its optimal value. The loss is therefore the LP's optimal
value *as a function of the scores*, and its gradient is that value differentiated through the
solver (unrolled Newton steps or the final active set): by LP sensitivity, ``-v`` for the entries of
``b``, i.e. the batch's own optimal multipliers.

It is a *minibatch* quantity: the optimum of the LP on the batch, a nonlinear function of the batch,
so its expectation over batches is not the data set's objective (biased), unlike the
reparameterized estimate ``L_B`` of method note sec. 3, which is linear in per-sample terms.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_choice, check_labels, check_positive, check_scores, check_steps
from .lp_layer import BACKWARDS, solve_lp

AUC_SOLVERS = ("diagonal", "dense")
REDUCTIONS = ("mean", "sum")


def auc_lp_problem(
    scores: Tensor, labels: Tensor, *, margin: float = 0.01
) -> tuple[Tensor, Tensor, Tensor]:
    r"""The AUC LP (1) of Meng et al. in standard form, dense: one variable per (positive, negative) pair.

    $$
    \min_z \sum_{i \in B^+, j \in B^-} z_{ij}\quad\text{s.t.}\quad
    u_i - u_j \ge \text{margin} - z_{ij},\ z \ge 0
    $$

    i.e. ``A = -I`` (``P x P``, ``P = |B+| |B-|``), ``b_ij = u_i - u_j - margin``, ``c = 1``; pairs
    ordered positive-major. Its optimum is ``sum_ij max(0, margin - u_i + u_j)``: the pairwise hinge.

    Args:
        scores: ``(B,)`` float scores ``u`` of the batch.
        labels: ``(B,)`` 0/1 labels (1: positive), at least one positive and one negative.
        margin: the pairs' margin (``>= 0``).

    Returns:
        ``(A, b, c)`` of ``min c^T z s.t. A z <= b, z >= 0`` for ``reparam.baselines.solve_lp``.

    Examples:
        >>> import torch
        >>> from reparam.baselines import auc_lp_problem
        >>> u, y = torch.tensor([2.0, -1.0, 0.5, 1.0]), torch.tensor([1, 0, 1, 0])
        >>> A, b, c = auc_lp_problem(u, y, margin=0.0)  # pairs (2, -1), (2, 1), (0.5, -1), (0.5, 1)
        >>> tuple(A.shape), b.tolist()
        ((4, 4), [3.0, 1.0, 1.5, -0.5])
    """
    scores = check_scores(scores)
    pos = check_labels(labels, scores, need_both=True)
    margin = check_positive("margin", margin, allow_zero=True)
    diff = (scores[pos].unsqueeze(1) - scores[~pos].unsqueeze(0)).reshape(-1)
    P = diff.numel()
    eye = torch.eye(P, dtype=scores.dtype, device=scores.device)
    return -eye, diff - margin, torch.ones_like(diff)


def auc_lp_loss(
    scores: Tensor,
    labels: Tensor,
    *,
    margin: float = 0.01,
    solver: str = "diagonal",
    backward: str = "unroll",
    eps: float = 1e-4,
    rho: float = 1e-3,
    steps: int = 30,
    reduction: str = "mean",
) -> Tensor:
    r"""Optimal value of the minibatch AUC LP (1) of Meng et al., differentiated through the solver.

    $$
    \ell(u) = \frac{1}{|B^+||B^-|}\min_{z \ge 0} \Big\{\sum_{ij} z_{ij} :
    z_{ij} \ge \text{margin} - (u_i - u_j)\Big\} = \text{mean}_{ij}\max(0, \text{margin} - u_i + u_j)
    $$

    ``margin`` is the paper's :math:`\epsilon` of (1) (0.01 in its experiments); ``eps``/``rho``/
    ``steps`` are the Newton solver's (``reparam.baselines.solve_lp``). The number of constraints is
    ``|B+| |B-|``. ``solver="diagonal"`` runs the *same* Newton iteration exploiting ``A = -I`` (the
    Hessian is diagonal, O(|B+||B-|) per step: Meng et al.'s sparse implementation taken to its
    limit); ``"dense"`` hands the explicit ``P x P`` matrix to the generic layer (O(P^3) per step;
    for checks and the benchmark only). ``backward`` as in ``reparam.baselines.solve_lp`` (for the
    diagonal solver, ``"active_set"`` differentiates the final active set's closed-form solution).
    The count-based AUC estimate of the paper is ``1 - mean(relu(margin - z) / margin)`` for the
    ``z`` of the LP; this function returns the LP value. ``reduction``: ``"mean"`` over pairs or
    ``"sum"``. See method note sec. 9.

    Args:
        scores: ``(B,)`` float scores ``u`` of the batch.
        labels: ``(B,)`` 0/1 labels (1: positive), at least one positive and one negative.
        margin: the pairs' margin (``>= 0``).
        solver: ``"diagonal"`` or ``"dense"``.
        backward: ``"unroll"`` or ``"active_set"``.
        eps: the solver's penalty parameter (``> 0``).
        rho: the solver's Hessian modification (``> 0``).
        steps: the solver's Newton steps (``>= 1``).
        reduction: ``"mean"`` or ``"sum"`` over the pairs.

    Raises:
        ValueError: bad scores/labels (no positive or no negative), options out of range.

    Examples:
        >>> import torch
        >>> from reparam.baselines import auc_lp_loss
        >>> u = torch.tensor([2.0, -1.0, 0.5, 1.0], requires_grad=True)
        >>> loss = auc_lp_loss(u, torch.tensor([1, 0, 1, 0]))  # pair (0.5, 1): 0.01 + 0.5
        >>> round(loss.item(), 4)
        0.1275
        >>> loss.backward(); u.grad  # through the solver: the violated pair's -1/4 and +1/4
        tensor([ 0.0000,  0.0000, -0.2500,  0.2500])
    """
    solver = check_choice("solver", solver, AUC_SOLVERS)
    reduction = check_choice("reduction", reduction, REDUCTIONS)
    backward = check_choice("backward", backward, BACKWARDS)
    if solver == "dense":
        A, b, c = auc_lp_problem(scores, labels, margin=margin)
        total = solve_lp(A, b, c, eps=eps, rho=rho, steps=steps, backward=backward).value
    else:
        scores = check_scores(scores)
        pos = check_labels(labels, scores, need_both=True)
        margin = check_positive("margin", margin, allow_zero=True)
        b = (scores[pos].unsqueeze(1) - scores[~pos].unsqueeze(0)).reshape(-1) - margin
        total = _diagonal_auc(
            b,
            eps=check_positive("eps", eps),
            rho=check_positive("rho", rho),
            steps=check_steps("steps", steps),
            backward=backward,
        ).sum()
    return total / b.numel() if reduction == "mean" else total


def _diagonal_auc(b: Tensor, *, eps: float, rho: float, steps: int, backward: str) -> Tensor:
    """Newton on (*) for ``A = -I``, ``c = 1``: rows ``-z <= b`` and ``-z <= 0``; returns ``z``."""
    delta = 1e3 * torch.finfo(b.dtype).eps

    def run(b: Tensor) -> Tensor:
        y = torch.zeros_like(b)
        for _ in range(steps):  # grad = eps - relu(-y - b) - relu(-y), Hessian diagonal
            grad = eps - torch.relu(-y - b) - torch.relu(-y)
            hess = (-y - b > 0).to(b.dtype) + (y < 0).to(b.dtype) + rho
            y = y - grad / hess
        return y

    if backward == "unroll":
        y = run(b)
        k = (-y - b > 0).to(b.dtype) + (y < 0).to(b.dtype) + delta
        return y + (torch.relu(-y - b) + torch.relu(-y)) / k
    with torch.no_grad():
        y = run(b)
        on = (-y - b > 0).to(b.dtype)
        k = on + (y < 0).to(b.dtype) + delta
    return (delta * y - on * b) / k  # the active equations -z_ij = b_ij, z_k = 0, solved exactly


def fbeta_lp_problem(
    scores: Tensor, labels: Tensor, *, beta: float = 1.0, infeasibility_cost: float | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    r"""LP (3') of method note sec. 2 on one minibatch, the scores as data, in standard form.

    With ``n = |B+|``, ``m = |B-|``: variables ``z = (eps, zeta_1..n, xi_1..m[, s])``, all ``>= 0``,
    where ``tau_i = eps - zeta_i`` (so ``zeta >= 0`` is exactly ``tau_i <= eps``) and ``xi_j`` is the
    hinge ``max(0, eps + u_j)``:

    $$
    \min\ \beta^2 \epsilon + \tfrac1n \sum_j \xi_j\ [+\ M s]\quad\text{s.t.}\quad
    \epsilon - \zeta_i \le u_i,\quad \epsilon - \xi_j \le -u_j,\quad
    -\epsilon + \tfrac1n\sum_i \zeta_i\ [-\ s] \le -1.
    $$

    The last row is ``mean tau >= 1`` (same optimum as ``= 1``: the objective does not involve
    ``tau``). Without ``s`` (``infeasibility_cost=None``) this is (3') exactly, infeasible when
    ``mean_{B+} u < 1``; with ``s`` (elastic, cost ``M``) it is always feasible and has the same
    optimum as (3') whenever (3') is feasible and ``M`` exceeds its optimal value ``f*`` (the
    multiplier of ``mean tau = 1`` is ``-f*``, method note sec. 3b). Rows: positives, negatives,
    the mean row; ``b`` depends on the scores, ``A`` and ``c`` do not.

    Args:
        scores: ``(B,)`` float scores ``u`` of the batch.
        labels: ``(B,)`` 0/1 labels (1: positive), at least one positive.
        beta: the ``beta`` of F-beta (``> 0``).
        infeasibility_cost: ``M``, the cost of the elastic variable ``s`` (``None``: no ``s``).

    Returns:
        ``(A, b, c)`` of ``min c^T z s.t. A z <= b, z >= 0`` for ``reparam.baselines.solve_lp``.

    Examples:
        >>> import torch
        >>> from reparam.baselines import fbeta_lp_problem
        >>> u, y = torch.tensor([2.0, -1.0, 0.5, 1.0]), torch.tensor([1, 0, 1, 0])
        >>> A, b, c = fbeta_lp_problem(u, y)  # z = (eps, zeta_1, zeta_2, xi_1, xi_2)
        >>> tuple(A.shape), b.tolist(), c.tolist()
        ((5, 5), [2.0, 0.5, 1.0, -1.0, -1.0], [1.0, 0.0, 0.0, 0.5, 0.5])
    """
    scores = check_scores(scores)
    pos = check_labels(labels, scores, need_both=False)
    beta = check_positive("beta", beta)
    if infeasibility_cost is not None:
        infeasibility_cost = check_positive("infeasibility_cost", infeasibility_cost)
    u_pos, u_neg = scores[pos], scores[~pos]
    n, m = u_pos.numel(), u_neg.numel()
    elastic = infeasibility_cost is not None
    nv = 1 + n + m + int(elastic)
    kw = dict(dtype=scores.dtype, device=scores.device)
    A = torch.zeros(n + m + 1, nv, **kw)
    A[: n + m, 0] = 1.0
    A[: n + m, 1 : 1 + n + m] = -torch.eye(n + m, **kw)
    A[-1, 0] = -1.0
    A[-1, 1 : 1 + n] = 1.0 / n
    c = torch.zeros(nv, **kw)
    c[0] = beta**2
    c[1 + n : 1 + n + m] = 1.0 / n
    if elastic:
        A[-1, -1] = -1.0
        c[-1] = infeasibility_cost
    b = torch.cat([u_pos, -u_neg, scores.new_full((1,), -1.0)])
    return A, b, c


def fbeta_lp_loss(
    scores: Tensor,
    labels: Tensor,
    *,
    beta: float = 1.0,
    infeasibility_cost: float | None = None,
    backward: str = "unroll",
    eps: float = 1e-4,
    rho: float = 1e-3,
    steps: int = 30,
) -> Tensor:
    r"""Optimal value ``f*_B`` of LP (3') on the minibatch (scores as data), through the LP layer.

    $$
    f^*_B(u) = \min_{(\epsilon, \tau) \in C,\ \mathrm{mean}_{B^+}\tau = 1,\ \tau_i \le u_i}
    \beta^2 \epsilon + \tfrac1{|B^+|} \sum_{j \in B^-} \max(0, \epsilon + u_j)
    $$

    (standard form in ``fbeta_lp_problem``). Lower is better: ``(1 + beta^2)/(1 + f*_B)`` is
    the certified F-beta bound of method note sec. 2 on the batch. Its gradient is the batch's
    optimal multipliers: ``-lambda_i / n``-like on the positives (``tau_i <= u_i``), the hinge
    indicators ``/ n`` on the negatives, recomputed from scratch on every batch (contrast with
    the per-sample multipliers kept across batches by ``reparam``, method note sec. 3, 9).

    (3') is infeasible when ``mean_{B+} u < 1`` (method note sec. 2). The default
    (``infeasibility_cost=None``) is the exact (3'); on an infeasible batch there is no optimum,
    the layer returns ``c^T z`` of the penalty's least-violation point, and its gradient is *not*
    a feasibility-restoring direction (measured: it pushes the positives' scores down). Check
    ``scores[labels].mean() >= 1`` first, or pass ``infeasibility_cost=M``: the elastic LP, always
    feasible and exact for ``M > f*``, on which the Newton method converges more slowly
    (docs/baselines.md). Solver options as in ``reparam.baselines.solve_lp``.

    Args:
        scores: ``(B,)`` float scores ``u`` of the batch.
        labels: ``(B,)`` 0/1 labels (1: positive), at least one positive.
        beta: the ``beta`` of F-beta (``> 0``).
        infeasibility_cost: ``M`` of the elastic LP (``None``: the exact (3')).
        backward: ``"unroll"`` or ``"active_set"``.
        eps: the solver's penalty parameter (``> 0``).
        rho: the solver's Hessian modification (``> 0``).
        steps: the solver's Newton steps (``>= 1``).

    Raises:
        ValueError: bad scores/labels (no positive), options out of range.

    Examples:
        >>> import torch
        >>> from reparam.baselines import fbeta_lp_loss
        >>> u, y = torch.tensor([2.0, -1.0, 1.5, -0.5]), torch.tensor([1, 0, 1, 0])
        >>> f = fbeta_lp_loss(u, y)  # feasible: the positives' mean is 1.75 >= 1
        >>> round(f.item(), 4), round(2 / (1 + f.item()), 4)  # f*_B and the F-1 it certifies
        (1.25, 0.8889)
    """
    A, b, c = fbeta_lp_problem(scores, labels, beta=beta, infeasibility_cost=infeasibility_cost)
    return solve_lp(A, b, c, eps=eps, rho=rho, steps=steps, backward=backward).value
