r"""Newton losses (Petersen, Borgelt, Sutter, Kuehne, Deussen, Ermon, "Newton losses: using curvature
information for learning with differentiable algorithms", NeurIPS 2024); method note sec. 9.

A hard-to-optimize loss ``l(y)`` of a network output ``y`` (``(B, m)``) is replaced, for the step at
hand, by the quadratic ``1/2 ||y - z*||^2`` around one regularized Newton step of ``l`` in ``y``:

$$
z^* = y - (H + \lambda I)^{-1} \nabla_y l(y),
$$

so the network's gradient descent on the new loss moves ``y`` along that Newton step (its gradient at
``y`` is ``y - z* = (H + lambda I)^{-1} grad l``). Two curvature sources:

* **Hessian** (``newton_loss``): ``H`` the Hessian of ``l`` in ``y``, in full, block-diagonal by
  rows, or the paper's empirical Hessian (the mean of the row blocks, one ``m x m`` matrix);
* **empirical Fisher** (``inject_fisher``): an identity in the forward pass whose backward
  replaces the incoming gradient ``g`` (``(B, m)``) by ``g (F + lambda I)^{-1}``,
  ``F = g^T g * B``. With ``l = mean_i l_i`` the rows of ``g`` are ``grad l_i / B``, so ``F`` is the
  paper's ``(1/B) sum_i grad l_i grad l_i^T`` (its Algorithm 2 writes exactly ``g.T @ g * B``).

Meaningful on non-convex relaxed losses (soft F-beta, soft-sort losses); for the MSE
``l = 1/2 ||y - t||^2`` the Hessian is ``I``: the Newton loss's gradient is the MSE's scaled by
``1/(1 + lambda)`` (its value by ``1/(1 + lambda)^2``), the MSE itself for ``lambda = 0``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ._checks import check_choice, check_finite, check_float_tensor, check_positive

HESSIANS = ("full", "rows", "mean")


def newton_step(
    loss_fn: Callable[[Tensor], Tensor],
    y: Tensor,
    *,
    tikhonov: float,
    hessian: str = "full",
) -> Tensor:
    r"""The regularized Newton step ``(H + lambda I)^{-1} grad l(y)`` of ``loss_fn`` at ``y`` (``(B, m)``).

    ``hessian``:

    * ``"full"``: the exact Hessian of ``l`` in all ``B m`` entries (``(Bm) x (Bm)``; any loss,
      ``O(B m)`` Hessian-vector products);
    * ``"rows"``: block-diagonal, ``H_i = d^2 l / d y_i^2`` per row. **Assumes** ``l`` is a sum of
      per-row terms, ``l = sum_i l_i(y_i)`` (then it is exact); it is computed with ``m``
      Hessian-vector products (``v = 1 (x) e_k``), which return the row sums of the Hessian's
      blocks, equal to the diagonal blocks only under that assumption;
    * ``"mean"``: the paper's empirical Hessian ``(1/B) sum_i H_i`` (same assumption), one
      ``m x m`` matrix for every row.

    The loss must be twice differentiable; ``lambda`` must exceed the most negative curvature for
    ``H + lambda I`` to be positive definite (it is solved by LU, not Cholesky).

    Args:
        loss_fn: ``(B, m) -> scalar``, the loss ``l`` of the output.
        y: ``(B, m)`` the output at which the step is taken.
        tikhonov: ``lambda`` (``>= 0``).
        hessian: ``"full"``, ``"rows"`` or ``"mean"``.

    Returns:
        ``(B, m)`` the step, detached.

    Examples:
        >>> import torch
        >>> from reparam.baselines import newton_step
        >>> t = torch.tensor([[1.0], [0.0]])
        >>> mse = lambda y: 0.5 * (y - t).square().sum()  # H = I: the step (y - t) / (1 + lambda)
        >>> newton_step(mse, torch.tensor([[3.0], [1.0]]), tikhonov=1.0).tolist()
        [[1.0], [0.5]]
    """
    y = _check_output(y)
    lam = check_positive("tikhonov", tikhonov, allow_zero=True)
    hessian = check_choice("hessian", hessian, HESSIANS)
    B, m = y.shape
    with torch.enable_grad():
        y0 = y.detach().requires_grad_(True)
        loss = loss_fn(y0)
        if not isinstance(loss, Tensor) or loss.numel() != 1:
            raise ValueError(f"loss_fn must return a scalar tensor, got {loss!r}")
        (grad,) = torch.autograd.grad(loss, y0, create_graph=True)
        eye = torch.eye(m, dtype=y.dtype, device=y.device)
        if hessian == "full":
            rows = [
                torch.autograd.grad(grad.reshape(-1)[k], y0, retain_graph=True)[0].reshape(-1)
                for k in range(B * m)
            ]
            H = torch.stack(rows) + lam * torch.eye(B * m, dtype=y.dtype, device=y.device)
            step = torch.linalg.solve(H, grad.detach().reshape(-1)).reshape(B, m)
        else:
            cols = []
            for k in range(m):
                v = torch.zeros_like(y0)
                v[:, k] = 1.0
                (hv,) = torch.autograd.grad(grad, y0, v, retain_graph=True)
                cols.append(hv)
            blocks = torch.stack(cols, -1)  # (B, m, m): blocks[i, :, k] = H_i e_k
            if hessian == "mean":
                blocks = blocks.mean(0, keepdim=True).expand(B, m, m)
            step = torch.linalg.solve(blocks + lam * eye, grad.detach().unsqueeze(-1)).squeeze(-1)
    return step.detach()


def newton_loss(
    loss_fn: Callable[[Tensor], Tensor], y: Tensor, *, tikhonov: float, hessian: str = "full"
) -> Tensor:
    r"""The Hessian Newton loss ``1/2 ||y - z*.detach()||^2``, ``z* = y - (H + lambda I)^{-1} grad l(y)``.

    Its value is ``1/2 ||step||^2`` and its gradient in ``y`` is exactly the regularized Newton step
    of ``loss_fn`` at ``y`` (``newton_step``, same ``hessian`` options): a gradient step of size
    ``eta`` on the network's output is a damped Newton step on the original loss. ``loss_fn`` maps a
    ``(B, m)`` tensor to a scalar; it is evaluated on a detached copy, so only this quadratic
    is differentiated into the network. See method note sec. 9.

    Args:
        loss_fn: ``(B, m) -> scalar``, the loss ``l`` of the output.
        y: ``(B, m)`` the network's output (with autograd).
        tikhonov: ``lambda`` (``>= 0``).
        hessian: ``"full"``, ``"rows"`` or ``"mean"`` (see ``newton_step``).

    Examples:
        >>> import torch
        >>> from reparam.baselines import newton_loss
        >>> t = torch.tensor([[1.0], [0.0]])
        >>> mse = lambda y: 0.5 * (y - t).square().sum()
        >>> y = torch.tensor([[3.0], [1.0]], requires_grad=True)
        >>> loss = newton_loss(mse, y, tikhonov=1.0)
        >>> loss.item()  # the MSE's value 2.5 scaled by 1 / (1 + lambda)^2
        0.625
        >>> loss.backward(); y.grad.tolist()  # the Newton step
        [[1.0], [0.5]]
    """
    y = _check_output(y)
    target = y.detach() - newton_step(loss_fn, y, tikhonov=tikhonov, hessian=hessian)
    return 0.5 * (y - target).square().sum()


def fisher_step(g: Tensor, tikhonov: float) -> Tensor:
    r"""``g (F + lambda I)^{-1}`` with ``F = g^T g * B`` for a ``(B, m)`` gradient ``g``.

    The backward of ``inject_fisher`` (differentiable itself, so double backward works).

    Args:
        g: ``(B, m)`` the gradient of the loss in the output.
        tikhonov: ``lambda`` (``>= 0``).

    Examples:
        >>> import torch
        >>> from reparam.baselines import fisher_step
        >>> g = torch.tensor([[0.5], [-0.5]])  # F = (0.25 + 0.25) * 2 = 1
        >>> fisher_step(g, tikhonov=1.0).tolist()  # g / (F + lambda)
        [[0.25], [-0.25]]
    """
    g = _check_output(g, name="g")
    lam = check_positive("tikhonov", tikhonov, allow_zero=True)
    B, m = g.shape
    fisher = g.transpose(0, 1) @ g * B + lam * torch.eye(m, dtype=g.dtype, device=g.device)
    return torch.linalg.solve(fisher, g.transpose(0, 1)).transpose(0, 1)  # F symmetric


def inject_fisher(y: Tensor, *, tikhonov: float) -> Tensor:
    r"""Identity on ``y`` whose backward preconditions the gradient by the empirical Fisher.

    ``y`` is ``(B, m)``; the incoming gradient becomes ``g -> g (g^T g B + lambda I)^{-1}`` (the
    Fisher Newton loss).

    Use as ``loss = l(inject_fisher(model(x), tikhonov=lam))``: ``l`` itself is unchanged, only the
    gradient reaching the network is. See method note sec. 9.

    Args:
        y: ``(B, m)`` the network's output.
        tikhonov: ``lambda`` (``>= 0``).

    Examples:
        >>> import torch
        >>> from reparam.baselines import inject_fisher
        >>> y = torch.tensor([[3.0], [1.0]], requires_grad=True)
        >>> z = inject_fisher(y, tikhonov=1.0)
        >>> torch.equal(z, y)  # the identity forward
        True
        >>> (0.5 * (z - torch.tensor([[1.0], [0.0]])).square().sum()).backward()
        >>> y.grad  # g = (2, 1), F = (4 + 1) * 2 = 10: g / 11
        tensor([[0.1818],
                [0.0909]])
    """
    y = _check_output(y)
    lam = check_positive("tikhonov", tikhonov, allow_zero=True)
    return _InjectFisher.apply(y, lam)


class _InjectFisher(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, lam):
        ctx.lam = lam
        return y.view_as(y)

    @staticmethod
    def backward(ctx, g):
        return fisher_step(g, ctx.lam), None


def _check_output(y: object, name: str = "y") -> Tensor:
    y = check_float_tensor(name, y)
    if y.dim() != 2 or y.shape[0] == 0 or y.shape[1] == 0:
        raise ValueError(f"{name} must have shape (B, m) with B, m >= 1, got {tuple(y.shape)}")
    check_finite(name, y)
    return y
