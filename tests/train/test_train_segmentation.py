"""The trainer on COCO-Stuff caches built from the official-format fixture (data_prep/cocostuff_synthetic.py):
one epoch with the regularizer for DeepLabV3+ and SegNet, metrics re-derived from the checkpoint,
the loss's ignore index, joint augmentations, bad configs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torchvision import tv_tensors

from train import checkpoint
from train import config as C
from train.__main__ import main
from train.data import IGNORE_INDEX, SegmentationCacheDataset, load_data, segmentation_augment
from train.loop import task_loss
from train.metrics import segmentation_confusion, segmentation_scores
from train.models import build_model

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "cocostuff_tiny.yaml"


def _train_cli(cache: Path, out: Path, *extra: str) -> dict:
    rc = main(
        [
            "--config",
            str(TINY),
            "--regularizer",
            "fbeta",
            "--alpha",
            "0.1",
            "--out",
            str(out),
            f"data.path={cache}",
            "train.epochs=1",
            "train.progress=false",
            "regularizer.projection=epoch",
            *extra,
        ]
    )
    assert rc == 0
    return json.loads((out / "metrics.json").read_text())


def test_deeplabv3plus_one_epoch_with_the_regularizer(coco_cache_stuff, tmp_path):
    out = tmp_path / "run"
    metrics = _train_cli(coco_cache_stuff, out)
    meta = json.loads((coco_cache_stuff / "meta.json").read_text())
    (row,) = metrics["history"]
    for key in (
        "test_miou",
        "test_pixel_accuracy",
        "test_mean_class_accuracy",
        "test_fw_iou",
        "test_miou_small",
        "test_miou_big",
        "test_shape_fbeta",
        "reg_eps",
        "reg_projections",
        "train_seconds",
    ):
        assert key in row, key
    assert len(row["test_iou"]) == meta["num_classes"] == 92
    assert row["reg_projections"] == 1 and 0 <= row["test_miou"] <= 1
    assert C.load(out / "config.yaml").model.name == "deeplabv3plus"
    ckpt = checkpoint.latest(out)[1]
    assert ckpt["epoch"] == 1 and ckpt["regularizer"] is not None
    events = list((out / "tb").glob("events.out.tfevents.*"))
    assert events and b"val/input_prediction_truth" in events[0].read_bytes()

    # the reported metrics equal a confusion matrix re-derived from the checkpoint's predictions
    cfg = C.load(out / "config.yaml")
    data = load_data(cfg.data)
    model = build_model(cfg.model, data.image_shape, data.num_classes)
    model.load_state_dict(ckpt["model"])
    model.eval()
    batch = data.test[list(range(len(data.test)))]
    with torch.no_grad():
        pred = model(batch["image"])[0].argmax(1)
    cm = segmentation_confusion(batch["label"], pred, data.num_classes)
    scores = segmentation_scores(cm)
    assert row["test_miou"] == pytest.approx(scores["miou"], abs=1e-12)
    assert row["test_fw_iou"] == pytest.approx(scores["fw_iou"], abs=1e-12)
    small = batch["shape"] == 0
    cm_small = segmentation_confusion(batch["label"][small], pred[small], data.num_classes)
    assert row["test_miou_small"] == pytest.approx(segmentation_scores(cm_small)["miou"])


def test_segnet_sky_one_epoch_with_the_regularizer(coco_cache_sky, tmp_path):
    metrics = _train_cli(
        coco_cache_sky, tmp_path / "run", "model.name=segnet", "model.encoder=vgg16_bn"
    )
    (row,) = metrics["history"]
    assert len(row["test_iou"]) == 2 and row["reg_projections"] == 1
    assert 0 <= row["test_pixel_accuracy"] <= 1


def test_loss_ignores_unlabelled_pixels():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 3, 5)
    y = torch.randint(0, 4, (2, 3, 5))
    y[0, 0] = IGNORE_INDEX
    valid = y != IGNORE_INDEX
    expected = F.cross_entropy(logits.permute(0, 2, 3, 1)[valid], y[valid])
    assert torch.allclose(task_loss(logits, y), expected)
    none = torch.full_like(y, IGNORE_INDEX)
    assert task_loss(logits, none).item() == 0.0  # not NaN


def test_augmentations_move_image_and_mask_together(coco_cache_stuff):
    cfg = C.DataConfig(
        kind="cocostuff", path=str(coco_cache_stuff), hflip=True, scale_range=[1.5, 1.5]
    )
    plain = SegmentationCacheDataset(coco_cache_stuff, "train")
    size = tuple(plain[[0]]["image"].shape[-2:])
    flip = SegmentationCacheDataset(
        coco_cache_stuff,
        "train",
        augment=segmentation_augment(C.DataConfig(kind="cocostuff", hflip=True), size),
    )
    torch.manual_seed(0)
    a, b = plain[[0, 1, 2, 3]], flip[[0, 1, 2, 3]]
    flipped = [torch.equal(b["image"][i], a["image"][i].flip(-1)) for i in range(4)]
    for i in range(4):
        same = torch.equal(b["image"][i], a["image"][i])
        assert flipped[i] or same
        assert torch.equal(b["label"][i], a["label"][i].flip(-1) if flipped[i] else a["label"][i])
    aug = segmentation_augment(cfg, size)
    torch.manual_seed(0)
    img, mask = aug(tv_tensors.Image(a["image"][0]), tv_tensors.Mask(a["label"][0]))
    assert img.shape[-2:] == size and mask.shape == size
    values = set(np.unique(mask.numpy())) - {IGNORE_INDEX}
    assert values <= set(np.unique(a["label"][0].numpy()))  # nearest: no new classes


def test_batches_come_back_in_sampler_order(coco_cache_stuff):
    ds = SegmentationCacheDataset(coco_cache_stuff, "train")
    batch = ds[[3, 0, 2]]
    for j, i in enumerate([3, 0, 2]):
        assert torch.equal(batch["image"][j], ds[[i]]["image"][0])
    assert batch["index"].tolist() == [3, 0, 2]


def test_segmentation_config_errors(tmp_path):
    with pytest.raises(ValueError, match=r"model\.name must be one of"):
        C.load(ROOT / "configs" / "smnist_linear.yaml", ["model.name=deeplabv3plus"])
    with pytest.raises(ValueError, match="segmentation architecture"):
        C.load(TINY, ["model.name=linear"])
    with pytest.raises(ValueError, match=r"data\.scale_range"):
        C.load(TINY, ["data.scale_range=[2, 1]"])
    cfg = C.load(TINY, [f"data.path={tmp_path / 'nothing'}"])
    with pytest.raises(ValueError, match=r"data_prep\.cocostuff"):
        load_data(cfg.data)


def test_three_shape_bins_train_one_vs_rest(coco_root, tmp_path):
    """p = 3 shape classes (docs/method/shape-labels.md sec. 6): ``--thresholds 0.02 0.2``, one F-beta term per non-zero
    bin (``regularizer.fbeta.positive_classes=[1,2]``) on its own column of the shape head, mIoU
    reported per bin."""
    from data_prep import cocostuff

    cache = cocostuff.prepare(
        cocostuff.Options(
            out=tmp_path / "cache", root=coco_root, size=(24, 32), workers=0, thresholds=(0.02, 0.2)
        ),
        log=lambda *_: None,
    )
    counts = json.loads((cache / "meta.json").read_text())["splits"]["train"]["shape_counts"]
    assert set(counts) == {"0", "1", "2"} and min(counts.values()) > 0
    out = tmp_path / "run"
    metrics = _train_cli(cache, out, "regularizer.fbeta.positive_classes=[1,2]")
    (row,) = metrics["history"]
    assert len(row["test_miou_per_group"]) == 3
    assert row["test_miou_big"] == row["test_miou_per_group"][2]
    ckpt = checkpoint.latest(out)[1]
    assert ckpt["model"]["net.shape_head.linear.weight"].shape[0] == 3  # column c: bin c
    assert ckpt["regularizer"]["mu"].shape == (2,) and ckpt["regularizer"]["scores"].shape[1] == 2
