r"""Differentiable ("soft") projection onto C: the relu form of method note sec. 5.

``Pi_C(delta, gamma) = (e*, min(gamma, e*))``: once the threshold is known the projection is one
relu, ``min(gamma, e) = gamma - relu(gamma - e)``. Here the threshold is smooth in the inputs:

$$
e_s = s \,\mathrm{softplus}(o_s / s), \qquad \tau_s = \gamma - \mathrm{relu}(\gamma - e_s),
$$

so ``(e_s, tau_s)`` is always feasible (``tau_s <= e_s``, ``e_s > 0``), and ``o_s -> r`` (the root
of method note sec. 4) as the strength ``s -> 0``. Two ways to get ``o_s``:

* ``method="smooth"`` (no sort, O(n) per Newton step): ``o_s`` is the root of the smoothed

  $$
  h_s(e) = e - \delta - s \sum_i \mathrm{softplus}((\gamma_i - e) / s),
  $$

  increasing and concave; ``h_s <= h`` so ``o_s >= r``, and ``o_s - r <= s n log 2``. Newton from the
  exact root (a left point) converges monotonically. Gradients by the implicit function theorem:
  ``d o/d delta = 1 / h_s'``, ``d o/d gamma_i = sigmoid((gamma_i - o)/s) / h_s'`` with
  ``h_s' = 1 + sum_i sigmoid((gamma_i - o)/s)`` -- no graph through the iterations.
* ``method="sort"`` (the paper's route): a differentiable sort of ``gamma`` (descending), the top-i
  averages ``A_k = (delta + g_(1) + ... + g_(k)) / (k + 1)``, ``k = 0..n`` (a cumsum), and a soft
  choice of ``k*``: ``o_s = sum_k softmax(A / s)_k A_k``. Exact because ``A_k`` is unimodal in ``k``
  with its maximum ``r`` at ``k*`` (``A_k - A_{k-1} = D_k / (k (k+1))`` with
  ``D_k = k g_(k) - delta - S_{k-1}`` non-increasing), so ``o_s -> max_k A_k = r``.
  Sorting backends: ``torchsort`` (Blondel et al. 2020, O(n log n); optional, compiles at install)
  or ``diffsort`` (Petersen et al. 2022, differentiable sorting networks; a pure-Python wheel, but
  dense O(n^2) memory per layer, so limited to ``n <= DIFFSORT_MAX_N``).
"""

from __future__ import annotations

import functools
import importlib.util
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _checks
from .exact import _LOW_PRECISION, project_onto_c, projection_root

SOFT_METHODS = ("smooth", "sort")
"""The names ``soft_project_onto_c`` takes as ``method``.

``"smooth"`` (the default: the root of the softplus-smoothed equation by Newton, no sort, O(n) per
step) and ``"sort"`` (the paper's route: a differentiable sort, the top-i averages and a softmax
choice among them; needs a sorting backend, ``SORT_BACKENDS``)."""
SORT_BACKENDS = ("auto", "torchsort", "diffsort")
"""The differentiable sorts ``soft_project_onto_c(method="sort")`` takes as ``sort_backend``.

``"torchsort"`` (Blondel et al. 2020, O(n log n); optional, compiled at install), ``"diffsort"``
(Petersen et al. 2022, sorting networks; pure Python, dense O(n^2) memory per layer, so at most
``DIFFSORT_MAX_N`` coordinates) and ``"auto"``, the default: torchsort when installed, else
diffsort."""
DIFFSORT_MAX_N = 1024
_NEWTON_MAX_ITERS = 100


def soft_project_onto_c(
    eps: Tensor,
    tau: Tensor,
    *,
    strength: float,
    method: str = "smooth",
    groups: Tensor | None = None,
    sort_backend: str = "auto",
) -> tuple[Tensor, Tensor]:
    r"""Smooth surrogate of ``projections.project_onto_c`` (method note sec. 5); exact as ``strength -> 0``.

    Args:
        eps: as in ``projections.project_onto_c``: ``(...,)``, or grouped ``(G,)``.
        tau: as in ``projections.project_onto_c``: ``(..., n)``, or grouped ``(n,)``.
        groups: as in ``projections.project_onto_c``: ``None`` or ``(n,)``.
        strength: smoothing ``s >= 0`` in the units of ``tau`` (``0`` returns the exact projection).
        method: ``"smooth"`` (softplus-smoothed root, no sort) or ``"sort"`` (differentiable sort,
            top-i averages, softmax choice of ``k*``: the paper's route).
        sort_backend: for ``method="sort"``: ``"torchsort"``, ``"diffsort"`` or ``"auto"`` (torchsort
            when installed, else diffsort).

    Returns:
        ``(eps_s, tau_s)``, feasible for C, same dtype/device/shapes as the inputs.

    Examples:
        >>> import torch
        >>> from projections import soft_project_onto_c
        >>> eps, tau = torch.tensor(0.5), torch.tensor([2.0, 1.0, 0.0])
        >>> e, t = soft_project_onto_c(eps, tau, strength=0.1)
        >>> round(e.item(), 4), [round(v, 4) for v in t.tolist()]
        (1.2538, [1.2538, 1.0, 0.0])
    """
    method = _checks.check_method(method, SOFT_METHODS)
    if sort_backend not in SORT_BACKENDS:
        raise ValueError(f"sort_backend must be one of {SORT_BACKENDS}, got {sort_backend!r}")
    if (
        isinstance(strength, bool)
        or not isinstance(strength, (int, float))
        or not (math.isfinite(strength) and strength >= 0)
    ):
        raise ValueError(f"strength must be a finite number >= 0, got {strength!r}")
    if groups is None:
        eps, tau = _checks.check_pair(eps, tau)
    else:
        eps, tau, groups = _checks.check_grouped(eps, tau, groups)
    if strength == 0:
        return project_onto_c(eps, tau, groups=groups)
    out_dtype = eps.dtype
    if out_dtype in _LOW_PRECISION:
        eps, tau = eps.float(), tau.float()
    s = float(strength)
    if method == "smooth":
        o = _SmoothRoot.apply(eps, tau, s, groups)
    elif groups is None:
        o = _sorted_root(eps, tau, s, sort_backend)
    else:  # one differentiable sort per group
        o = torch.stack(
            [_sorted_root(eps[g], tau[groups == g], s, sort_backend) for g in range(eps.shape[0])]
        )
    e = s * F.softplus(o / s)
    e_full = e[groups] if groups is not None else e.unsqueeze(-1)
    t = tau - torch.relu(tau - e_full)
    return e.to(out_dtype), t.to(out_dtype)


# --- method="smooth": root of h_s by Newton, gradient by the implicit function theorem -------------


def _expand(x: Tensor, groups: Tensor | None) -> Tensor:
    return x[groups] if groups is not None else x.unsqueeze(-1)


def _reduce(x: Tensor, groups: Tensor | None, num_groups: int) -> Tensor:
    if groups is None:
        return x.sum(-1)
    return torch.zeros(num_groups, dtype=x.dtype, device=x.device).index_add_(0, groups, x)


@torch.no_grad()
def smooth_root(delta: Tensor, gamma: Tensor, strength: float, groups: Tensor | None) -> Tensor:
    """Root ``o_s`` of ``h_s`` (module docstring) by Newton's method from the exact root."""
    num_groups = delta.shape[0] if groups is not None else 0
    e = projection_root(delta, gamma, groups=groups, _checked=True, method="auto")
    tol = 8 * torch.finfo(gamma.dtype).eps
    for _ in range(_NEWTON_MAX_ITERS):
        z = (gamma - _expand(e, groups)) / strength
        h = e - delta - strength * _reduce(F.softplus(z), groups, num_groups)
        dh = 1 + _reduce(torch.sigmoid(z), groups, num_groups)
        step = h / dh  # h <= 0 from the left: the step is <= 0 and e increases monotonically
        e = e - step
        if bool((step.abs() <= tol * (e.abs() + strength)).all()):
            break
    return e


class _SmoothRoot(torch.autograd.Function):
    @staticmethod
    def forward(ctx, delta, gamma, strength, groups):  # type: ignore[override]
        o = smooth_root(delta.detach(), gamma.detach(), strength, groups)
        ctx.save_for_backward(gamma, o)
        ctx.strength, ctx.groups = strength, groups
        return o

    @staticmethod
    def backward(ctx, grad_o):  # type: ignore[override]
        gamma, o = ctx.saved_tensors
        groups = ctx.groups
        sig = torch.sigmoid((gamma - _expand(o, groups)) / ctx.strength)
        num_groups = o.shape[0] if groups is not None else 0
        g_delta = grad_o / (1 + _reduce(sig, groups, num_groups))
        return g_delta, _expand(g_delta, groups) * sig, None, None


# --- method="sort": the paper's route ----------------------------------------------------------------


def _sorted_root(delta: Tensor, gamma: Tensor, strength: float, backend: str) -> Tensor:
    """``sum_k softmax(A/s)_k A_k`` with ``A`` the top-i averages of a soft descending sort."""
    batch, n = delta.shape, gamma.shape[-1]
    d = delta.reshape(-1, 1)
    g = gamma.reshape(d.shape[0], n)
    if n:
        gs = soft_sort_descending(g, strength, backend)
        k = torch.arange(2, n + 2, dtype=g.dtype, device=g.device)
        avgs = torch.cat([d, (d + torch.cumsum(gs, -1)) / k], -1)
    else:
        avgs = d
    w = torch.softmax(avgs / strength, -1)
    return (w * avgs).sum(-1).reshape(batch)


def soft_sort_descending(x: Tensor, strength: float, backend: str = "auto") -> Tensor:
    """Differentiable descending sort of the rows of ``x`` (B, n); -> ``sort(x)`` as strength -> 0."""
    if backend == "auto":
        backend = "torchsort" if _has("torchsort") else "diffsort"
    if not _has(backend):
        raise ValueError(
            f"sort_backend={backend!r} needs the package {backend!r}, which is not installed: "
            "`pip install diffsort` (pure Python) or torchsort (compiles; see README), "
            "or use method='smooth'"
        )
    if backend == "torchsort":
        import torchsort

        # torchsort's kernels are float32/float64 CPU/CUDA; it sorts ascending.
        return -torchsort.soft_sort(-x, regularization="l2", regularization_strength=strength)
    n = x.shape[-1]
    if n > DIFFSORT_MAX_N:
        raise ValueError(
            f"sort_backend='diffsort' builds dense n x n matrices and is limited to n <= "
            f"{DIFFSORT_MAX_N}, got n = {n}; use sort_backend='torchsort' or method='smooth'"
        )
    if n == 1:
        return x
    net = _diffsort_net(n, str(x.device), 1.0 / strength)
    ascending, _ = net(-x)
    return -ascending


@functools.lru_cache(maxsize=16)
def _diffsort_net(n: int, device: str, steepness: float):  # building a network costs O(n^2 log n)
    import diffsort

    return diffsort.DiffSortNet(
        "bitonic", n, device=device, steepness=steepness, distribution="logistic"
    )


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
