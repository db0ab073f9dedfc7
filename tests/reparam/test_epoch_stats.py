"""The epoch end's statistics without a sort (value buckets, expected O(n)): ``best_fbeta_threshold``
and ``best_feasible_eps`` against their one-sort references, on every path the buckets take."""

from __future__ import annotations

import contextlib
from unittest import mock

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reparam import functional as fn


@contextlib.contextmanager
def _buckets_always(scan_at: int = 8):
    """The bucket path from 1 score on, re-bucketing whenever more than ``scan_at`` candidates
    remain (the defaults sort below 2^14 scores and scan up to 2^16 candidates)."""
    with mock.patch.object(fn, "_SORT_BELOW", 1), mock.patch.object(fn, "_SCAN_AT", scan_at):
        yield


@contextlib.contextmanager
def _sort_sizes():
    """The sizes of every ``torch.sort`` inside, and no fallback to the one-sort references."""
    sizes: list[int] = []
    sort = torch.sort

    def counted(x, *args, **kwargs):
        sizes.append(x.numel())
        return sort(x, *args, **kwargs)

    def refused(*args):
        raise AssertionError("the bucket path fell back to the full sort")

    with (
        mock.patch.object(torch, "sort", counted),
        mock.patch.object(fn, "_best_fbeta_threshold_sorted", refused),
        mock.patch.object(fn, "_best_feasible_eps_sorted", refused),
    ):
        yield sizes


def _assert_same_eps(u: torch.Tensor, exact: bool) -> None:
    new, ref = fn.best_feasible_eps(u), fn._best_feasible_eps_sorted(u)
    assert (new is None) == (ref is None)
    if ref is not None:
        assert new.dtype == ref.dtype and new.shape == ref.shape
        if exact:  # integer scores: every sum is exact in float64
            assert float(new) == float(ref)
        else:  # the float64 sums' rounding only
            assert float(new) == pytest.approx(float(ref), rel=1e-9, abs=0)


def _scores(kind: str, n: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "gaussian":
        return torch.randn(n, generator=gen)
    if kind == "ties":  # a few distinct values: most cuts fall inside tie groups
        return torch.randint(-3, 4, (n,), generator=gen).float()
    if kind == "exponential":
        return torch.empty(n).exponential_(generator=gen) ** 3
    if kind == "outliers":  # almost everything in one bucket of the first round
        u = torch.randn(n, generator=gen)
        u[:3] = torch.tensor([1e30, 1e12, -1e20])
        return u
    if kind == "equal":
        return torch.full((n,), 0.75)
    raise ValueError(kind)


KINDS = ["gaussian", "ties", "exponential", "outliers", "equal"]


@settings(max_examples=150, deadline=None)
@given(
    pos=st.lists(st.integers(-4, 4), min_size=1, max_size=40),
    neg=st.lists(st.integers(-4, 4), min_size=0, max_size=40),
    beta=st.sampled_from([0.5, 1.0, 2.0]),
    scan_at=st.sampled_from([1, 4, 64]),
)
def test_threshold_buckets_equal_the_sort_with_ties(pos, neg, beta, scan_at):
    """The same threshold (the same two scores' midpoint) and the same F-beta, bit for bit."""
    u_pos, u_neg = torch.tensor(pos, dtype=torch.float64), torch.tensor(neg, dtype=torch.float64)
    with _buckets_always(scan_at):
        got = fn.best_fbeta_threshold(u_pos, u_neg, beta)
    assert got == fn._best_fbeta_threshold_sorted(u_pos, u_neg, beta)


@settings(max_examples=150, deadline=None)
@given(
    u=hnp.arrays(np.float32, st.integers(1, 60), elements=st.floats(-5, 5, width=32)),
    pos_every=st.integers(1, 4),
    beta=st.sampled_from([0.5, 1.0, 2.0]),
)
def test_threshold_buckets_equal_the_sort_float32(u, pos_every, beta):
    u = torch.from_numpy(u)
    is_pos = torch.arange(u.numel()) % pos_every == 0
    with _buckets_always():
        got = fn.best_fbeta_threshold(u[is_pos], u[~is_pos], beta)
    assert got == fn._best_fbeta_threshold_sorted(u[is_pos], u[~is_pos], beta)


@settings(max_examples=150, deadline=None)
@given(
    u=st.lists(st.integers(-3, 8), min_size=1, max_size=60),
    scan_at=st.sampled_from([1, 4, 64]),
)
def test_feasible_eps_buckets_equal_the_sort_on_integers(u, scan_at):
    with _buckets_always(scan_at):
        _assert_same_eps(torch.tensor(u, dtype=torch.float64), exact=True)


@settings(max_examples=150, deadline=None)
@given(hnp.arrays(np.float64, st.integers(1, 60), elements=st.floats(-5, 20)))
def test_feasible_eps_buckets_equal_the_sort_on_floats(u):
    with _buckets_always():
        _assert_same_eps(torch.from_numpy(u), exact=False)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("positives", [0.0, 0.001, 0.5, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_threshold_at_bucket_sizes(kind, positives, dtype):
    """Large enough for the default bucket path (2^14 scores and more), several betas, shifted
    positives; no positives at all: ``(0.0, F-beta of u > 0)``."""
    gen = torch.Generator().manual_seed(len(kind))
    n = 40_000
    u = _scores(kind, n, gen).to(dtype)
    is_pos = torch.rand(n, generator=gen) < positives
    u_pos, u_neg = u[is_pos] + 0.5, u[~is_pos]
    for beta in (0.5, 1.0, 3.0):
        got = fn.best_fbeta_threshold(u_pos, u_neg, beta)
        assert got == fn._best_fbeta_threshold_sorted(u_pos, u_neg, beta)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_feasible_eps_at_bucket_sizes(kind, dtype):
    """Roots in a tie group, between values, at the minimum (``eps = 1``), and no root."""
    gen = torch.Generator().manual_seed(len(kind))
    u = _scores(kind, 30_000, gen).to(dtype)
    for v in (u.abs() + 0.8, u + 1.0, 0.3 * u + 0.99, u.abs() + 1.0, u - 2.0):
        _assert_same_eps(v, exact=kind in ("ties", "equal") and bool((v == v.round()).all()))


def test_small_and_degenerate_inputs_take_the_sort():
    """One score, NaN and inf fall back to the references (no hang), with their results."""
    with _buckets_always():
        assert fn.best_fbeta_threshold(torch.tensor([2.0]), torch.empty(0), 1.0) == (1.5, 1.0)
        assert float(fn.best_feasible_eps(torch.tensor([3.0]))) == 1.0
    u = torch.randn(40_000)
    for bad in (float("nan"), float("inf"), -float("inf")):
        v = u.clone()
        v[7] = bad
        ref = fn._best_fbeta_threshold_sorted(v[:100], v[100:], 1.0)
        got = fn.best_fbeta_threshold(v[:100], v[100:], 1.0)
        assert got == ref or (got[0] != got[0] and ref[0] != ref[0])  # NaN == NaN
        assert fn.best_feasible_eps(v.abs() + 1) == fn._best_feasible_eps_sorted(v.abs() + 1)


def test_mixed_dtypes_compare_as_their_concatenation():
    gen = torch.Generator().manual_seed(3)
    u_pos = torch.randn(20_000, generator=gen) + 1
    u_neg = torch.randn(20_000, generator=gen, dtype=torch.float64)
    got = fn.best_fbeta_threshold(u_pos, u_neg, 1.0)
    assert got == fn._best_fbeta_threshold_sorted(u_pos, u_neg, 1.0)


@pytest.mark.parametrize("kind", ["gaussian", "outliers"])
def test_bucket_path_sorts_a_small_fraction(kind):
    """The bucket path runs (the one-sort references refuse) and sorts few scores: the candidate
    buckets only, also when a few huge scores put almost everything in one bucket (re-bucketed)."""
    gen = torch.Generator().manual_seed(0)
    n = 200_000
    u = _scores(kind, n, gen)
    is_pos = torch.rand(n, generator=gen) < 0.5
    u_pos, u_neg = u[is_pos] + 1.0, u[~is_pos]
    ref = fn._best_fbeta_threshold_sorted(u_pos, u_neg, 1.0)
    eps_ref = fn._best_feasible_eps_sorted(u_pos.abs() + 0.8)
    with _sort_sizes() as sizes:
        assert fn.best_fbeta_threshold(u_pos, u_neg, 1.0) == ref
        assert max(sizes) < n / 20, sizes
        sizes.clear()
        assert float(fn.best_feasible_eps(u_pos.abs() + 0.8)) == float(eps_ref)
        assert max(sizes, default=0) < n / 20, sizes
