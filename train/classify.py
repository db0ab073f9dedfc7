"""``python -m train.classify --run RUN --images DIR --out OUT``: what a trained S-MNIST run makes of
your images.

For every ``.png`` / ``.jpg`` / ``.jpeg`` file in ``--images`` (not recursive, sorted by name; hidden
files left out) it writes one row of ``OUT/predictions.csv``: the image's name, the predicted class,
its softmax probability, the shape node's score ``u`` and its decision ``u > t``, with ``t`` the
threshold saved in the checkpoint (``train.shape_threshold``: the objective's learned one, or the
one chosen on the val split), else 0.

The network is rebuilt from the run folder alone (``config.yaml``, ``run.json``, ``--checkpoint
best`` or ``last``), as ``train.predict`` does for segmentation runs (its module docstring has the
checkpoint rules and the errors). Each image is converted to 8-bit grayscale and resized to the
training size with PIL's bilinear filter, and fed as the trainer's loader ships its cache, uint8
``(B, H, W)``. The training digits are light on a dark ground, as in MNIST; ``--invert`` flips
images drawn dark on light. Errors are one line ``error: <message>`` on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps
from torch import Tensor

from .files import write_text_atomic
from .predict import (
    CHOICES,
    Predictor,
    _stderr,
    list_images,
    load_predictor,
    read_image,
)

PREDICTIONS_CSV = "predictions.csv"
COLUMNS = ["image", "class", "probability", "shape_score", "shape_decision"]


def to_gray_input(image: Image.Image, size: tuple[int, int], invert: bool = False) -> Tensor:
    """uint8 ``(H, W)`` at the training ``size`` (bilinear), as the S-MNIST loader ships it."""
    gray = image.convert("L")
    if invert:
        gray = ImageOps.invert(gray)
    h, w = size
    return torch.from_numpy(np.asarray(gray.resize((w, h), Image.Resampling.BILINEAR)).copy())


@torch.inference_mode()
def classify(predictor: Predictor, images: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """uint8 ``(B, H, W)`` -> the classes ``(B,)``, their probabilities, the shape scores ``(B,)``
    and the shape decisions ``u > predictor.shape_threshold``."""
    logits, u = predictor.model(images.to(predictor.device))
    if predictor.shape_column is not None and u.dim() == 2:
        u = u[:, predictor.shape_column]
    probability, label = logits.float().softmax(1).max(1)
    u = u.float().cpu()
    return label.cpu(), probability.cpu(), u, u > predictor.shape_threshold


def classify_images(
    predictor: Predictor,
    paths: Sequence[Path],
    out: str | Path,
    batch_size: int = 256,
    invert: bool = False,
    skip_bad: bool = False,
    warn: Callable[[str], object] = print,
) -> tuple[int, list[Path]]:
    """Write ``OUT/predictions.csv`` for the images of ``paths``; returns (images classified, the
    skipped unreadable ones). Without ``skip_bad`` an unreadable image is a ``ValueError``."""
    buffer = io.StringIO()  # the csv module quotes a name with a comma
    rows = csv.writer(buffer, lineterminator="\n")
    rows.writerow(COLUMNS)
    written, skipped = 0, []
    for start in range(0, len(paths), batch_size):
        batch = []
        for path in paths[start : start + batch_size]:
            try:
                batch.append((path, to_gray_input(read_image(path), predictor.size, invert)))
            except ValueError as e:
                if not skip_bad:
                    raise
                warn(f"warning: skipped {e}")
                skipped.append(path)
        if not batch:
            continue
        label, probability, u, decision = classify(predictor, torch.stack([x for _, x in batch]))
        for (path, _), *values in zip(batch, label, probability, u, decision, strict=True):
            c, pr, score, d = (v.item() for v in values)
            rows.writerow([path.name, c, f"{pr:.6g}", f"{score:.6g}", int(d)])
            written += 1
    if not written:
        raise ValueError(f"none of the {len(paths)} images could be read ({skipped[0]} and others)")
    Path(out).mkdir(parents=True, exist_ok=True)
    write_text_atomic(buffer.getvalue(), Path(out) / PREDICTIONS_CSV)
    return written, skipped


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m train.classify",
        description=(
            "The class and the shape node's decision of a trained S-MNIST run for every "
            "PNG/JPEG image of a folder, from the run folder alone; writes OUT/predictions.csv."
        ),
        epilog="Errors: one line on stderr, exit code 2.",
    )
    p.add_argument("--run", required=True, metavar="RUN_DIR", help="an S-MNIST run folder")
    p.add_argument("--images", required=True, metavar="DIR", help="folder of .png/.jpg/.jpeg")
    p.add_argument("--out", required=True, metavar="DIR", help="writes DIR/predictions.csv")
    p.add_argument("--checkpoint", choices=CHOICES, default="best", help="(default: best)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or mps")
    p.add_argument("--batch-size", type=int, default=256, help="images per pass (default 256)")
    p.add_argument("--invert", action="store_true", help="the images are dark digits on light")
    p.add_argument("--skip-bad", action="store_true", help="report unreadable images, go on")
    a = p.parse_args(argv)
    try:
        if a.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {a.batch_size}")
        paths = list_images(a.images, unique_stems=False)
        predictor = load_predictor(a.run, a.checkpoint, a.device, note=_stderr, task="smnist")
        h, w = predictor.size
        print(
            f"{predictor.checkpoint}: {predictor.num_classes} classes, trained at {h}x{w}; "
            f"{len(paths)} image(s); shape decision u > {predictor.shape_threshold:.6g}"
        )
        written, skipped = classify_images(
            predictor, paths, a.out, a.batch_size, a.invert, a.skip_bad, warn=_stderr
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        f"wrote {written} prediction(s) to {Path(a.out) / PREDICTIONS_CSV}"
        + (f"; skipped {len(skipped)} unreadable image(s)" if skipped else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
