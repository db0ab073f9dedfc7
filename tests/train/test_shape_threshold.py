"""The trainer's shape threshold (``train.shape_threshold``): the rate objectives' learned one, or
the one their target picks on a val split (``data.val_fraction`` for S-MNIST), reported on test
and saved in ``checkpoints/best.pt``."""

from __future__ import annotations

import json

import pytest
import torch

from reparam import rate_functional as R
from train import config as C
from train import loop, run_info
from train.__main__ import main as train_main
from train.data import load_data
from train.models import build_model

from .run_utils import quiet, smnist_args, smnist_cfg

PAR = ("--regularizer", "precision_at_recall", "regularizer.precision_at_recall.recall=0.9")


def test_val_fraction_holds_out_a_fixed_seeded_split(digits_smnist, tmp_path):
    whole = load_data(smnist_cfg(digits_smnist, tmp_path).data)
    cfg = smnist_cfg(digits_smnist, tmp_path, "data.val_fraction=0.25")
    a, b = load_data(cfg.data), load_data(cfg.data)
    assert len(a.val) == round(0.25 * len(whole.train)) and len(a.train) + len(a.val) == len(
        whole.train
    )
    assert torch.equal(a.val.tensors["image"], b.val.tensors["image"])  # the same split each time
    # every training image is in exactly one part; both parts hold both shape groups
    rows = {bytes(x.numpy()) for x in whole.train.tensors["image"]}
    parts = [bytes(x.numpy()) for d in (a.train, a.val) for x in d.tensors["image"]]
    assert len(parts) == len(whole.train) and set(parts) <= rows
    assert set(a.val.shape_labels.tolist()) == set(whole.train.shape_labels.tolist())


def test_threshold_chosen_on_val_is_reported_and_saved(digits_smnist, tmp_path):
    out = tmp_path / "run"
    args = smnist_args(digits_smnist, out, *PAR[2:], "data.val_fraction=0.25")
    args += ["train.shape_threshold=val", "regularizer.name=precision_at_recall"]
    assert train_main(args) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    selected = metrics["selected"]
    t = selected["test_shape_threshold"]
    # the target holds where it was chosen, and the val figures are at the chosen threshold
    assert selected["val_shape_recall_at_threshold"] >= 0.9
    best = torch.load(run_info.best_path(out), weights_only=False)
    assert best["epoch"] == selected["epoch"] and best["shape_threshold"] == t
    # the saved threshold is the val split's calibration by the saved weights
    cfg = C.load(out / "config.yaml")
    data = load_data(cfg.data)
    model = build_model(cfg.model, data.image_shape, data.num_classes)
    model.load_state_dict(best["model"])
    model.eval()
    with torch.no_grad():
        _, u = model(data.val.tensors["image"])
    pos = data.val.shape_labels == 1
    chosen = R.threshold_at_recall(u[pos], u[~pos], 0.9)
    assert t == pytest.approx(chosen.threshold, abs=1e-5)
    assert selected["val_shape_recall_at_threshold"] == pytest.approx(chosen.recall)
    assert selected["val_shape_precision_at_threshold"] == pytest.approx(chosen.precision)


def test_learned_threshold_of_a_rate_objective_is_reported(digits_smnist, tmp_path):
    out = tmp_path / "run"
    assert train_main([*smnist_args(digits_smnist, out), *PAR]) == 0
    final = json.loads((out / "metrics.json").read_text())["final"]
    assert final["test_shape_threshold"] == pytest.approx(final["reg_decision_threshold"])
    assert final["reg_train_recall_at_threshold"] >= 0.9
    assert final["test_shape_recall_at_threshold"] is not None


@pytest.mark.parametrize(
    "extra, match",
    [
        (["train.shape_threshold=val"], "needs a val split"),
        (["train.shape_threshold=val", "regularizer.name=none"], "needs regularizer.name in"),
        (["train.shape_threshold=val", "regularizer.name=roc_auc"], "needs regularizer.name in"),
        (["data.val_fraction=1.5"], "data.val_fraction must be null or in"),
    ],
)
def test_bad_threshold_settings_are_errors(digits_smnist, tmp_path, extra, match):
    with pytest.raises(ValueError, match=match):  # the config's checks, or the trainer's setup
        loop.run(smnist_cfg(digits_smnist, tmp_path, *extra), log=quiet)
