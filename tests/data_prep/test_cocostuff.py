"""COCO-Stuff prep: labels vs masks decoded here, shape labels, sky task, determinism, resume, bad input."""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as mask_utils

from data_prep import cocostuff as cs
from data_prep.cocostuff import build, shards
from data_prep.cocostuff_synthetic import (
    CMYK_ID,
    GRAY_ID,
    SKY,
    TIE_ID,
    UNCOMPRESSED_ID,
    UNLABELLED_ID,
    image_id,
    load_truth,
    stuff_labels,
    write_synthetic_cocostuff,
)

SIZE = (24, 32)  # the session caches' size (tests/conftest.py)
# pycocotools 2.0.x under numpy 2 warns on every decode (harmless)
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")
SAMPLE = Path(__file__).resolve().parents[3] / "shared" / "data" / "cocostuff-sample"


def quiet(*_):
    pass


def opts(root: Path, out: Path, **kwargs) -> cs.Options:
    return cs.Options(out=out, root=root, **{"size": SIZE, "workers": 0, **kwargs})


def nearest(a: np.ndarray, size=SIZE) -> np.ndarray:
    return np.asarray(Image.fromarray(a).resize((size[1], size[0]), Image.Resampling.NEAREST))


def decode_json(path: Path) -> dict[int, np.ndarray]:
    """Paint each image's stuff label map (index = id - 92) from the JSON, with pycocotools."""
    doc = json.loads(path.read_text())
    maps = {r["id"]: np.full((r["height"], r["width"]), 255, np.uint8) for r in doc["images"]}
    for a in doc["annotations"]:
        seg = a["segmentation"]
        if isinstance(seg["counts"], list):
            seg = mask_utils.frPyObjects(seg, *seg["size"])
        maps[a["image_id"]][mask_utils.decode(seg) > 0] = a["category_id"] - 92
    return maps


def expected_shape(labels: np.ndarray, num_classes: int, thresholds) -> np.ndarray:
    """The all-class rule written out per image: most common bin over present classes, ties low."""
    out = []
    for lab in labels:
        counts = np.bincount(lab.ravel(), minlength=256)[:num_classes]
        bins = [sum(c / lab.size > t for t in thresholds) for c in counts if c > 0]
        votes = [bins.count(j) for j in range(len(thresholds) + 1)]
        out.append(votes.index(max(votes)))  # first maximum = smallest bin
    return np.array(out)


def npy_digests(out: Path) -> dict[str, str]:
    files = sorted(out.glob("*/*.npy")) + sorted(out.glob("*/table.csv"))
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def small_root(tmp_path: Path, **kwargs) -> Path:
    return write_synthetic_cocostuff(tmp_path / "coco", **{"n_train": 4, "n_val": 2, **kwargs})


# --- labels ---------------------------------------------------------------------------------------


def test_stuff_labels_equal_masks_decoded_here(coco_root, coco_cache_stuff):
    splits, meta = cs.load(coco_cache_stuff)
    truth = load_truth(coco_root)
    assert meta["num_classes"] == 92 and meta["ignore_index"] == 255
    assert meta["class_ids"] == list(range(92, 184)) and meta["image_size"] == list(SIZE)
    assert meta["class_names"][157 - 92] == "sky-other" and meta["class_names"][91] == "other"
    doc = json.loads((coco_root / "annotations" / "stuff_train2017.json").read_text())
    assert any(isinstance(a["segmentation"]["counts"], list) for a in doc["annotations"])
    assert any(isinstance(a["segmentation"]["counts"], str) for a in doc["annotations"])
    for split in cs.SPLITS:
        s = splits[split]
        decoded = decode_json(coco_root / "annotations" / f"stuff_{split}2017.json")
        assert s["image_ids"].tolist() == sorted(decoded)  # every image, ascending id
        assert s["images"].shape == (len(decoded), *SIZE, 3) and s["images"].dtype == np.uint8
        assert s["labels"].shape == (len(decoded), *SIZE) and s["labels"].dtype == np.uint8
        assert isinstance(s["labels"], np.memmap)
        for k, iid in enumerate(s["image_ids"]):
            np.testing.assert_array_equal(decoded[iid], stuff_labels(truth[iid]))  # the fixture
            np.testing.assert_array_equal(s["labels"][k], nearest(decoded[iid]))
        counts = np.stack([np.bincount(x.ravel(), minlength=256)[:92] for x in s["labels"]])
        np.testing.assert_allclose(s["fractions"], counts / (SIZE[0] * SIZE[1]), rtol=1e-6)
        assert s["fractions"].dtype == np.float32 and s["size"].dtype == np.int64
        np.testing.assert_array_equal(s["size"], counts.sum(1))  # labelled pixels
        m = meta["splits"][split]
        assert m["class_pixels"] == counts.sum(0).tolist()
        assert m["class_images"] == (counts > 0).sum(0).tolist()
    assert UNCOMPRESSED_ID in splits["train"]["image_ids"]


def test_stuffthing_labels_equal_the_pngs(coco_root, coco_cache_stuffthing):
    splits, meta = cs.load(coco_cache_stuffthing)
    truth = load_truth(coco_root)
    ids = meta["class_ids"]
    assert meta["num_classes"] == len(ids) == 171 and ids == sorted(ids)
    assert not set(ids) & {12, 26, 29, 30, 45, 66, 68, 69, 71, 83, 91} and ids[-1] == 182
    names = meta["class_names"]
    assert names[:3] == ["person", "bicycle", "car"] and names[ids.index(157)] == "sky-other"
    assert names[79] == "toothbrush" and names[80] == "banner"
    index = np.full(256, 255, np.uint8)
    index[ids] = np.arange(171)
    for split in cs.SPLITS:
        s = splits[split]
        for k, iid in enumerate(s["image_ids"]):
            np.testing.assert_array_equal(s["labels"][k], nearest(index[truth[iid]]))
        np.testing.assert_array_equal(s["shape"], expected_shape(s["labels"], 171, [0.05]))
    k = splits["train"]["image_ids"].tolist().index(TIE_ID)
    present = np.flatnonzero(splits["train"]["fractions"][k])
    assert [ids[c] for c in present] == [1, 124, 157, 169]  # person, grass, sky, tree
    assert splits["train"]["shape"][k] == 0  # 2 big, 2 small: a tie -> small


def test_all_class_shape_labels(coco_cache_stuff):
    splits, meta = cs.load(coco_cache_stuff)
    assert meta["edges"] == [0.05] and meta["shape_bins"] == 2
    for split in cs.SPLITS:
        s = splits[split]
        np.testing.assert_array_equal(s["shape"], expected_shape(s["labels"], 92, [0.05]))
        assert meta["splits"][split]["shape_counts"] == {
            str(b): int((s["shape"] == b).sum()) for b in (0, 1)
        }
    train = splits["train"]
    assert set(train["shape"].tolist()) == {0, 1}
    # the tie image: sky, grass (big) and tree, "other" = the person (small) -> s = 0
    k = train["image_ids"].tolist().index(TIE_ID)
    f = train["fractions"][k]
    assert np.flatnonzero(f).tolist() == [124 - 92, 157 - 92, 169 - 92, 91]
    assert sorted(f[f > 0] > 0.05) == [False, False, True, True] and train["shape"][k] == 0
    # the image without annotations: nothing labelled, s = 0, counted
    k = train["image_ids"].tolist().index(UNLABELLED_ID)
    assert (train["labels"][k] == 255).all() and train["size"][k] == 0 and train["shape"][k] == 0
    assert meta["splits"]["train"]["no_labelled_pixels"] == 1
    with open(coco_cache_stuff / "train" / "table.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["image_id"]) for r in rows] == train["image_ids"].tolist()
    tie = rows[train["image_ids"].tolist().index(TIE_ID)]
    assert tie["shape"] == "0" and tie["classes"] == "32 65 77 91"
    assert tie["file_name"] == f"{TIE_ID:012d}.jpg" and int(tie["orig_height"]) >= 40


def test_shape_rule_on_a_hand_computed_table():
    # 100 pixels per image, 4 classes; t = 0.05: a class is big if it has > 5 pixels
    counts = np.array(
        [
            [50, 30, 3, 2],  # 2 big, 2 small: tie -> 0 (smaller bin)
            [60, 30, 10, 0],  # 3 big -> 1
            [0, 0, 0, 0],  # nothing labelled -> 0
            [5, 6, 0, 0],  # 5 is not > 5: 1 small, 1 big: tie -> 0
            [1, 1, 90, 0],  # 2 small, 1 big -> 0
            [0, 40, 0, 7],  # 2 big -> 1
        ]
    )
    assert cs.majority_shape(counts, 100, [0.05]).tolist() == [0, 1, 0, 0, 0, 1]
    # three bins, thresholds 0.05 < 0.3: per class 0 (<= 5 px), 1 (<= 30 px), 2 (> 30 px)
    counts3 = np.array(
        [
            [50, 20, 10, 2],  # bins 2, 1, 1, 0 -> 1
            [50, 40, 2, 1],  # 2, 2, 0, 0: tie of 0 and 2 -> 0
            [40, 35, 20, 5],  # 2, 2, 1, 0 -> 2
            [31, 30, 6, 0],  # 2, 1, 1 -> 1
        ]
    )
    assert cs.majority_shape(counts3, 100, [0.05, 0.3]).tolist() == [1, 0, 2, 1]
    assert cs.bin_sizes(np.array([1, 5, 6, 10]), [5.0]).tolist() == [0, 0, 1, 1]
    assert cs.size_edges(np.array([0, 10, 20, 30]), 2) == [15.0]
    assert cs.size_edges(np.array([0, 10, 20, 30]), 3) == pytest.approx([10.0, 20.0])


def test_decode_segmentation_formats():
    m = np.zeros((5, 7), np.uint8)
    m[1:3, 2:5] = 1
    rle = mask_utils.encode(np.asfortranarray(m))
    string = {"size": [5, 7], "counts": rle["counts"].decode("ascii")}
    listed = {"size": [5, 7], "counts": [11, 2, 3, 2, 3, 2, 12]}  # column-major runs, zeros first
    polygon = [[2.0, 1.0, 5.0, 1.0, 5.0, 3.0, 2.0, 3.0]]  # x, y corners of the same box
    for seg in (string, listed):
        np.testing.assert_array_equal(cs.decode_segmentation(seg, 5, 7), m)
    assert cs.decode_segmentation(polygon, 5, 7)[1:3, 2:5].all()


def test_sky_task_uses_the_training_threshold(coco_root, coco_cache_sky, coco_cache_stuff):
    sky, meta = cs.load(coco_cache_sky)
    stuff, _ = cs.load(coco_cache_stuff)
    assert meta["num_classes"] == 2 and meta["class_names"] == ["rest", "sky-other"]
    assert meta["class_ids"] == [-1, SKY]
    for split in cs.SPLITS:
        s, a = sky[split], stuff[split]
        has_sky = (a["labels"] == SKY - 92).any(axis=(1, 2))
        assert s["image_ids"].tolist() == a["image_ids"][has_sky].tolist()  # only images with sky
        assert meta["splits"][split]["dropped_no_sky"] == int((~has_sky).sum()) > 0
        full = a["labels"][has_sky]
        expected = np.where(full == 255, 255, (full == SKY - 92).astype(np.uint8))
        np.testing.assert_array_equal(s["labels"], expected)
        np.testing.assert_array_equal(s["size"], (s["labels"] == 1).sum(axis=(1, 2)))
        np.testing.assert_allclose(s["fractions"][:, 1], s["size"] / (SIZE[0] * SIZE[1]))
    t = sky["train"]["size"].mean()
    assert meta["edges"] == [pytest.approx(t)]
    for split in cs.SPLITS:
        np.testing.assert_array_equal(sky[split]["shape"], sky[split]["size"] > t)
    val = sky["val"]["size"]  # the fixture's val skies are bigger: a val-mean rule would differ
    assert ((val > val.mean()) != (val > t)).any()


def test_pixels_are_rgb_from_gray_and_cmyk_jpegs(coco_cache_stuff):
    splits, _ = cs.load(coco_cache_stuff)
    train, val = splits["train"], splits["val"]
    gray = train["images"][train["image_ids"].tolist().index(GRAY_ID)].astype(int)
    assert (gray[..., 0] == gray[..., 1]).all() and (gray[..., 1] == gray[..., 2]).all()
    k = val["image_ids"].tolist().index(CMYK_ID)
    sky_pixels = val["images"][k][val["labels"][k] == SKY - 92]
    assert len(sky_pixels) > 10
    np.testing.assert_allclose(sky_pixels.mean(0), [120, 170, 235], atol=25)  # blue, not inverted


def test_multi_bin_thresholds_and_sky_quantiles(coco_root, tmp_path):
    out = cs.prepare(opts(coco_root, tmp_path / "p3", thresholds=(0.02, 0.2)), log=quiet)
    splits, meta = cs.load(out)
    assert meta["shape_bins"] == 3 and meta["edges"] == [0.02, 0.2]
    for split in cs.SPLITS:
        s = splits[split]
        np.testing.assert_array_equal(s["shape"], expected_shape(s["labels"], 92, [0.02, 0.2]))
    assert len(set(splits["train"]["shape"].tolist())) >= 2
    out = cs.prepare(opts(coco_root, tmp_path / "sky3", only="sky-other", bins=3), log=quiet)
    splits, meta = cs.load(out)
    edges = np.quantile(splits["train"]["size"], [1 / 3, 2 / 3])
    assert meta["edges"] == pytest.approx(edges.tolist()) and meta["options"]["bins"] == 3
    for split in cs.SPLITS:
        s = splits[split]
        np.testing.assert_array_equal(s["shape"], (s["size"][:, None] > edges).sum(1))
    assert set(splits["train"]["shape"].tolist()) == {0, 1, 2}


# --- determinism, re-runs, interruption -----------------------------------------------------------


def test_identical_bytes_across_builds_and_workers(coco_root, tmp_path, coco_cache_stuff):
    a = cs.prepare(opts(coco_root, tmp_path / "a", shard_size=5), log=quiet)
    b = cs.prepare(opts(coco_root, tmp_path / "b", workers=2, shard_size=3), log=quiet)
    assert npy_digests(a) == npy_digests(b) == npy_digests(coco_cache_stuff)
    assert len(npy_digests(a)) == 2 * (len(cs.ARRAYS) + 1)
    meta_a, meta_b = (json.loads((p / cs.META_NAME).read_text()) for p in (a, b))
    assert meta_a == meta_b
    assert not (a / cs.PARTIAL_NAME).exists()  # shards removed after success
    c = cs.prepare(opts(coco_root, tmp_path / "c", interpolation="bilinear"), log=quiet)
    ca, cc = cs.load(a)[0]["train"], cs.load(c)[0]["train"]
    np.testing.assert_array_equal(ca["labels"], cc["labels"])
    assert not np.array_equal(ca["images"], cc["images"])


def test_interrupted_run_resumes_from_its_shards(coco_root, tmp_path, monkeypatch):
    options = opts(coco_root, tmp_path / "out", shard_size=3)  # train: 4 shards, val: 2
    real_write, calls = shards._write_shard, []

    def crash_on_third(path, arrays):
        calls.append(path)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real_write(path, arrays)

    monkeypatch.setattr(shards, "_write_shard", crash_on_third)
    with pytest.raises(KeyboardInterrupt):
        cs.prepare(options, log=quiet)
    out = tmp_path / "out"
    assert not (out / cs.META_NAME).exists() and not cs.is_complete(out)
    assert len(list((out / cs.PARTIAL_NAME / "train").glob("shard_*.npz"))) == 2
    with pytest.raises(
        ValueError, match=r"not hold a complete segmentation cache.*data_prep\.cocostuff"
    ):
        cs.load(out)

    monkeypatch.setattr(shards, "_write_shard", real_write)
    real_process, processed, lines = cs.process_image, [], []
    monkeypatch.setattr(
        shards, "process_image", lambda job: processed.append(job) or real_process(job)
    )
    cs.prepare(options, log=lines.append)
    assert len(processed) == 12 + 6 - 2 * 3  # the two finished shards were not redone
    assert any("train: reused 2 of 4 shards" in line for line in lines)
    reference = cs.prepare(opts(coco_root, tmp_path / "ref"), log=quiet)
    assert npy_digests(out) == npy_digests(reference)
    assert cs.is_complete(out, options) and not (out / cs.PARTIAL_NAME).exists()


def test_crash_before_meta_leaves_an_incomplete_cache(coco_root, tmp_path, monkeypatch):
    options = opts(coco_root, tmp_path, limit=3)
    cs.prepare(options, log=quiet)
    before = npy_digests(tmp_path)

    def crash(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(build, "plot_class_sizes", crash)  # after the arrays, before meta.json
    with pytest.raises(KeyboardInterrupt):
        cs.prepare(cs.Options(**{**options.__dict__, "force": True}), log=quiet)
    assert (tmp_path / "train" / "images.npy").exists() and not cs.is_complete(tmp_path)
    monkeypatch.undo()
    cs.prepare(options, log=quiet)
    assert cs.is_complete(tmp_path, options) and npy_digests(tmp_path) == before


def test_rerun_skips_and_changes_rebuild(tmp_path):
    root = small_root(tmp_path)
    options = opts(root, tmp_path / "out")
    cs.prepare(options, log=quiet)
    lines = []
    cs.prepare(options, log=lines.append)
    assert len(lines) == 1 and "nothing to do" in lines[0]
    changed = cs.Options(**{**options.__dict__, "threshold": 0.2})
    assert not cs.is_complete(tmp_path / "out", changed)
    lines.clear()
    cs.prepare(changed, log=lines.append)
    assert "nothing to do" not in lines[-1] and cs.load(tmp_path / "out")[1]["edges"] == [0.2]
    ann = root / "annotations" / "stuff_val2017.json"
    ann.write_text(ann.read_text() + "\n")  # same content, other bytes: inputs changed
    lines.clear()
    cs.prepare(changed, log=lines.append)
    assert "nothing to do" not in lines[-1]
    lines.clear()
    cs.prepare(cs.Options(**{**changed.__dict__, "force": True}), log=lines.append)
    assert "nothing to do" not in lines[-1]


def test_load_rejects_a_damaged_cache(coco_cache_stuff, tmp_path):
    copy = Path(shutil.copytree(coco_cache_stuff, tmp_path / "copy"))
    assert cs.load(copy, verify=True)[1]["setup"] == "stuff"
    with open(copy / "val" / "labels.npy", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ValueError, match=r"val/labels\.npy is missing or has the wrong size"):
        cs.load(copy)
    with pytest.raises(ValueError, match=r"no meta\.json.*--root"):
        cs.load(tmp_path / "nothing-here")


# --- inputs: layouts, the real sample, bad input ---------------------------------------------------


def test_other_layouts_give_the_same_cache(tmp_path):
    root = small_root(tmp_path)
    ref = cs.prepare(opts(root, tmp_path / "ref"), log=quiet)
    flat = tmp_path / "flat"  # JSONs at the root, images under images/
    (flat / "images").mkdir(parents=True)
    for s in cs.SPLITS:
        shutil.copy(root / "annotations" / f"stuff_{s}2017.json", flat)
        shutil.copytree(root / f"{s}2017", flat / "images" / f"{s}2017")
    assert npy_digests(cs.prepare(opts(flat, tmp_path / "o1"), log=quiet)) == npy_digests(ref)
    explicit = cs.Options(
        out=tmp_path / "o2", annotations=flat, images=flat / "images", size=SIZE, workers=0
    )
    assert npy_digests(cs.prepare(explicit, log=quiet)) == npy_digests(ref)


@pytest.mark.skipif(not SAMPLE.is_dir(), reason=f"no COCO-Stuff sample at {SAMPLE}")
def test_the_real_official_annotation_file(tmp_path):
    root = tmp_path / "real"
    doc = json.loads((SAMPLE / "stuff_examples.json").read_text())
    photos = sorted(SAMPLE.glob("COCO_train2014_*.jpg"))
    for s in cs.SPLITS:
        (root / "annotations").mkdir(parents=True, exist_ok=True)
        shutil.copy(SAMPLE / "stuff_examples.json", root / "annotations" / f"stuff_{s}2017.json")
        (root / f"{s}2017").mkdir()
        for r, photo in zip(doc["images"], photos, strict=True):  # stand-in photos, resized
            im = Image.open(photo).convert("RGB").resize((r["width"], r["height"]))
            im.save(root / f"{s}2017" / r["file_name"])
    splits, meta = cs.load(cs.prepare(opts(root, tmp_path / "out"), log=quiet))
    decoded = decode_json(root / "annotations" / "stuff_train2017.json")
    for k, iid in enumerate(splits["train"]["image_ids"]):
        np.testing.assert_array_equal(splits["train"]["labels"][k], nearest(decoded[iid]))
    # the fixture's and the module's names are the real ones
    from data_prep.cocostuff_synthetic import STUFF_NAMES

    assert {c["id"]: c["name"] for c in doc["categories"]} == STUFF_NAMES
    assert meta["class_names"] == [STUFF_NAMES[i] for i in range(92, 184)]
    official = dict(
        line.split(": ", 1) for line in (SAMPLE / "labels.txt").read_text().splitlines() if line
    )
    assert {i: official[str(i)] for i in cs.THING_NAMES} == cs.THING_NAMES
    unused = {
        "street sign",
        "hat",
        "shoe",
        "eye glasses",
        "plate",
        "mirror",
        "window",
        "desk",
        "door",
        "blender",
        "hair brush",
    }
    assert {official[str(i)] for i in cs.UNUSED_THING_IDS} == unused


def test_missing_and_corrupt_images_are_listed(tmp_path, capsys):
    lost, broken, no_png = image_id("train", 1), image_id("val", 0), image_id("train", 2)
    root = small_root(tmp_path, missing=(lost,), corrupt=(broken,), missing_maps=(no_png,))
    splits, meta = cs.load(cs.prepare(opts(root, tmp_path / "out")))
    assert (
        "skipped image 1017 (missing image train2017/000000001017.jpg)" in capsys.readouterr().out
    )
    train, val = meta["splits"]["train"], meta["splits"]["val"]
    assert train["skipped_count"] == 1 and train["count"] == 3
    assert train["skipped"] == [
        {
            "image_id": lost,
            "file_name": f"{lost:012d}.jpg",
            "reason": f"missing image train2017/{lost:012d}.jpg",
        }
    ]
    assert val["skipped_count"] == 1 and val["skipped"][0]["image_id"] == broken
    assert val["skipped"][0]["reason"].startswith(f"unreadable image val2017/{broken:012d}.jpg")
    assert lost not in splits["train"]["image_ids"] and broken not in splits["val"]["image_ids"]
    _, meta = cs.load(cs.prepare(opts(root, tmp_path / "st", setup="stuffthing"), log=quiet))
    reasons = {s["image_id"]: s["reason"] for s in meta["splits"]["train"]["skipped"]}
    assert reasons == {
        lost: f"missing image train2017/{lost:012d}.jpg",
        no_png: f"missing stuffthing map train2017/{no_png:012d}.png",
    }


def test_a_split_without_readable_images_is_an_error(tmp_path):
    root = small_root(tmp_path, missing=(image_id("val", 0),), corrupt=(image_id("val", 1),))
    with pytest.raises(ValueError, match=r"val: none of the 2 images could be read \(missing"):
        cs.prepare(opts(root, tmp_path / "out"), log=quiet)
    assert not cs.is_complete(tmp_path / "out")


def _edit_json(root: Path, split: str, edit) -> None:
    path = root / "annotations" / f"stuff_{split}2017.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def test_annotation_for_an_unknown_image(tmp_path):
    root = small_root(tmp_path)
    _edit_json(
        root,
        "val",
        lambda d: d["annotations"].append({**d["annotations"][0], "id": 42, "image_id": 999999}),
    )
    with pytest.raises(
        ValueError, match=r"stuff_val2017\.json: annotation 42 refers to image 999999"
    ):
        cs.prepare(opts(root, tmp_path / "out"), log=quiet)


def test_wrong_category_ids(tmp_path):
    root = small_root(tmp_path)
    _edit_json(root, "train", lambda d: d["annotations"][0].update(category_id=12, id=7))
    with pytest.raises(
        ValueError, match=r"annotation 7 \(image \d+\) has category_id 12; .*92\.\.183"
    ):
        cs.prepare(opts(root, tmp_path / "out"), log=quiet)
    root = small_root(tmp_path / "b")
    png = root / "stuffthingmaps_trainval2017" / "train2017" / f"{TIE_ID:012d}.png"
    values = np.array(Image.open(png))
    values[0, :3] = [11, 182, 255]  # id 12 is unused, 183 ("other") is no stuffthing class
    Image.fromarray(values).save(png)
    with pytest.raises(ValueError, match=rf"{TIE_ID:012d}\.png: value\(s\) \[11, 182\] are not"):
        cs.prepare(opts(root, tmp_path / "out", setup="stuffthing"), log=quiet)


def test_missing_inputs_are_listed(tmp_path):
    root = small_root(tmp_path)
    (root / "annotations" / "stuff_val2017.json").unlink()
    with pytest.raises(
        ValueError, match=r"stuff_val2017\.json: looked for .*annotations/stuff_val"
    ):
        cs.prepare(opts(root, tmp_path / "out"), log=quiet)
    shutil.rmtree(root / "stuffthingmaps_trainval2017")
    with pytest.raises(ValueError, match=r"(?s)stuff_val2017.*stuffthingmaps folder train2017"):
        cs.prepare(opts(root, tmp_path / "out", setup="stuffthing"), log=quiet)
    with pytest.raises(ValueError, match="root must be given"):
        cs.prepare(cs.Options(out=tmp_path / "out"), log=quiet)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"threshold": 0.0}, r"threshold must be a number in \(0, 1\).*got 0\.0"),
        ({"threshold": 1.5}, r"threshold must be a number in \(0, 1\)"),
        (
            {"thresholds": (0.2, 0.1)},
            r"thresholds must be strictly increasing .*got \(0\.2, 0\.1\)",
        ),
        ({"size": (0, 10)}, r"size must be two integers >= 1"),
        ({"size": (10,)}, r"size must be two integers >= 1"),
        ({"only": "sky-other", "bins": 1}, r"bins must be an integer >= 2, got 1"),
        ({"bins": 3}, r"bins must be 2 without only='sky-other'"),
        ({"only": "sky-other", "thresholds": (0.1, 0.2)}, r"thresholds must be empty with only"),
        ({"only": "sky"}, r"only must be 'sky-other'.*got 'sky'"),
        ({"setup": "stuffthing", "only": "sky-other"}, r"needs setup 'stuff'.*'stuffthing'"),
        ({"setup": "things"}, r"setup must be one of \('stuff', 'stuffthing'\)"),
        ({"interpolation": "nearest"}, r"interpolation must be one of \('area', 'bilinear'\)"),
        ({"limit": 0}, r"limit must be None or an integer >= 1"),
        ({"workers": -1}, r"workers must be an integer >= 0"),
    ],
)
def test_bad_options(kwargs, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        cs.prepare(opts(tmp_path, tmp_path / "out", **kwargs), log=quiet)


def test_cli(tmp_path, capsys):
    root = small_root(tmp_path)
    argv = ["--root", str(root), "--setup", "stuff", "--size", "12", "16", "--workers", "0"]
    assert cs.main([*argv, "--out", str(tmp_path / "o"), "--limit", "3"]) == 0
    assert "train 3 / val 2 images" in capsys.readouterr().out
    splits, meta = cs.load(tmp_path / "o")
    assert splits["train"]["images"].shape == (3, 12, 16, 3) and meta["options"]["limit"] == 3
    assert splits["train"]["image_ids"].tolist() == [image_id("train", i) for i in range(3)]
    assert cs.main([*argv, "--out", str(tmp_path / "o"), "--limit", "3"]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert cs.main([*argv, "--out", str(tmp_path / "p"), "--only", "sky"]) == 2
    assert "error: only must be 'sky-other'" in capsys.readouterr().err
    assert cs.main([*argv, "--out", str(tmp_path / "p"), "--threshold", "2"]) == 2
    assert "error: threshold must be" in capsys.readouterr().err
