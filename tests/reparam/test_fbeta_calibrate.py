"""``FBetaRegularizer.calibrate``: the F-beta-optimal cut of fresh scores, per positive class,
against hand-computed counts and ``functional.best_fbeta_threshold``; after training, the cut of
the head as it ends is at least as good as ``decision_threshold`` (of the remembered scores, which
lag the head); bad input is a ``ValueError`` naming it; the state is not changed."""

from __future__ import annotations

import pytest
import torch

from benchmarks.fbeta_lp import gaussian_toy, train_head
from reparam import FBetaRegularizer
from reparam import functional as Fn


def _fbeta_at(u: torch.Tensor, positive: torch.Tensor, t: float) -> float:
    return Fn.fbeta_of_decisions(u[positive] - t, u[~positive] - t, 1.0)


def test_the_cut_of_one_class_by_hand():
    """Scores 2, 1, 0.5, -1 with positives at 2 and 0.5: keeping the top three gives
    F1 = 2 * 2 / (3 + 2) = 0.8 (the best; the top one alone: 2 / 3), cut midway to -1."""
    reg = FBetaRegularizer(torch.tensor([0, 1, 1, 0, 1]))
    before = {k: v.clone() for k, v in reg.state_dict().items()}
    cut = reg.calibrate(torch.tensor([2.0, 1.0, 0.5, -1.0]), torch.tensor([1, 0, 1, 0]))
    assert cut.tolist() == [-0.25]
    assert all(torch.equal(v, reg.state_dict()[k]) for k, v in before.items())


def test_each_class_gets_its_own_cut_from_its_column():
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 3, (200,), generator=g)
    scores = torch.randn(200, 2, generator=g) + torch.stack([labels == 1, labels == 2], 1)
    reg = FBetaRegularizer(labels, positive_classes=(1, 2))
    cuts = reg.calibrate(scores, labels)
    for k, c in enumerate((1, 2)):
        pos = labels == c
        t, best = Fn.best_fbeta_threshold(scores[pos, k], scores[~pos, k], 1.0)
        assert cuts[k].item() == pytest.approx(t) and _fbeta_at(scores[:, k], pos, t) == best


def test_the_fresh_cut_of_the_trained_head_is_its_best():
    """A linear head on a 2-D toy, 30 epochs: at the end, F1 of ``u > calibrate(u)`` on the
    training set is the head's best cut's, and no lower than at ``decision_threshold``."""
    a, s = gaussian_toy(80, 400, 2, seed=0, mean=1.0)
    _, reg, u = train_head(a, s, epochs=30, batch_size=40, seed=0)
    labels, pos = torch.as_tensor(s), torch.as_tensor(s) == 1
    cut = float(reg.calibrate(u, labels)[0])
    best = Fn.best_fbeta_threshold(u[pos], u[~pos], 1.0)[1]
    assert _fbeta_at(u, pos, cut) == pytest.approx(best)
    assert best >= _fbeta_at(u, pos, float(reg.decision_threshold[0]))


@pytest.mark.parametrize(
    "scores, labels, match",
    [
        (torch.tensor([1.0, float("nan")]), torch.tensor([1, 0]), "scores must be finite"),
        (torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), "labels must contain positives"),
        (torch.ones(2, 2), torch.tensor([1, 0]), r"scores must have shape \(M,\) or \(M, 1\)"),
        (torch.tensor([1, 0]), torch.tensor([1, 0]), "scores must be a floating tensor"),
        (torch.tensor([1.0, 0.0]), torch.tensor([1, 0, 1]), "labels must have one entry"),
    ],
)
def test_bad_input_is_named(scores, labels, match):
    with pytest.raises(ValueError, match=match):
        FBetaRegularizer(torch.tensor([0, 1, 1, 0])).calibrate(scores, labels)


def test_groups_are_refused_with_the_way_round():
    reg = FBetaRegularizer(torch.tensor([0, 1, 1, 0]), groups=torch.tensor([0, 0, 1, 1]))
    with pytest.raises(ValueError, match="best_fbeta_threshold per group"):
        reg.calibrate(torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([1, 0, 1, 0]))
