"""A trained S-MNIST run used outside the trainer: ``train.classify`` labels image files at the
saved threshold, ``load_predictor`` gives the same in a few lines, and ``train.export`` writes a
``torch.export`` program that reproduces them loaded back with torch alone."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from train import checkpoint
from train.__main__ import main as train_main
from train.caches import smnist
from train.classify import PREDICTIONS_CSV
from train.classify import main as classify_main
from train.export import main as export_main
from train.predict import load_predictor
from train.predict import main as predict_main

from .run_utils import smnist_args


@pytest.fixture(scope="module")
def run(digits_smnist, tmp_path_factory) -> Path:
    """The demo's MLP with precision at recall, its threshold chosen on a val split (2 epochs)."""
    out = tmp_path_factory.mktemp("classify") / "run"
    args = smnist_args(
        digits_smnist,
        out,
        "regularizer.name=precision_at_recall",
        "regularizer.precision_at_recall.recall=0.9",
        "train.shape_threshold=val",
        "data.val_fraction=0.1",
    )
    assert train_main(args) == 0
    return out


@pytest.fixture(scope="module")
def digits(digits_smnist) -> np.ndarray:
    splits, _ = smnist.load(digits_smnist)
    return splits["test"]["images"][:20]


def _write(images: np.ndarray, folder: Path) -> Path:
    folder.mkdir()
    for i, image in enumerate(images):
        Image.fromarray(image).save(folder / f"{i:02d}.png")
    return folder


def test_load_predictor_gives_the_runs_predictions_at_its_saved_threshold(run, digits):
    net = load_predictor(run, task=None)  # checkpoints/best.pt
    saved = checkpoint.load(run / "checkpoints" / "best.pt")
    assert net.shape_threshold == pytest.approx(float(saved["shape_threshold"]))
    assert net.shape_threshold != 0.0  # chosen on val, not the default
    # kept by default: the last step checkpoint and best.pt
    assert [p.name for p in checkpoint.listing(run)] == ["step-000000022.pt"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "best.pt",
        "step-000000022.pt",
    ]
    classes, scores = net.predict(torch.from_numpy(digits))
    assert classes.shape == scores.shape == (20,)
    # the network of best.pt, evaluated by hand
    model = net.model
    with torch.no_grad():
        logits, u = model(torch.from_numpy(digits))
    assert torch.equal(classes, logits.argmax(1).to(torch.uint8))
    assert torch.equal(scores, u.float())


def test_classify_writes_the_class_and_the_shape_decision_of_every_image(
    run, digits, tmp_path, capsys
):
    folder = _write(digits, tmp_path / "images")
    assert (
        classify_main(["--run", str(run), "--images", str(folder), "--out", str(tmp_path / "o")])
        == 0
    )
    rows = list(csv.DictReader((tmp_path / "o" / PREDICTIONS_CSV).open()))
    assert [r["image"] for r in rows] == [f"{i:02d}.png" for i in range(20)]
    net = load_predictor(run, task="smnist")
    classes, scores = net.predict(torch.from_numpy(digits))  # PNG round trip is lossless
    assert [int(r["class"]) for r in rows] == classes.tolist()
    assert [float(r["shape_score"]) for r in rows] == pytest.approx(scores.tolist(), rel=1e-5)
    assert [int(r["shape_decision"]) for r in rows] == (scores > net.shape_threshold).int().tolist()
    assert all(0.1 <= float(r["probability"]) <= 1 for r in rows)
    assert "shape decision u > " in capsys.readouterr().out


def test_inverted_images_are_flipped_back(run, digits, tmp_path):
    plain = _write(digits, tmp_path / "plain")
    dark = _write(255 - digits, tmp_path / "dark")
    for folder, extra in ((plain, []), (dark, ["--invert"])):
        args = ["--run", str(run), "--images", str(folder), "--out", str(folder) + "-out", *extra]
        assert classify_main(args) == 0
    read = lambda f: (Path(str(f) + "-out") / PREDICTIONS_CSV).read_text()  # noqa: E731
    assert read(plain) == read(dark)


def test_the_wrong_kind_of_run_is_one_line(run, tmp_path, capsys):
    folder = _write(np.zeros((1, 8, 8), np.uint8), tmp_path / "images")
    assert (
        predict_main(["--run", str(run), "--images", str(folder), "--out", str(tmp_path / "o")])
        == 2
    )
    assert "python -m train.classify labels images with it" in capsys.readouterr().err
    assert (
        classify_main(
            ["--run", str(tmp_path), "--images", str(folder), "--out", str(tmp_path / "o")]
        )
        == 2
    )
    assert "no config.yaml" in capsys.readouterr().err


def test_the_exported_program_reproduces_the_predictions(run, digits, tmp_path):
    path = tmp_path / "model.pt2"
    assert export_main(["--run", str(run), "--out", str(path)]) == 0
    program = torch.export.load(path).module()  # torch alone: no project code needed to run it
    net = load_predictor(run, task=None)
    images = torch.from_numpy(digits)
    for batch in (images, images[:3], images[:1]):  # the batch dimension is dynamic
        logits, u, decision = program(batch)
        classes, scores = net.predict(batch)
        assert torch.equal(logits.argmax(1).to(torch.uint8), classes)
        assert torch.allclose(u, scores, atol=1e-6)
        assert torch.equal(decision, scores > net.shape_threshold)
    assert float(program.threshold) == pytest.approx(net.shape_threshold)
