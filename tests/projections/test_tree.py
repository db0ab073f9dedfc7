"""The "tree" method (max tree, verified Newton) on long vectors: exact on every path it can take."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from projections import _tree, project_onto_c, projection_root
from projections._roots import root_sort

from .reference import qp_project
from .test_properties import points

BACKENDS = [pytest.param(True, id="numpy"), pytest.param(False, id="torch")]


def _inputs(n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Adversarial and ordinary float64 vectors of length n."""
    gen = torch.Generator().manual_seed(seed)
    few_huge = torch.randn(n, generator=gen, dtype=torch.float64)
    few_huge[torch.randperm(n, generator=gen)[:5]] = 1e4  # a sample of n/4096 misses them
    return {
        "gauss": torch.randn(n, generator=gen, dtype=torch.float64),
        "all_equal": torch.full((n,), 2.5, dtype=torch.float64),
        "geometric": 2.0 ** -torch.arange(n, dtype=torch.float64).remainder(1000),
        "few_huge": few_huge,
        "pareto": torch.rand(n, generator=gen, dtype=torch.float64).pow(-1.5),  # heavy tail
        "cauchy": torch.empty(n, dtype=torch.float64).cauchy_(generator=gen),
        "ties": torch.randint(-3, 4, (n,), generator=gen).double(),
        "sorted": torch.linspace(-1, 1, n, dtype=torch.float64),
        "sorted_desc": torch.linspace(1, -1, n, dtype=torch.float64),
    }


def _deltas(x: torch.Tensor) -> list[float]:
    """From r below every value (delta very negative) to r above every value (delta large)."""
    n = x.numel()
    hi = float(x.max())
    return [
        -4.0 * n * float(x.abs().max()) - 1,
        -n / 2,
        -n / 64,
        -10.0,
        0.0,
        hi + 1,
        1e3 * hi + 1e6,
    ]


def _check_root(delta: float, x: torch.Tensor, **kwargs) -> None:
    d = torch.tensor(delta, dtype=x.dtype)
    expected = root_sort(d.double(), x.double()).item()
    got = _tree.root_tree(d, x, **kwargs).item()
    scale = max(1.0, abs(delta), float(x.abs().max()))
    tol = (1e-12 if x.dtype == torch.float64 else 5e-6) * scale
    assert abs(got - expected) <= tol, (delta, got, expected)


@pytest.mark.parametrize("use_numpy", BACKENDS)
@pytest.mark.parametrize("n", [1, 7, 100, 3000, 20_000, 150_000])
def test_root_agrees_with_sort_on_adversarial_inputs(n, use_numpy):
    for x in _inputs(n).values():
        for delta in _deltas(x):
            _check_root(delta, x, use_numpy=use_numpy)


@pytest.mark.parametrize("use_numpy", BACKENDS)
def test_float32_agrees_with_float64_sort_at_large_n(use_numpy):
    gen = torch.Generator().manual_seed(4)
    n = 1_000_000
    for x in [torch.randn(n, generator=gen), torch.randn(n, generator=gen).exp() * 10 + 1e3]:
        for delta in [-n / 4, -100.0, 0.0, 3.0]:
            _check_root(delta, x, use_numpy=use_numpy)


def _count_passes(monkeypatch) -> dict[str, int]:
    calls = {"count": 0, "sum": 0, "linear": 0}
    count, total, linear = _tree._Passes.count_above, _tree._Passes.sum_above, _tree.root_linear

    def count_above(self, p, *args):
        calls["count"] += 1
        return count(self, p, *args)

    def sum_above(self, p):
        calls["sum"] += 1
        return total(self, p)

    def root_linear(*args, **kwargs):
        calls["linear"] += 1
        return linear(*args, **kwargs)

    monkeypatch.setattr(_tree._Passes, "count_above", count_above)
    monkeypatch.setattr(_tree._Passes, "sum_above", sum_above)
    monkeypatch.setattr(_tree, "root_linear", root_linear)
    return calls


def test_few_clipped_coordinates_need_no_full_pass_but_the_tree(monkeypatch):
    calls = _count_passes(monkeypatch)
    x = torch.randn(300_000, generator=torch.Generator().manual_seed(0))
    _check_root(0.0, x)  # about 10 coordinates clipped
    assert calls == {"count": 0, "sum": 0, "linear": 0}


def test_many_clipped_coordinates_take_few_verified_newton_steps(monkeypatch):
    calls = _count_passes(monkeypatch)
    x = torch.randn(300_000, generator=torch.Generator().manual_seed(0))
    _check_root(-50_000.0, x)  # about a third of the coordinates clipped
    # one sum pass; the values between two points come from their masks after that
    assert calls["sum"] == 1 and 2 <= calls["count"] <= 5 and not calls["linear"]


@pytest.mark.parametrize("use_numpy", BACKENDS)
@pytest.mark.parametrize("start", ["far_below", "far_above", "just_above"])
def test_a_bad_sample_estimate_still_gives_the_exact_root(monkeypatch, use_numpy, start):
    x = torch.randn(200_000, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    delta = -20_000.0
    r = root_sort(torch.tensor(delta, dtype=torch.float64), x).item()
    wrong = {"far_below": -50.0, "far_above": 50.0, "just_above": np.nextafter(r, np.inf)}[start]
    monkeypatch.setattr(_tree, "sample_estimate", lambda *args: wrong)
    _check_root(delta, x, use_numpy=use_numpy)


def test_newton_from_above_finishes_among_the_values_it_passed(monkeypatch):
    """A start just above the root: one Newton step lands below it, and the values between the
    two points (from their masks) hold the root: 1 sum and 2 counts."""
    calls = _count_passes(monkeypatch)
    x = torch.randn(200_000, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    delta = -20_000.0
    r = root_sort(torch.tensor(delta, dtype=torch.float64), x).item()
    above = float(x[x > r].min())  # the smallest clipped coordinate
    monkeypatch.setattr(_tree, "sample_estimate", lambda *args: above)
    _check_root(delta, x)
    assert calls == {"count": 2, "sum": 1, "linear": 0}


def test_newton_with_sum_passes_only(monkeypatch):
    """Without the masks (as on CUDA, or after a dense band) every step sums: the same roots."""
    calls = _count_passes(monkeypatch)
    monkeypatch.setattr(_tree._Passes, "between", lambda self, *args: None)
    x = torch.randn(200_000, generator=torch.Generator().manual_seed(2))
    for delta in [-50_000.0, -2000.0]:
        _check_root(delta, x)
    assert calls["sum"] >= 4 and not calls["linear"]


@pytest.mark.parametrize("use_numpy", BACKENDS)
def test_newton_hands_over_to_the_randomized_method(monkeypatch, use_numpy):
    """Past NEWTON_STEPS unverified steps (inputs made to defeat Newton), the randomized linear
    method finishes from the last lower bound, still exactly; here it takes over at once."""
    calls = _count_passes(monkeypatch)
    monkeypatch.setattr(_tree, "MIN_GATHER_CAP", 8)  # the tree gives up at once
    monkeypatch.setattr(_tree, "GATHER_DIVISOR", 1 << 62)
    monkeypatch.setattr(_tree, "NEWTON_STEPS", 0)
    x = torch.randn(40_000, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    for delta in [-10_000.0, -1000.0]:
        _check_root(delta, x, use_numpy=use_numpy)
    assert calls["linear"] == 2


@pytest.mark.parametrize("use_numpy", BACKENDS)
def test_tree_gives_up_to_newton_when_too_many_values_are_above_its_bound(monkeypatch, use_numpy):
    calls = _count_passes(monkeypatch)
    monkeypatch.setattr(_tree, "MIN_GATHER_CAP", 64)
    monkeypatch.setattr(_tree, "GATHER_DIVISOR", 1 << 62)
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    for delta in [-1000.0, 0.0]:
        _check_root(delta, x, use_numpy=use_numpy)
    assert calls["count"] >= 2


def test_lower_bound_when_the_largest_values_are_not_enough(monkeypatch):
    """lower_bound looping over only the 2 largest values first: the same roots."""
    monkeypatch.setattr(_tree, "PY_MAX_VALUES", 2)
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for delta in [-5000.0, -50.0, 0.0, 1.0]:
        _check_root(delta, x)


def test_projection_agrees_with_generic_qp_solver_on_structured_inputs():
    for name, x in _inputs(3000, seed=5).items():
        for delta in [-300.0, 0.0, 2.0]:
            e_ref, t_ref = qp_project(delta, x.numpy())
            e, t = project_onto_c(torch.tensor(delta, dtype=torch.float64), x, method="tree")
            scale = max(1.0, abs(delta), float(x.abs().max()))
            assert abs(e.item() - e_ref) <= 1e-7 * scale, name
            np.testing.assert_allclose(t.numpy(), t_ref, rtol=0, atol=1e-7 * scale, err_msg=name)


@pytest.mark.parametrize("n", [0, 1, 50, 5000, 100_000])
def test_fast_output_pass_equals_the_threshold_rebuild(n):
    """Without grad, "tree" writes min(tau, e*) itself: bit for bit what the autograd rebuild gives."""
    gen = torch.Generator().manual_seed(n)
    for dtype in [torch.float32, torch.float64]:
        tau = torch.randn(n, generator=gen, dtype=dtype) * 3
        for delta in [-0.5 * n - 1, 0.0, 4.0]:
            eps = torch.tensor(delta, dtype=dtype)
            e, t = project_onto_c(eps, tau, method="tree")
            r = projection_root(eps, tau, method="tree")
            assert r.dtype == dtype and r.shape == ()
            assert torch.equal(e, r.clamp_min(0)) and torch.equal(t, torch.minimum(tau, e))


def test_non_contiguous_row_shapes_and_half_precision():
    gen = torch.Generator().manual_seed(6)
    base = torch.randn(4, 60_000, generator=gen)
    tau = base[:, ::2][1]  # strided
    eps = torch.tensor(-2000.0)
    e0, t0 = project_onto_c(eps, tau.contiguous(), method="sort")
    e1, t1 = project_onto_c(eps, tau, method="tree")
    e2, t2 = project_onto_c(eps.reshape(1), tau.reshape(1, -1), method="tree")
    assert e2.shape == (1,) and t2.shape == (1, 30_000)
    for e, t in [(e1, t1), (e2.reshape(()), t2.reshape(-1))]:
        torch.testing.assert_close(e, e0, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(t, t0, rtol=1e-5, atol=1e-5)
    for dtype in [torch.float16, torch.bfloat16]:
        e, t = project_onto_c(eps.to(dtype), tau.to(dtype), method="tree")
        e32, t32 = project_onto_c(eps.to(dtype).float(), tau.to(dtype).float(), method="sort")
        assert e.dtype == t.dtype == dtype
        torch.testing.assert_close(e.float(), e32.to(dtype).float())
        torch.testing.assert_close(t.float(), t32.to(dtype).float())


def test_deterministic_and_global_rng_untouched(monkeypatch):
    monkeypatch.setattr(_tree, "MIN_GATHER_CAP", 64)  # through the sample and Newton
    monkeypatch.setattr(_tree, "GATHER_DIVISOR", 1 << 62)
    x = torch.randn(200_000, generator=torch.Generator().manual_seed(7))
    torch.manual_seed(123)
    before = torch.get_rng_state()
    np_before = np.random.get_state()[1].copy()  # noqa: NPY002 -- numpy's global state
    first = [projection_root(torch.tensor(d), x, method="tree").item() for d in [-5e4, 0.0]]
    assert torch.equal(torch.get_rng_state(), before)
    assert np.array_equal(np.random.get_state()[1], np_before)  # noqa: NPY002
    _tree._sample_index.cache_clear()  # the positions are drawn again, from the same seed
    again = [projection_root(torch.tensor(d), x, method="tree").item() for d in [-5e4, 0.0]]
    assert first == again


def test_batched_and_grouped_input_use_the_linear_method():
    gen = torch.Generator().manual_seed(8)
    eps, tau = torch.randn(3, generator=gen), torch.randn(3, 500, generator=gen)
    for a, b in zip(
        project_onto_c(eps, tau, method="tree"),
        project_onto_c(eps, tau, method="linear"),
        strict=True,
    ):
        assert torch.equal(a, b)
    groups = torch.randint(0, 3, (500,), generator=gen)
    for a, b in zip(
        project_onto_c(eps, tau[0], groups=groups, method="tree"),
        project_onto_c(eps, tau[0], groups=groups, method="linear"),
        strict=True,
    ):
        assert torch.equal(a, b)


def test_auto_uses_tree_for_one_row_on_cpu(monkeypatch):
    used = []
    tree_value = _tree.root_tree_value

    def spy(*args, **kwargs):
        used.append(True)
        return tree_value(*args, **kwargs)

    from projections import exact

    monkeypatch.setattr(exact, "root_tree_value", spy)
    for n in [1, exact.AUTO_SORT_MAX_N + 1]:
        project_onto_c(torch.tensor(0.0), torch.randn(n))
    assert len(used) == 2
    project_onto_c(torch.zeros(2), torch.randn(2, exact.AUTO_SORT_MAX_N + 1))
    assert len(used) == 2


def test_on_device(device):
    """The torch branch on the device itself (CUDA when present): counts and gathers in torch."""
    gen = torch.Generator().manual_seed(9)
    for n in [5000, 200_000]:
        x = torch.randn(n, generator=gen, dtype=torch.float64)
        for delta in [-n / 4, 0.0, 3.0]:
            d = torch.tensor(delta, dtype=torch.float64)
            r = _tree.root_tree(d.to(device), x.to(device))
            assert r.device == d.to(device).device
            assert abs(r.item() - root_sort(d, x).item()) <= 1e-12 * max(1.0, abs(delta))
            e, t = project_onto_c(d.to(device), x.to(device), method="tree")
            e0, t0 = project_onto_c(d, x, method="sort")
            torch.testing.assert_close(e.cpu(), e0)
            torch.testing.assert_close(t.cpu(), t0)


@given(points(max_n=400), st.sampled_from(["tree", "newton", "sorted_cap"]), st.booleans())
def test_every_path_on_generated_inputs(p, path, use_numpy):
    """Tiny tree parameters put short generated vectors (ties, scale spread) through the descent
    (several levels, tails) or, with no room to gather, through the sample and Newton."""
    delta, gamma = p
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_tree, "SMALL_N", 0)
        mp.setattr(_tree, "LEAF", 2)
        mp.setattr(_tree, "FANOUT", 3)
        mp.setattr(_tree, "TOP_NODES", 4)
        mp.setattr(_tree, "SAMPLE", 5)
        if path == "newton":
            mp.setattr(_tree, "MIN_GATHER_CAP", 0)
            mp.setattr(_tree, "GATHER_DIVISOR", 1 << 62)
        elif path == "sorted_cap":  # the descent gathers, then hands many clipped values on
            mp.setattr(_tree, "MIN_SORTED", 0)
        got = _tree.root_tree(delta, gamma, use_numpy=use_numpy).item()
    expected = root_sort(delta, gamma).item()
    scale = max(1.0, abs(delta.item()), float(gamma.abs().max()) if gamma.numel() else 0.0)
    assert abs(got - expected) <= 1e-10 * scale * max(1, gamma.numel())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_fast_path_rejects_non_finite_values_anywhere(monkeypatch, bad):
    """The one-row fast path checks with one amin (NaN, -inf) and the root (+inf: the top level of
    the tree holds the maximum, short last blocks included). Tiny tree parameters give several
    levels, each with a short last node, so every position class is tried."""
    monkeypatch.setattr(_tree, "SMALL_N", 0)
    monkeypatch.setattr(_tree, "LEAF", 4)
    monkeypatch.setattr(_tree, "FANOUT", 3)
    monkeypatch.setattr(_tree, "TOP_NODES", 4)
    n = 103  # 25 blocks of 4 and one of 3; 8 nodes of 3 and one of 1; 3 nodes
    for pos in range(n):
        tau = torch.randn(n, generator=torch.Generator().manual_seed(pos))
        tau[pos] = bad
        with pytest.raises(ValueError, match="tau must be finite"):
            project_onto_c(torch.tensor(0.0), tau)
        if bad == float("inf"):
            assert _tree.root_tree_value(0.0, tau)[0] == float("inf")


@pytest.mark.parametrize("n", [1 << 20, (1 << 20) + 777, 3_000_001])
def test_blocks_with_a_short_last_one_at_real_sizes(n):
    """LEAF-sized blocks, the last one shorter, on one and two tree levels: the exact root, and the
    largest coordinate placed in the short last block is found."""
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=gen)
    x[-1] = 50.0  # alone in the short last block (when there is one)
    for delta in [0.0, 3.0, -float(n) / 64]:
        _check_root(delta, x)


def test_many_clipped_values_in_the_gathered_blocks_go_on_to_newton(monkeypatch):
    """Blocks that hold many coordinates above the tree's bound, more than PY_MAX_VALUES of them
    clipped (here: the largest values side by side, as in sorted input): sorting them all would
    cost more than Newton's passes, so the descent hands its bound on; the root stays exact."""
    calls = _count_passes(monkeypatch)
    monkeypatch.setattr(_tree, "MIN_SORTED", 1000)
    n = 200_000
    x = torch.linspace(1.0, -1.0, n, dtype=torch.float64)  # the largest values in one stretch
    k = 3000  # coordinates clipped, in 3 blocks of 1024: r = x[k], delta = (k + 1) r - sum(x[:k])
    delta = float((k + 1) * x[k] - x[:k].sum())
    _check_root(delta, x)
    assert calls["count"] >= 1 and not calls["linear"]
    calls.update(count=0, sum=0)
    monkeypatch.setattr(_tree, "MIN_SORTED", 1 << 20)  # allowed to sort them: no pass at all
    _check_root(delta, x)
    assert calls == {"count": 0, "sum": 0, "linear": 0}
