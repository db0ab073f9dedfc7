"""S-MNIST generation: construction, shape labels, determinism, atomic output, bad input."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil

import numpy as np
import pytest

from data_prep import smnist


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_construction_and_shape_labels(digits_smnist):
    splits, meta = smnist.load(digits_smnist)
    train, test = splits["train"], splits["test"]
    assert train["images"].shape == (600, 56, 56) and train["images"].dtype == np.uint8
    assert test["images"].shape == (2 * 300, 56, 56)  # limit 300 per split, fraction 1
    for s in (train, test):
        # both copies keep the digit label; originals come first, copies point at their source
        orig, copy = s["rescaled"] == 0, s["rescaled"] == 1
        np.testing.assert_array_equal(s["labels"][copy], s["labels"][orig][s["source_index"][copy]])
        np.testing.assert_array_equal(s["size"], (s["images"] > 0).sum(axis=(1, 2)))
        # bimodal: every 2x copy has >= 3x the foreground of its original
        assert (s["size"][copy] >= 3 * s["size"][orig][s["source_index"][copy]]).all()
    threshold = meta["threshold"]
    assert threshold == pytest.approx(train["size"].mean())
    for s in (train, test):  # the test split uses the training threshold
        np.testing.assert_array_equal(s["shape"], (s["size"] > threshold).astype(np.int64))
    # the threshold separates the two modes: originals small, copies big
    assert train["shape"][train["rescaled"] == 0].mean() < 0.05
    assert train["shape"][train["rescaled"] == 1].mean() > 0.9
    c = meta["counts"]["train"]
    assert sum(c["per_digit"].values()) == 600 and sum(c["per_shape"].values()) == 600
    assert (digits_smnist / smnist.PLOT_NAME).stat().st_size > 10_000


def test_originals_are_centred_unchanged():
    x = np.arange(28 * 28, dtype=np.uint8).reshape(1, 28, 28)
    out = smnist.place_centred(x, 56)
    np.testing.assert_array_equal(out[0, 14:42, 14:42], x[0])
    assert out[0, :14].sum() == 0 and out[0, :, :14].sum() == 0
    big = np.ones((1, 60, 61), np.uint8)
    assert smnist.place_centred(big, 56).shape == (1, 56, 56)  # centre-cropped


def test_options_fraction_factor_canvas(tmp_path):
    opts = smnist.Options(source="digits", limit=50, fraction=0.5, factor=1.5, canvas=64, seed=3)
    smnist.prepare(tmp_path, opts, log=lambda *_: None)
    splits, meta = smnist.load(tmp_path)
    assert splits["train"]["images"].shape == (75, 64, 64)
    assert meta["counts"]["train"]["rescaled_copies"] == 25
    assert meta["options"]["factor"] == 1.5 and meta["options"]["seed"] == 3


def test_same_options_give_identical_bytes(tmp_path):
    opts = smnist.Options(source="digits", limit=40)
    a, b = tmp_path / "a", tmp_path / "b"
    smnist.prepare(a, opts, log=lambda *_: None)
    smnist.prepare(b, opts, log=lambda *_: None)
    assert _sha(a / smnist.NPZ_NAME) == _sha(b / smnist.NPZ_NAME)
    assert json.loads((a / smnist.META_NAME).read_text()) == json.loads(
        (b / smnist.META_NAME).read_text()
    )
    smnist.prepare(b, smnist.Options(source="digits", limit=40, seed=1), log=lambda *_: None)
    assert _sha(a / smnist.NPZ_NAME) != _sha(b / smnist.NPZ_NAME)


def test_rerun_skips_finished_work(tmp_path):
    opts = smnist.Options(source="digits", limit=20)
    smnist.prepare(tmp_path, opts, log=lambda *_: None)
    lines = []
    smnist.prepare(tmp_path, opts, log=lines.append)
    assert "nothing to do" in lines[0]


def test_interrupted_write_leaves_no_complete_looking_output(tmp_path, monkeypatch):
    opts = smnist.Options(source="digits", limit=20)

    def crash(path, arrays):
        path.write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(smnist, "write_npz", crash)
    with pytest.raises(KeyboardInterrupt):
        smnist.prepare(tmp_path, opts, log=lambda *_: None)
    assert list(tmp_path.iterdir()) == []  # temp file removed, nothing final written
    assert not smnist.is_complete(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not hold a complete S-MNIST build"):
        smnist.load(tmp_path)


def test_rebuild_after_a_crash_between_data_and_meta(tmp_path, monkeypatch):
    opts = smnist.Options(source="digits", limit=20)
    smnist.prepare(tmp_path, opts, log=lambda *_: None)
    (tmp_path / smnist.NPZ_NAME).write_bytes(b"truncated")  # e.g. a copy cut short
    assert not smnist.is_complete(tmp_path, opts)
    smnist.prepare(tmp_path, opts, log=lambda *_: None)
    assert smnist.is_complete(tmp_path, opts)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"canvas": 20}, "canvas must be an integer >= 28"),
        ({"factor": 0}, "factor must be"),
        ({"fraction": 1.5}, "fraction must be"),
        ({"interpolation": "lanczos"}, "interpolation must be one of"),
        ({"limit": 0}, "limit must be"),
        ({"source": "emnist"}, "source must be"),
    ],
)
def test_bad_options(kwargs, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        smnist.prepare(tmp_path, smnist.Options(**kwargs))


def test_missing_files_are_listed(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing train-images-idx3-ubyte.*expected"):
        smnist.find_mnist_files(tmp_path)
    assert smnist.main(["--mnist-dir", str(tmp_path), "--out", str(tmp_path / "o")]) == 2


def test_checksum_mismatch_names_the_file(tmp_path, mnist_dir):
    for f in mnist_dir.glob("*.gz"):
        shutil.copy(f, tmp_path / f.name)
    bad = tmp_path / "t10k-labels-idx1-ubyte.gz"
    data = bytearray(bad.read_bytes())
    data[-1] ^= 0xFF
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"t10k-labels-idx1-ubyte.gz: md5 .* does not match"):
        smnist.find_mnist_files(tmp_path)


def test_real_mnist_gz_and_raw_give_the_same_build(tmp_path, mnist_dir):
    opts = smnist.Options(limit=500)
    smnist.prepare(tmp_path / "gz", opts, mnist_dir=mnist_dir, log=lambda *_: None)
    raw = tmp_path / "raw"
    raw.mkdir()
    for f in mnist_dir.glob("*.gz"):
        (raw / f.stem).write_bytes(gzip.decompress(f.read_bytes()))
    smnist.prepare(tmp_path / "out-raw", opts, mnist_dir=raw, log=lambda *_: None)
    assert _sha(tmp_path / "gz" / smnist.NPZ_NAME) == _sha(tmp_path / "out-raw" / smnist.NPZ_NAME)
    splits, meta = smnist.load(tmp_path / "gz")
    assert splits["train"]["images"].shape == (1000, 56, 56)
    assert meta["inputs_md5"]["train-images-idx3-ubyte.gz"] == "f68b3c2dcbeaaa9fbdd348bbdeb94873"
    assert 0.3 < splits["train"]["shape"].mean() < 0.7


def test_cli_digits(tmp_path, capsys):
    assert smnist.main(["--source", "digits", "--limit", "30", "--out", str(tmp_path)]) == 0
    assert "train 60 / test 60 images" in capsys.readouterr().out
    assert smnist.is_complete(tmp_path)
