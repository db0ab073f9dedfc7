"""Soft projection (docs/method/projection.md sec. 5): convergence to the exact projection, feasibility, autograd."""

from __future__ import annotations

import importlib.util
import itertools

import pytest
import torch

from projections import project_onto_c, soft_project_onto_c
from projections import soft as soft_mod

_NO_TORCHSORT = pytest.mark.skipif(
    importlib.util.find_spec("torchsort") is None,
    reason="torchsort is optional (it compiles at install; see README)",
)
BACKENDS = ["diffsort", pytest.param("torchsort", marks=_NO_TORCHSORT)]


def _point(seed: int, rows: int = 3, n: int = 40):
    gen = torch.Generator().manual_seed(seed)
    eps = torch.randn(rows, generator=gen, dtype=torch.float64)
    tau = torch.randn(rows, n, generator=gen, dtype=torch.float64) * 2 + 0.5
    eps[0] = -3.0  # a row whose exact eps is 0 or small
    return eps, tau


def _max_err(a, b):
    return max(float((a[0] - b[0]).abs().max()), float((a[1] - b[1]).abs().max()))


@pytest.mark.parametrize(
    "method, backend",
    [
        ("smooth", "auto"),
        ("sort", "diffsort"),
        pytest.param("sort", "torchsort", marks=_NO_TORCHSORT),
    ],
)
def test_converges_to_exact_projection(method, backend):
    eps, tau = _point(0)
    exact = project_onto_c(eps, tau)
    errs = [
        _max_err(
            soft_project_onto_c(eps, tau, strength=s, method=method, sort_backend=backend), exact
        )
        for s in [1.0, 1e-1, 1e-2, 1e-3, 1e-4]
    ]
    assert errs[-1] < 1e-3, errs
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(errs)), errs  # monotone in strength
    assert errs[0] > 10 * errs[-1]  # a real smoothing, not the exact map


@pytest.mark.parametrize("method", ["smooth", "sort"])
def test_output_is_feasible_and_keeps_dtype(method, device):
    if method == "sort" and device == "cuda":
        pytest.skip("diffsort network is built on CPU in this test")
    for dtype in [torch.float32, torch.float64]:
        eps, tau = _point(1)
        eps, tau = eps.to(device, dtype), tau.to(device, dtype)
        e, t = soft_project_onto_c(eps, tau, strength=0.1, method=method)
        assert e.dtype == dtype and t.dtype == dtype and e.device == eps.device
        assert bool((e > 0).all()) and bool((t <= e.unsqueeze(-1)).all())


def test_zero_strength_is_exact():
    eps, tau = _point(2)
    assert _max_err(soft_project_onto_c(eps, tau, strength=0), project_onto_c(eps, tau)) == 0


def test_smooth_threshold_matches_its_definition():
    """o_s solves h_s(o) = 0 with h_s(e) = e - delta - s * sum softplus((gamma - e)/s)."""
    eps, tau = _point(3)
    s = 0.3
    o = soft_mod._SmoothRoot.apply(eps, tau, s, None)
    h = o - eps - s * torch.nn.functional.softplus((tau - o.unsqueeze(-1)) / s).sum(-1)
    assert float(h.abs().max()) < 1e-12
    e, _ = soft_project_onto_c(eps, tau, strength=s)
    torch.testing.assert_close(e, s * torch.nn.functional.softplus(o / s))


def test_gradcheck_smooth():
    eps, tau = _point(4, rows=2, n=7)
    eps.requires_grad_()
    tau.requires_grad_()
    for s in [1.0, 0.05]:
        assert torch.autograd.gradcheck(
            lambda e, t, s=s: soft_project_onto_c(e, t, strength=s), (eps, tau)
        )
    groups = torch.tensor([0, 1, 1, 0, 2, 2, 1])
    e3 = torch.randn(3, dtype=torch.float64, requires_grad=True)
    t3 = tau[0].detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda e, t: soft_project_onto_c(e, t, strength=0.2, groups=groups), (e3, t3)
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradcheck_sort_route(backend):
    eps, tau = _point(5, rows=2, n=8)
    eps.requires_grad_()
    tau.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda e, t: soft_project_onto_c(e, t, strength=0.5, method="sort", sort_backend=backend),
        (eps, tau),
    )


@pytest.mark.parametrize("method", ["smooth", "sort"])
def test_grouped_equals_per_group(method):
    gen = torch.Generator().manual_seed(6)
    eps = torch.randn(3, generator=gen, dtype=torch.float64)
    tau = torch.randn(30, generator=gen, dtype=torch.float64)
    groups = torch.randint(0, 3, (30,), generator=gen)
    e, t = soft_project_onto_c(eps, tau, strength=0.1, groups=groups, method=method)
    for g in range(3):
        eg, tg = soft_project_onto_c(eps[g], tau[groups == g], strength=0.1, method=method)
        torch.testing.assert_close(e[g], eg)
        torch.testing.assert_close(t[groups == g], tg)


def test_empty_tau():
    e, t = soft_project_onto_c(torch.tensor([-1.0, 2.0]), torch.empty(2, 0), strength=1e-3)
    assert t.shape == (2, 0)
    torch.testing.assert_close(e, torch.tensor([0.0, 2.0]), atol=1e-3, rtol=0)
    e, t = soft_project_onto_c(torch.tensor([2.0]), torch.empty(1, 0), strength=1e-3, method="sort")
    torch.testing.assert_close(e, torch.tensor([2.0]), atol=1e-3, rtol=0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"strength": -1.0}, "strength must be a finite number >= 0"),
        ({"strength": float("nan")}, "strength must be a finite number >= 0"),
        ({"strength": "0.1"}, "strength must be a finite number >= 0"),
        ({"strength": 0.1, "method": "sinkhorn"}, "method must be one of"),
        (
            {"strength": 0.1, "method": "sort", "sort_backend": "numpy"},
            "sort_backend must be one of",
        ),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        soft_project_onto_c(torch.tensor(0.0), torch.tensor([1.0, 2.0]), **kwargs)
    with pytest.raises(ValueError, match="tau must be finite"):
        soft_project_onto_c(torch.tensor(0.0), torch.tensor([1.0, float("inf")]), strength=0.1)


def test_diffsort_size_limit_is_a_clear_error():
    n = soft_mod.DIFFSORT_MAX_N + 1
    with pytest.raises(ValueError, match="limited to n <= 1024"):
        soft_project_onto_c(
            torch.tensor(0.0), torch.zeros(n), strength=0.1, method="sort", sort_backend="diffsort"
        )


def test_missing_backend_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(soft_mod, "_has", lambda name: False)
    with pytest.raises(ValueError, match="not installed"):
        soft_project_onto_c(torch.tensor(0.0), torch.ones(4), strength=0.1, method="sort")
