"""Metrics against hand-computed confusion matrices."""

from __future__ import annotations

import pytest
import torch

from train.metrics import GroupedConfusion, accuracy, confusion_matrix


def test_confusion_matrix_by_hand():
    target = torch.tensor([0, 0, 1, 2, 2, 2])
    pred = torch.tensor([0, 1, 1, 2, 0, 2])
    expected = torch.tensor([[1, 1, 0], [0, 1, 0], [1, 0, 2]])
    cm = confusion_matrix(target, pred, 3)
    assert torch.equal(cm, expected)
    assert accuracy(cm) == pytest.approx(4 / 6)


def test_grouped_accuracy_and_gap_accumulate_over_batches():
    conf = GroupedConfusion(num_classes=3)
    # small group: 3 of 4 right; big group: 1 of 2 right; fed in two batches
    conf.update(torch.tensor([0, 1, 2]), torch.tensor([0, 1, 0]), torch.tensor([0, 0, 0]))
    conf.update(torch.tensor([2, 1, 0]), torch.tensor([2, 0, 0]), torch.tensor([0, 1, 1]))
    s = conf.summary()
    assert s["accuracy_small"] == pytest.approx(3 / 4)
    assert s["accuracy_big"] == pytest.approx(1 / 2)
    assert s["accuracy"] == pytest.approx(4 / 6)
    assert s["accuracy_gap"] == pytest.approx(1 / 4)


def test_empty_group_reports_none():
    conf = GroupedConfusion(num_classes=2)
    conf.update(torch.tensor([0, 1]), torch.tensor([0, 1]), torch.tensor([0, 0]))
    s = conf.summary()
    assert s["accuracy_big"] is None and s["accuracy_gap"] is None and s["accuracy"] == 1.0


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="same shape"):
        confusion_matrix(torch.zeros(3), torch.zeros(4), 2)
