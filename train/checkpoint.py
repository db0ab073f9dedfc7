"""Checkpoints and run files written atomically (``data_prep.atomic``: temp file, fsync, rename)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from data_prep.atomic import atomic_path


def save_atomic(obj: Any, path: str | Path) -> None:
    """``torch.save(obj)`` to ``path`` so that a crash leaves either the old file or the new one."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        torch.save(obj, f)


def write_text_atomic(text: str, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def load(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    return torch.load(path, map_location=map_location, weights_only=True)
