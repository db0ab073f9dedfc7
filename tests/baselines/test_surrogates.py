"""Soft F-beta and the pairwise squared hinge against values computed by hand; gradcheck."""

from __future__ import annotations

import math

import pytest
import torch

from reparam.baselines import pairwise_squared_hinge_auc_loss, soft_fbeta_loss

L3 = math.log(3.0)  # sigmoid(ln 3) = 3/4


@pytest.mark.parametrize(
    "u, labels, beta, temperature, expected",
    [
        # p = (1/2, 1/2): tp = fp = fn = 1/2, F = 1 / (1 + 1/2 + 1/2) = 1/2 (any beta)
        ([0.0, 0.0], [1, 0], 1.0, 1.0, 0.5),
        ([0.0, 0.0], [1, 0], 2.0, 1.0, 0.5),
        # p = (3/4, 1/4, 1/2): tp = 5/4, fp = 1/4, fn = 3/4; F1 = (5/2) / (5/2 + 3/4 + 1/4) = 5/7
        ([L3, -L3, 0.0], [1, 0, 1], 1.0, 1.0, 2 / 7),
        # beta = 1/2: (5/4 * 5/4) / (25/16 + 3/16 + 1/4) = 25/32
        ([L3, -L3, 0.0], [1, 0, 1], 0.5, 1.0, 7 / 32),
        # the temperature divides the scores
        ([2 * L3, -2 * L3, 0.0], [1, 0, 1], 1.0, 2.0, 2 / 7),
        # no negatives: fp = 0, p = 3/4: F1 = (3/2) / (3/2 + 1/4) = 6/7
        ([L3], [1], 1.0, 1.0, 1 / 7),
    ],
)
def test_soft_fbeta_loss_by_hand(u, labels, beta, temperature, expected):
    u = torch.tensor(u, dtype=torch.float64)
    loss = soft_fbeta_loss(u, torch.tensor(labels), beta=beta, temperature=temperature)
    assert float(loss) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "margin, expected",
    [
        # pairs (2,1) (2,-1) (0.5,1) (0.5,-1): gaps 1, 3, -0.5, 1.5
        (1.0, (0 + 0 + 1.5**2 + 0) / 4),
        (2.0, (1.0 + 0 + 2.5**2 + 0.5**2) / 4),
        (0.0, (0 + 0 + 0.5**2 + 0) / 4),
    ],
)
def test_pairwise_squared_hinge_by_hand(margin, expected):
    u = torch.tensor([2.0, 0.5, 1.0, -1.0], dtype=torch.float64)
    loss = pairwise_squared_hinge_auc_loss(u, torch.tensor([1, 1, 0, 0]), margin=margin)
    assert float(loss) == pytest.approx(expected, rel=1e-12)


def test_gradcheck_and_column_scores():
    g = torch.Generator().manual_seed(0)
    u = torch.randn(9, dtype=torch.float64, generator=g, requires_grad=True)
    y = torch.tensor([1, 0, 1, 1, 0, 0, 0, 1, 0], dtype=torch.bool)
    assert torch.autograd.gradcheck(lambda u: soft_fbeta_loss(u, y, beta=0.7, temperature=0.5), u)
    assert torch.autograd.gradcheck(lambda u: pairwise_squared_hinge_auc_loss(u, y), u)
    col = soft_fbeta_loss(u.detach()[:, None], y)  # a (B, 1) head output is accepted
    assert float(col) == pytest.approx(float(soft_fbeta_loss(u.detach(), y)))


def test_low_temperature_gives_the_hard_fbeta():
    u = torch.tensor([3.0, -2.0, 0.5, 1.0, -0.5])
    y = torch.tensor([1, 1, 0, 1, 0])  # tp = 2, fn = 1, fp = 1: F1 = 4 / (4 + 1 + 1)
    assert float(soft_fbeta_loss(u, y, temperature=1e-3)) == pytest.approx(1 - 4 / 6, abs=1e-6)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda u, y: soft_fbeta_loss(u, y, temperature=0.0), "temperature must be a finite"),
        (lambda u, y: soft_fbeta_loss(u, y, beta=float("inf")), "beta must be a finite"),
        (lambda u, y: soft_fbeta_loss(u, torch.zeros_like(y)), "at least one positive"),
        (lambda u, y: pairwise_squared_hinge_auc_loss(u, torch.ones_like(y)), "one negative"),
        (lambda u, y: pairwise_squared_hinge_auc_loss(u.long(), y), "floating-point"),
        (lambda u, y: soft_fbeta_loss(u * float("nan"), y), "scores must be finite"),
    ],
)
def test_bad_input_raises_value_error_naming_it(call, match):
    with pytest.raises(ValueError, match=match):
        call(torch.tensor([1.0, -1.0, 0.0]), torch.tensor([1, 0, 1]))
