"""Shape labels from resized label maps (plain functions; the rules are in the package docstring)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def class_bins(fractions: np.ndarray, thresholds: Iterable[float]) -> np.ndarray:
    """``s^c`` = number of thresholds ``f_c`` exceeds (strictly), elementwise."""
    t = np.asarray(list(thresholds), dtype=np.float64)
    return (np.asarray(fractions, np.float64)[..., None] > t).sum(-1)


def majority_shape(counts: np.ndarray, n_pixels: int, thresholds: Iterable[float]) -> np.ndarray:
    """All-class shape label per image from pixels per class ``counts (N, C)``.

    ``s`` = the most common ``s^c`` over the classes present (``counts > 0``); ties go to the
    smaller bin (``argmax`` returns the first maximum); no class present -> 0.
    """
    thresholds = list(thresholds)
    counts = np.asarray(counts)
    bins = class_bins(counts / n_pixels, thresholds)
    present = counts > 0
    votes = np.stack([(present & (bins == j)).sum(1) for j in range(len(thresholds) + 1)], 1)
    return votes.argmax(1).astype(np.int64)


def size_edges(train_size: np.ndarray, bins: int) -> list[float]:
    """Sky edges: the training mean for 2 bins (docs/method/shape-labels.md sec. 6), else the quantiles at ``k / bins``."""
    train_size = np.asarray(train_size, np.float64)
    if bins == 2:
        return [float(train_size.mean())]
    return [float(q) for q in np.quantile(train_size, np.arange(1, bins) / bins)]


def bin_sizes(size: np.ndarray, edges: Iterable[float]) -> np.ndarray:
    """``s`` = number of edges ``s'`` exceeds (strictly): ``1[s' > t]`` for one edge."""
    return (np.asarray(size, np.float64)[:, None] > np.asarray(list(edges))).sum(1).astype(np.int64)
