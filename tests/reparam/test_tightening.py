"""F-beta beyond the paper's form: the learned F-beta-optimal threshold, capped scores, lambda_init
and the presets (docs/comparison.md, part 5)."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reparam import FBETA_DEFAULTS, PAPER_PRESET, FBetaRegularizer, resolve_options, resolve_preset
from reparam import functional as fn


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
        reg = FBetaRegularizer(labels, cap_scores=cap, projection="epoch")
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
    reg = FBetaRegularizer(labels, cap_scores=True, projection="epoch", dual_lr_lambda=1.0)
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


def test_defaults_and_the_paper_preset():
    labels, _ = _labels()
    ours = FBetaRegularizer(labels, tau_update="dense")
    for key, value in FBETA_DEFAULTS.items():
        assert getattr(ours, key) == value, key
    assert (ours.projection, ours.dual_lr_lambda, ours.dual_lr_mu, ours.cap_scores) == (
        "inline",
        0.1,
        0.1,
        True,
    )
    # tau_update="auto" (the default): the inline projection's O(B) form with a sparse tau
    auto = FBetaRegularizer(labels)
    assert (auto.projection, auto.tau_update, auto.dual_lr_mu) == (
        "tracked",
        "sparse_adam_ahead",
        0.1,
    )
    paper = FBetaRegularizer(labels, preset="paper")
    for key, value in PAPER_PRESET.items():
        assert getattr(paper, key) == value, key
    assert "preset='paper'" in repr(paper)
    # an option passed explicitly overrides the preset (the paper's steps, projected inline)
    mixed = FBetaRegularizer(labels, preset="paper", projection="inline")
    assert (mixed.projection, mixed.dual_lr_lambda, mixed.cap_scores) == ("inline", 1e-3, False)
    assert FBetaRegularizer(labels, preset="paper", projection="tracked").projection == "tracked"
    with pytest.raises(ValueError, match="preset must be one of"):
        FBetaRegularizer(labels, preset="fast")
    # the one resolution rule the constructor and the trainer's config share
    assert resolve_preset("paper", projection="inline", cap_scores=None) == {
        **PAPER_PRESET,
        "projection": "inline",
    }
    assert resolve_preset(None) == FBETA_DEFAULTS


def test_auto_is_resolved_in_one_place():
    """``resolve_options``: ``tau_update="auto"`` is sparse (with the tracked projection) with the
    library's schedule, dense with a preset or a projection given; ``sparse`` overrides the
    choice; the constructor takes what it returns."""
    labels = torch.tensor([0, 1, 1, 0, 1])
    cases = [
        (dict(), ("tracked", "sparse_adam_ahead")),
        (dict(projection="inline"), ("inline", "dense")),
        (dict(preset="paper"), ("epoch", "dense")),
        (dict(preset="paper", sparse=True), ("epoch", "sparse_adam_ahead")),
        (dict(sparse=False), ("inline", "dense")),
        (dict(tau_update="dense"), ("inline", "dense")),
        (dict(projection="epoch", tau_update="sparse_adam_ahead"), ("epoch", "sparse_adam_ahead")),
    ]
    for options, expected in cases:
        out = resolve_options(**options)
        assert (out["projection"], out["tau_update"]) == expected, options
        if "sparse" not in options:
            reg = FBetaRegularizer(labels, **options)
            assert (reg.projection, reg.tau_update) == expected, options
