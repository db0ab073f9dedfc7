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


# --- segmentation: a 3-class example computed by hand -----------------------------------------
from train.metrics import (  # noqa: E402
    GroupedSegmentationConfusion,
    segmentation_confusion,
    segmentation_scores,
)

# two 2x3 images; 255 = unlabelled (not counted), class 2 never appears in truth
SEG_TARGET = torch.tensor([[[0, 0, 1], [1, 255, 0]], [[1, 1, 1], [0, 0, 255]]])
SEG_PRED = torch.tensor([[[0, 1, 1], [1, 2, 0]], [[1, 1, 2], [0, 1, 0]]])
# truth 0: pixels (img0: 3 of them -> pred 0,1,0), (img1: 2 -> pred 0,1) => row [3, 2, 0]
# truth 1: img0 2 -> pred 1,1; img1 3 -> pred 1,1,2         => row [0, 4, 1]
SEG_CM = torch.tensor([[3, 2, 0], [0, 4, 1], [0, 0, 0]])


def test_segmentation_confusion_by_hand_skips_ignore():
    assert torch.equal(segmentation_confusion(SEG_TARGET, SEG_PRED, 3), SEG_CM)


def test_segmentation_scores_by_hand():
    s = segmentation_scores(SEG_CM)
    # IoU_0 = 3 / (5 + 3 - 3) = 3/5; IoU_1 = 4 / (5 + 6 - 4) = 4/7; IoU_2 = 0 / (0 + 1 - 0) = 0
    # (class 2 is predicted, so it counts in the mean although it never appears in the truth)
    assert s["iou"] == pytest.approx([3 / 5, 4 / 7, 0.0])
    assert s["miou"] == pytest.approx((3 / 5 + 4 / 7 + 0) / 3)
    assert s["pixel_accuracy"] == pytest.approx(7 / 10)
    assert s["mean_class_accuracy"] == pytest.approx((3 / 5 + 4 / 5) / 2)  # classes in truth
    assert s["fw_iou"] == pytest.approx(0.5 * 3 / 5 + 0.5 * 4 / 7)


def test_segmentation_absent_class_is_none_and_excluded():
    cm = torch.tensor([[2, 0, 0], [0, 0, 0], [0, 0, 1]])  # class 1 neither in truth nor predicted
    s = segmentation_scores(cm)
    assert s["iou"] == [1.0, None, 1.0] and s["miou"] == 1.0
    empty = segmentation_scores(torch.zeros(3, 3, dtype=torch.int64))
    assert empty["miou"] is None and empty["pixel_accuracy"] is None


def test_grouped_segmentation_per_group_miou_over_batches():
    conf = GroupedSegmentationConfusion(num_classes=3)
    group = torch.tensor([0, 1])  # image 0 small, image 1 big; fed one image at a time
    conf.update(SEG_TARGET[:1], SEG_PRED[:1], group[:1])
    conf.update(SEG_TARGET[1:], SEG_PRED[1:], group[1:])
    cm = conf.matrices()
    assert torch.equal(cm.sum(0), SEG_CM)
    assert torch.equal(cm[0], segmentation_confusion(SEG_TARGET[0], SEG_PRED[0], 3))
    s = conf.summary()
    # image 0: cm [[2,1,0],[0,2,0],[0,0,0]] + pred 2 on an ignored pixel (not counted)
    # IoU_0 = 2/3, IoU_1 = 2/3 -> mIoU 2/3; image 1: [[1,1,0],[0,2,1],[0,0,0]]:
    # IoU_0 = 1/2, IoU_1 = 2/4, IoU_2 = 0 -> mIoU 1/3
    assert s["miou_small"] == pytest.approx(2 / 3)
    assert s["miou_big"] == pytest.approx(1 / 3)
    assert s["miou_gap"] == pytest.approx(1 / 3)
    assert s["miou"] == pytest.approx((3 / 5 + 4 / 7) / 3)


def test_grouped_segmentation_bad_shapes():
    conf = GroupedSegmentationConfusion(num_classes=3)
    with pytest.raises(ValueError, match=r"\(B, H, W\)"):
        conf.update(SEG_TARGET[0], SEG_PRED[0], torch.tensor([0]))
