"""train.loss / loss_ce_weight / loss_per_image / class_weights (train/losses.py): each loss equals
segmentation_models_pytorch's own (plus torch's cross-entropy), ignored pixels count nowhere, the
two class-weight rules against hand-computed numbers, config errors name the key, the default is
bit for bit the old cross-entropy, and a short run on the tiny COCO-Stuff cache."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from segmentation_models_pytorch import losses as smp_losses

from train import config as C
from train.__main__ import main
from train.data import IGNORE_INDEX, load_data
from train.loop import task_loss
from train.losses import (
    TaskLoss,
    build_task_loss,
    class_pixel_counts,
    class_weights,
    inverse_sqrt_weights,
    median_frequency_weights,
    training_class_weights,
)

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "cocostuff_tiny.yaml"
SMNIST = ROOT / "configs" / "smnist_linear.yaml"
C_ = 4  # classes of the random batches

SMP = {
    "dice": smp_losses.DiceLoss,
    "jaccard": smp_losses.JaccardLoss,
    "tversky": smp_losses.TverskyLoss,
    "focal": smp_losses.FocalLoss,
    "lovasz": smp_losses.LovaszLoss,
}
# (train.loss, per_image)
SMP_CASES = [(name, False) for name in SMP] + [("lovasz", True)]
ALL_CASES = [("cross_entropy", False), *SMP_CASES]
WEIGHTS = torch.tensor([0.5, 2.0, 1.0, 0.25])


def _batch(seed: int = 0, b: int = 3, hw: tuple[int, int] = (5, 6)):
    """Logits ``(b, C, H, W)``, labels with a few ignored pixels in every image (no image fully
    unlabelled) and the mask of the ignored ones."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, C_, *hw, generator=g)
    y = torch.randint(0, C_, (b, *hw), generator=g)
    y[0, 0] = IGNORE_INDEX
    y[1, :, :2] = IGNORE_INDEX
    y[2, 3, 4] = IGNORE_INDEX
    return logits, y, y == IGNORE_INDEX


def _smp(name: str, per_image: bool = False, weights: torch.Tensor | None = None):
    kwargs = {"mode": "multiclass", "ignore_index": IGNORE_INDEX}
    if per_image:
        kwargs["per_image"] = True
    if weights is not None:
        kwargs["class_weights"] = weights.tolist()
    return SMP[name](**kwargs)


# --- values: smp's own loss (+ torch's cross-entropy) ---------------------------------------------


@pytest.mark.parametrize("ce_weight", [0.0, 0.7])
@pytest.mark.parametrize(("name", "per_image"), SMP_CASES, ids=[f"{n}-{p}" for n, p in SMP_CASES])
def test_each_loss_is_smps_plus_weighted_cross_entropy(name, per_image, ce_weight):
    logits, y, _ = _batch()
    got = TaskLoss(name, C_, ce_weight=ce_weight, per_image=per_image)(logits, y)
    expected = _smp(name, per_image)(logits, y)
    expected = expected + ce_weight * F.cross_entropy(logits, y, ignore_index=IGNORE_INDEX)
    torch.testing.assert_close(got, expected)
    if ce_weight == 0 and name != "focal":  # the very call smp makes (focal: TaskLoss._focal)
        assert torch.equal(got, _smp(name, per_image)(logits, y))


GRAD_CASES = [(n, p, None) for n, p in SMP_CASES] + [
    (n, False, WEIGHTS) for n in ("dice", "jaccard", "tversky", "focal")
]


@pytest.mark.parametrize(
    ("name", "per_image", "weights"),
    GRAD_CASES,
    ids=[f"{n}-{p}-{w is not None}" for n, p, w in GRAD_CASES],
)
def test_gradients_are_smps(name, per_image, weights):
    """Focal runs smp's focal function on all classes at once (TaskLoss._focal): the gradient, as
    the value, is that of smp's FocalLoss class; the others call smp's class as it is."""
    logits, y, _ = _batch(8)
    grads = []
    for loss in (
        TaskLoss(name, C_, per_image=per_image, class_weights=weights),
        _smp(name, per_image, weights),
    ):
        z = logits.clone().requires_grad_()
        loss(z, y).backward()
        grads.append(z.grad)
    torch.testing.assert_close(grads[0], grads[1])


WEIGHTED = [("cross_entropy", 0.0)] + [
    (name, w) for name in ("dice", "jaccard", "tversky", "focal") for w in (0.0, 0.7)
]


@pytest.mark.parametrize(("name", "ce_weight"), WEIGHTED, ids=[f"{n}-{w}" for n, w in WEIGHTED])
def test_class_weights_go_to_the_cross_entropy_and_smps_class_weights(name, ce_weight):
    logits, y, _ = _batch(1)
    got = TaskLoss(name, C_, ce_weight=ce_weight, class_weights=WEIGHTS)(logits, y)
    weighted_ce = F.cross_entropy(logits, y, weight=WEIGHTS, ignore_index=IGNORE_INDEX)
    if name == "cross_entropy":
        expected = weighted_ce
    else:
        expected = _smp(name, weights=WEIGHTS)(logits, y) + ce_weight * weighted_ce
        # the weights do change smp's value (the test would not see them otherwise)
        assert not torch.allclose(_smp(name)(logits, y), _smp(name, weights=WEIGHTS)(logits, y))
    torch.testing.assert_close(got, expected)


def test_lovasz_with_class_weights_weighs_the_cross_entropy_term():
    logits, y, _ = _batch(2)
    got = TaskLoss("lovasz", C_, ce_weight=0.5, per_image=True, class_weights=WEIGHTS)(logits, y)
    expected = _smp("lovasz", per_image=True)(logits, y) + 0.5 * F.cross_entropy(
        logits, y, weight=WEIGHTS, ignore_index=IGNORE_INDEX
    )
    torch.testing.assert_close(got, expected)
    with pytest.raises(ValueError, match="class_weights with loss='lovasz' need ce_weight > 0"):
        TaskLoss("lovasz", C_, class_weights=WEIGHTS)


# --- ignored pixels -------------------------------------------------------------------------------


def _cases_with_weights():
    out = [(n, p, 0.0, None) for n, p in ALL_CASES]
    out += [(n, p, 0.3, None) for n, p in SMP_CASES]
    out += [("cross_entropy", False, 0.0, WEIGHTS), ("dice", False, 0.3, WEIGHTS)]
    out += [("focal", False, 0.3, WEIGHTS), ("lovasz", True, 0.3, WEIGHTS)]
    return out


CASES_W = _cases_with_weights()


@pytest.mark.parametrize(
    ("name", "per_image", "ce_weight", "weights"),
    CASES_W,
    ids=[f"{n}-{p}-{w}-{x is not None}" for n, p, w, x in CASES_W],
)
def test_ignored_pixels_count_nowhere(name, per_image, ce_weight, weights):
    """Other logits at the ignored pixels: the same value, and no gradient there; an image with
    no labelled pixel changes nothing, a batch with none gives 0 (not NaN, not an empty tensor)."""
    loss = TaskLoss(name, C_, ce_weight=ce_weight, per_image=per_image, class_weights=weights)
    logits, y, ignored = _batch(3)
    y[1] = IGNORE_INDEX  # one image without a labelled pixel
    ignored = y == IGNORE_INDEX
    other = torch.where(ignored.unsqueeze(1), 10 * torch.randn_like(logits), logits)
    values, grads = [], []
    for z in (logits, other):
        z = z.clone().requires_grad_()
        value = loss(z, y)
        value.backward()
        values.append(value.detach())
        grads.append(z.grad)
    assert values[0].shape == () and torch.isfinite(values[0])
    torch.testing.assert_close(values[1], values[0], rtol=0, atol=1e-6)
    mask = ignored.unsqueeze(1).expand_as(logits)
    assert torch.all(grads[0][mask] == 0) and torch.all(grads[1][mask] == 0)
    assert grads[0][~mask].abs().sum() > 0
    torch.testing.assert_close(grads[1][~mask], grads[0][~mask], rtol=0, atol=1e-6)
    # the image without labels changes nothing (per_image: the mean is over the other images)
    keep = torch.tensor([True, False, True])
    torch.testing.assert_close(loss(logits[keep], y[keep]), values[0])

    none = torch.full_like(y, IGNORE_INDEX)
    z = logits.clone().requires_grad_()
    value = loss(z, none)
    value.backward()
    assert value.shape == () and value.item() == 0.0
    assert torch.all(z.grad == 0)


def test_smp_breaks_on_unlabelled_images_without_the_guard():
    """The smp 0.6.0 behaviour TaskLoss works around (if this fails, smp changed: re-check)."""
    logits, y, _ = _batch(4)
    y[1] = IGNORE_INDEX
    none = torch.full_like(y, IGNORE_INDEX)
    assert torch.isnan(_smp("focal")(logits, none))
    assert _smp("lovasz")(logits, none).shape == (0, C_)
    with pytest.raises(RuntimeError, match="broadcast shape"):
        _smp("lovasz", per_image=True)(logits, y)


def test_focal_mean_is_over_the_labelled_pixels_only():
    """smp's focal drops the ignored pixels before its mean: the value is that of the labelled
    pixels alone (so ignored pixels are not in the normalization either)."""
    logits, y, ignored = _batch(5)
    value = TaskLoss("focal", C_)(logits, y)
    flat_logits = logits.movedim(1, -1)[~ignored].T.reshape(1, C_, -1, 1)  # labelled pixels
    flat_y = y[~ignored].reshape(1, -1, 1)
    torch.testing.assert_close(value, _smp("focal")(flat_logits, flat_y))


def test_under_bf16_autocast_the_loss_is_float32():
    logits, y, _ = _batch(6)
    loss = TaskLoss("lovasz", C_, ce_weight=0.5, class_weights=WEIGHTS)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = loss(logits.bfloat16(), y)
    assert value.dtype == torch.float32
    torch.testing.assert_close(value, loss(logits.bfloat16().float(), y))


# --- class weights --------------------------------------------------------------------------------

# 3 images of 2 x 5 pixels, 4 classes (class 3 never labelled; image 1 has 5 unlabelled pixels)
COUNTS = np.array([[6, 4, 0, 0], [2, 0, 3, 0], [0, 5, 5, 0]])
FRACTIONS = (COUNTS / 10).astype(np.float32)


def test_pixel_counts_from_the_fractions_are_exact():
    np.testing.assert_array_equal(class_pixel_counts(FRACTIONS, (2, 5)), COUNTS)
    # a realistic size: every count up to H W comes back
    h, w = 106, 160
    counts = np.arange(h * w + 1)[:, None]
    fractions = (counts / (h * w)).astype(np.float32)
    np.testing.assert_array_equal(class_pixel_counts(fractions, (h, w)), counts)


def test_median_frequency_by_hand():
    # pixels 8, 9, 8, 0; labelled pixels of the images where c is present: 10+5, 10+10, 5+10, -
    freq = [8 / 15, 9 / 20, 8 / 15]
    median = 8 / 15
    expected = [median / freq[0], median / freq[1], median / freq[2], 0.0]  # 1, 32/27, 1, 0
    np.testing.assert_allclose(median_frequency_weights(COUNTS), expected, rtol=1e-15)
    np.testing.assert_allclose(expected, [1, 32 / 27, 1, 0])
    np.testing.assert_allclose(class_weights("median_frequency", COUNTS), expected, rtol=1e-15)


def test_inverse_sqrt_by_hand():
    # p = 8/25, 9/25, 8/25, 0; w_c = p_c^-1/2 / sum_k p_k^1/2, sum_k p_k^1/2 = (2 sqrt 8 + 3) / 5
    s8 = math.sqrt(8)
    expected = [25 / (16 + 3 * s8), 25 / (6 * s8 + 9), 25 / (16 + 3 * s8), 0.0]
    got = inverse_sqrt_weights(COUNTS)
    np.testing.assert_allclose(got, expected, rtol=1e-15)
    p = COUNTS.sum(0) / COUNTS.sum()
    assert (p * got).sum() == pytest.approx(1.0, rel=1e-15)  # a labelled pixel weighs 1 on average
    np.testing.assert_allclose(inverse_sqrt_weights(np.full((2, 3), 7)), 1.0)  # uniform: all 1


def test_class_weights_rules_and_errors():
    assert class_weights("none", COUNTS) is None
    with pytest.raises(ValueError, match="no labelled pixel"):
        class_weights("inverse_sqrt", np.zeros((2, 3), np.int64))
    with pytest.raises(ValueError, match="rule must be one of"):
        class_weights("inverse", COUNTS)


def test_training_class_weights_read_the_cache_and_respect_train_subset(coco_cache_stuff):
    cfg = C.load(
        TINY,
        [
            f"data.path={coco_cache_stuff}",
            "data.train_subset=5",
            "train.class_weights=inverse_sqrt",
        ],
    )
    data = load_data(cfg.data)
    labels = np.load(coco_cache_stuff / "train" / "labels.npy")[:5]
    counts = np.stack([np.bincount(x.ravel(), minlength=256)[: data.num_classes] for x in labels])
    got = training_class_weights(cfg, data)
    assert got.dtype == torch.float32 and got.shape == (data.num_classes,)
    np.testing.assert_allclose(got.numpy(), inverse_sqrt_weights(counts), rtol=1e-6)
    assert (got[counts.sum(0) == 0] == 0).all() and (got[counts.sum(0) > 0] > 0).all()
    criterion = build_task_loss(cfg, data)
    assert criterion.loss == "cross_entropy" and torch.equal(criterion.class_weights, got)


# --- config ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "overrides", "match"),
    [
        (TINY, ["train.loss=dice", "train.loss_per_image=true"], r"train\.loss_per_image=true"),
        (TINY, ["train.loss_per_image=true"], r"train\.loss_per_image"),
        (TINY, ["train.loss_ce_weight=0.5"], r"train\.loss_ce_weight=0\.5 applies only"),
        (TINY, ["train.loss=dice", "train.loss_ce_weight=-1"], r"train\.loss_ce_weight must be"),
        (TINY, ["train.loss=dice", "train.loss_ce_weight=.nan"], r"train\.loss_ce_weight must be"),
        (TINY, ["train.loss=lovasz", "train.class_weights=inverse_sqrt"], r"train\.class_weights"),
        (TINY, ["train.loss=hinge"], r"train\.loss must be one of"),
        (TINY, ["train.class_weights=sqrt"], r"train\.class_weights must be one of"),
        (SMNIST, ["train.loss=focal"], r"train\.loss='focal' is for segmentation"),
        (SMNIST, ["train.class_weights=median_frequency"], r"train\.class_weights="),
        (
            TINY,
            ["train.loss=dice", "train.group_weighting=balanced"],
            r"train\.group_weighting='balanced' .* train\.loss='dice'",
        ),
        (
            TINY,
            ["train.class_weights=inverse_sqrt", "train.group_weighting=dro"],
            r"train\.group_weighting='dro' .* train\.class_weights='inverse_sqrt'",
        ),
    ],
)
def test_config_errors_name_the_key(config, overrides, match):
    with pytest.raises(ValueError, match=match):
        C.load(config, overrides)


def test_config_accepts_the_combinations():
    cfg = C.load(
        TINY,
        [
            "train.loss=lovasz",
            "train.loss_per_image=true",
            "train.loss_ce_weight=1",
            "train.class_weights=median_frequency",
        ],
    )
    t = cfg.train
    assert (t.loss, t.loss_per_image, t.loss_ce_weight, t.class_weights) == (
        "lovasz",
        True,
        1.0,
        "median_frequency",
    )
    assert C.load(TINY, ["train.loss=focal", "train.class_weights=inverse_sqrt"])


# --- the default is the old cross-entropy --------------------------------------------------------


def test_default_is_bitwise_the_old_cross_entropy(coco_cache_stuff):
    t = C.TrainConfig()
    assert (t.loss, t.loss_ce_weight, t.loss_per_image, t.class_weights) == (
        "cross_entropy",
        0.0,
        False,
        "none",
    )
    cfg = C.load(TINY, [f"data.path={coco_cache_stuff}"])
    assert build_task_loss(cfg, load_data(cfg.data)) is None  # the loop's own code path
    logits, y, _ = _batch(7)
    old = F.cross_entropy(logits, y, ignore_index=IGNORE_INDEX, reduction="sum")
    old = old / (y != IGNORE_INDEX).sum().clamp_min(1)
    assert torch.equal(task_loss(logits, y), old)
    assert torch.equal(task_loss(logits, y, None, None, None), old)


# --- end to end -----------------------------------------------------------------------------------


def test_one_epoch_with_lovasz_per_image_cross_entropy_and_class_weights(
    coco_cache_stuff, tmp_path, capsys
):
    out = tmp_path / "run"
    rc = main(
        [
            "--config",
            str(TINY),
            "--out",
            str(out),
            f"data.path={coco_cache_stuff}",
            "train.epochs=1",
            "train.progress=false",
            "train.loss=lovasz",
            "train.loss_per_image=true",
            "train.loss_ce_weight=0.5",
            "train.class_weights=median_frequency",
        ]
    )
    assert rc == 0
    assert "task loss: loss=lovasz, ce_weight=0.5, per_image=True" in capsys.readouterr().out
    (row,) = json.loads((out / "metrics.json").read_text())["history"]
    assert math.isfinite(row["train_loss"]) and row["train_loss"] > 0
    saved = C.load(out / "config.yaml").train
    assert (saved.loss, saved.class_weights, saved.loss_ce_weight) == (
        "lovasz",
        "median_frequency",
        0.5,
    )
