"""F-beta beyond the paper's form: the learned F-beta-optimal threshold, capped scores, lambda_init
and the library's defaults against ``FBetaRegularizer.paper`` (docs/comparison.md, part 5)."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reparam import DenseTau, EpochEnd, FBetaRegularizer, Inline, SparseTau, Tracked
from reparam import functional as fn
from reparam.fbeta import PAPER


def _brute_force_best(u_pos: torch.Tensor, u_neg: torch.Tensor, beta: float) -> float:
    """Max F-beta of ``u > t`` over every cut between sorted distinct scores (and below all)."""
    values = torch.cat([u_pos, u_neg]).double().unique()
    cuts = [float(values[0]) - 1.0] + [float(a + b) / 2 for a, b in itertools.pairwise(values)]
    cuts.append(float(values[-1]) + 1.0)
    return max(fn.fbeta_of_decisions(u_pos - t, u_neg - t, beta) for t in cuts)


@settings(max_examples=60, deadline=None)
@given(
    pos=st.lists(st.integers(-5, 5), min_size=1, max_size=12),
    neg=st.lists(st.integers(-5, 5), min_size=0, max_size=12),
    beta=st.sampled_from([0.5, 1.0, 2.0]),
)
def test_best_threshold_is_the_brute_force_optimum(pos, neg, beta):
    """Integer scores make ties common: the cut must fall between distinct values."""
    u_pos, u_neg = torch.tensor(pos, dtype=torch.float64), torch.tensor(neg, dtype=torch.float64)
    t, f = fn.best_fbeta_threshold(u_pos, u_neg, beta)
    assert f == pytest.approx(_brute_force_best(u_pos, u_neg, beta), abs=1e-12)
    assert fn.fbeta_of_decisions(u_pos - t, u_neg - t, beta) == pytest.approx(f, abs=1e-12)


def test_best_threshold_hand_computed():
    # scores 3 (+), 2 (-), 1 (+), 0 (-): keep {3}: F1 = 2/3; keep {3,2,1}: tp 2 fp 1 -> 0.8; all: 2/3
    t, f = fn.best_fbeta_threshold(torch.tensor([3.0, 1.0]), torch.tensor([2.0, 0.0]), 1.0)
    assert (t, f) == (0.5, pytest.approx(0.8))
    assert fn.best_fbeta_threshold(torch.empty(0), torch.tensor([1.0]), 1.0)[1] == 0.0


def _labels(n=40, seed=0):
    gen = torch.Generator().manual_seed(seed)
    labels = (torch.rand(n, generator=gen) < 0.4).long()
    labels[:2] = torch.tensor([0, 1])
    return labels, gen


def test_decision_threshold_is_learned_at_the_epoch_end():
    labels, gen = _labels()
    reg = FBetaRegularizer(labels)
    u = torch.randn(40, generator=gen) + labels  # overlapping classes
    reg(u, torch.arange(40))
    assert float(reg.decision_threshold) == 0.0  # u > 0 until the first epoch end
    reg.end_epoch_()
    pos = labels == 1
    t, f = fn.best_fbeta_threshold(u[pos], u[~pos], 1.0)
    assert float(reg.decision_threshold) == pytest.approx(t)
    stats = reg.stats()
    assert stats["train_fbeta_at_threshold"] == pytest.approx(f)
    assert stats["train_fbeta_at_threshold"] >= stats["train_fbeta"]


def test_capped_scores_stop_pulling_positives_above_eps():
    """With ``cap_scores`` the positives' term is ``-lambda_i min(u_i, eps)``: a positive whose
    score is above ``eps`` gets no gradient from it; below ``eps`` the paper's gradient."""
    labels = torch.tensor([1, 1, 0, 0])
    grads = {}
    for cap in (False, True):
        reg = FBetaRegularizer(labels, cap_scores=cap, schedule=EpochEnd(), tau=DenseTau())
        with torch.no_grad():
            reg.eps_param.fill_(1.0)
            reg.lam.fill_(0.5)
        u = torch.tensor([2.0, 0.3, -3.0, -3.0], requires_grad=True)  # negatives inactive
        reg(u, torch.arange(4)).backward()
        grads[cap] = u.grad.clone()
    scale = 4 / (2 * 4)  # N / (n_+ B)
    assert torch.allclose(grads[False][:2], torch.tensor([-0.5 * scale, -0.5 * scale]))
    assert torch.allclose(grads[True][:2], torch.tensor([0.0, -0.5 * scale]))
    assert torch.equal(grads[False][2:], grads[True][2:])


def test_capped_dual_step_uses_the_capped_scores():
    labels = torch.tensor([1, 1, 0, 0])
    reg = FBetaRegularizer(
        labels, cap_scores=True, schedule=EpochEnd(), tau=DenseTau(), dual_lr_lambda=1.0
    )
    with torch.no_grad():
        reg.eps_param.fill_(1.0)
        reg.tau_param.fill_(1.0)
    reg(torch.tensor([5.0, 0.2, -1.0, -1.0]), torch.arange(4))
    reg.end_epoch_()
    # lambda_i <- max(0, lambda_i + (tau_i - min(u_i, eps))), tau = eps = 1 after the projection
    assert torch.allclose(reg.lam, torch.tensor([0.0, 0.8]))


def test_lambda_init_and_its_validation():
    labels, _ = _labels()
    assert torch.all(FBetaRegularizer(labels, lambda_init=1.0).lam == 1.0)
    with pytest.raises(ValueError, match="lambda_init"):
        FBetaRegularizer(labels, lambda_init=-1.0)
    with pytest.raises(ValueError, match="cap_scores must be a bool"):
        FBetaRegularizer(labels, cap_scores="yes")


def test_defaults_and_the_paper_options():
    """``FBetaRegularizer(labels)`` is the library's defaults (the tracked threshold over a sparse
    ``tau``); ``FBetaRegularizer.paper(labels)`` is Algorithm 3 as published (``PAPER``), and an
    option passed to it overrides the paper's value only."""
    labels, _ = _labels()
    ours = FBetaRegularizer(labels)
    assert ours.options == (Tracked(), SparseTau())
    assert (ours.projection, ours.tau_update, ours.inline_strength) == (
        "tracked",
        "sparse_adam_ahead",
        0.0,
    )
    assert (ours.dual_lr_lambda, ours.dual_lr_mu, ours.cap_scores) == (0.1, 0.1, True)
    assert (
        "schedule=Tracked(), tau=SparseTau(lr=None) (rule adam(betas=(0.9, 0.999), eps=1e-08), lr 0.01)"
        in repr(ours)
    )
    assert PAPER == {
        "schedule": EpochEnd(),
        "tau": DenseTau(),
        "dual_lr_lambda": 1e-3,
        "dual_lr_mu": 1e-5,
        "cap_scores": False,
    }
    paper = FBetaRegularizer.paper(labels)
    assert paper.options == (PAPER["schedule"], PAPER["tau"])
    for key in ("dual_lr_lambda", "dual_lr_mu", "cap_scores"):
        assert getattr(paper, key) == PAPER[key], key
    assert (paper.projection, paper.tau_update) == ("epoch", "dense")
    assert "schedule=EpochEnd(), tau=DenseTau()" in repr(paper)
    # an option passed explicitly overrides the paper's (its steps, projected inline)
    mixed = FBetaRegularizer.paper(labels, schedule=Inline())
    assert (mixed.projection, mixed.tau_update, mixed.dual_lr_lambda, mixed.cap_scores) == (
        "inline",
        "dense",
        1e-3,
        False,
    )
    tracked = FBetaRegularizer.paper(labels, schedule=Tracked(), beta=2.0)
    assert (tracked.projection, tracked.tau_update, tracked.beta) == ("tracked", "dense", 2.0)
    sparse = FBetaRegularizer.paper(labels, tau=SparseTau(lr=0.05))
    assert (sparse.projection, sparse.tau_update, sparse.tau_lr) == (
        "epoch",
        "sparse_adam_ahead",
        0.05,
    )
    assert PAPER["schedule"] == EpochEnd() and PAPER["tau"] == DenseTau()  # left as they were
    assert type(FBetaRegularizer.paper(labels)) is FBetaRegularizer
    with pytest.raises(TypeError, match="unexpected keyword argument 'preset'"):
        FBetaRegularizer.paper(labels, preset="fast")


def test_no_option_changes_another():
    """Each option is what was given: the schedule does not depend on ``tau`` nor on the paper's
    values (before 0.4 ``tau_update="auto"`` switched between them), and a pair the objective
    cannot run is refused at construction rather than replaced."""
    labels = torch.tensor([0, 1, 1, 0, 1])
    cases = [
        (dict(), ("tracked", "sparse_adam_ahead")),
        (dict(tau=DenseTau()), ("tracked", "dense")),
        (dict(schedule=EpochEnd()), ("epoch", "sparse_adam_ahead")),
        (dict(schedule=EpochEnd(), tau=DenseTau()), ("epoch", "dense")),
        (dict(schedule=Inline(), tau=DenseTau()), ("inline", "dense")),
        (dict(schedule=Inline(strength=0.1), tau=DenseTau()), ("inline", "dense")),
        (dict(schedule=Tracked(), tau=SparseTau(lr=0.1)), ("tracked", "sparse_adam_ahead")),
    ]
    for options, expected in cases:
        reg = FBetaRegularizer(labels, **options)
        assert (reg.projection, reg.tau_update) == expected, options
        given = (options.get("schedule", Tracked()), options.get("tau", SparseTau()))
        assert reg.options == given, options
    assert (
        FBetaRegularizer.paper(labels).projection,
        FBetaRegularizer.paper(labels).tau_update,
    ) == (
        "epoch",
        "dense",
    )
    with pytest.raises(ValueError, match=r"schedule=Inline\(strength=0\.0\) couples every row"):
        FBetaRegularizer(labels, schedule=Inline())  # no silent switch to a dense tau
