"""What a run folder records so that its network can be used without the training data.

* ``run.json`` (next to ``config.yaml``): what the data cache told the trainer and the config does
  not say: the number of classes, their names, the training image size ``(H, W)``, the number of
  shape-node outputs, and the input the network takes (uint8 RGB ``(B, 3, H, W)`` in 0..255; the
  ImageNet normalization is inside the network, ``train.models.SegmentationClassifier``, and its
  mean and std are buffers of the saved weights).
* ``checkpoints/best.pt``: the network's weights at the epoch the run selects
  (``reporting.selected_epoch``: the best ``val_miou`` / ``val_accuracy`` where the data set has a
  selection split, else the last epoch), rewritten whenever the selection moves to a newer epoch.
  It is not one of the ``step-N.pt`` checkpoints (``train.keep_checkpoints`` does not count or
  prune it) and holds no optimizer or regularizer state: it cannot be resumed from.

The trainer writes both on rank 0 (``train/loop.py``), atomically (``train.files``);
``python -m train.predict`` reads them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import checkpoint, reporting
from .build import shape_score_columns
from .config import Config
from .data import IGNORE_INDEX, DataBundle
from .files import write_text_atomic
from .state import TrainState

NAME = "run.json"
BEST = "best.pt"
FORMAT = 1  # the layout of run.json and best.pt; checked by the readers
INPUT = {  # what the network's forward pass takes (SegmentationClassifier / SMNISTNet)
    "segmentation": {
        "dtype": "uint8",
        "layout": "(B, 3, H, W) RGB, values 0..255, H, W = image_size",
        "normalization": "inside the network: ImageNet mean and std (buffers of the weights)",
    },
    "smnist": {
        "dtype": "uint8",
        "layout": "(B, H, W) grayscale, values 0..255, H, W = image_size",
        "normalization": "inside the network: divided by 255",
    },
}


def describe(data: DataBundle, cfg: Config) -> dict[str, Any]:
    """The content of ``run.json`` for a run on ``data`` with config ``cfg``."""
    task = "segmentation" if cfg.data.segmentation else "smnist"
    names = data.class_names
    return {
        "format": FORMAT,
        "task": task,
        "num_classes": int(data.num_classes),
        "class_names": None if names is None else [str(n) for n in names],
        "image_size": [int(v) for v in data.image_shape],
        "shape_scores": shape_score_columns(cfg.regularizer.positive_classes()),
        "ignore_index": IGNORE_INDEX if task == "segmentation" else None,
        "input": INPUT[task],
        "data_path": cfg.data.path,
    }


def write(out: str | Path, data: DataBundle, cfg: Config) -> None:
    """Write ``out/run.json`` (atomically; rank 0 only)."""
    text = json.dumps(describe(data, cfg), indent=2) + "\n"
    write_text_atomic(text, Path(out) / NAME)


def read(run_dir: str | Path) -> dict[str, Any]:
    """``run_dir/run.json``; ``ValueError`` naming what is missing or wrong (a run folder of a
    trainer from before this file existed has none)."""
    path = Path(run_dir) / NAME
    if not path.is_file():
        raise ValueError(
            f"{path} does not exist: the run was trained before the trainer recorded it, so the "
            f"number of classes, their names and the training image size are unknown; train the "
            f"run again (or --resume it for one more epoch: train.epochs=<done + 1>) to write it"
        )
    try:
        info = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} cannot be read ({e})") from e
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        found = info.get("format") if isinstance(info, dict) else None
        raise ValueError(f"{path} has format {found!r}, this version reads format {FORMAT}")
    missing = [
        k for k in ("task", "num_classes", "image_size", "shape_scores") if info.get(k) is None
    ]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}")
    return info


def best_path(run_dir: str | Path) -> Path:
    """``run_dir/checkpoints/best.pt``."""
    return Path(run_dir) / checkpoint.FOLDER / BEST


def save_best(state: TrainState, out: str | Path, cfg: Config) -> bool:
    """At the end of an epoch (after ``state.end_epoch``; rank 0): write ``best.pt`` if the run's
    selected epoch is this epoch, i.e. the selection moved to it. ``True`` if written. Nothing
    without ``train.checkpoint``."""
    if not cfg.train.checkpoint or not state.history:
        return False
    epoch = state.history[-1]["epoch"]
    if reporting.selected_epoch(state.history) != epoch:
        return False
    path = best_path(out)
    path.parent.mkdir(exist_ok=True)
    best = {
        "format": FORMAT,
        "kind": "best",
        "epoch": epoch,
        "global_step": state.global_step,
        "config": state.config,
        "model": state.model.state_dict(),
        # the shape node's decision threshold at this epoch (train.shape_threshold), for predict
        "shape_threshold": state.history[-1].get("test_shape_threshold"),
    }
    checkpoint.save_atomic(best, path)
    return True
