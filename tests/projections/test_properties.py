"""Invariants of Pi_C (docs/method/projection.md sec. 4), checked by hypothesis on generated inputs."""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from projections import project_onto_c

# Values on a coarse grid produce exact ties; wide floats produce scale spread.
_values = st.one_of(
    st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False, width=64),
    st.integers(-4, 4).map(float),
)


@st.composite
def points(draw, max_n: int = 30):
    n = draw(st.integers(0, max_n))
    gamma = draw(hnp.arrays(np.float64, n, elements=_values))
    delta = draw(_values)
    return torch.tensor(delta, dtype=torch.float64), torch.from_numpy(gamma)


methods = st.sampled_from(["sort", "linear", "tree"])


def _tol(*xs: torch.Tensor) -> float:
    scale = max([1.0] + [float(x.abs().max()) for x in xs if x.numel()])
    return 1e-10 * scale


@given(points(), methods)
def test_feasible(p, method):
    e, t = project_onto_c(*p, method=method)
    assert e.item() >= 0
    assert bool((t <= e).all())


@given(points(), methods)
def test_kkt_conditions(p, method):
    """Stationarity with multipliers nu_i = gamma_i - t_i >= 0 (for t_i <= e) and
    kappa = e - delta - sum(nu) >= 0 (for e >= 0); complementary slackness for both."""
    delta, gamma = p
    e, t = project_onto_c(delta, gamma, method=method)
    tol = _tol(delta, gamma) * max(1, gamma.numel())
    nu = gamma - t
    kappa = e - delta - nu.sum()
    assert bool((nu >= -tol).all()) and kappa.item() >= -tol
    assert bool(((nu * (e - t)).abs() <= tol * (1 + nu.abs().max() if nu.numel() else 1)).all())
    assert abs(kappa.item() * e.item()) <= tol * (1 + abs(e.item()) + abs(kappa.item()))


@given(points(), methods)
def test_idempotent(p, method):
    e, t = project_onto_c(*p, method=method)
    e2, t2 = project_onto_c(e, t, method=method)
    tol = _tol(e, t)
    assert abs(e2.item() - e.item()) <= tol and bool(((t2 - t).abs() <= tol).all())


@given(points(max_n=15), points(max_n=15), methods)
def test_non_expansive(p, q, method):
    n = min(p[1].numel(), q[1].numel())
    x, y = (p[0], p[1][:n]), (q[0], q[1][:n])
    ex, tx = project_onto_c(*x, method=method)
    ey, ty = project_onto_c(*y, method=method)
    d_out = torch.sqrt((ex - ey) ** 2 + ((tx - ty) ** 2).sum())
    d_in = torch.sqrt((x[0] - y[0]) ** 2 + ((x[1] - y[1]) ** 2).sum())
    assert d_out.item() <= d_in.item() + _tol(*x, *y)


@given(points(max_n=60))
def test_sort_equals_linear_and_tree(p):
    es, ts = project_onto_c(*p, method="sort")
    tol = _tol(*p)
    for method in ["linear", "tree"]:
        el, tl = project_onto_c(*p, method=method)
        assert abs(es.item() - el.item()) <= tol and bool(((ts - tl).abs() <= tol).all())


@given(st.integers(1, 4), st.integers(1, 3), st.integers(0, 12), st.integers(0, 2**31 - 1), methods)
def test_batched_equals_loop_of_single_calls(b1, b2, n, seed, method):
    gen = torch.Generator().manual_seed(seed)
    eps = torch.randn(b1, b2, generator=gen, dtype=torch.float64)
    tau = torch.randint(-3, 4, (b1, b2, n), generator=gen).double()  # ties across rows too
    tau += torch.randn(b1, b2, n, generator=gen, dtype=torch.float64) * (seed % 2)
    e, t = project_onto_c(eps, tau, method=method)
    for i in range(b1):
        for j in range(b2):
            ei, ti = project_onto_c(eps[i, j], tau[i, j], method=method)
            assert torch.allclose(e[i, j], ei, atol=1e-12) and torch.allclose(
                t[i, j], ti, atol=1e-12
            )


@given(st.integers(1, 6), st.integers(0, 40), st.integers(0, 2**31 - 1), methods)
def test_grouped_equals_per_group_calls(num_groups, n, seed, method):
    gen = torch.Generator().manual_seed(seed)
    eps = torch.randn(num_groups, generator=gen, dtype=torch.float64) * 2
    scales = 10.0 ** torch.randint(-3, 4, (num_groups,), generator=gen).double()  # per-group scale
    groups = torch.randint(0, num_groups, (n,), generator=gen)
    tau = torch.randn(n, generator=gen, dtype=torch.float64) * scales[groups]
    e, t = project_onto_c(eps, tau, groups=groups, method=method)
    for g in range(num_groups):
        eg, tg = project_onto_c(eps[g], tau[groups == g], method=method)
        tol = 1e-12 * max(1.0, float(scales[g]))
        assert abs(e[g].item() - eg.item()) <= tol
        assert torch.allclose(t[groups == g], tg, atol=tol, rtol=0)
