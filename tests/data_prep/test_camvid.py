"""CamVid prep: labels and shape labels against a re-derivation here, on real frames (skipped when
../shared/data/camvid is absent) and on a small synthetic copy of the SegNet layout; determinism;
bad input named in one line with nothing written; format-1 caches still read."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from data_prep import camvid
from train.caches import segmentation

CAMVID = Path(__file__).resolve().parents[3] / "shared" / "data" / "camvid"
SIZE = (24, 32)
needs_camvid = pytest.mark.skipif(not (CAMVID / "train").is_dir(), reason="no CamVid copy here")


def quiet(*_):
    pass


def write_layout(root: Path, n: int = 3, hw=(36, 48), seed: int = 0) -> Path:
    """A CamVid-shaped folder: ``n`` random frames per split with labels 0..11 (11: unlabelled)."""
    rng = np.random.default_rng(seed)
    for split in camvid.SPLITS:
        (root / split).mkdir(parents=True)
        (root / f"{split}annot").mkdir()
        for i in range(n):
            image = rng.integers(0, 256, (*hw, 3), dtype=np.uint8)
            label = rng.integers(0, 12, hw, dtype=np.uint8)
            label[: hw[0] * (i + 1) // (n + 1)] = 0  # a sky band of growing height
            Image.fromarray(image).save(root / split / f"f{i:03d}.png")
            Image.fromarray(label).save(root / f"{split}annot" / f"f{i:03d}.png")
    return root


def write_cache(tmp: Path, task: str, n: int, hw: tuple[int, int]) -> Path:
    """A cache built from :func:`write_layout`'s frames (``tmp/cache``)."""
    root = write_layout(tmp / "camvid", n=n, hw=hw)
    camvid.prepare(camvid.Options(root=root, out=tmp / "cache", task=task, size=hw), log=quiet)
    return tmp / "cache"


def nearest(a: np.ndarray, size=SIZE) -> np.ndarray:
    return np.asarray(Image.fromarray(a).resize((size[1], size[0]), Image.Resampling.NEAREST))


def digests(out: Path) -> dict[str, str]:
    files = sorted(out.glob("*/*.npy")) + sorted(out.glob("*/table.csv"))
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def check_cache(root: Path, out: Path, task: str, limit: int | None = None) -> None:
    """Every label, shape label and size of the cache re-derived from the PNGs."""
    splits, meta = segmentation.load(out, verify=True)
    assert meta["split_names"] == ["train", "val", "test"]
    assert segmentation.eval_splits(meta) == ("val", "test")
    h, w = meta["image_size"]
    derived = {}
    for split in camvid.SPLITS:
        names = sorted(p.name for p in (root / split).glob("*.png"))[:limit]
        labels = np.stack(
            [nearest(np.asarray(Image.open(root / f"{split}annot" / n)), (h, w)) for n in names]
        )
        labels = np.where(labels == 11, 255, labels).astype(np.uint8)
        if task == "sky":
            labels = np.where(labels == 255, 255, (labels == 0).astype(np.uint8))
            keep = (labels == 1).any((1, 2))
            labels = labels[keep]
            assert meta["splits"][split]["dropped_no_sky"] == int((~keep).sum())
        np.testing.assert_array_equal(splits[split]["labels"], labels)
        derived[split] = labels
    if task == "sky":
        t = (derived["train"] == 1).sum((1, 2)).mean()
        assert meta["edges"] == pytest.approx([t])
        for split, labels in derived.items():
            size = (labels == 1).sum((1, 2))
            np.testing.assert_array_equal(splits[split]["size"], size)
            np.testing.assert_array_equal(splits[split]["shape"], (size > t).astype(np.int64))
    else:
        for split, labels in derived.items():
            expected = []
            for lab in labels:  # majority vote of 1[f_c > 0.05] over classes present, ties -> 0
                counts = np.bincount(lab[lab != 255], minlength=11)
                bins = [int(c / lab.size > 0.05) for c in counts if c > 0]
                expected.append(int(bins.count(1) > bins.count(0)))
            np.testing.assert_array_equal(splits[split]["shape"], expected)
            np.testing.assert_allclose(
                splits[split]["fractions"],
                np.stack([np.bincount(x[x != 255], minlength=11) / x.size for x in labels]),
                rtol=1e-6,
            )
    assert (out / segmentation.PLOT_NAME).is_file()


@needs_camvid
@pytest.mark.parametrize("task", camvid.TASKS)
def test_real_camvid_frames(task, tmp_path):
    out = tmp_path / task
    camvid.prepare(camvid.Options(root=CAMVID, out=out, task=task, size=SIZE, limit=4), log=quiet)
    check_cache(CAMVID, out, task, limit=4)
    splits, meta = segmentation.load(out)
    assert meta["class_names"] == (["rest", "sky"] if task == "sky" else list(camvid.CLASS_NAMES))
    assert splits["train"]["images"].shape[1:] == (*SIZE, 3)


@pytest.mark.parametrize("task", camvid.TASKS)
def test_synthetic_layout_rederived(task, tmp_path):
    root = write_layout(tmp_path / "camvid")
    out = tmp_path / "out"
    camvid.prepare(camvid.Options(root=root, out=out, task=task, size=SIZE), log=quiet)
    check_cache(root, out, task)


def test_deterministic_and_rerun_does_nothing(tmp_path):
    root = write_layout(tmp_path / "camvid")
    a, b = tmp_path / "a", tmp_path / "b"
    camvid.prepare(camvid.Options(root=root, out=a, size=SIZE), log=quiet)
    camvid.prepare(camvid.Options(root=root, out=b, size=SIZE), log=quiet)
    assert digests(a) == digests(b)
    said = []
    camvid.prepare(camvid.Options(root=root, out=a, size=SIZE), log=said.append)
    assert "nothing to do" in said[0]
    camvid.prepare(camvid.Options(root=root, out=a, size=SIZE, threshold=0.2), log=said.append)
    assert json.loads((a / "meta.json").read_text())["options"]["threshold"] == 0.2


def _damage(root: Path, kind: str) -> Path:
    label = root / "valannot" / "f001.png"
    if kind == "missing folder":
        shutil.rmtree(root / "testannot")
        return root / "testannot"
    if kind == "missing label":
        label.unlink()
        return label
    if kind == "wrong size":
        Image.fromarray(np.zeros((10, 10), np.uint8)).save(label)
    elif kind == "value > 11":
        Image.fromarray(np.full((36, 48), 12, np.uint8)).save(label)
    elif kind == "truncated":
        frame = root / "val" / "f001.png"
        frame.write_bytes(frame.read_bytes()[:200])
        return frame
    return label


@pytest.mark.parametrize(
    "kind", ["missing folder", "missing label", "wrong size", "value > 11", "truncated"]
)
def test_bad_input_names_the_file_and_writes_nothing(kind, tmp_path, capsys):
    root = write_layout(tmp_path / "camvid")
    culprit = _damage(root, kind)
    out = tmp_path / "out"
    rc = camvid.main(["--root", str(root), "--out", str(out), "--size", "24", "32"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert str(culprit) in err
    assert not out.exists()  # every frame is checked before anything is written


def test_failed_rebuild_leaves_the_previous_cache(tmp_path):
    root = write_layout(tmp_path / "camvid")
    out = tmp_path / "out"
    camvid.prepare(camvid.Options(root=root, out=out, size=SIZE), log=quiet)
    before = digests(out)
    _damage(root, "value > 11")
    with pytest.raises(ValueError, match="label value 12 > 11"):
        camvid.prepare(camvid.Options(root=root, out=out, size=SIZE, force=True), log=quiet)
    assert digests(out) == before and segmentation.inspect(out)[0] is not None


def test_bad_options(tmp_path):
    for kwargs, match in (
        ({"task": "cars"}, "--task"),
        ({"threshold": 1.5}, "--threshold"),
        ({"thresholds": (0.2, 0.1)}, "--thresholds"),
        ({"bins": 1}, "--bins"),
        ({"size": (0, 5)}, "--size"),
    ):
        with pytest.raises(ValueError, match=match):
            camvid.prepare(camvid.Options(root=tmp_path, out=tmp_path / "o", **kwargs))
    with pytest.raises(ValueError, match=r"--root .*no such folder"):
        camvid.prepare(camvid.Options(root=tmp_path / "nope", out=tmp_path / "o"))


def test_format_1_caches_still_read_and_unknown_formats_refused(tmp_path):
    root = write_layout(tmp_path / "camvid")
    out = tmp_path / "out"
    camvid.prepare(camvid.Options(root=root, out=out, size=SIZE), log=quiet)
    meta = json.loads((out / "meta.json").read_text())
    old = {k: v for k, v in meta.items() if k != "split_names"} | {"format_version": 1}
    old["files"] = {k: v for k, v in meta["files"].items() if not k.startswith("test/")}
    (out / "meta.json").write_text(json.dumps(old))
    splits, _ = segmentation.load(out)  # a format-1 (COCO-Stuff) cache: train and val
    assert list(splits) == ["train", "val"]
    assert segmentation.eval_splits(old) == ("val", "val")
    (out / "meta.json").write_text(json.dumps(meta | {"format_version": 9}))
    with pytest.raises(ValueError, match=r"format_version 9.*reads \[1, 2\].*--force"):
        segmentation.load(out)
