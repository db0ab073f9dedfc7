"""``python -m train.export --run RUN --out FILE.pt2``: a trained run's network and its decision
threshold as one ``torch.export`` program, to serve without this repository's code.

The program takes the run's input (``run.json``'s ``input``: uint8 ``(B, H, W)`` grayscale for
S-MNIST, uint8 ``(B, 3, H, W)`` RGB for segmentation, at the training size ``H, W``; any batch size)
and returns ``(logits, shape_score, shape_decision)``: the class logits (per image, or per pixel for
segmentation), the shape node's score ``u`` ``(B,)`` and ``u > t``, with ``t`` the threshold saved in
the checkpoint (the one ``train.predict`` and ``train.classify`` use) held in the program as the
buffer ``threshold``. Loading it back takes torch alone::

    program = torch.export.load("model.pt2").module()
    logits, score, decision = program(images)

The weights are those of ``--checkpoint best`` (default) or ``last`` (``train.predict``'s rules).
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import torch
from torch import Tensor, nn

from .files import atomic_path
from .models import SegmentationClassifier
from .predict import CHOICES, Predictor, _stderr, load_predictor


class Deployed(nn.Module):
    """A run's network with its decision threshold: ``images -> (logits, u, u > threshold)``."""

    def __init__(self, model: nn.Module, threshold: float, column: int | None) -> None:
        super().__init__()
        self.model, self.column = model, column
        self.register_buffer("threshold", torch.tensor(float(threshold)))

    def forward(self, images: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        logits, u = self.model(images)
        if self.column is not None and u.dim() == 2:
            u = u[:, self.column]
        return logits, u, u > self.threshold


def export_program(predictor: Predictor, channels: int | None) -> torch.export.ExportedProgram:
    """``torch.export`` of ``Deployed(predictor's network)`` with a dynamic batch dimension;
    ``channels``: 3 for RGB input ``(B, 3, H, W)``, ``None`` for grayscale ``(B, H, W)``."""
    module = Deployed(predictor.model, predictor.shape_threshold, predictor.shape_column).eval()
    h, w = predictor.size
    shape = (2, h, w) if channels is None else (2, channels, h, w)
    example = torch.zeros(shape, dtype=torch.uint8, device=predictor.device)
    batch = torch.export.Dim("batch", min=1)
    with torch.no_grad():
        return torch.export.export(module, (example,), dynamic_shapes=({0: batch},))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m train.export",
        description="A run's network and decision threshold as a torch.export program (.pt2).",
        epilog="Errors: one line on stderr, exit code 2.",
    )
    p.add_argument(
        "--run", required=True, metavar="RUN_DIR", help="a run folder of python -m train"
    )
    p.add_argument("--out", required=True, metavar="FILE", help="the program, e.g. model.pt2")
    p.add_argument("--checkpoint", choices=CHOICES, default="best", help="(default: best)")
    a = p.parse_args(argv)
    try:
        predictor = load_predictor(a.run, a.checkpoint, "cpu", note=_stderr, task=None)
        segmentation = isinstance(predictor.model, SegmentationClassifier)
        program = export_program(predictor, 3 if segmentation else None)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()  # torch.export.save wants a .pt2 name or a buffer; the file is atomic
    torch.export.save(program, buffer)
    with atomic_path(out) as tmp:
        tmp.write_bytes(buffer.getvalue())
    print(
        f"wrote {out}: {predictor.checkpoint}'s network, input uint8 "
        f"{'(B, 3, H, W)' if segmentation else '(B, H, W)'} at H, W = {predictor.size}, shape "
        f"decision u > {predictor.shape_threshold:.6g}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
