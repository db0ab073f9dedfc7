"""train.group_weighting: group-balanced reweighting and online group DRO against hand computations,
their state in checkpoints, and the trainer on a CamVid-layout cache (val selects, test reports)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.data_prep.test_camvid import write_cache
from train import config as C
from train.__main__ import main
from train.evaluation import per_image_iou
from train.groups import GroupWeighting
from train.loop import task_loss
from train.reporting import selected_epoch

ROOT = Path(__file__).resolve().parents[2]


def _batch(seed=0, b=4, c=3, hw=(5, 6)):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, c, *hw, generator=g, dtype=torch.float64)
    y = torch.randint(0, c, (b, *hw), generator=g)
    y[0, 0] = 255
    y[2, :2] = 255
    return logits, y, torch.tensor([0, 1, 1, 0])


def test_balanced_is_the_weighted_pixel_mean():
    logits, y, shape = _batch()
    train_groups = torch.tensor([0] * 30 + [1] * 10)  # N_0 = 30, N_1 = 10 -> w = (2/3, 2)
    gw = GroupWeighting("balanced", train_groups, 2)
    ce = F.cross_entropy(logits, y, ignore_index=255, reduction="none")
    valid = y != 255
    w = torch.tensor([2 / 3, 2.0], dtype=torch.float64)[shape].view(-1, 1, 1)
    expected = (w * ce * valid).sum() / (w * valid).sum()
    torch.testing.assert_close(task_loss(logits, y, gw, shape), expected)


def test_balanced_with_equal_groups_is_the_plain_loss():
    logits, y, shape = _batch(1)
    gw = GroupWeighting("balanced", torch.tensor([0, 1] * 20), 2)
    torch.testing.assert_close(task_loss(logits, y, gw, shape), task_loss(logits, y))


def test_dro_follows_sagawa_et_al_algorithm_1():
    eta = 0.3
    gw = GroupWeighting("dro", torch.tensor([0, 1, 1]), 2, dro_step=eta)
    q = np.array([0.5, 0.5])
    for seed in range(3):
        logits, y, shape = _batch(seed)
        ce = F.cross_entropy(logits, y, ignore_index=255, reduction="none")
        valid = y != 255
        means = np.array([float(ce[shape == j][valid[shape == j]].mean()) for j in (0, 1)])
        q = q * np.exp(eta * means)
        q = q / q.sum()
        loss = task_loss(logits, y, gw, shape)
        assert float(loss) == pytest.approx(float((q * means).sum()), rel=1e-12)
        np.testing.assert_allclose(gw.q.numpy(), q, rtol=1e-12)
    # a group absent from the batch keeps its weight relative to ... nothing: exp(0) = 1
    logits, y, _ = _batch(5)
    before = gw.q.clone()
    task_loss(logits, y, gw, torch.zeros(4, dtype=torch.long))
    assert gw.q[0] / gw.q[1] > before[0] / before[1]
    # a non-finite batch leaves q as it was
    q_now = gw.q.clone()
    task_loss(logits * math.nan, y, gw, torch.tensor([0, 1, 1, 0]))
    torch.testing.assert_close(gw.q, q_now)


def test_dro_state_round_trip_and_classification():
    gw = GroupWeighting("dro", torch.tensor([0, 1]), 2, dro_step=1.0)
    logits = torch.randn(6, 10, dtype=torch.float64)
    y = torch.randint(0, 10, (6,))
    loss = task_loss(logits, y, gw, torch.tensor([0, 0, 0, 1, 1, 1]))
    per = F.cross_entropy(logits, y, reduction="none")
    means = torch.stack([per[:3].mean(), per[3:].mean()])
    q = torch.softmax(means, 0)  # from uniform, one step with eta = 1
    torch.testing.assert_close(loss, (q * means).sum())
    other = GroupWeighting("dro", torch.tensor([0, 1]), 2)
    other.load_state_dict(gw.state_dict())
    torch.testing.assert_close(other.q, gw.q)


def test_bad_arguments():
    with pytest.raises(ValueError, match="mode must be one of"):
        GroupWeighting("none", torch.tensor([0, 1]), 2)
    with pytest.raises(ValueError, match="dro_step must be > 0"):
        GroupWeighting("dro", torch.tensor([0, 1]), 2, dro_step=0)
    with pytest.raises(ValueError, match=r"train\.dro_step must be > 0"):
        C.from_dict({"train": {"dro_step": -1.0}})
    with pytest.raises(ValueError, match=r"train\.group_weighting must be one of"):
        C.from_dict({"train": {"group_weighting": "upweight"}})


def test_per_image_iou_by_hand():
    label = torch.tensor([[[0, 0], [1, 255]], [[1, 1], [1, 1]]])
    pred = torch.tensor([[[0, 1], [1, 0]], [[1, 1], [0, 1]]])
    iou = per_image_iou(label, pred, 3)
    expected = torch.tensor([[1 / 2, 1 / 2, math.nan], [0.0, 3 / 4, math.nan]], dtype=torch.float64)
    torch.testing.assert_close(iou, expected, equal_nan=True)


def test_selected_epoch():
    rows = [
        {"epoch": 1, "val_miou": 0.5},
        {"epoch": 2, "val_miou": 0.7},
        {"epoch": 3, "val_miou": 0.7},
    ]
    assert selected_epoch(rows) == 2  # ties: the earlier epoch
    assert selected_epoch([{"epoch": 1}, {"epoch": 2}]) == 2  # no val split: the last epoch
    assert selected_epoch([]) is None


@pytest.fixture(scope="module")
def camvid_cache(tmp_path_factory) -> Path:
    return write_cache(tmp_path_factory.mktemp("camvid"), task="all", n=4, hw=(32, 48))


@pytest.mark.parametrize("weighting", ["none", "dro"])
def test_trainer_on_a_camvid_cache_selects_on_val_and_reports_test(
    camvid_cache, tmp_path, weighting
):
    out = tmp_path / "run"
    # overrides before, between and after the options (intermixed)
    rc = main(
        [
            "--config",
            str(ROOT / "configs" / "camvid.yaml"),
            f"data.path={camvid_cache}",
            "--regularizer",
            "fbeta",
            "train.epochs=2",
            "--out",
            str(out),
            "data.batch_size=4",
            "model.encoder=resnet18",
            "train.progress=false",
            f"train.group_weighting={weighting}",
            "train.log_images=0",
        ]
    )
    assert rc == 0
    m = json.loads((out / "metrics.json").read_text())
    rows = m["history"]
    assert all("val_miou" in r and "test_miou" in r for r in rows)
    assert all(0.0 <= r["test_shape_positive_rate"] <= 1.0 for r in rows)
    best = max(rows, key=lambda r: (r["val_miou"], -r["epoch"]))
    assert m["selected"]["epoch"] == best["epoch"]
    assert m["selected"]["test_miou"] == best["test_miou"]
    per = np.load(out / "per_image_test.npz")
    assert int(per["epoch"][0]) == best["epoch"]
    np.testing.assert_array_equal(per["index"], np.arange(4))
    assert per["iou"].shape == (4, 11)
    if weighting == "dro":
        q = rows[-1]["group_q"]
        assert len(q) == 2 and sum(q) == pytest.approx(1.0) and q != [0.5, 0.5]
        ckpt = torch.load(sorted((out / "checkpoints").glob("*.pt"))[-1], weights_only=False)
        np.testing.assert_allclose(ckpt["groups"]["q"].numpy(), q)


def test_warnings_name_an_inert_regularizer_or_a_one_sided_shape_node():
    from train.reporting import warnings

    healthy = {"test_shape_positive_rate": 0.4, "reg_inert": None}
    assert warnings(healthy, "fbeta") == []
    assert warnings({"test_shape_positive_rate": 0.0}, None) == []  # no regularizer: no advice
    (w,) = warnings({"reg_inert": "mu moved by < 1e-4"}, "fbeta")
    assert w.startswith("the regularizer looks inert: mu moved")
    (w,) = warnings({"test_shape_positive_rate": 0.0}, "roc_auc")
    assert "'small' for every test sample" in w and "(roc_auc)" in w
    (w,) = warnings({"test_shape_positive_rate": 1.0}, "soft_fbeta")
    assert "'big' for every test sample" in w
