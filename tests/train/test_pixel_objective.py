"""``regularizer.target: pixels``: the grouped F-beta on each image's pixels (docs/segmentation/pixels.md):
pixel identities through the augmentation, the margins the objective scores, one run end to end."""

from __future__ import annotations

import json

import pytest
import torch

from train import config as C
from train import distributed
from train.__main__ import main
from train.build import pixel_scores
from train.data import IGNORE_INDEX, SegmentationCacheDataset, segmentation_augment
from train.loop import setup

from .test_train_segmentation import TINY


@pytest.mark.parametrize("scale_range", [None, [0.5, 2.0]])
def test_each_pixel_keeps_its_identity_through_the_augmentation(coco_cache_stuff, scale_range):
    """The batch's ``pixel`` is each output pixel's dataset index: the cache's label there is the
    augmented label (wherever it is labelled), and asking for it changes no image or label."""
    plain = SegmentationCacheDataset(coco_cache_stuff, "train")
    size = tuple(plain[[0]]["image"].shape[-2:])
    cfg = C.DataConfig(kind="cocostuff", hflip=True, scale_range=scale_range)
    kw = dict(augment=segmentation_augment(cfg, size), seed=3)
    without = SegmentationCacheDataset(coco_cache_stuff, "train", **kw)
    with_index = SegmentationCacheDataset(coco_cache_stuff, "train", pixel_index=True, **kw)
    idx = [3, 0, 2, 1]
    a, b = without[idx], with_index[idx]
    assert torch.equal(a["image"], b["image"]) and torch.equal(a["label"], b["label"])
    all_labels = torch.stack([plain[[i]]["label"][0] for i in range(len(plain))]).reshape(-1)
    labelled = b["label"] != IGNORE_INDEX
    assert bool(labelled.any())
    looked_up = all_labels[b["pixel"][labelled]]
    assert torch.equal(looked_up, b["label"][labelled])
    image_of = b["pixel"] // (size[0] * size[1])
    assert torch.equal(
        image_of[labelled], torch.tensor(idx).view(-1, 1, 1).expand_as(image_of)[labelled]
    )
    labels, groups = plain.pixel_problem()
    assert labels.numel() == groups.numel() == len(plain) * size[0] * size[1]
    assert bool((groups[all_labels == IGNORE_INDEX] == -1).all())


def test_pixel_scores_are_one_vs_rest_margins():
    logits = torch.randn(2, 4, 3, 5, generator=torch.Generator().manual_seed(0))
    u = pixel_scores(logits, [1, 3])
    z = logits.movedim(1, -1)
    for col, c in enumerate([1, 3]):
        others = torch.cat([z[..., :c], z[..., c + 1 :]], -1).amax(-1)
        torch.testing.assert_close(u[..., col], z[..., c] - others)
        assert torch.equal(u[..., col] > 0, z.argmax(-1) == c)


def test_pixel_scores_with_tied_logits_take_the_max_over_the_other_classes():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]]).view(2, 4, 1, 1)
    u = pixel_scores(logits, [0, 1, 2, 3]).view(2, 4)
    # a tie for the top: both tied classes at margin 0 (neither wins), the rest below it
    torch.testing.assert_close(u, torch.tensor([[-2.0, 0.0, 0.0, -3.0], [0.0, 0.0, 0.0, 0.0]]))


def test_labelled_pixel_scores_drop_the_ignored_pixels_and_keep_gradients():
    from train.build import labelled_pixel_scores

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 5, 4, 6, generator=g, requires_grad=True)
    labels = torch.randint(0, 5, (3, 4, 6), generator=g)
    labels[0, :2] = labels[2, 3, 1:] = IGNORE_INDEX
    pixels = torch.randperm(3 * 4 * 6, generator=g).view(3, 4, 6).int()
    u, idx = labelled_pixel_scores(logits, [2, 4], labels, pixels, IGNORE_INDEX)
    keep = labels != IGNORE_INDEX
    assert u.shape == (int(keep.sum()), 2) and idx.dtype == torch.int32
    assert torch.equal(idx, pixels[keep])
    torch.testing.assert_close(u, pixel_scores(logits, [2, 4])[keep])
    u.sum().backward()
    assert bool((logits.grad.movedim(1, -1)[~keep] == 0).all())  # ignored pixels get no gradient
    assert bool((logits.grad.movedim(1, -1)[keep] != 0).any())


def test_target_pixels_config_errors(tmp_path):
    with pytest.raises(
        ValueError, match=r"regularizer\.target=pixels needs regularizer\.name=fbeta"
    ):
        C.load(TINY, ["regularizer.name=roc_auc", "regularizer.target=pixels"])
    with pytest.raises(ValueError, match=r"regularizer\.target must be one of"):
        C.load(TINY, ["regularizer.target=pixel"])
    with pytest.raises(ValueError, match=r"regularizer\.projection=tracked"):
        C.load(TINY, ["regularizer.name=fbeta", "regularizer.target=pixels"])  # its inline
    cfg = C.load(
        TINY, ["regularizer.name=fbeta", "regularizer.target=pixels", "regularizer.projection=null"]
    )
    assert cfg.regularizer.fbeta.tau_update == "sparse_adam_ahead"  # the O(B) state at every size


def test_a_run_on_the_pixels_trains_each_images_fbeta(coco_cache_sky, tmp_path):
    """One epoch with the per-image F-beta: one problem per training image with sky, its state
    moves (eps, tau, the certified mean bound), and the saved config pins the O(B) state."""
    out = tmp_path / "run"
    args = ["--config", str(TINY), "--regularizer", "fbeta", "--alpha", "1", "--out", str(out)]
    extra = [f"data.path={coco_cache_sky}", "train.epochs=2", "train.progress=false"]
    extra.append("regularizer.projection=null")  # the tiny config's inline: O(n) per step
    extra.append("data.scale_range=null")  # flips only: every labelled pixel is seen each epoch
    assert main([*args, *extra, "regularizer.target=pixels"]) == 0
    rows = json.loads((out / "metrics.json").read_text())["history"]
    saved = C.load(out / "config.yaml", [f"train.out={tmp_path / 'again'}"])
    assert saved.regularizer.projection == "tracked"
    assert saved.regularizer.fbeta.tau_update == "sparse_adam_ahead"
    s = setup(saved, distributed.Context(), None, lambda *_: None)
    assert s.reg.grouped
    labels, groups = s.data.train.pixel_problem()
    assert s.reg.n_samples == labels.numel()
    with_sky = {int(g) for g in groups[(labels == 1) & (groups >= 0)].unique()}
    assert s.reg.n_problems == len(with_sky)
    assert rows[-1]["reg_problems_scored"] == len(with_sky)
    assert rows[0]["reg_eps"] != rows[1]["reg_eps"]
    # every labelled pixel was scored (flips move pixels, they lose none); unlabelled ones never
    labelled = float((groups >= 0).float().mean())
    assert rows[-1]["reg_scored_fraction"] == pytest.approx(labelled)
