"""The builder's options: where to read and write, and the fields that determine the output bytes."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SETUPS = ("stuff", "stuffthing")
INTERPOLATIONS = ("area", "bilinear")


def default_workers() -> int:
    return min(4, os.cpu_count() or 1)


@dataclass(frozen=True)
class Options:
    """Where to read and write, and everything that determines the output bytes.

    Only the fields of ``key()`` change the cache (they are saved in ``meta.json``); the input
    locations, ``workers``, ``shard_size`` and ``force`` do not.
    """

    out: str | Path
    setup: str = "stuff"
    root: str | Path | None = None
    annotations: str | Path | None = None  # folder with stuff_{train,val}2017.json
    images: str | Path | None = None  # folder with train2017/, val2017/
    stuffthingmaps: str | Path | None = None  # folder with train2017/, val2017/ PNGs
    only: str | None = None  # None | "sky-other"
    size: tuple[int, int] = (106, 160)
    threshold: float = 0.05
    thresholds: tuple[float, ...] = ()  # p > 2 bins for the all-class shape label
    bins: int = 2  # sky: 2 = mean threshold (the paper), P > 2 = training quantiles
    interpolation: str = "area"
    limit: int | None = None  # first N images (by id) of each split
    workers: int = field(default_factory=default_workers)
    shard_size: int = 512
    force: bool = False

    @property
    def sky(self) -> bool:
        return self.only is not None

    @property
    def shape_thresholds(self) -> tuple[float, ...]:
        return tuple(self.thresholds) or (self.threshold,)

    def key(self) -> dict[str, object]:
        """The options that determine the output (JSON types: compared with ``meta.json``)."""
        return {
            "setup": self.setup,
            "only": self.only,
            "size": [int(v) for v in self.size],
            "interpolation": self.interpolation,
            "limit": self.limit,
            "thresholds": None if self.sky else [float(t) for t in self.shape_thresholds],
            "bins": int(self.bins) if self.sky else None,
        }

    def validate(self) -> None:
        def bad(name: str, expected: str) -> ValueError:
            return ValueError(f"{name} must be {expected}, got {getattr(self, name)!r}")

        def is_int(v: object) -> bool:
            return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

        if self.setup not in SETUPS:
            raise bad("setup", f"one of {SETUPS}")
        if self.only is not None:
            if self.only != "sky-other":
                raise bad("only", "'sky-other' (the paper's sky task) or None (all classes)")
            if self.setup != "stuff":
                raise ValueError(
                    f"only='sky-other' needs setup 'stuff' (sky-other is a class of the stuff-only "
                    f"annotations), got setup {self.setup!r}"
                )
        if len(self.size) != 2 or not all(is_int(v) and v >= 1 for v in self.size):
            raise bad("size", "two integers >= 1 (height, width)")
        if not (isinstance(self.threshold, (int, float)) and 0 < self.threshold < 1):
            raise bad("threshold", "a number in (0, 1) (a fraction of the image's pixels)")
        ts = tuple(self.thresholds)
        if not all(isinstance(t, (int, float)) and 0 < t < 1 for t in ts) or any(
            a >= b for a, b in itertools.pairwise(ts)
        ):
            raise bad("thresholds", "strictly increasing numbers in (0, 1)")
        if not is_int(self.bins) or self.bins < 2:
            raise bad("bins", "an integer >= 2")
        if self.sky and ts:
            raise bad(
                "thresholds", "empty with only='sky-other' (the sky task bins s' with --bins)"
            )
        if not self.sky and self.bins != 2:
            raise bad("bins", "2 without only='sky-other' (all classes: use --thresholds)")
        if self.interpolation not in INTERPOLATIONS:
            raise bad("interpolation", f"one of {INTERPOLATIONS}")
        if self.limit is not None and not (is_int(self.limit) and self.limit >= 1):
            raise bad("limit", "None or an integer >= 1")
        if not is_int(self.workers) or self.workers < 0:
            raise bad("workers", "an integer >= 0 (0 or 1: in this process)")
        if not is_int(self.shard_size) or self.shard_size < 1:
            raise bad("shard_size", "an integer >= 1")
