"""``python -m train.predict --run RUN --images DIR --out OUT``: what a trained segmentation model
makes of your images.

For every ``.png`` / ``.jpg`` / ``.jpeg`` file in ``--images`` (not recursive, sorted by name; hidden
files left out) it writes, at the image's own size:

* ``OUT/classes/<stem>.png``: the class map, uint8 class indices (0 .. num_classes - 1), one channel;
* ``OUT/overlays/<stem>.png``: the image blended with one colour per class (``--alpha``): CamVid's
  conventional colours when the run's classes are CamVid's 11, else the fixed seeded palette of the
  trainer's TensorBoard images (``reporting.class_palette``);
* ``OUT/shape.csv``: one row per image, the shape node's score and its decision ``u > t``, with
  ``t`` the threshold saved in the checkpoint (``train.shape_threshold``: the objective's learned
  one, or the one chosen on the val split), else 0.

The model is rebuilt from the run folder alone, without the training data: ``config.yaml`` (the
architecture; the encoder is built without pretrained weights, the checkpoint has them), ``run.json``
(the classes, their names, the training image size; written by the trainer, ``train/run_info.py``)
and a checkpoint: ``--checkpoint best`` (the default) reads ``checkpoints/best.pt``, the weights of
the epoch the run selects (best ``val_miou`` where the data set has a val split, else the last
epoch); ``last`` reads the newest ``checkpoints/step-N.pt``. A run folder with step checkpoints but
no ``best.pt`` (stopped inside its first epoch) falls back to the last one with a note on stderr.

Each image: EXIF orientation applied, converted to 8-bit RGB (grayscale and palette images
expanded, alpha dropped, 16-bit grayscale scaled to 8 bits), resized to the training size with PIL's
bilinear filter (antialiased when it shrinks; the cache builders used PIL's box filter), fed as the
trainer's loader ships its cache, uint8 ``(B, 3, H, W)`` (the network normalizes inside,
``train.models.SegmentationClassifier``); the argmax of the logits is resized back
to the image's size nearest neighbour, so the maps align with the images. Any image size works: the
input is resized to the training size, and the networks zero-pad to the multiple they need.

Errors are one line ``error: <message>`` on stderr with exit code 2 (no traceback): a missing run
folder, ``config.yaml`` or ``run.json``, an S-MNIST run, no checkpoint, a checkpoint that cannot be
read or lacks the weights, a checkpoint of another architecture than ``config.yaml`` describes, a
missing or empty ``--images`` folder, two inputs that would write the same output name, and an
unreadable image (named; with ``--skip-bad`` it is reported and skipped instead, and only a folder
without one readable image is an error). Outputs of the batches before an unreadable image stay
written; every file is written atomically (``train.files``).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps
from torch import Tensor, nn

from . import checkpoint, reporting, run_info
from . import config as config_mod
from .files import atomic_path, write_text_atomic
from .models import build_model

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
SHAPE_CSV = "shape.csv"  # per image: the shape node's score and its decision
CHOICES = ("best", "last")
# CamVid's conventional colours (SegNet's), by the class names of data_prep.camvid
CAMVID_COLOURS: dict[str, tuple[int, int, int]] = {
    "sky": (128, 128, 128),
    "building": (128, 0, 0),
    "pole": (192, 192, 128),
    "road": (128, 64, 128),
    "pavement": (60, 40, 222),
    "tree": (128, 128, 0),
    "sign_symbol": (192, 128, 128),
    "fence": (64, 64, 128),
    "car": (64, 0, 128),
    "pedestrian": (64, 64, 0),
    "bicyclist": (0, 128, 192),
}


@dataclass
class Predictor:
    """A run's network, ready to map uint8 images at ``size`` to classes: ``(B, 3, H, W)`` RGB to
    class maps ``(B, H, W)`` (segmentation), or ``(B, H, W)`` grayscale to one class per image
    ``(B,)`` (S-MNIST)."""

    model: nn.Module
    size: tuple[int, int]  # the training image size (H, W)
    num_classes: int
    class_names: list[str] | None
    device: torch.device
    checkpoint: Path
    epoch: int | None  # the epoch the weights are from, where the checkpoint says
    # the shape node's decision u > shape_threshold: the threshold saved with the checkpoint
    # (train.shape_threshold), else 0
    shape_threshold: float = 0.0
    shape_column: int | None = None  # the column of a multi-column shape node (None: one score)

    @torch.inference_mode()
    def __call__(self, images: Tensor) -> Tensor:
        """uint8 images at ``size`` -> uint8 class indices (CPU): maps ``(B, H, W)`` of
        segmentation runs, ``(B,)`` of S-MNIST runs."""
        return self.predict(images)[0]

    @torch.inference_mode()
    def predict(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """The class maps (as :meth:`__call__`) and the shape node's scores ``(B,)`` (CPU)."""
        logits, u = self.model(images.to(self.device))
        u = u if self.shape_column is None or u.dim() == 1 else u[:, self.shape_column]
        return logits.argmax(1).to(torch.uint8).cpu(), u.float().cpu()


# --- the run folder -------------------------------------------------------------------------


def load_predictor(
    run_dir: str | Path,
    which: str = "best",
    device: str | torch.device = "cpu",
    note: Callable[[str], object] = print,
    task: str | None = "segmentation",
) -> Predictor:
    """The network of run folder ``run_dir`` with the weights of checkpoint ``which`` (``best`` or
    ``last``, see the module docstring) on ``device``, in eval mode. ``note`` gets the fallback
    message when ``best`` is missing. ``task``: the kind of run expected, ``"segmentation"``
    (``train.predict``), ``"smnist"`` (``train.classify``) or ``None`` (either: ``train.export``).
    ``ValueError`` (one line) for every problem listed in the module docstring.

    Outside the trainer, three lines give a run's predictions at its saved threshold::

        from train.predict import load_predictor
        net = load_predictor("runs/demo/<tag>", task=None)       # checkpoints/best.pt
        classes, scores = net.predict(images)                  # uint8 images, as run.json says
        decisions = scores > net.shape_threshold
    """
    run = Path(run_dir)
    if which not in CHOICES:
        raise ValueError(f"--checkpoint must be one of {CHOICES}, got {which!r}")
    if not run.is_dir():
        raise ValueError(f"--run {run}: no such folder")
    if not (run / "config.yaml").is_file():
        raise ValueError(f"--run {run}: no config.yaml (not a run folder?)")
    try:
        cfg = config_mod.load(run / "config.yaml")
    except ValueError as e:
        raise ValueError(f"{run / 'config.yaml'}: {e}") from e
    if task == "segmentation" and not cfg.data.segmentation:
        raise ValueError(
            f"--run {run} is an S-MNIST classification run (data.kind {cfg.data.kind!r}, model "
            f"{cfg.model.name!r}); train.predict draws class maps of segmentation runs only "
            f"(python -m train.classify labels images with it)"
        )
    if task == "smnist" and cfg.data.segmentation:
        raise ValueError(
            f"--run {run} is a segmentation run (model {cfg.model.name!r}); train.classify labels "
            f"images with S-MNIST classification runs only (python -m train.predict draws class "
            f"maps with it)"
        )
    info = run_info.read(run)
    num_classes, size = int(info["num_classes"]), tuple(int(v) for v in info["image_size"])
    if not 1 <= num_classes <= 256:
        raise ValueError(f"{run / run_info.NAME}: {num_classes} classes do not fit a uint8 map")
    dev = resolve_device(device)
    path = checkpoint_path(run, which, note)
    state = load_weights(path)
    # the weights come from the checkpoint: no pretrained download or local weights file needed
    model_cfg = dataclasses.replace(cfg.model, encoder_weights=None)
    model = build_model(model_cfg, size, num_classes, int(info["shape_scores"]))
    check_architecture(model, state, path, run, cfg, num_classes)
    model.load_state_dict(state["model"])
    model.to(dev).eval()
    names = info.get("class_names")
    threshold = state.get("shape_threshold")
    column = cfg.regularizer.positive_classes()[0] if int(info["shape_scores"]) > 1 else None
    return Predictor(
        model,
        size,
        num_classes,
        names,
        dev,
        path,
        state.get("epoch"),
        0.0 if threshold is None else float(threshold),
        column,
    )


def resolve_device(name: str | torch.device) -> torch.device:
    """``--device``: ``cpu``, ``cuda``, ``cuda:N`` or ``mps``, available on this machine."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"--device {name!r} is not a device (cpu, cuda, cuda:1, mps)") from e
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {name}: CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"--device {name}: MPS is not available on this machine")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"--device {name!r}: use cpu, cuda, cuda:N or mps")
    return device


def checkpoint_path(run: Path, which: str, note: Callable[[str], object] = print) -> Path:
    """``best``: ``checkpoints/best.pt`` (else the last, with a ``note``); ``last``: the newest
    ``checkpoints/step-N.pt``."""
    steps = checkpoint.listing(run)
    best = run_info.best_path(run)
    if which == "best" and best.is_file():
        return best
    if not steps:
        raise ValueError(
            f"--run {run}: no checkpoint in {run / checkpoint.FOLDER} (the run was trained with "
            f"train.checkpoint=false, or stopped before its first checkpoint)"
        )
    if which == "best":
        note(
            f"note: {best} does not exist (the run stopped inside its first epoch, or its "
            f"trainer did not write one); using the last checkpoint, {steps[0].name}"
        )
    return steps[0]


def load_weights(path: Path) -> dict[str, Any]:
    """The checkpoint at ``path`` (a ``step-N.pt`` or ``best.pt``), checked to hold the network's
    weights."""
    state = checkpoint.load(path)  # CheckpointError (a ValueError): one line naming the file
    weights = state.get("model") if isinstance(state, dict) else None
    if not isinstance(weights, dict) or not all(isinstance(v, Tensor) for v in weights.values()):
        keys = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(
            f"checkpoint {path} holds no network weights (no 'model' state dict; found {keys})"
        )
    return state


def check_architecture(
    model: nn.Module,
    state: dict[str, Any],
    path: Path,
    run: Path,
    cfg: config_mod.Config,
    num_classes: int,
) -> None:
    """``ValueError`` unless the checkpoint's weights have exactly the keys and shapes of
    ``model`` (built from ``config.yaml`` and ``run.json``)."""
    expected = model.state_dict()
    weights = state["model"]
    missing = [k for k in expected if k not in weights]
    unexpected = [k for k in weights if k not in expected]
    shapes = [
        (k, tuple(weights[k].shape), tuple(v.shape))
        for k, v in expected.items()
        if k in weights and weights[k].shape != v.shape
    ]
    if not (missing or unexpected or shapes):
        return
    found = []
    if missing:
        found.append(f"{len(missing)} weights missing (e.g. {missing[0]})")
    if unexpected:
        found.append(f"{len(unexpected)} unexpected (e.g. {unexpected[0]})")
    if shapes:
        k, theirs, ours = shapes[0]
        found.append(
            f"{len(shapes)} of another shape (e.g. {k}: {theirs} in the checkpoint, {ours} in "
            f"the network)"
        )
    saved = (
        state.get("config", {}).get("model", {}) if isinstance(state.get("config"), dict) else {}
    )
    differs = [
        f"model.{k}={saved[k]!r}"
        for k in ("name", "encoder")
        if k in saved and saved[k] != getattr(cfg.model, k)
    ]
    hint = f"; the checkpoint's own config says {', '.join(differs)}" if differs else ""
    raise ValueError(
        f"checkpoint {path} does not fit the network {run / 'config.yaml'} describes "
        f"(model.name={cfg.model.name!r}, model.encoder={cfg.model.encoder!r}, {num_classes} "
        f"classes): {'; '.join(found)}{hint}"
    )


# --- images ----------------------------------------------------------------------------------


def list_images(folder: str | Path, unique_stems: bool = True) -> list[Path]:
    """The image files of ``folder`` (see the module docstring); ``ValueError`` when there are none
    or (``unique_stems``) two would write the same output name."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"--images {folder}: no such folder")
    paths = sorted(
        p
        for p in folder.iterdir()
        if p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith(".") and p.is_file()
    )
    if not paths:
        raise ValueError(f"--images {folder}: no {'/'.join(IMAGE_SUFFIXES)} files in it")
    seen: dict[str, Path] = {}
    for p in paths if unique_stems else []:
        if p.stem in seen:
            raise ValueError(
                f"--images {folder}: {seen[p.stem].name} and {p.name} would both write "
                f"{p.stem}.png; rename one"
            )
        seen[p.stem] = p
    return paths


def read_image(path: str | Path) -> Image.Image:
    """An 8-bit RGB PIL image (EXIF orientation applied); ``ValueError`` naming the file when it
    cannot be decoded."""
    try:
        with Image.open(path) as opened:
            image = ImageOps.exif_transpose(opened)  # a loaded copy, upright as viewers show it
        if image.mode.startswith("I;16"):  # 16-bit grayscale: convert("RGB") would clip it
            image = Image.fromarray((np.asarray(image).astype(np.uint16) >> 8).astype(np.uint8))
        elif image.mode in ("I", "F"):
            raise ValueError(f"{image.mode} (32-bit) pixels are not supported")
        return image.convert("RGB")
    except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, DecompressionBombError...
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path}: not a readable image ({reason})") from e


def to_input(image: Image.Image, size: tuple[int, int]) -> Tensor:
    """uint8 ``(3, H, W)`` at the training ``size`` (bilinear), as the trainer's loader ships it."""
    h, w = size
    resized = image.resize((w, h), Image.Resampling.BILINEAR)
    return torch.from_numpy(np.asarray(resized).copy()).permute(2, 0, 1)


def class_palette(class_names: Sequence[str] | None, num_classes: int) -> np.ndarray:
    """uint8 ``(num_classes, 3)``: CamVid's colours when the classes are CamVid's 11 (by name),
    else the trainer's seeded palette (``reporting.class_palette``)."""
    if class_names is not None and sorted(class_names) == sorted(CAMVID_COLOURS):
        return np.array([CAMVID_COLOURS[n] for n in class_names], dtype=np.uint8)
    return reporting.class_palette(num_classes)[:num_classes].numpy()


def overlay(
    image: Image.Image, classes: np.ndarray, palette: np.ndarray, alpha: float
) -> Image.Image:
    """``image`` blended with the colours of ``classes`` (uint8 ``(H, W)`` at the image's size)."""
    colours = Image.fromarray(palette[classes])
    return Image.blend(image, colours, alpha)


def save_png(image: Image.Image, path: Path) -> None:
    """Write ``image`` as PNG atomically."""
    with atomic_path(path) as tmp:
        image.save(tmp, format="PNG")


def predict_images(
    predictor: Predictor,
    paths: Sequence[Path],
    out: str | Path,
    batch_size: int = 8,
    alpha: float = 0.5,
    skip_bad: bool = False,
    warn: Callable[[str], object] = print,
) -> tuple[int, list[Path]]:
    """Write the class map and the overlay of every image of ``paths`` under ``out`` (see the
    module docstring), ``batch_size`` images per forward pass; returns (images written, the
    skipped unreadable ones). Without ``skip_bad`` an unreadable image is a ``ValueError``."""
    out = Path(out)
    classes_dir, overlays_dir = out / "classes", out / "overlays"
    for d in (classes_dir, overlays_dir):
        d.mkdir(parents=True, exist_ok=True)
    palette = class_palette(predictor.class_names, predictor.num_classes)
    written, skipped = 0, []
    shape_csv = io.StringIO()  # the csv module quotes a name with a comma
    shape_rows = csv.writer(shape_csv, lineterminator="\n")
    shape_rows.writerow(["image", "shape_score", "shape_decision"])
    for start in range(0, len(paths), batch_size):
        batch: list[tuple[Path, Image.Image]] = []
        for path in paths[start : start + batch_size]:
            try:
                batch.append((path, read_image(path)))
            except ValueError as e:
                if not skip_bad:
                    raise
                warn(f"warning: skipped {e}")
                skipped.append(path)
        if not batch:
            continue
        maps, scores = predictor.predict(
            torch.stack([to_input(image, predictor.size) for _, image in batch])
        )
        for (path, image), small, u in zip(batch, maps.numpy(), scores.tolist(), strict=True):
            shape_rows.writerow([path.name, f"{u:.6g}", int(u > predictor.shape_threshold)])
            full = Image.fromarray(small).resize(image.size, Image.Resampling.NEAREST)
            save_png(full, classes_dir / f"{path.stem}.png")
            save_png(
                overlay(image, np.asarray(full), palette, alpha), overlays_dir / f"{path.stem}.png"
            )
            written += 1
    if not written:
        raise ValueError(f"none of the {len(paths)} images could be read ({skipped[0]} and others)")
    write_text_atomic(shape_csv.getvalue(), out / SHAPE_CSV)
    return written, skipped


# --- command line ----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m train.predict",
        description=(
            "Class maps and colour overlays of a trained segmentation run for a folder of "
            "PNG/JPEG images, from the run folder alone (config.yaml, run.json, a checkpoint; no "
            "training data). Each image is resized to the run's training size (bilinear) for the "
            "network; the class map is resized back to the image's own size (nearest), so "
            "OUT/classes/<name>.png (uint8 class indices, one channel) and OUT/overlays/<name>.png "
            "align with the image. Any image size works."
        ),
        epilog="Errors: one line on stderr, exit code 2.",
    )
    p.add_argument(
        "--run", required=True, metavar="RUN_DIR", help="a run folder of python -m train"
    )
    p.add_argument(
        "--images", required=True, metavar="DIR", help="folder of .png/.jpg/.jpeg images"
    )
    p.add_argument("--out", required=True, metavar="DIR", help="writes DIR/classes, DIR/overlays")
    p.add_argument(
        "--checkpoint",
        choices=CHOICES,
        default="best",
        help="best: checkpoints/best.pt, the epoch the run selected on val (falls back to last, "
        "with a note, where the run has none); last: the newest checkpoints/step-N.pt "
        "(default: best)",
    )
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or mps")
    p.add_argument("--batch-size", type=int, default=8, help="images per forward pass (default 8)")
    p.add_argument(
        "--alpha", type=float, default=0.5, help="opacity of the class colours (0..1, default 0.5)"
    )
    p.add_argument(
        "--skip-bad",
        action="store_true",
        help="report unreadable images on stderr and go on (default: stop with an error)",
    )
    a = p.parse_args(argv)
    try:
        if a.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {a.batch_size}")
        if not 0.0 <= a.alpha <= 1.0:
            raise ValueError(f"--alpha must be in [0, 1], got {a.alpha}")
        paths = list_images(a.images)
        predictor = load_predictor(a.run, a.checkpoint, a.device, note=_stderr)
        epoch = "" if predictor.epoch is None else f" (epoch {predictor.epoch})"
        h, w = predictor.size
        print(
            f"{predictor.checkpoint}{epoch}: {predictor.num_classes} classes, trained at "
            f"{h}x{w}; {len(paths)} image(s) on {predictor.device}; shape decision u > "
            f"{predictor.shape_threshold:.6g}"
        )
        written, skipped = predict_images(
            predictor, paths, a.out, a.batch_size, a.alpha, a.skip_bad, warn=_stderr
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(a.out)
    print(
        f"wrote {written} class map(s) to {out / 'classes'}, overlay(s) to {out / 'overlays'} "
        f"and the shape decisions to {out / SHAPE_CSV}"
        + (f"; skipped {len(skipped)} unreadable image(s)" if skipped else "")
    )
    return 0


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
