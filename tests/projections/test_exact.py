"""Exact projection onto C: agreement with a generic QP solver, edge cases, autograd, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from projections import _roots, project_onto_c, project_onto_c_, projection_root

from .reference import qp_project

METHODS = ["sort", "linear", "tree"]


def _instances(rng: np.random.Generator, count: int):
    """Random small instances covering the cases that matter (see the names)."""
    kinds = ["gauss", "ties", "all_negative", "delta_neg_gamma_pos", "huge", "tiny", "empty", "one"]
    for i in range(count):
        kind = kinds[i % len(kinds)]
        n = int(rng.integers(1, 25))
        delta = float(rng.normal() * 2)
        gamma = rng.normal(size=n) * 2 + rng.normal()
        if kind == "ties":
            gamma = np.round(gamma)  # many exact ties, possibly with the threshold
            delta = float(np.round(delta))
        elif kind == "all_negative":
            gamma = -np.abs(gamma) - 0.1
            delta = -abs(delta)
        elif kind == "delta_neg_gamma_pos":
            gamma = np.abs(gamma) + 0.1
            delta = -abs(delta) - 0.1
        elif kind == "huge":
            gamma, delta = gamma * 1e6, delta * 1e6
        elif kind == "tiny":
            gamma, delta = gamma * 1e-6, delta * 1e-6
        elif kind == "empty":
            gamma = gamma[:0]
        elif kind == "one":
            gamma = gamma[:1]
        yield kind, delta, gamma


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("method", METHODS)
def test_agrees_with_generic_qp_solver(method, dtype):
    rng = np.random.default_rng(0 if dtype == torch.float64 else 1)
    rtol = 1e-7 if dtype == torch.float64 else 2e-5
    checked = set()
    for kind, delta, gamma in _instances(rng, 160):
        e_ref, t_ref = qp_project(delta, gamma)
        e, t = project_onto_c(
            torch.tensor(delta, dtype=dtype), torch.tensor(gamma, dtype=dtype), method=method
        )
        scale = max(1.0 if kind != "tiny" else 1e-6, abs(delta), np.abs(gamma).max(initial=0))
        assert abs(e.item() - e_ref) <= rtol * scale, (kind, delta, gamma)
        np.testing.assert_allclose(t.double().numpy(), t_ref, rtol=0, atol=rtol * scale)
        checked.add(kind)
    assert len(checked) == 8


def _algorithm4_clip_first(delta: float, gamma: np.ndarray) -> float:
    """The paper's Algorithm 4 order: clip eps >= 0 *before* averaging (docs/method/projection.md sec. 4 says wrong)."""
    delta = max(delta, 0.0)
    g = np.sort(gamma)[::-1]
    k, s = 0, 0.0
    while k < g.size and g[k] > (delta + s + g[k]) / (k + 2):
        s += g[k]
        k += 1
    return (delta + s) / (k + 1)


@pytest.mark.parametrize("method", METHODS)
def test_regression_paper_algorithm4_clips_eps_too_early(method):
    """delta < 0 with positive gamma: the root is averaged with the *negative* delta, then clipped."""
    delta, gamma = -1.0, np.array([3.0, 0.5, -2.0])
    e, t = project_onto_c(
        torch.tensor(delta, dtype=torch.float64), torch.tensor(gamma), method=method
    )
    e_ref, t_ref = qp_project(delta, gamma)
    assert e.item() == pytest.approx(1.0) and e_ref == pytest.approx(1.0, abs=1e-7)
    assert t.tolist() == pytest.approx([1.0, 0.5, -2.0])
    np.testing.assert_allclose(t.numpy(), t_ref, atol=1e-7)
    assert _algorithm4_clip_first(delta, gamma) == pytest.approx(1.5)  # the wrong answer


@pytest.mark.parametrize("method", METHODS)
def test_empty_tau_only_clips_eps(method):
    for d in [-2.0, 0.0, 3.0]:
        e, t = project_onto_c(torch.tensor(d), torch.empty(0), method=method)
        assert e.item() == max(d, 0.0) and t.shape == (0,)
    e, t = project_onto_c(torch.tensor([-1.0, 2.0]), torch.empty(2, 0), method=method)
    assert e.tolist() == [0.0, 2.0] and t.shape == (2, 0)


@pytest.mark.parametrize("method", METHODS)
def test_ties_and_already_feasible(method):
    e, t = project_onto_c(torch.tensor(0.0).double(), torch.full((7,), 2.0).double(), method=method)
    assert e.item() == pytest.approx(14 / 8) and torch.allclose(
        t, torch.full((7,), 14 / 8).double()
    )
    eps, tau = torch.tensor(1.0), torch.tensor([1.0, 1.0, -3.0, 0.5])  # feasible, with ties at eps
    e, t = project_onto_c(eps, tau, method=method)
    assert e.item() == 1.0 and torch.equal(t, tau)


@pytest.mark.parametrize("method", ["auto", *METHODS])
def test_keeps_dtype_device_and_does_not_modify_inputs(method, device):
    for dtype in [torch.float32, torch.float64, torch.bfloat16, torch.float16]:
        eps = torch.randn(3, 4, dtype=dtype, device=device)
        tau = torch.randn(3, 4, 50, dtype=dtype, device=device)
        eps0, tau0 = eps.clone(), tau.clone()
        e, t = project_onto_c(eps, tau, method=method)
        assert e.dtype == t.dtype == dtype and e.device == t.device == eps.device
        assert e.shape == (3, 4) and t.shape == (3, 4, 50)
        assert torch.equal(eps, eps0) and torch.equal(tau, tau0)
        e64, t64 = project_onto_c(eps.double(), tau.double(), method=method)
        tol = 1e-6 if dtype in (torch.float32, torch.float64) else 3e-2
        torch.testing.assert_close(e.double(), e64, atol=tol, rtol=tol)
        torch.testing.assert_close(t.double(), t64, atol=tol, rtol=tol)


def test_in_place_variant_on_parameters(device):
    eps = torch.nn.Parameter(torch.tensor(-0.5, device=device))
    tau = torch.nn.Parameter(torch.tensor([2.0, 0.1, -1.0], device=device))
    expected = project_onto_c(eps.detach(), tau.detach())
    out = project_onto_c_(eps, tau)
    assert out[0] is eps and out[1] is tau and eps.requires_grad and tau.requires_grad
    assert torch.equal(eps.detach(), expected[0]) and torch.equal(tau.detach(), expected[1])
    assert eps.grad_fn is None and tau.grad_fn is None  # leaves: not part of any graph


def test_linear_agrees_with_sort_on_large_inputs():
    gen = torch.Generator().manual_seed(3)
    for x in [
        torch.randn(200_000, generator=gen),
        torch.rand(100_000, generator=gen).exp() * 10,
        torch.randint(-5, 5, (50_000,), generator=gen).float(),  # massive ties
    ]:
        for d in [-1e3, 0.0, 5.0, 1e5]:
            delta = torch.tensor(d)
            a = projection_root(delta, x, method="sort")
            b = projection_root(delta, x, method="linear")
            assert b.item() == pytest.approx(a.item(), rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("newton_passes", [0, 24])
def test_linear_on_input_that_defeats_newton(monkeypatch, newton_passes):
    """Geometric values: each Newton step decides one coordinate; random pivots keep it linear."""
    monkeypatch.setattr(_roots, "NEWTON_PASSES", newton_passes)
    x = 2.0 ** -torch.arange(400, dtype=torch.float64)
    for d in [-5.0, -1.0, 0.0, 0.7]:
        a = _roots.root_sort(torch.tensor(d, dtype=torch.float64), x)
        b = _roots.root_linear(torch.tensor([d], dtype=torch.float64), x)
        assert b.item() == pytest.approx(a.item(), rel=1e-12, abs=1e-15)
    g = torch.randint(0, 5, (400,))
    a = _roots.root_sort_grouped(torch.zeros(5, dtype=torch.float64) - 1, x, g)
    b = _roots.root_linear(torch.zeros(5, dtype=torch.float64) - 1, x, g)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)


def test_linear_does_not_touch_global_rng(monkeypatch):
    monkeypatch.setattr(_roots, "NEWTON_PASSES", 0)  # random pivots on every other pass
    torch.manual_seed(123)
    before = torch.get_rng_state()
    project_onto_c(torch.tensor(0.0), torch.randn(10_000), method="linear")
    torch.set_rng_state(before)
    expected = torch.rand(3)
    torch.set_rng_state(before)
    project_onto_c(torch.tensor(0.0), torch.zeros(10_000).normal_(), method="linear")
    assert torch.equal(torch.rand(3), expected) is False  # sanity: normal_ consumed the RNG
    torch.set_rng_state(before)
    x = torch.linspace(-3, 3, 10_000)
    project_onto_c(torch.tensor(0.0), x, method="linear")
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("method", METHODS)
def test_grouped_form(method, device):
    gen = torch.Generator().manual_seed(0)
    eps = torch.randn(6, generator=gen, dtype=torch.float64).to(device)
    tau = (torch.randn(400, generator=gen, dtype=torch.float64) * 3).to(device)
    groups = torch.randint(0, 5, (400,), generator=gen).to(device)  # group 5 is empty
    e, t = project_onto_c(eps, tau, groups=groups, method=method)
    for g in range(6):
        eg, tg = project_onto_c(eps[g], tau[groups == g], method="sort")
        torch.testing.assert_close(e[g], eg)
        torch.testing.assert_close(t[groups == g], tg)
    assert e[5].item() == max(eps[5].item(), 0.0)


# --- autograd -------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_gradcheck_exact(method):
    gen = torch.Generator().manual_seed(1)
    for shape in [(), (3,)]:
        eps = torch.randn(shape, generator=gen, dtype=torch.float64).requires_grad_()
        tau = (torch.randn(*shape, 9, generator=gen, dtype=torch.float64) + 0.5).requires_grad_()
        assert torch.autograd.gradcheck(
            lambda e, t: project_onto_c(e, t, method=method), (eps, tau)
        )
    eps = torch.randn(4, generator=gen, dtype=torch.float64).requires_grad_()
    tau = (torch.randn(20, generator=gen, dtype=torch.float64) + 1).requires_grad_()
    groups = torch.arange(20) % 4
    assert torch.autograd.gradcheck(
        lambda e, t: project_onto_c(e, t, groups=groups, method=method), (eps, tau)
    )


@pytest.mark.parametrize("method", METHODS)
def test_jacobian_matches_spec_formula(method):
    """docs/method/projection.md sec. 4: d e*/d delta = d e*/d gamma_i = 1/(|A|+1) on the clipped set A, identity elsewhere."""
    gen = torch.Generator().manual_seed(7)
    delta = torch.tensor(0.3, dtype=torch.float64)
    gamma = torch.randn(12, generator=gen, dtype=torch.float64) * 2
    e, _ = project_onto_c(delta, gamma)
    assert e.item() > 0
    clipped = gamma > e
    n_a = int(clipped.sum())
    assert 0 < n_a < 12
    x = torch.cat([delta.reshape(1), gamma])

    def f(x):
        e, t = project_onto_c(x[0], x[1:], method=method)
        return torch.cat([e.reshape(1), t])

    jac = torch.autograd.functional.jacobian(f, x)
    on_a = torch.cat([torch.tensor([True]), clipped])  # eps and the clipped coordinates
    expected = torch.zeros(13, 13, dtype=torch.float64)
    expected[on_a.nonzero()[:, 0][:, None], on_a.nonzero()[:, 0]] = 1.0 / (n_a + 1)
    free = (~on_a).nonzero()[:, 0]
    expected[free, free] = 1.0
    torch.testing.assert_close(jac, expected)


@pytest.mark.parametrize("method", METHODS)
def test_jacobian_is_zero_through_eps_when_clipped_at_zero(method):
    delta = torch.tensor(-4.0, dtype=torch.float64, requires_grad=True)  # r = -1/3
    gamma = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64, requires_grad=True)
    e, t = project_onto_c(delta, gamma, method=method)
    assert e.item() == 0.0
    (e + t.sum()).backward()
    assert delta.grad.item() == 0.0 and gamma.grad.tolist() == [0.0, 1.0, 0.0]


def test_gradients_agree_with_differentiable_qp_layer():
    """The OptNet anchor: qpth differentiates the KKT system of the same QP."""
    qpth = pytest.importorskip("qpth", reason="qpth (OptNet QP layer) is not installed")
    from qpth.qp import QPFunction, QPSolvers

    gen = torch.Generator().manual_seed(5)
    n = 6
    delta = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    gamma = (torch.randn(n, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    w = torch.randn(n + 1, generator=gen, dtype=torch.float64)  # a random linear read-out

    e, t = project_onto_c(delta, gamma)
    (w[0] * e + w[1:] @ t).backward()
    ours = torch.cat([delta.grad.reshape(1), gamma.grad])

    # z = (e, t): min 1/2 z'Qz + p'z with Q = 2I, p = -2 (delta, gamma); G z <= h encodes C.
    x = torch.cat([delta.detach().reshape(1), gamma.detach()]).requires_grad_()
    q = 2 * torch.eye(n + 1, dtype=torch.float64)
    g = torch.zeros(n + 1, n + 1, dtype=torch.float64)
    g[0, 0] = -1.0  # -e <= 0
    g[1:, 0] = -1.0
    g[1:, 1:] = torch.eye(n, dtype=torch.float64)  # t_i - e <= 0
    h = torch.zeros(n + 1, dtype=torch.float64)
    empty = torch.empty(0, dtype=torch.float64)
    z = QPFunction(verbose=-1, eps=1e-14, maxIter=100, solver=QPSolvers.PDIPM_BATCHED)(
        q, -2 * x, g, h, empty, empty
    )[0]
    torch.testing.assert_close(z, torch.cat([e.reshape(1), t]).detach(), atol=1e-6, rtol=0)
    (w @ z).backward()
    torch.testing.assert_close(x.grad, ours, atol=1e-5, rtol=0)
    assert qpth is not None


# --- bad input -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "eps, tau, kwargs, match",
    [
        (torch.tensor(0.0), torch.tensor([1.0, float("nan")]), {}, "tau must be finite"),
        (torch.tensor(float("inf")), torch.tensor([1.0]), {}, "eps must be finite"),
        (torch.tensor(0.0), torch.tensor([-float("inf")]), {}, "tau must be finite"),
        (torch.zeros(2), torch.zeros(3, 4), {}, r"eps must have shape tau.shape\[:-1\]"),
        (torch.zeros(()), torch.zeros(()), {}, "tau must have at least one dimension"),
        (torch.tensor(0), torch.tensor([1.0]), {}, "eps must be a floating-point tensor"),
        (torch.tensor(0.0), torch.tensor([1, 2]), {}, "tau must be a floating-point tensor"),
        (0.0, torch.tensor([1.0]), {}, "eps must be a torch.Tensor"),
        (torch.tensor(0.0), torch.tensor([1.0], dtype=torch.float64), {}, "same dtype"),
        (torch.tensor(0.0), torch.tensor([1.0]), {"method": "bisect"}, "method must be one of"),
        (torch.zeros(2), torch.zeros(3), {"groups": torch.tensor([0, 1, 2])}, r"\[0, 2\)"),
        (
            torch.zeros(2),
            torch.zeros(3),
            {"groups": torch.tensor([0, -1, 1])},
            r"got values in \[-1, 1\]",
        ),
        (
            torch.zeros(2),
            torch.zeros(3),
            {"groups": torch.tensor([0, 1, 1], dtype=torch.int32)},
            "int64",
        ),
        (torch.zeros(2), torch.zeros(3), {"groups": torch.tensor([0.0, 1.0, 1.0])}, "int64"),
        (torch.zeros(2), torch.zeros(3), {"groups": [0, 1, 1]}, "groups must be a torch.Tensor"),
        (
            torch.zeros(2),
            torch.zeros(3),
            {"groups": torch.tensor([0, 1])},
            "groups must have the shape",
        ),
        (
            torch.zeros(2, 1),
            torch.zeros(3),
            {"groups": torch.tensor([0, 1, 1])},
            r"eps must have shape \(G,\)",
        ),
        (
            torch.zeros(2),
            torch.zeros(3, 1),
            {"groups": torch.tensor([0, 1, 1])},
            r"tau must have shape \(n,\)",
        ),
    ],
)
def test_bad_input_raises_value_error(eps, tau, kwargs, match):
    with pytest.raises(ValueError, match=match):
        project_onto_c(eps, tau, **kwargs)
    if isinstance(eps, torch.Tensor) and isinstance(tau, torch.Tensor):
        with pytest.raises(ValueError, match=match):
            project_onto_c_(eps.clone(), tau.clone(), **kwargs)


@pytest.mark.parametrize("top_m", [1, 3, 8])
def test_linear_when_top_prefix_is_not_enough(monkeypatch, top_m):
    """More than TOP_M clipped coordinates: Newton continues from A_m with k_lo = m."""
    from projections import exact

    monkeypatch.setattr(exact, "TOP_M", top_m)
    gen = torch.Generator().manual_seed(top_m)
    for trial in range(150):
        rows = int(torch.randint(1, 4, (), generator=gen))
        n = int(torch.randint(top_m + 1, 40, (), generator=gen))
        tau = torch.randn(rows, n, generator=gen, dtype=torch.float64) * 3
        if trial % 3 == 0:
            tau = tau.round()  # ties, also with the threshold
        eps = torch.randn(rows, generator=gen, dtype=torch.float64) * 5 - 2
        es, ts = project_onto_c(eps, tau, method="sort")
        el, tl = project_onto_c(eps, tau, method="linear")
        torch.testing.assert_close(el, es, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(tl, ts, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [0, 1, 7, 40_000, 300_000])
def test_one_row_fast_path_equals_general_path(dtype, n):
    """The one-row CPU fast path (0-d eps, 1-D tau, no autograd) gives the general path's bits;
    a row whose sum would overflow in float32 (finite values) is projected too."""
    gen = torch.Generator().manual_seed(n)
    tau = torch.randn(n, generator=gen, dtype=dtype) * 3
    for eps in (torch.tensor(0.0, dtype=dtype), torch.tensor(-float(n) / 8, dtype=dtype)):
        fast = project_onto_c(eps, tau)
        general = project_onto_c(eps.reshape(1), tau.reshape(1, n), method="tree")  # rows: general
        assert torch.equal(fast[0], general[0][0]) and torch.equal(fast[1], general[1][0])
        with torch.no_grad():  # requires_grad without a graph: the fast path too
            e, t = project_onto_c(eps, tau.clone().requires_grad_())
        assert torch.equal(e, fast[0]) and torch.equal(t, fast[1])
    if dtype == torch.float32:  # float32 values sum to inf in float32, not in the tree's float64
        big = torch.full((4,), torch.finfo(dtype).max / 2, dtype=dtype)
        e, t = project_onto_c(torch.tensor(0.0, dtype=dtype), big)
        assert torch.isfinite(e) and torch.equal(t, torch.minimum(big, e))
