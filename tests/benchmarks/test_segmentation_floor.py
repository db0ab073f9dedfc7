"""The 1-pixel boundary floor (benchmarks/segmentation_study/floor.py) against hand-computed maps and
confusion matrices."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.segmentation_study import floor as fl

IGN = fl.IGNORE


def test_dilation_grows_the_higher_class_by_one_pixel_in_a_cross_and_never_the_ignored():
    labels = np.zeros((1, 5, 5), np.uint8)
    labels[0, 2, 2] = 1
    labels[0, 0, 4] = IGN  # an ignored corner: does not grow, stays ignored
    labels[0, 4, 0] = IGN
    labels[0, 4, 1] = IGN  # an ignored pixel beside a labelled one: takes the labelled class
    out = fl.dilated(labels)[0]
    want = np.zeros((5, 5), np.uint8)
    want[2, 2] = want[1, 2] = want[3, 2] = want[2, 1] = want[2, 3] = 1
    want[0, 4] = 0  # its neighbours are rest (0): the max over the cross
    want[4, 0] = want[4, 1] = 0
    np.testing.assert_array_equal(out, want)
    alone = np.full((1, 3, 3), IGN, np.uint8)
    np.testing.assert_array_equal(fl.dilated(alone), alone)  # nothing known: stays ignored


def test_shift_moves_the_map_repeats_the_edge_and_keeps_the_truth_under_ignored():
    labels = np.array([[[0, 1, 2], [3, IGN, 5]]], np.uint8)
    right = fl.shifted(labels, 0, 1)[0]
    np.testing.assert_array_equal(right, [[0, 0, 1], [3, 3, 5]])  # (1, 2) keeps its 5 under 255
    down = fl.shifted(labels, 1, 0)[0]
    np.testing.assert_array_equal(down, [[0, 1, 2], [0, 1, 2]])  # (an ignored target: not scored)
    np.testing.assert_array_equal(fl.shifted(labels, -1, 0)[0], [[3, 1, 5], [3, IGN, 5]])


def test_score_of_a_dilated_block_matches_the_hand_computed_confusion():
    labels = np.zeros((2, 4, 4), np.uint8)
    labels[0, 1:3, 1:3] = 1  # image 0 (group 0): a 2x2 sky block in 16 pixels
    labels[1, :3, :] = 1  # image 1 (group 1): sky on 12 of 16 pixels
    shape = np.array([0, 1])
    out = fl.score(labels, fl.dilated(labels), shape, 2, 2)
    # image 0: sky grows to the block and its 8 cross neighbours = 12 pixels; TP 4, FP 8, rest TP 4
    # image 1: sky grows one row down: rest 4 -> 0 correct; sky TP 12, FP 4
    sky_0, rest_0 = 4 / 12, 4 / 12
    sky_1, rest_1 = 12 / 16, 0.0
    assert out["miou_small"] == pytest.approx((sky_0 + rest_0) / 2)
    assert out["miou_big"] == pytest.approx((sky_1 + rest_1) / 2)
    assert out["miou_gap"] == pytest.approx(abs(out["miou_small"] - out["miou_big"]))
    sky, rest = (4 + 12) / (12 + 16), 4 / (12 + 4)  # summed matrix: TP 16, union 28; rest 4 / 16
    assert out["iou"] == pytest.approx([rest, sky])
    per = fl.per_image_iou(labels, fl.dilated(labels), 2)
    np.testing.assert_allclose(per, [[rest_0, sky_0], [rest_1, sky_1]])


def test_floor_of_a_cache_small_regions_pay_more_for_a_one_pixel_error(tmp_path):
    rng = np.random.default_rng(0)
    labels = np.zeros((4, 32, 32), np.uint8)
    for i, side in enumerate((4, 6, 20, 24)):  # two small skies (group 0), two big (group 1)
        top = rng.integers(0, 32 - side)
        labels[i, top : top + side, 4 : 4 + side] = 1
    labels[:, -1, :] = IGN
    (tmp_path / "test").mkdir()
    np.save(tmp_path / "test" / "labels.npy", labels)
    np.save(tmp_path / "test" / "shape.npy", np.array([0, 0, 1, 1]))
    (tmp_path / "meta.json").write_text(json.dumps({"num_classes": 2, "shape_bins": 2}))
    out = fl.floor(tmp_path)
    for how in ("dilation", "shift"):
        assert out[how]["miou_small"] < out[how]["miou_big"] < 1.0
    assert len(out["shift_moves"]) == 4
    gaps = [m["miou_gap"] for m in out["shift_moves"]]
    assert out["shift"]["miou_gap"] == pytest.approx(np.mean(gaps))
    per = np.array(out["dilation_per_image_iou"], dtype=float)
    assert per.shape == (4, 2) and (per[:2, 1] < per[2:, 1].min()).all()  # small skies lower
