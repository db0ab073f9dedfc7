"""``class_sizes.png``: the class-size histogram with the shape threshold(s) (the paper's Fig. 6)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .options import Options


def plot_class_sizes(path: Path, options: Options, train: dict[str, np.ndarray], edges) -> None:
    """The paper's Fig. 6: histogram of per-(image, class) fractions (log x) with ``t``; sky: of ``s'``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if options.sky:
        ax.hist(train["size"], bins=40, color="tab:blue")
        ax.set_xlabel("sky pixels s' per image")
        title = "COCO-Stuff sky-other (train): sky size per image"
    else:
        n_pixels = options.size[0] * options.size[1]
        f = train["counts"][train["counts"] > 0] / n_pixels
        ax.hist(f, bins=np.logspace(np.log10(1 / n_pixels), 0, 50), color="tab:blue")
        ax.set_xscale("log")
        ax.set_xlabel("fraction of the image's pixels f_c, per (image, class present)")
        title = f"COCO-Stuff {options.setup} (train): class sizes"
    for e in edges:
        ax.axvline(e, color="tab:red", lw=1)
    ax.set_ylabel("count")
    ax.set_title(f"{title}; red: threshold(s)")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)
