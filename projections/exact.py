r"""Exact Euclidean projection onto C = {(eps, tau) : tau_i <= eps, eps >= 0} (method note sec. 4).

$$
\Pi_C(\delta, \gamma) = \arg\min_{(e, t) \in C} (e - \delta)^2 + \lVert t - \gamma \rVert^2
                     = (e^*, \min(\gamma, e^*)),\qquad e^* = \max(0, r),\ h(r) = 0.
$$

The root ``r`` is found without autograd (by sort or in expected linear time, see
``projections._roots``, and for one long row near the cost of a pass, ``projections._tree``);
``_apply_threshold`` then rebuilds ``e*`` from ``r``'s active set
``A = {i : gamma_i > r}`` so that autograd yields the Jacobian of method note sec. 4 a.e.:
``d e*/d delta = d e*/d gamma_i = 1 / (|A| + 1)`` for ``i in A`` when ``r > 0`` (0 otherwise);
clipped coordinates follow ``e*``, the others pass through with identity.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from . import _checks
from ._roots import root_linear, root_sort, root_sort_grouped, root_top_prefix
from ._tree import as_dtype, root_tree, root_tree_value
from .collective import LocalComm, root_over

# Up to this many coordinates per row (grouped: in all), "auto" uses the sort: one fused sort
# beats the linear method's passes on short rows. Crossovers measured on 2 CPU cores
# (docs/projection.md): 64 rows between 128 and 256, grouped ~1e4. One row uses "tree" on CPU
# at every n (faster than the sort from n = 8 on, measured) and elsewhere above AUTO_SORT_MAX_N.
AUTO_SORT_MAX_N = 192
"""Up to this many coordinates per row, ``method="auto"`` sorts (several rows, or one row off the CPU).

One fused sort beats the linear method's passes on short rows; above it ``"auto"`` uses
``"linear"`` (several rows) or ``"tree"`` (one row; on the CPU one row uses ``"tree"`` at every
``n``). The crossover was measured on 2 CPU cores, 64 rows: between 128 and 256 coordinates
(docs/projection.md)."""
AUTO_GROUPED_SORT_MAX_N = 8192
# The linear method first tries the exact root from the TOP_M largest coordinates (topk): it is
# exact whenever fewer than TOP_M coordinates are clipped. torch.topk is linear in n up to ~2e6
# on CPU and much slower beyond (measured), where the Newton passes start at once.
TOP_M = 64
TOP_MAX_N = 1 << 21
_LOW_PRECISION = (torch.float16, torch.bfloat16)
_TREE_DTYPES = (torch.float32, torch.float64)  # the max tree's (numpy's) dtypes


def project_onto_c(
    eps: Tensor,
    tau: Tensor,
    *,
    method: str = "auto",
    groups: Tensor | None = None,
    comm: LocalComm | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Euclidean projection of ``(eps, tau)`` onto C (method note sec. 4), differentiable a.e.

    Args:
        eps: ``(...,)`` -- the point's ``delta``; with ``groups``, ``(G,)``: one ``eps_g`` per group.
        tau: ``(..., n)`` -- the point's ``gamma``, batched over leading dims; with ``groups``, ``(n,)``.
        method: ``"sort"`` (O(n log n): sort + cumsum + max of the top-i averages), ``"linear"``
            (expected O(n), no full sort), ``"tree"`` (one row: a max tree of the coordinates,
            else verified Newton steps from a sample; with few coordinates clipped it reads ``tau``
            once besides validation and the output pass; batched or grouped input uses
            ``"linear"``) or ``"auto"`` (one row: ``"tree"``, off the CPU only above
            ``AUTO_SORT_MAX_N`` coordinates; several rows: sort up to
            ``AUTO_SORT_MAX_N`` -- grouped: ``AUTO_GROUPED_SORT_MAX_N`` -- coordinates, else linear).
        groups: optional int64 ``(n,)`` with values in ``[0, G)``: coordinate ``i`` is constrained
            by ``tau_i <= eps[groups[i]]`` (one projection per group, solved jointly).
        comm: the processes over which the coordinates of one problem are spread
            (``projections.collective``; method note sec. 13): ``tau`` is this process's part,
            ``eps`` (0-dim) the same on every process, and the root is found over all of them
            (``projections.collective.root_over``; no autograd). ``None`` or one process
            (``LOCAL``): every coordinate is here.

    Returns:
        ``(eps_p, tau_p)`` with the dtype, device and shapes of the inputs, which are not modified.
        ``n = 0`` is allowed (then only ``eps`` is clipped at 0).

    Raises:
        ValueError: non-tensor or integer input, NaN/inf, mismatched shapes/dtypes/devices,
            ``groups`` of the wrong dtype/shape or out of range, unknown ``method``.

    Examples:
        >>> import torch
        >>> from projections import project_onto_c
        >>> eps, tau = project_onto_c(torch.tensor(0.5), torch.tensor([2.0, 1.0, 0.0]))
        >>> eps.item(), tau.tolist()
        (1.25, [1.25, 1.0, 0.0])
    """
    if comm is not None and comm.world > 1:
        e = projection_root(eps, tau, groups=groups, comm=comm).clamp_min(0)
        return e, torch.minimum(tau.detach(), e if groups is None else e[groups.long()])
    if groups is None and (method == "auto" or method == "tree"):
        out = _project_vector(eps, tau)
        if out is not None:
            return out
    method = _checks.check_method(method)
    if groups is None:
        eps, tau = _checks.check_pair(eps, tau)
    else:
        eps, tau, groups = _checks.check_grouped(eps, tau, groups)
    out_dtype = eps.dtype
    if out_dtype in _LOW_PRECISION:  # sums of half-precision values are too coarse
        eps, tau = eps.float(), tau.float()
    method = _resolve(method, tau, eps.numel(), groups)
    if method == "tree" and not _needs_grad(eps, tau):
        e, t = _project_tree(eps, tau)
    else:
        r = projection_root(eps, tau, method=method, groups=groups, _checked=True)
        e, t = _apply_threshold(eps, tau, r, groups)
    return e.to(out_dtype), t.to(out_dtype)


@torch.no_grad()
def project_onto_c_(
    eps: Tensor, tau: Tensor, *, method: str = "auto", groups: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """In-place ``project_onto_c`` (e.g. on ``nn.Parameter``s, once per epoch); returns them.

    Runs under ``torch.no_grad()``, so it is not part of any graph -- the per-epoch step of
    Algorithm 3 (method note sec. 3b). Equivalent to ``eps.copy_(e); tau.copy_(t)`` with ``(e, t) =
    project_onto_c(eps, tau)``.

    Args:
        eps: ``(...,)`` (grouped: ``(G,)``), overwritten with ``eps_p``.
        tau: ``(..., n)`` (grouped: ``(n,)``), overwritten with ``tau_p``.
        method: as for ``project_onto_c``.
        groups: as for ``project_onto_c``.

    Returns:
        ``(eps, tau)``, the inputs themselves.

    Examples:
        >>> import torch
        >>> from projections import project_onto_c_
        >>> eps, tau = torch.tensor(0.5), torch.tensor([2.0, 1.0, 0.0])
        >>> _ = project_onto_c_(eps, tau)
        >>> eps.item(), tau.tolist()
        (1.25, [1.25, 1.0, 0.0])
    """
    e, t = project_onto_c(eps, tau, method=method, groups=groups)
    eps.copy_(e)
    tau.copy_(t)
    return eps, tau


def projection_root(
    eps: Tensor,
    tau: Tensor,
    *,
    method: str = "auto",
    groups: Tensor | None = None,
    comm: LocalComm | None = None,
    _checked: bool = False,
) -> Tensor:
    """The root ``r`` of ``h`` (method note sec. 4) per row or group, without autograd.

    The projection's ``e* = max(0, r)``. ``comm`` as for ``project_onto_c``: over several processes,
    by ``projections.collective.root_over``, one problem (``eps`` 0-dim) or each group's in turn
    (``eps`` ``(G,)``: ``G`` searches, for a few groups such as classes).

    Args:
        eps: ``(...,)``, the point's ``delta`` (grouped: ``(G,)``).
        tau: ``(..., n)``, the point's ``gamma`` (grouped: ``(n,)``).
        method: as for ``project_onto_c``.
        groups: as for ``project_onto_c``.
        comm: as for ``project_onto_c``.

    Returns:
        ``r`` of shape ``(...,)`` (grouped: ``(G,)``), detached.

    Examples:
        >>> import torch
        >>> from projections import projection_root
        >>> tau = torch.tensor([[2.0, 1.0, 0.0], [1.0, 0.0, -1.0]])
        >>> r = projection_root(torch.tensor([0.5, -3.0]), tau)
        >>> [round(v, 4) for v in r.tolist()]  # e* = max(0, r): 1.25 and 0
        [1.25, -0.6667]
    """
    if comm is not None and comm.world > 1:
        if groups is None and eps.dim() != 0:
            raise ValueError(
                f"comm: the root over several processes takes eps 0-dim, or (G,) with groups, "
                f"got eps of shape {tuple(eps.shape)}"
            )
        try:  # (each process checks its own rows; all raise if one does)
            if groups is None:
                eps, tau = _checks.check_pair(eps.detach(), tau.detach())
            else:
                eps, tau, groups = _checks.check_grouped(eps.detach(), tau.detach(), groups)
            error = None
        except ValueError as e:
            error = e
        comm.agree(error)
        if groups is None:
            return root_over(eps, tau, comm)
        return torch.stack([root_over(e, tau[groups == g], comm) for g, e in enumerate(eps)])
    if not _checked:
        method = _checks.check_method(method)
        if groups is None:
            eps, tau = _checks.check_pair(eps, tau)
        else:
            eps, tau, groups = _checks.check_grouped(eps, tau, groups)
    method = _resolve(method, tau, eps.numel(), groups)
    if method == "tree":
        return root_tree(eps.detach(), tau.detach())
    if groups is not None:
        if method == "sort":
            return root_sort_grouped(eps.detach(), tau.detach(), groups)
        return root_linear(eps.detach(), tau.detach(), groups)
    if method == "sort":
        return root_sort(eps.detach(), tau.detach())
    return _root_linear_rows(eps.detach(), tau.detach())


def _resolve(method: str, tau: Tensor, rows: int, groups: Tensor | None) -> str:
    """The concrete method: "auto" by size and device; "tree" only for one ungrouped row."""
    if method == "auto":
        n = tau.shape[-1]
        if groups is not None:
            return "linear" if n > AUTO_GROUPED_SORT_MAX_N else "sort"
        if rows == 1 and (tau.device.type == "cpu" or n > AUTO_SORT_MAX_N):
            return "tree"
        return "sort" if n <= AUTO_SORT_MAX_N else "linear"
    if method == "tree" and (groups is not None or rows != 1):
        return "linear"
    return method


def _needs_grad(eps: Tensor, tau: Tensor) -> bool:
    return torch.is_grad_enabled() and (eps.requires_grad or tau.requires_grad)


def _project_vector(eps: object, tau: object) -> tuple[Tensor, Tensor] | None:
    """The common call on the CPU -- ``eps`` 0-d, ``tau`` one contiguous float32/float64 row, no
    autograd -- with no further dispatch and its checks folded into the work: one reduction
    (``float(tau.amin())`` finite: no NaN, no -inf) and the root itself (+inf in ``tau`` makes it
    +inf: the max tree's top level holds ``tau``'s maximum). None for anything else and for
    non-finite input, which the general path then checks and reports as before. At n = 1e6 these
    fixed costs were half of the total (docs/figures/projection.md)."""
    if not (
        isinstance(eps, Tensor)
        and isinstance(tau, Tensor)
        and eps.dim() == 0
        and tau.dim() == 1
        and tau.dtype in _TREE_DTYPES
        and eps.dtype == tau.dtype
        and eps.is_cpu
        and tau.is_cpu
        and tau.is_contiguous()
        and not (torch.is_grad_enabled() and (eps.requires_grad or tau.requires_grad))
    ):
        return None
    x = tau.detach() if tau.requires_grad else tau
    d = float(eps)
    if not (math.isfinite(d) and (not x.numel() or math.isfinite(float(x.amin())))):
        return None  # NaN or -inf: the general path reports it
    r, scratch = root_tree_value(d, x)
    if not math.isfinite(r):
        return None  # +inf in tau
    return _threshold_output(eps, x, r, scratch)


def _project_tree(eps: Tensor, tau: Tensor) -> tuple[Tensor, Tensor]:
    """One row without autograd: the root by ``root_tree``, whose passes use the output
    buffer as scratch memory, then one pass ``min(tau, e*)`` into that buffer."""
    x = tau.detach() if tau.requires_grad else tau
    if x.dim() != 1 or not x.is_contiguous():
        x = x.reshape(-1).contiguous()
    e, t = _threshold_output(eps, x, *root_tree_value(float(eps), x))
    return e, t if tau.dim() == 1 else t.view(tau.shape)


def _threshold_output(
    eps: Tensor, x: Tensor, r: float, scratch: Tensor | None
) -> tuple[Tensor, Tensor]:
    """``(e*, min(x, e*))`` for one contiguous row ``x`` and its root ``r``; ``min`` written into
    the root's scratch memory when its passes allocated some."""
    e = float(as_dtype(x.dtype, max(r, 0.0)))  # e* rounded to tau's dtype, as r.clamp_min(0) is
    t = torch.clamp_max(x, e) if scratch is None else torch.clamp_max(x, e, out=scratch)
    return eps.new_full(eps.shape, e), t


def _root_linear_rows(eps: Tensor, tau: Tensor) -> Tensor:
    """Linear-time root per row: exact from the top ``TOP_M`` values when possible, else Newton
    passes (with random pivots) from that lower bound; rows become groups of one flat vector."""
    batch, n = eps.shape, tau.shape[-1]
    d = eps.reshape(-1)
    g = tau.reshape(d.shape[0], n)
    if d.numel() == 0 or n == 0:
        return d.clone().reshape(batch)
    lo = k_lo = None
    if TOP_M < n <= TOP_MAX_N:
        r, exact = root_top_prefix(d, g, TOP_M)
        if bool(exact.all() if exact.numel() > 1 else exact):
            return r.reshape(batch)
        todo = (~exact).nonzero()[:, 0]
        d, g, lo = d[todo], g[todo], r[todo]
        k_lo = torch.full_like(lo, float(TOP_M))
    else:
        r = todo = None
    rows = d.shape[0]
    row_ids = None if rows == 1 else torch.arange(rows, device=g.device).repeat_interleave(n)
    r_rest = root_linear(d, g.reshape(-1), row_ids, lo=lo, k_lo=k_lo)
    if r is None:
        return r_rest.reshape(batch)
    return r.index_put((todo,), r_rest).reshape(batch)


def _apply_threshold(
    eps: Tensor, tau: Tensor, r: Tensor, groups: Tensor | None
) -> tuple[Tensor, Tensor]:
    """``(max(0, r), min(tau, max(0, r)))``, rebuilt differentiably from ``r``'s active set.

    Without grad this is two elementwise ops. With grad, ``r`` is recomputed as
    ``(delta + sum_{i in A} gamma_i) / (|A| + 1)`` over ``A = {gamma_i > r}`` -- equal in value,
    and its autograd is the Jacobian of method note sec. 4.
    """
    expand = (lambda x: x[groups]) if groups is not None else (lambda x: x.unsqueeze(-1))
    if not _needs_grad(eps, tau):
        e = r.clamp_min(0)
        return e, torch.minimum(tau, expand(e))
    active = tau > expand(r)
    zero = torch.zeros((), dtype=tau.dtype, device=tau.device)
    if groups is None:
        s = torch.where(active, tau, zero).sum(-1)
        k = active.sum(-1)
    else:
        s = torch.zeros_like(eps).index_add(0, groups, torch.where(active, tau, zero))
        k = torch.bincount(groups[active], minlength=eps.shape[0])
    e = ((eps + s) / (k + 1).to(eps.dtype)).clamp_min(0)
    clipped = tau > expand(e.detach())
    return e, torch.where(clipped, expand(e), tau)
