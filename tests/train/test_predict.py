"""``python -m train.predict``: a tiny CamVid-layout run trained end to end (2 epochs, what the
trainer now records: ``run.json`` and ``checkpoints/best.pt``), then class maps and overlays of PNG
and JPEG files of other sizes checked against the checkpoint's own argmax; every error case is one
line on stderr with exit code 2. ``main(argv)`` runs in this process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from data_prep import camvid
from tests.data_prep.test_camvid import write_layout
from train import checkpoint, run_info
from train import config as C
from train.__main__ import main as train_main
from train.models import build_model
from train.predict import CAMVID_COLOURS, class_palette, main, read_image
from train.reporting import class_palette as seeded_palette

ROOT = Path(__file__).resolve().parents[2]
SIZE = (32, 48)  # the training size (H, W) of the run below


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """DeepLabV3+ / ResNet-18 (random init) trained 2 epochs on a CamVid-layout cache, 11 classes."""
    tmp = tmp_path_factory.mktemp("predict")
    root = write_layout(tmp / "camvid", n=4, hw=SIZE)
    cache = tmp / "cache"
    camvid.prepare(camvid.Options(root=root, out=cache, task="all", size=SIZE), log=lambda *_: None)
    out = tmp / "run"
    rc = train_main(
        [
            "--config",
            str(ROOT / "configs" / "camvid.yaml"),
            "--out",
            str(out),
            f"data.path={cache}",
            "data.batch_size=4",
            "train.epochs=2",
            "train.progress=false",
            "train.log_images=0",
            "train.keep_checkpoints=2",  # both epochs' step checkpoints, to compare with best.pt
        ]
    )
    assert rc == 0
    return out


@pytest.fixture
def images(tmp_path) -> list[Path]:
    """PNG and JPEG files of other sizes and modes than the training images."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "images"
    folder.mkdir()
    arrays = {
        "a.png": rng.integers(0, 256, (37, 53, 3), dtype=np.uint8),  # RGB, larger, odd size
        "b.jpg": rng.integers(0, 256, (*SIZE, 3), dtype=np.uint8),  # the training size
        "c.png": rng.integers(0, 256, (20, 11), dtype=np.uint8),  # grayscale, smaller
    }
    for name, array in arrays.items():
        Image.fromarray(array).save(folder / name)
    (folder / "notes.txt").write_text("not an image: left out")
    return [folder / name for name in arrays]


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """``python -m train.predict ARGV`` in this process: (exit code, stdout, stderr)."""
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse
        rc = e.code
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def _fails(argv: list[str], capsys, *expected: str) -> str:
    """The command exits 2 with one line ``error: ...`` on stderr containing ``expected``."""
    rc, _, err = _cli(argv, capsys)
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    for text in expected:
        assert text in err, err
    return err


def _reference(run: Path, ckpt: Path, paths: list[Path], batch: int) -> list[np.ndarray]:
    """The class maps computed here from the checkpoint: the run's network, each image resized to
    the training size (bilinear) as uint8 (B, 3, H, W), argmax, resized back (nearest)."""
    cfg = C.load(run / "config.yaml")
    model = build_model(cfg.model, SIZE, 11)
    model.load_state_dict(torch.load(ckpt, weights_only=True)["model"])
    model.eval()
    originals = [Image.open(p).convert("RGB") for p in paths]
    x = torch.stack(
        [
            torch.from_numpy(np.array(im.resize(SIZE[::-1], Image.Resampling.BILINEAR)))
            .permute(2, 0, 1)
            .contiguous()
            for im in originals
        ]
    )
    with torch.no_grad():
        small = torch.cat([model(x[i : i + batch])[0].argmax(1) for i in range(0, len(x), batch)])
    return [
        np.asarray(
            Image.fromarray(s.numpy().astype(np.uint8)).resize(im.size, Image.Resampling.NEAREST)
        )
        for s, im in zip(small, originals, strict=True)
    ]


def test_the_trainer_records_what_predict_needs(run):
    info = json.loads((run / "run.json").read_text())
    assert info["num_classes"] == 11 and info["image_size"] == list(SIZE)
    assert info["class_names"] == list(camvid.CLASS_NAMES) and info["shape_scores"] == 1
    assert info["input"]["dtype"] == "uint8" and info["task"] == "segmentation"
    selected = json.loads((run / "metrics.json").read_text())["selected"]["epoch"]
    best = checkpoint.load(run_info.best_path(run))
    assert best["epoch"] == selected and best["format"] == run_info.FORMAT
    # the weights of the selected epoch's step checkpoint, bit for bit
    (step,) = [p for p in checkpoint.listing(run) if checkpoint.load(p)["epoch"] == selected]
    state = checkpoint.load(step)
    assert best["global_step"] == state["global_step"]
    assert best["model"].keys() == state["model"].keys()
    assert all(torch.equal(best["model"][k], state["model"][k]) for k in best["model"])
    assert len(checkpoint.listing(run)) == 2  # best.pt is not a step checkpoint (not pruned)


@pytest.mark.parametrize("which, batch", [("best", 8), ("last", 1)])
def test_class_maps_are_the_checkpoints_argmax(run, images, tmp_path, capsys, which, batch):
    out = tmp_path / "out"
    argv = ["--run", str(run), "--images", str(images[0].parent), "--out", str(out)]
    rc, stdout, err = _cli([*argv, "--checkpoint", which, "--batch-size", str(batch)], capsys)
    assert rc == 0 and err == "", err
    ckpt = run_info.best_path(run) if which == "best" else checkpoint.listing(run)[0]
    assert str(ckpt) in stdout and "wrote 3 class map(s)" in stdout
    expected = _reference(run, ckpt, images, batch)
    assert sorted(p.name for p in (out / "classes").iterdir()) == ["a.png", "b.png", "c.png"]
    for path, want in zip(images, expected, strict=True):
        written = Image.open(out / "classes" / f"{path.stem}.png")
        assert written.mode == "L" and written.size == Image.open(path).size
        np.testing.assert_array_equal(np.asarray(written), want)
        assert np.asarray(written).max() < 11
        shown = Image.open(out / "overlays" / f"{path.stem}.png")
        assert shown.mode == "RGB" and shown.size == Image.open(path).size
    # the overlay is the image blended half and half with CamVid's colour of each pixel's class
    image = np.asarray(Image.open(images[0]).convert("RGB")).astype(float)
    colours = class_palette(camvid.CLASS_NAMES, 11)[expected[0]].astype(float)
    shown = np.asarray(Image.open(out / "overlays" / "a.png")).astype(float)
    assert np.abs(shown - (image + colours) / 2).max() <= 1


def test_unreadable_images_stop_the_run_or_are_skipped(run, images, tmp_path, capsys):
    folder = images[0].parent
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    argv = ["--run", str(run), "--images", str(folder), "--out", str(tmp_path / "out")]
    _fails(argv, capsys, "broken.png: not a readable image")
    rc, stdout, err = _cli([*argv, "--skip-bad"], capsys)
    assert rc == 0 and err.startswith("warning: skipped ") and "broken.png" in err
    assert "wrote 3 class map(s)" in stdout and "skipped 1 unreadable image(s)" in stdout
    for path in images:
        assert (tmp_path / "out" / "classes" / f"{path.stem}.png").is_file()


def _copy_run(run: Path, dst: Path, *, best: bool = True, steps: bool = True) -> Path:
    """A copy of the run folder: config.yaml, run.json, and links to the chosen checkpoints."""
    (dst / checkpoint.FOLDER).mkdir(parents=True)
    for name in ("config.yaml", run_info.NAME):
        shutil.copy(run / name, dst / name)
    chosen = ([run_info.best_path(run)] if best else []) + (
        checkpoint.listing(run) if steps else []
    )
    for path in chosen:
        (dst / checkpoint.FOLDER / path.name).symlink_to(path)
    return dst


def test_best_missing_falls_back_to_the_last_checkpoint(run, images, tmp_path, capsys):
    copy = _copy_run(run, tmp_path / "copy", best=False)
    argv = ["--run", str(copy), "--images", str(images[0].parent), "--out", str(tmp_path / "o")]
    rc, stdout, err = _cli(argv, capsys)
    assert rc == 0 and err.startswith("note: ") and "best.pt does not exist" in err
    assert checkpoint.listing(copy)[0].name in err and checkpoint.listing(copy)[0].name in stdout


def test_run_folder_errors(run, images, tmp_path, capsys):
    folder = str(images[0].parent)

    def argv(r: Path) -> list[str]:
        return ["--run", str(r), "--images", folder, "--out", str(tmp_path / "o")]

    _fails(argv(tmp_path / "nowhere"), capsys, "no such folder")
    (tmp_path / "empty").mkdir()
    _fails(argv(tmp_path / "empty"), capsys, "no config.yaml")
    older = _copy_run(run, tmp_path / "older")
    (older / run_info.NAME).unlink()  # a run of the trainer before run.json
    _fails(argv(older), capsys, "run.json does not exist", "number of classes")
    bare = _copy_run(run, tmp_path / "bare", best=False, steps=False)
    _fails(argv(bare), capsys, "no checkpoint in")
    smnist = tmp_path / "smnist"
    smnist.mkdir()
    C.save(C.load(ROOT / "configs" / "demo.yaml"), smnist / "config.yaml")
    _fails(argv(smnist), capsys, "S-MNIST classification run")


def test_checkpoint_errors(run, images, tmp_path, capsys):
    folder = str(images[0].parent)

    def argv(r: Path, *extra: str) -> list[str]:
        return ["--run", str(r), "--images", folder, "--out", str(tmp_path / "o"), *extra]

    corrupt = _copy_run(run, tmp_path / "corrupt", best=False, steps=False)
    run_info.best_path(corrupt).write_bytes(b"PK\x03\x04 truncated")
    _fails(argv(corrupt), capsys, "best.pt is truncated or corrupt (14 bytes)")
    run_info.best_path(corrupt).write_bytes(bytes(range(256)) * 4)  # not torch's: no zip
    err = _fails(argv(corrupt), capsys, "best.pt is not a checkpoint of this project")
    assert "weights_only" not in err  # torch's advice to load it unsafely is never passed on
    checkpoint.save_atomic({"epoch": 1}, checkpoint.path_for(corrupt, 5))
    _fails(argv(corrupt, "--checkpoint", "last"), capsys, "holds no network weights")
    # config.yaml edited to another architecture than the one the weights were trained as
    other = _copy_run(run, tmp_path / "other")
    raw = yaml.safe_load((other / "config.yaml").read_text())
    raw["model"]["name"] = "unet"
    (other / "config.yaml").write_text(yaml.safe_dump(raw))
    _fails(
        argv(other),
        capsys,
        "does not fit the network",
        "model.name='unet'",
        "the checkpoint's own config says model.name='deeplabv3plus'",
    )


def test_argument_and_image_folder_errors(run, images, tmp_path, capsys):
    def argv(folder: Path, *extra: str) -> list[str]:
        return ["--run", str(run), "--images", str(folder), "--out", str(tmp_path / "o"), *extra]

    folder = images[0].parent
    _fails(argv(tmp_path / "nothing"), capsys, "--images", "no such folder")
    (tmp_path / "no-images").mkdir()
    (tmp_path / "no-images" / "readme.txt").write_text("x")
    _fails(argv(tmp_path / "no-images"), capsys, "no .png/.jpg/.jpeg files")
    _fails(argv(folder, "--batch-size", "0"), capsys, "--batch-size must be >= 1")
    _fails(argv(folder, "--alpha", "1.5"), capsys, "--alpha must be in [0, 1]")
    _fails(argv(folder, "--device", "gpu0"), capsys, "is not a device")
    if not torch.cuda.is_available():
        _fails(argv(folder, "--device", "cuda"), capsys, "CUDA is not available")
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(folder / "a.jpeg")
    _fails(argv(folder), capsys, "a.jpeg and a.png would both write a.png")
    assert not (tmp_path / "o").exists()  # nothing written on any of these


def test_palette():
    names = list(camvid.CLASS_NAMES)
    assert set(names) == set(CAMVID_COLOURS)  # the builder's names, CamVid's colours
    np.testing.assert_array_equal(class_palette(names, 11)[names.index("road")], (128, 64, 128))
    shuffled = names[::-1]  # by name, not by position
    np.testing.assert_array_equal(class_palette(shuffled, 11), class_palette(names, 11)[::-1])
    other = class_palette(["rest", "sky"], 2)  # not CamVid's classes: the trainer's seeded palette
    np.testing.assert_array_equal(other, seeded_palette(2)[:2].numpy())
    np.testing.assert_array_equal(class_palette(None, 5), seeded_palette(5)[:5].numpy())


def test_best_checkpoint_follows_the_selected_epoch(tmp_path):
    model = torch.nn.Linear(2, 1)
    state = SimpleNamespace(history=[], global_step=0, config={}, model=model)
    cfg = C.from_dict({})
    written = []
    for epoch, val in enumerate([0.5, 0.7, 0.6, 0.7, 0.9], start=1):
        state.history.append({"epoch": epoch, "val_miou": val})
        state.global_step += 10
        if run_info.save_best(state, tmp_path, cfg):
            written.append(epoch)
    assert written == [1, 2, 5]  # a tie (epoch 4) keeps the earlier epoch, as the selection does
    best = checkpoint.load(run_info.best_path(tmp_path))
    assert best["epoch"] == 5 and best["global_step"] == 50
    cfg.train.checkpoint = False
    assert not run_info.save_best(state, tmp_path / "none", cfg)


def test_images_are_read_upright_as_8_bit_rgb(tmp_path):
    rng = np.random.default_rng(0)
    deep = rng.integers(
        0, 1 << 16, (5, 7), dtype=np.uint16
    )  # 16-bit grayscale: scaled, not clipped
    Image.fromarray(deep).save(tmp_path / "deep.png")
    image = read_image(tmp_path / "deep.png")
    assert image.mode == "RGB" and image.size == (7, 5)
    np.testing.assert_array_equal(np.asarray(image)[..., 1], (deep >> 8).astype(np.uint8))
    rgba = rng.integers(0, 256, (5, 7, 4), dtype=np.uint8)
    Image.fromarray(rgba).save(tmp_path / "rgba.png")
    np.testing.assert_array_equal(np.asarray(read_image(tmp_path / "rgba.png")), rgba[..., :3])
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: the camera was turned; viewers rotate by 90 degrees
    Image.fromarray(rgba[..., :3]).save(tmp_path / "turned.jpg", exif=exif)
    assert read_image(tmp_path / "turned.jpg").size == (5, 7)
    (tmp_path / "empty.jpg").write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty\.jpg: not a readable image"):
        read_image(tmp_path / "empty.jpg")


def test_shape_decisions_use_the_saved_threshold(run, images, tmp_path, capsys):
    """``OUT/shape.csv``: each image's shape score (the network's, as the class maps are its
    argmax) and its decision at the threshold ``checkpoints/best.pt`` saved (else 0)."""
    best = checkpoint.load(run_info.best_path(run))
    assert best["shape_threshold"] is None  # the run's objective learns no threshold
    out = tmp_path / "plain"
    argv = ["--images", str(images[0].parent), "--out"]
    rc, stdout, _ = _cli(["--run", str(run), *argv, str(out)], capsys)
    assert rc == 0 and "shape decision u > 0" in stdout
    rows = (out / "shape.csv").read_text().splitlines()
    assert rows[0] == "image,shape_score,shape_decision" and len(rows) == 4
    scores = {r.split(",")[0]: float(r.split(",")[1]) for r in rows[1:]}
    assert all(int(r.split(",")[2]) == (scores[r.split(",")[0]] > 0) for r in rows[1:])
    # a run whose best.pt saved a threshold: between the two highest scores, one image above
    copy = _copy_run(run, tmp_path / "copy", steps=False)
    (copy / checkpoint.FOLDER / run_info.BEST).unlink()
    ordered = sorted(scores.values())
    t = (ordered[1] + ordered[2]) / 2
    checkpoint.save_atomic(best | {"shape_threshold": t}, copy / checkpoint.FOLDER / run_info.BEST)
    rc, stdout, _ = _cli(["--run", str(copy), *argv, str(tmp_path / "t")], capsys)
    assert rc == 0 and f"shape decision u > {t:.6g}" in stdout
    rows = (tmp_path / "t" / "shape.csv").read_text().splitlines()[1:]
    decided = {r.split(",")[0]: int(r.split(",")[2]) for r in rows}
    assert decided == {name: int(u > t) for name, u in scores.items()}
    assert sum(decided.values()) == 1


@pytest.mark.slow  # (the default suite's time budget)
def test_the_exported_segmentation_program_reproduces_the_class_maps(run, tmp_path):
    """``train.export`` of the DeepLabV3+ run: loaded back with torch alone, its class maps and shape
    decisions are the predictor's (any batch size)."""
    from train.export import main as export_main
    from train.predict import load_predictor

    path = tmp_path / "model.pt2"
    assert export_main(["--run", str(run), "--out", str(path)]) == 0
    program = torch.export.load(path).module()
    net = load_predictor(run)
    images = torch.randint(
        0, 256, (3, 3, *SIZE), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )
    for batch in (images, images[:1]):
        logits, u, decision = program(batch)
        maps, scores = net.predict(batch)
        assert torch.equal(logits.argmax(1).to(torch.uint8), maps)
        assert torch.allclose(u, scores, atol=1e-5)
        assert torch.equal(decision, u > net.shape_threshold)
