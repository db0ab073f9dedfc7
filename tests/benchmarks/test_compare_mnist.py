"""``python -m benchmarks.compare mnist --quick`` runs offline and writes its tables and plot (no timing asserted)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.compare.mnist import __main__ as cli
from benchmarks.compare.mnist import spec

REAL_MNIST = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "mnist"


def write_fake_mnist(folder: Path, n_train: int = 600, n_test: int = 300, seed: int = 0) -> Path:
    """Four tiny idx.gz files in the official names and format: random 28x28 images whose mean
    brightness depends on the digit (so the classes are learnable), random digits 0-9."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        digits = rng.integers(0, 10, n).astype(np.uint8)
        noise = rng.integers(0, 128, (n, 28, 28))
        images = np.clip(noise + 12 * digits[:, None, None], 0, 255).astype(np.uint8)
        for kind, arr, code in (("images", images, 3), ("labels", digits, 1)):
            header = bytes([0, 0, 8, arr.ndim]) + b"".join(d.to_bytes(4, "big") for d in arr.shape)
            with gzip.open(folder / f"{prefix}-{kind}-idx{code}-ubyte.gz", "wb") as f:
                f.write(header + arr.tobytes())
    return folder


def test_the_smnist_reader_reads_the_fake_files(tmp_path):
    from data_prep.smnist import load_mnist

    data, _ = load_mnist(write_fake_mnist(tmp_path, n_train=50, n_test=20), verify=False)
    assert data["train"][0].shape == (50, 28, 28) and data["test"][1].shape == (20,)
    assert data["train"][1].dtype == np.int64 and data["train"][1].max() <= 9
    with pytest.raises(ValueError, match="md5"):  # the stand-in is not the official MNIST
        load_mnist(tmp_path)


def test_imbalanced_subset_hits_the_ratio():
    digits = np.random.default_rng(0).integers(0, 10, 2000)
    for ratio in (0.91, 0.5, 0.3):
        keep = spec.imbalanced_subset(digits, ratio, np.random.default_rng(1))
        assert abs((digits[keep] <= 4).mean() - ratio) < 0.01
        assert len(np.unique(keep)) == len(keep)


@pytest.mark.parametrize("source", ["synthetic", "real"])
def test_quick_writes_tables_and_plot_with_every_method(tmp_path, source):
    """``--quick`` on the synthetic stand-in (always) and on the real MNIST (when present)."""
    if source == "real" and not (REAL_MNIST / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"real MNIST not found at {REAL_MNIST}")
    mnist = REAL_MNIST if source == "real" else write_fake_mnist(tmp_path / "mnist")
    runs, out = tmp_path / "runs", tmp_path / "out"
    argv = [
        "--mnist-dir",
        str(mnist),
        "--quick",
        "--jobs",
        "2",
        "--runs",
        str(runs),
        "--out",
        str(out),
    ]
    assert cli.main(argv) == 0
    text = (out / "compare_mnist.md").read_text()
    for label, _ in spec.METHODS.values():
        assert text.count(label) >= 4, label  # AUC, F1 / acc, share, time tables
    assert "u > t" in text and "x CE" in text and "--quick" in text.splitlines()[0]
    assert ("Official MNIST files" in text) == (source == "real")
    assert (out / "compare_mnist.png").stat().st_size > 0
    records = [json.loads(p.read_text()) for p in sorted(runs.glob("*.json"))]
    assert len(records) == len(spec.METHODS)
    assert all(r["iterations_done"] == spec.QUICK_ITERATIONS for r in records)
    # resumes: nothing left to run, and --table-only rebuilds the same tables
    (out / "compare_mnist.md").unlink()
    assert cli.main([*argv, "--table-only"]) == 0
    assert (out / "compare_mnist.md").read_text() == text


def test_pesg_decays_passed_in_one_epoch_keep_the_weights_finite():
    """Both decay points in one epoch: one ``update_regularizer`` call (two in a row divide by 0)."""
    pytest.importorskip("libauc")
    import torch

    labels = torch.tensor([1, 0] * 64)
    model = spec.mlp(0)
    method = spec.make_method("libauc_pesg", model, labels)
    x, idx = torch.rand(128, 784), torch.arange(128)
    for _ in range(2):
        method.opt.zero_grad()
        method.loss(model(x)[:, 0], idx).backward()
        method.opt.step()
        method.end_epoch(10, 10)  # past 50 % and 75 % of a 10-iteration run
    assert method.opt.param_groups[0]["lr"] == pytest.approx(spec.PESG["lr"] / 100)
    assert all(torch.isfinite(p).all() for p in model.parameters())
