"""``class_sizes.png``: the class-size histogram with the shape threshold(s) (the paper's Fig. 6)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..segmentation_cache import save_size_histogram
from .options import Options


def plot_class_sizes(path: Path, options: Options, train: dict[str, np.ndarray], edges) -> None:
    """The paper's Fig. 6: histogram of per-(image, class) fractions (log x) with ``t``; sky: of ``s'``."""
    if options.sky:
        save_size_histogram(
            path,
            train["size"],
            edges,
            xlabel="sky pixels s' per image",
            title="COCO-Stuff sky-other (train): sky size per image",
        )
        return
    n_pixels = options.size[0] * options.size[1]
    save_size_histogram(
        path,
        train["counts"][train["counts"] > 0] / n_pixels,
        edges,
        log_from=1 / n_pixels,
        xlabel="fraction of the image's pixels f_c, per (image, class present)",
        title=f"COCO-Stuff {options.setup} (train): class sizes",
    )
