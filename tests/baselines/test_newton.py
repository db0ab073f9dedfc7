"""Newton losses: the Hessian variant's gradient is one regularized Newton step, the Fisher variant's
backward is the stated formula, the MSE collapses to itself; gradcheck in float64."""

from __future__ import annotations

import pytest
import torch

from reparam.baselines import fisher_step, inject_fisher, newton_loss, newton_step, soft_fbeta_loss

LABELS = torch.tensor([1, 0, 1, 1, 0, 0], dtype=torch.bool)


def _y(B=6, m=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, m, dtype=torch.float64, generator=g)


def _soft_f(y):  # not a sum over rows: a ratio of batch counts
    return soft_fbeta_loss(y[:, 0], LABELS)


def _cross_entropy_sum(y):  # a sum over rows
    t = torch.arange(y.shape[0]) % y.shape[1]
    return torch.nn.functional.cross_entropy(y, t, reduction="sum")


def _explicit_newton(loss_fn, y, lam):
    flat = y.reshape(-1)
    H = torch.autograd.functional.hessian(lambda f: loss_fn(f.reshape(y.shape)), flat)
    g = torch.autograd.functional.jacobian(lambda f: loss_fn(f.reshape(y.shape)), flat)
    return torch.linalg.solve(H + lam * torch.eye(flat.numel(), dtype=y.dtype), g).reshape(y.shape)


@pytest.mark.parametrize("lam", [0.1, 1.0])
def test_hessian_newton_loss_gradient_is_one_regularized_newton_step(lam):
    y = _y().requires_grad_(True)
    loss = newton_loss(_soft_f, y, tikhonov=lam)
    loss.backward()
    step = _explicit_newton(_soft_f, y.detach(), lam)
    torch.testing.assert_close(y.grad, step, atol=1e-10, rtol=0)
    assert float(loss.detach()) == pytest.approx(0.5 * float(step.square().sum()))


def test_row_blocks_are_exact_for_a_row_separable_loss_and_mean_is_the_papers_formula():
    y, lam = _y(5, 3, seed=1), 0.3
    full = newton_step(_cross_entropy_sum, y, tikhonov=lam, hessian="full")
    rows = newton_step(_cross_entropy_sum, y, tikhonov=lam, hessian="rows")
    torch.testing.assert_close(rows, full, atol=1e-10, rtol=0)
    # the empirical Hessian of Definition 1: mean of the row blocks, one m x m matrix
    H = torch.autograd.functional.hessian(_cross_entropy_sum, y)  # (B, m, B, m)
    blocks = torch.stack([H[i, :, i, :] for i in range(5)]).mean(0)
    g = torch.autograd.functional.jacobian(_cross_entropy_sum, y)
    expected = torch.linalg.solve(blocks + lam * torch.eye(3, dtype=y.dtype), g.T).T
    mean = newton_step(_cross_entropy_sum, y, tikhonov=lam, hessian="mean")
    torch.testing.assert_close(mean, expected, atol=1e-10, rtol=0)


@pytest.mark.parametrize("hessian", ["full", "rows", "mean"])
@pytest.mark.parametrize("lam", [0.0, 0.5])
def test_mse_collapses_to_itself_scaled_by_one_over_one_plus_lambda(hessian, lam):
    y, t = _y(4, 2, seed=2).requires_grad_(True), _y(4, 2, seed=3)

    def mse(y):
        return 0.5 * (y - t).square().sum()

    loss = newton_loss(mse, y, tikhonov=lam, hessian=hessian)
    loss.backward()
    torch.testing.assert_close(y.grad, (y.detach() - t) / (1 + lam), atol=1e-12, rtol=0)
    assert float(loss.detach()) == pytest.approx(float(mse(y.detach())) / (1 + lam) ** 2)


def test_fisher_injection_replaces_the_gradient_by_the_stated_formula():
    y = _y(6, 3, seed=4).requires_grad_(True)

    def loss_fn(y):
        return torch.nn.functional.cross_entropy(y, torch.tensor([0, 1, 2, 0, 1, 2]))  # mean

    loss_fn(inject_fisher(y, tikhonov=0.01)).backward()
    g = torch.autograd.functional.jacobian(loss_fn, y.detach())  # (B, m), rows grad l_i / B
    F = g.T @ g * 6  # = (1/B) sum_i grad l_i grad l_i^T
    expected = g @ torch.linalg.inv(F + 0.01 * torch.eye(3, dtype=y.dtype))
    torch.testing.assert_close(y.grad, expected, atol=1e-10, rtol=0)
    torch.testing.assert_close(inject_fisher(y, tikhonov=0.01), y)  # identity forward


def test_gradcheck_of_the_fisher_backward_and_double_backward():
    g = _y(5, 2, seed=5).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda g: fisher_step(g, 0.1), g)
    y = _y(5, 2, seed=6).requires_grad_(True)
    (gy,) = torch.autograd.grad((inject_fisher(y, tikhonov=0.1) ** 3).sum(), y, create_graph=True)
    gy.sum().backward()  # a gradient penalty through the injected backward works
    assert y.grad is not None and torch.isfinite(y.grad).all()


def test_gradcheck_of_the_hessian_newton_loss_at_a_fixed_target():
    """With z* held fixed the loss is 1/2 ||y - z*||^2; its autograd gradient is y - z*."""
    y = _y(4, 1, seed=7).requires_grad_(True)
    step = newton_step(_soft_f_small, y.detach(), tikhonov=1.0)
    target = y.detach() - step
    assert torch.autograd.gradcheck(lambda y: 0.5 * (y - target).square().sum(), y)
    (grad,) = torch.autograd.grad(newton_loss(_soft_f_small, y, tikhonov=1.0), y)
    torch.testing.assert_close(grad, step, atol=1e-12, rtol=0)


def _soft_f_small(y):
    return soft_fbeta_loss(y[:, 0], LABELS[:4])


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda y: newton_loss(_soft_f, y[:, 0], tikhonov=1.0), r"y must have shape \(B, m\)"),
        (lambda y: newton_loss(_soft_f, y, tikhonov=-1.0), "tikhonov must be a finite number >= 0"),
        (lambda y: newton_loss(_soft_f, y, tikhonov=1.0, hessian="diag"), "hessian must be one of"),
        (lambda y: newton_loss(lambda y: y, y, tikhonov=1.0), "loss_fn must return a scalar"),
        (lambda y: inject_fisher(y.long(), tikhonov=1.0), "y must be a floating-point tensor"),
        (lambda y: fisher_step(y * float("inf"), 1.0), "g must be finite"),
    ],
)
def test_bad_input_raises_value_error_naming_it(call, match):
    with pytest.raises(ValueError, match=match):
        call(_y())
