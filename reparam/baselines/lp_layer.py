r"""A differentiable LP layer: Mangasarian's generalized Newton method on an exterior penalty.

The alternative of Meng, Mukherjee, Wu, Singh and Ravi, "Differentiable optimization of generalized
nondecomposable functions using linear programs" (NeurIPS 2021), sec. 4, built on Mangasarian, "A
Newton method for linear programming" (JOTA 2004); see method note sec. 9 and docs/baselines.md.

Problem (standard form, batched over leading dimensions):

$$
\min_z\ c^\top z \quad\text{s.t.}\quad A z \le b,\ z \ge 0,
\qquad A \in \mathbb{R}^{m\times n}.                                                     \qquad (P)
$$

Write the constraints as :math:`\hat A z \le \hat b` with :math:`\hat A = [A; -I]`,
:math:`\hat b = [b; 0]`. The solver minimizes the *exterior penalty of (P)*

$$
g(y) = \epsilon\, c^\top y + \tfrac12 \|\max(0, \hat A y - \hat b)\|^2             \qquad (*)
$$

over :math:`y \in \mathbb{R}^n` (no constraints, n variables however many constraints). (*) is the
Lagrangian dual of the Tikhonov-regularized dual LP
:math:`\max_{\hat v \ge 0,\ \hat A^\top \hat v = -c}\ -\hat b^\top \hat v - \tfrac\epsilon2\|\hat v\|^2`,
so for every :math:`\epsilon` below a problem-dependent threshold the *dual* is recovered exactly, in
closed form, as the least 2-norm optimal dual solution :math:`\hat v = \max(0, \hat A y^* - \hat b)/\epsilon`
(the primal minimizer :math:`y^*` itself is only :math:`O(\epsilon)`-accurate). The primal follows by
complementary slackness: the rows with :math:`\hat v_i > 0` are active, and :math:`z` solves
:math:`\hat A_S z = \hat b_S` (least squares, proximal to :math:`y`; one more Newton step on the
penalty alone). :math:`\epsilon` is the penalty's accuracy parameter, not a property of the LP.

Newton iteration (a fixed number of unrolled steps, no line search): with the generalized Hessian
:math:`H(y) = \hat A^\top \mathrm{diag}(1[\hat A y > \hat b]) \hat A` and the modification
:math:`\rho I`,

$$
y \leftarrow y - \lambda\,(H(y) + \rho I)^{-1} \nabla g(y),\qquad
      \nabla g(y) = \epsilon c + \hat A^\top \max(0, \hat A y - \hat b).
$$

Gradients w.r.t. ``A, b, c``: ``backward="unroll"`` differentiates through every Newton step and
the recovery (the step functions of the active sets have zero derivative a.e.); ``"active_set"``
differentiates the final active set's linear system implicitly (a custom autograd Function with the
closed-form backward below), so its cost does not grow with ``steps``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ._checks import check_choice, check_finite, check_float_tensor, check_positive, check_steps

BACKWARDS = ("unroll", "active_set")


@dataclass
class LPSolution:
    """What ``solve_lp`` returns (all batched over the same leading dimensions).

    ``z`` ``(..., n)`` primal solution; ``v`` ``(..., m)`` multipliers of ``A z <= b`` (``>= 0``);
    ``value`` ``(...,)`` ``c^T z``; ``y`` ``(..., n)`` the last Newton iterate of the penalty
    problem (*); ``active`` ``(..., m)`` bool, the rows of ``A z <= b`` found active.

    Attributes:
        z: ``(..., n)`` the primal solution.
        v: ``(..., m)`` the multipliers of ``A z <= b``.
        value: ``(...,)`` the objective ``c^T z``.
        y: ``(..., n)`` the last Newton iterate of (*).
        active: ``(..., m)`` bool, the active rows of ``A z <= b``.

    Examples:
        >>> import torch
        >>> from reparam.baselines import solve_lp
        >>> A, b, c = torch.eye(2), torch.tensor([1.0, 2.0]), torch.tensor([-1.0, -1.0])
        >>> sol = solve_lp(A, b, c)  # min -z_1 - z_2 s.t. z_1 <= 1, z_2 <= 2
        >>> sol.z.round(decimals=4).tolist(), sol.active.tolist()
        ([1.0, 2.0], [True, True])
        >>> sol.v.round(decimals=2).tolist()  # each bound is worth 1 per unit
        [1.0, 1.0]
    """

    z: Tensor
    v: Tensor
    value: Tensor
    y: Tensor
    active: Tensor


def solve_lp(
    A: Tensor,
    b: Tensor,
    c: Tensor,
    *,
    eps: float = 1e-4,
    rho: float = 1e-3,
    steps: int = 30,
    step_size: float = 1.0,
    backward: str = "unroll",
) -> LPSolution:
    r"""Solve ``min c^T z s.t. A z <= b, z >= 0`` by ``steps`` Newton steps on the penalty (*).

    Args:
        A: ``(..., m, n)`` constraint matrix. Leading dimensions of ``A``, ``b``, ``c``
            broadcast; any float dtype and device (half precision computes in float32).
        b: ``(..., m)`` right-hand side.
        c: ``(..., n)`` cost vector.
        eps: the penalty parameter :math:`\epsilon` of (*). The dual (hence the active set and
            the primal) is exact once ``eps`` is below a problem-dependent threshold (Mangasarian
            2004); too small makes (*) badly scaled. Default ``1e-4`` (Meng et al.'s code: ``1e-3``,
            which is not exact on F-score LPs of a few hundred samples; docs/baselines.md).
        rho: the Hessian modification :math:`H + \rho I`. Meng et al. take ``rho < eps``; without
            a line search that diverges on random LPs (the Newton step is ``eps c / rho`` along
            directions no active constraint covers), so the default is ``rho = 10 eps``, measured
            in docs/baselines.md. In units of ``A``'s squared scale.
        steps: number of Newton steps, all unrolled (no early exit, no line search).
        step_size: the constant step :math:`\lambda` (the paper's tunable hyper-parameter).
        backward: ``"unroll"`` or ``"active_set"`` (see the module docstring).

    Returns:
        ``LPSolution``. ``v`` is :math:`\max(0, A y - b)/\epsilon` with ``"unroll"`` and the
        active set's least-norm multipliers with ``"active_set"`` (equal at convergence).

    Raises:
        ValueError: non-tensors, non-float or non-finite inputs, shapes that do not match or
            broadcast, ``eps``/``rho``/``step_size`` not ``> 0``, ``steps < 1``, unknown ``backward``.

    Examples:
        >>> import torch
        >>> from reparam.baselines import solve_lp
        >>> A, c = torch.eye(2), torch.tensor([-1.0, -1.0])  # min -z_1 - z_2 s.t. z <= b
        >>> b = torch.tensor([[1.0, 2.0], [3.0, 1.0]])  # a batch of two LPs
        >>> solve_lp(A, b, c).value.round(decimals=4).tolist()
        [-3.0, -4.0]
    """
    A, b, c = _check_lp(A, b, c)
    eps, rho, steps, step_size = _check_options(eps, rho, steps, step_size)
    backward = check_choice("backward", backward, BACKWARDS)
    out_dtype = A.dtype
    if out_dtype in (torch.float16, torch.bfloat16):
        A, b, c = A.float(), b.float(), c.float()
    delta = _recovery_ridge(A.dtype)
    if backward == "unroll":
        y = _newton(A, b, c, eps, rho, steps, step_size)
        z, active = _recover(A, b, y, delta)
        v = torch.relu(_mv(A, y) - b) / eps
    else:
        with torch.no_grad():
            y = _newton(A, b, c, eps, rho, steps, step_size)
            active, free_zero = _masks(A, b, y)
        z, v = _ActiveSetLP.apply(A, b, c, y, active, free_zero, delta)
    value = (c * z).sum(-1)
    sol = LPSolution(z=z, v=v, value=value, y=y, active=active)
    if out_dtype != A.dtype:
        sol = LPSolution(*(t.to(out_dtype) for t in (z, v, value, y)), active=active)
    return sol


@torch.no_grad()
def solve_lp_trace(A: Tensor, b: Tensor, c: Tensor, **options: float) -> tuple[Tensor, Tensor]:
    """The objective value ``c^T z_k`` and the largest constraint violation after each Newton step.

    ``options``: ``eps``, ``rho``, ``steps``, ``step_size`` as in ``solve_lp`` (same defaults).
    ``z_k`` is the primal recovered from iterate ``k`` (as ``solve_lp`` would return with
    ``steps=k``). Returns ``(values, violations)``, each ``(..., steps)``: what the convergence
    measurement of docs/baselines.md is made of. No autograd.

    Args:
        A: ``(..., m, n)`` constraint matrix, as in ``solve_lp``.
        b: ``(..., m)`` right-hand side.
        c: ``(..., n)`` cost vector.
        **options: ``eps``, ``rho``, ``steps``, ``step_size``.

    Examples:
        >>> import torch
        >>> from reparam.baselines import solve_lp_trace
        >>> A, b, c = torch.eye(2), torch.tensor([1.0, 2.0]), torch.tensor([-1.0, -1.0])
        >>> values, violations = solve_lp_trace(A, b, c)  # 30 steps
        >>> [round(v, 4) for v in values[[0, 4, -1]].tolist()]  # steps 1, 5, 30: optimum -3
        [-0.2, -1.0, -3.0]
        >>> bool(violations.max() < 1e-4)
        True
    """
    A, b, c = _check_lp(A, b, c)
    eps, rho, steps, step_size = _check_options(**options)
    delta = _recovery_ridge(A.dtype)
    values, violations = [], []
    y = torch.zeros_like(c)
    for _ in range(steps):
        y = _newton_step(A, b, c, y, eps, rho, step_size)
        z, _ = _recover(A, b, y, delta)
        values.append((c * z).sum(-1))
        viol = torch.cat([_mv(A, z) - b, -z], -1).amax(-1).clamp_min(0)
        violations.append(viol)
    return torch.stack(values, -1), torch.stack(violations, -1)


# --- the solver ---------------------------------------------------------------------------------


def _mv(A: Tensor, x: Tensor) -> Tensor:
    return (A @ x.unsqueeze(-1)).squeeze(-1)


def _mtv(A: Tensor, x: Tensor) -> Tensor:
    return (A.transpose(-1, -2) @ x.unsqueeze(-1)).squeeze(-1)


def _gram(A: Tensor, rows: Tensor, diag: Tensor) -> Tensor:
    """``A^T diag(rows) A + diag(diag)``."""
    return A.transpose(-1, -2) @ (rows.unsqueeze(-1) * A) + torch.diag_embed(diag)


def _spd_solve(K: Tensor, rhs: Tensor) -> Tensor:
    L = torch.linalg.cholesky(K)
    return torch.cholesky_solve(rhs.unsqueeze(-1), L).squeeze(-1)


def _newton_step(
    A: Tensor, b: Tensor, c: Tensor, y: Tensor, eps: float, rho: float, step_size: float
) -> Tensor:
    r = _mv(A, y) - b
    row_on = (r > 0).to(A.dtype)
    neg_on = (y < 0).to(A.dtype)
    grad = eps * c + _mtv(A, torch.relu(r)) - torch.relu(-y)
    H = _gram(A, row_on, neg_on + rho)
    return y - step_size * _spd_solve(H, grad)


def _newton(
    A: Tensor, b: Tensor, c: Tensor, eps: float, rho: float, steps: int, step_size: float
) -> Tensor:
    y = torch.zeros_like(c)  # the penalty's minimizer is feasible-ish and O(solution) in size
    for _ in range(steps):
        y = _newton_step(A, b, c, y, eps, rho, step_size)
    return y


def _masks(A: Tensor, b: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Active rows of ``A z <= b`` (positive multiplier) and of ``z >= 0`` at the iterate ``y``."""
    return _mv(A, y) - b > 0, y < 0


def _recover(A: Tensor, b: Tensor, y: Tensor, delta: float) -> tuple[Tensor, Tensor]:
    """Primal from the active set: ``z = y - (K + delta I)^{-1} A_hat^T max(0, A_hat y - b_hat)``.

    ``K = A_hat^T D A_hat`` over the active rows ``D``: the least-squares solution of the active
    equations ``A_S z = b_S``, ``z_T = 0`` nearest to ``y`` (``delta`` keeps it unique).
    """
    active, free_zero = _masks(A, b, y)
    r = _mv(A, y) - b
    K = _gram(A, active.to(A.dtype), free_zero.to(A.dtype) + delta)
    return y - _spd_solve(K, _mtv(A, torch.relu(r)) - torch.relu(-y)), active


def _recovery_ridge(dtype: torch.dtype) -> float:
    return 1e3 * torch.finfo(dtype).eps


class _ActiveSetLP(torch.autograd.Function):
    r"""``(z, v)`` from a fixed active set, with the implicit (closed-form) backward.

    With ``K = A^T D_r A + D_s + delta I`` (``D_r`` the active rows, ``D_s`` the active ``z >= 0``):
    ``z = K^{-1}(A^T D_r b + delta y)`` (``y`` a constant) and ``v = -D_r A K^{-1} c``, the least-norm
    multipliers supported on the active set. For ``p = K^{-1} gz``, ``q = K^{-1} c``,
    ``h = D_r gv``, ``t = K^{-1} A^T h``:

    $$
    \bar A = D_r(b - Az)p^\top - D_r A p\, z^\top - h q^\top + D_r A q\, t^\top + D_r A t\, q^\top,\quad
    \bar b = D_r A p,\quad \bar c = -t.
    $$
    """

    @staticmethod
    def forward(ctx, A, b, c, y, active, free_zero, delta):
        dr = active.to(A.dtype)
        K = _gram(A, dr, free_zero.to(A.dtype) + delta)
        L = torch.linalg.cholesky(K)
        z = torch.cholesky_solve((_mtv(A, dr * b) + delta * y).unsqueeze(-1), L).squeeze(-1)
        q = torch.cholesky_solve(c.unsqueeze(-1), L).squeeze(-1)
        v = -dr * _mv(A, q)
        ctx.save_for_backward(A, b, z, q, L, dr)
        return z, v

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gz, gv):
        A, b, z, q, L, dr = ctx.saved_tensors

        def solve(x):
            return torch.cholesky_solve(x.unsqueeze(-1), L).squeeze(-1)

        def outer(u, w):
            return u.unsqueeze(-1) * w.unsqueeze(-2)

        gA = torch.zeros_like(A)
        gb = torch.zeros_like(b)
        gc = torch.zeros_like(q)
        if gz is not None:
            p = solve(gz)
            Ap = _mv(A, p)
            gA = gA + outer(dr * (b - _mv(A, z)), p) - outer(dr * Ap, z)
            gb = gb + dr * Ap
        if gv is not None:
            h = dr * gv
            t = solve(_mtv(A, h))
            gA = gA - outer(h, q) + outer(dr * _mv(A, q), t) + outer(dr * _mv(A, t), q)
            gc = gc - t
        return gA, gb, gc, None, None, None, None


# --- validation -----------------------------------------------------------------------------------


def _check_options(
    eps: float = 1e-4, rho: float = 1e-3, steps: int = 30, step_size: float = 1.0
) -> tuple[float, float, int, float]:
    """The Newton options of ``solve_lp`` (the defaults of both public functions live here)."""
    return (
        check_positive("eps", eps),
        check_positive("rho", rho),
        check_steps("steps", steps),
        check_positive("step_size", step_size),
    )


def _check_lp(A: object, b: object, c: object) -> tuple[Tensor, Tensor, Tensor]:
    A = check_float_tensor("A", A)
    b = check_float_tensor("b", b)
    c = check_float_tensor("c", c)
    if A.dim() < 2:
        raise ValueError(f"A must have shape (..., m, n), got {tuple(A.shape)}")
    m, n = A.shape[-2:]
    if b.dim() < 1 or b.shape[-1] != m:
        raise ValueError(
            f"b must have shape (..., m) with m = {m} (A's rows), got {tuple(b.shape)}"
        )
    if c.dim() < 1 or c.shape[-1] != n:
        raise ValueError(
            f"c must have shape (..., n) with n = {n} (A's columns), got {tuple(c.shape)}"
        )
    if n == 0:
        raise ValueError(f"A must have at least one column (n >= 1), got shape {tuple(A.shape)}")
    for name, t in (("b", b), ("c", c)):
        if t.dtype != A.dtype:
            raise ValueError(f"{name} must have A's dtype {A.dtype}, got {t.dtype}")
        if t.device != A.device:
            raise ValueError(f"{name} must be on A's device {A.device}, got {t.device}")
    try:
        batch = torch.broadcast_shapes(A.shape[:-2], b.shape[:-1], c.shape[:-1])
    except RuntimeError:
        raise ValueError(
            f"the leading (batch) dimensions of A {tuple(A.shape[:-2])}, b {tuple(b.shape[:-1])} "
            f"and c {tuple(c.shape[:-1])} must broadcast"
        ) from None
    for name, t in (("A", A), ("b", b), ("c", c)):
        check_finite(name, t)
    return A.expand(*batch, m, n), b.expand(*batch, m), c.expand(*batch, n)
