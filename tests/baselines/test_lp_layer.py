"""The Newton LP layer against HiGHS: optimal values, solutions, duals, gradients (docs/baselines.md).

Tolerances (float64): optimal value 1e-6 relative (the measured gap is ~1e-13 once converged),
solution and duals 1e-6 absolute, gradients 1e-6 between the two backward modes and against LP
sensitivity, 1e-5 against central finite differences.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.lp_layer import OURS, highs, planted_lp, steps_to_gap
from reparam.baselines import solve_lp, solve_lp_trace
from reparam.baselines.lp_layer import _ActiveSetLP, _masks, _newton, _recovery_ridge

# planted LPs on which 80 Newton steps reach the optimum (34 of 40 measured; docs/baselines.md)
CONVERGED = [(12, 3, s) for s in (0, 1, 2, 4, 7, 8)] + [(20, 5, s) for s in (0, 1, 2, 3, 4, 6)]
CONVERGED += [(30, 6, s) for s in range(6)]
STEPS = 80


def _lp(m, n, seed, dtype=torch.float64):
    return tuple(torch.tensor(t, dtype=dtype) for t in planted_lp(m, n, seed))


@pytest.mark.parametrize("backward", ["unroll", "active_set"])
@pytest.mark.parametrize("m, n, seed", CONVERGED)
def test_random_lp_matches_highs(m, n, seed, backward):
    A, b, c = _lp(m, n, seed)
    ref, z_ref, v_ref = highs(A, b, c)
    sol = solve_lp(A, b, c, steps=STEPS, backward=backward)
    assert float(sol.value) == pytest.approx(ref, rel=1e-6, abs=1e-6)
    np.testing.assert_allclose(sol.z.numpy(), z_ref, atol=1e-6)
    if backward == "active_set":  # the active set's least-norm multipliers = HiGHS's (unique) duals
        np.testing.assert_allclose(sol.v.numpy(), v_ref, atol=1e-6)
    assert bool((sol.active.numpy() == (v_ref > 0)).all())


def test_value_gradient_is_lp_sensitivity():
    """d value / d b = -v, d value / d c = z, d value / d A = v z^T (nondegenerate LP), both modes."""
    A, b, c = _lp(20, 5, 1)
    _, z_ref, v_ref = highs(A, b, c)
    for backward in ("unroll", "active_set"):
        A_, b_, c_ = (t.clone().requires_grad_(True) for t in (A, b, c))
        solve_lp(A_, b_, c_, steps=STEPS, backward=backward).value.backward()
        np.testing.assert_allclose(b_.grad.numpy(), -v_ref, atol=1e-6)
        np.testing.assert_allclose(c_.grad.numpy(), z_ref, atol=1e-6)
        np.testing.assert_allclose(A_.grad.numpy(), np.outer(v_ref, z_ref), atol=1e-6)


def test_unroll_and_active_set_gradients_agree_and_match_finite_differences():
    A, b, c = _lp(30, 6, 2)
    w = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    def f(A, b, c, backward="unroll"):  # a loss of the primal solution, not only of the value
        return (solve_lp(A, b, c, steps=STEPS, backward=backward).z * w).sum()

    grads = {}
    for backward in ("unroll", "active_set"):
        A_, b_, c_ = (t.clone().requires_grad_(True) for t in (A, b, c))
        f(A_, b_, c_, backward).backward()
        grads[backward] = (A_.grad, b_.grad, c_.grad)
    for gu, ga in zip(grads["unroll"], grads["active_set"], strict=True):
        torch.testing.assert_close(gu, ga, atol=1e-6, rtol=0)
    h = 1e-6
    for k, t in enumerate((A, b, c)):
        for i in range(0, t.numel(), max(1, t.numel() // 7)):  # a spread of entries
            e = torch.zeros_like(t).reshape(-1)
            e[i] = h
            args_p = [A, b, c]
            args_m = [A, b, c]
            args_p[k] = t + e.reshape(t.shape)
            args_m[k] = t - e.reshape(t.shape)
            fd = (f(*args_p) - f(*args_m)) / (2 * h)
            assert float(grads["unroll"][k].reshape(-1)[i]) == pytest.approx(float(fd), abs=1e-5)


def test_active_set_function_gradcheck():
    """The closed-form backward of the active-set system, with the masks of a converged solve."""
    A, b, c = _lp(12, 3, 0)
    y = _newton(A, b, c, OURS["eps"], OURS["rho"], STEPS, 1.0)
    active, free_zero = _masks(A, b, y)
    delta = _recovery_ridge(A.dtype)
    inputs = tuple(t.clone().requires_grad_(True) for t in (A, b, c))
    assert torch.autograd.gradcheck(
        lambda A, b, c: _ActiveSetLP.apply(A, b, c, y, active, free_zero, delta), inputs
    )


@pytest.mark.parametrize("backward", ["unroll", "active_set"])
def test_batched_equals_looped(backward):
    problems = [_lp(20, 5, s) for s in (0, 1, 2, 3)]
    A, b, c = (torch.stack(t).requires_grad_(True) for t in zip(*problems, strict=True))
    batched = solve_lp(A, b, c, steps=STEPS, backward=backward)
    batched.value.sum().backward()
    for k, (Ak, bk, ck) in enumerate(problems):
        Ak, bk, ck = (t.clone().requires_grad_(True) for t in (Ak, bk, ck))
        one = solve_lp(Ak, bk, ck, steps=STEPS, backward=backward)
        one.value.backward()
        torch.testing.assert_close(batched.z[k], one.z, atol=1e-10, rtol=0)
        torch.testing.assert_close(A.grad[k], Ak.grad, atol=1e-10, rtol=0)
        torch.testing.assert_close(b.grad[k], bk.grad, atol=1e-10, rtol=0)
    # leading dimensions broadcast: one c for all rows of the batch
    shared = solve_lp(A.detach(), b.detach(), c.detach()[0], steps=STEPS)
    torch.testing.assert_close(shared.value[0], batched.value[0].detach())


def test_float32_and_half_inputs_keep_their_dtype(device):
    A, b, c = (t.to(device) for t in _lp(12, 3, 1))
    ref = highs(A.cpu(), b.cpu(), c.cpu())[0]
    sol = solve_lp(A.float(), b.float(), c.float(), steps=STEPS)
    assert sol.z.dtype == torch.float32 and sol.z.device.type == device
    assert float(sol.value) == pytest.approx(ref, rel=1e-4)
    half = solve_lp(A.bfloat16(), b.bfloat16(), c.bfloat16(), steps=STEPS)
    assert half.value.dtype == torch.bfloat16


def test_convergence_counts_are_what_the_docs_say(capsys):
    """Newton steps to a 1e-6 relative gap (docs/baselines.md), printed with -s."""
    counts = {}
    for m, n in [(12, 3), (30, 6)]:
        counts[(m, n)] = [
            steps_to_gap(*_lp(m, n, s), highs(*_lp(m, n, s))[0], steps=STEPS, **OURS)
            for s in range(6)
        ]
    print(counts)
    assert counts[(30, 6)] == [20, 35, 23, 36, 9, 36]
    vals, viol = solve_lp_trace(*_lp(30, 6, 4), steps=12)
    assert vals.shape == viol.shape == (12,)
    assert float(viol[-1]) <= 1e-6


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(A=[[1.0]]), "A must be a torch.Tensor"),
        (dict(A=torch.ones(2, 3, dtype=torch.int64)), "A must be a floating-point"),
        (dict(b=torch.ones(3)), r"b must have shape \(\.\.\., m\) with m = 2"),
        (dict(c=torch.ones(2)), r"c must have shape \(\.\.\., n\) with n = 3"),
        (dict(b=torch.tensor([1.0, float("nan")])), "b must be finite"),
        (dict(c=torch.ones(3, dtype=torch.float64)), "c must have A's dtype"),
        (dict(b=torch.ones(4, 2), c=torch.ones(5, 3)), "must broadcast"),
        (dict(eps=0.0), "eps must be a finite number > 0, got 0.0"),
        (dict(rho=-1.0), "rho must be a finite number > 0"),
        (dict(steps=0), "steps must be an int >= 1, got 0"),
        (dict(backward="implicit"), r"backward must be one of \('unroll', 'active_set'\)"),
    ],
)
def test_bad_input_raises_value_error_naming_it(kwargs, match):
    args = dict(A=torch.ones(2, 3), b=torch.ones(2), c=torch.ones(3))
    opts = {k: kwargs.pop(k) for k in list(kwargs) if k not in args}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        solve_lp(args["A"], args["b"], args["c"], **opts)
