"""The regularizer against exact LP solutions (scipy HiGHS): equivalence, convergence, the bound."""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.fbeta_lp import gaussian_toy, head_quality, solve_fbeta_lp, train_head
from reparam import DenseTau, FBetaRegularizer, Inline
from reparam import functional as fn

# The documented settings (docs/regularizer.md): Adam lr 1e-2, dual steps 0.1, inline projection.
CONVERGENT = dict(
    schedule=Inline(), tau=DenseTau(), dual_lr_lambda=0.1, dual_lr_mu=0.1, batch_size=20
)


@pytest.mark.parametrize("dim, seed", [(2, 0), (2, 1), (5, 2), (20, 3)])
@pytest.mark.parametrize("beta", [1.0, 0.5])
def test_paper_lp_and_scale_free_lp_have_the_same_optimum(dim, seed, beta):
    a, s = gaussian_toy(15 + seed, 25, dim, seed=seed, mean=0.5)
    paper, _, _ = solve_fbeta_lp(a, s, beta, form="paper")
    scale_free, w, b = solve_fbeta_lp(a, s, beta, form="scale_free")
    assert scale_free == pytest.approx(paper, rel=1e-7)
    # the optimum is also what lp_objective gives at the optimal head with its best feasible eps
    _, obj = head_quality(torch.tensor(a @ w + b), s, beta)
    assert obj == pytest.approx(scale_free, rel=1e-6)


@pytest.mark.parametrize(
    "dim, mean, seed, epochs",
    [(2, 1.0, 0, 200), (2, 1.0, 1, 200), (20, 0.2, 0, 400)],
    ids=["2d-seed0", "2d-seed1", "20d-seed0"],
)
def test_algorithm3_converges_toward_the_lp_optimum(dim, mean, seed, epochs):
    a, s = gaussian_toy(40, 60, dim, seed=seed, mean=mean)
    opt, w, b = solve_fbeta_lp(a, s)
    f1_opt, _ = head_quality(torch.tensor(a @ w + b), s)
    _, reg, u = train_head(a, s, epochs=epochs, seed=seed, **CONVERGENT)
    f1, obj = head_quality(u, s)
    assert abs(f1 - f1_opt) <= 0.03, (f1, f1_opt)
    assert obj is not None and (obj - opt) / opt <= 0.10, (obj, opt)
    stats = reg.stats()
    assert stats["certified_fbeta"] is not None and stats["certified_fbeta"] <= stats["train_fbeta"]


@given(
    hnp.arrays(np.float64, st.integers(1, 30), elements=st.floats(-5, 5)),
    hnp.arrays(np.float64, st.integers(0, 30), elements=st.floats(-5, 5)),
    st.sampled_from([1.0, 0.5]),
    st.floats(0.5, 20),
)
def test_certified_bound_never_exceeds_true_fbeta(u_pos, u_neg, beta, scale):
    u_pos, u_neg = torch.tensor(u_pos * scale), torch.tensor(u_neg * scale)
    bound = fn.certified_fbeta_bound(u_pos, u_neg, beta)
    true = fn.fbeta_of_decisions(u_pos, u_neg, beta)
    if float(u_pos.mean()) < 1:
        assert bound is None
    else:
        assert bound is not None and bound <= true + 1e-12


@pytest.mark.parametrize("beta", [1.0, 0.5])
def test_stats_bound_is_sound_from_the_first_batch_and_says_how_fresh(beta):
    """Figures from the scores remembered so far, with the fraction scored and their age."""
    gen = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 2, (50,), generator=gen)
    labels[:2] = torch.tensor([0, 1])
    reg = FBetaRegularizer(labels, beta=beta)
    assert reg.stats()["certified_fbeta"] is None and reg.stats()["scored_fraction"] == 0.0
    u = torch.where(labels == 1, 2.0, -1.5) + torch.randn(50, generator=gen)
    reg(u[:25], torch.arange(25))
    half = reg.stats()
    assert half["scored_fraction"] == 0.5 and half["score_age_epochs_mean"] == 0.0
    first = labels[:25] == 1
    assert half["train_fbeta"] == pytest.approx(
        fn.fbeta_of_decisions(u[:25][first], u[:25][~first], beta)
    )
    assert half["certified_fbeta"] <= half["train_fbeta"] + 1e-12
    reg(u[25:], torch.arange(25, 50))
    reg.end_epoch_()
    st_ = reg.stats()
    assert st_["scored_fraction"] == 1.0 and st_["score_age_epochs_max"] == 1  # from the last epoch
    assert st_["certified_fbeta"] is not None
    assert st_["certified_fbeta"] <= st_["train_fbeta"] + 1e-12
    assert st_["train_fbeta"] == pytest.approx(
        fn.fbeta_of_decisions(u[labels == 1], u[labels == 0], beta)
    )


def test_best_feasible_eps_is_the_smallest_feasible():
    u = torch.tensor([0.5, 1.0, 2.0, 4.0], dtype=torch.float64)
    eps = fn.best_feasible_eps(u)
    assert float(torch.minimum(u, eps).mean()) == pytest.approx(1.0)
    smaller = eps - 1e-6
    assert float(torch.minimum(u, smaller).mean()) < 1.0
    assert fn.best_feasible_eps(torch.tensor([0.2, 0.5])) is None  # mean u < 1: no certificate
