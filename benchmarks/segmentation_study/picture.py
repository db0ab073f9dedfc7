"""The picture a reader looks at: the six test images with the least sky, each with the baseline's
class map, the best method's and the ground truth (the paper's Fig. 8-11, on CamVid)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .._report import save_figure, subplots
from .fit import class_maps
from .spec import cache, jobs


def picture(
    root: Path,
    task: str,
    size: tuple[int, int],
    best: str,
    seed: int,
    out: Path,
    epochs: int | None = None,
) -> Path:
    """``segmentation_study_smallest_sky_<H>x<W>.png``: the six test images with the least sky,
    each with the baseline's class map, ``best``'s and the ground truth (seed ``seed``'s runs in
    ``root``, their best-val checkpoints)."""
    keys = {m: job.key for _, m, job in jobs(epochs, [seed], [task], ["baseline", best], size)}
    test = Path(cache(task, size)) / "test"
    if not (test / "images.npy").is_file():
        raise ValueError(f"picture needs the cache {test.parent} (python -m data_prep.camvid)")
    obj = 1 if task == "sky" else 0
    fractions = np.load(test / "fractions.npy")[:, obj]
    chosen = np.argsort(fractions, kind="stable")[:6]
    images = np.load(test / "images.npy", mmap_mode="r")[chosen]
    labels = np.load(test / "labels.npy", mmap_mode="r")[chosen]
    maps = {method: class_maps(root / key, images) for method, key in keys.items()}
    fig, axes = subplots(len(chosen), 4, figsize=(10, 2.0 * len(chosen)), squeeze=False)
    titles = ["image", f"baseline (seed {seed})", f"{best} (seed {seed})", "ground truth"]
    for r, i in enumerate(chosen):
        gt = np.where(labels[r] == 255, np.nan, labels[r] == obj)
        panels = [images[r], maps["baseline"][r] == obj, maps[best][r] == obj, gt]
        for c, (ax, panel) in enumerate(zip(axes[r], panels, strict=True)):
            ax.imshow(
                panel, cmap=None if c == 0 else "Blues", vmin=0, vmax=1, interpolation="nearest"
            )
            ax.set_xticks([]), ax.set_yticks([])
            if r == 0:
                ax.set_title(titles[c], fontsize=9)
        axes[r][0].set_ylabel(f"test {i}: {fractions[i]:.3f}", fontsize=8)
    path = out / f"segmentation_study_smallest_{task}_{size[0]}x{size[1]}.png"
    out.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path)
    return path
