"""Data sets for the trainer: every sample carries its dataset index (the regularizer needs it).

S-MNIST lives in memory (uint8, 440 MB for the full build); batches are gathered by fancy
indexing: the data set's ``__getitem__`` takes a list of indices and ``DataLoader`` runs with
``batch_size=None`` over a ``BatchSampler`` (one indexing op per batch instead of one
``__getitem__`` + collate per sample, ~100x less Python per epoch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler

from data_prep import smnist

from .config import DataConfig


class IndexedTensorDataset(Dataset):
    """In-memory tensors indexed by batches: ``ds[[i, j, ...]]`` -> dict of stacked tensors."""

    def __init__(self, **tensors: Tensor) -> None:
        lengths = {len(t) for t in tensors.values()}
        if len(lengths) != 1:
            raise ValueError(f"tensors must have the same length, got {lengths}")
        self.tensors = tensors
        self.n = lengths.pop()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: list[int] | int) -> dict[str, Tensor]:
        i = torch.as_tensor(idx, dtype=torch.int64)
        return {"index": i, **{k: v[i] for k, v in self.tensors.items()}}


@dataclass
class DataBundle:
    train: IndexedTensorDataset
    test: IndexedTensorDataset
    meta: dict
    num_classes: int
    image_shape: tuple[int, int]

    @property
    def train_shape_labels(self) -> Tensor:
        return self.train.tensors["shape"]


def load_data(cfg: DataConfig) -> DataBundle:
    """Read the prepared cache for ``cfg.kind`` (first ``*_subset`` samples when set)."""
    if cfg.kind != "smnist":
        raise ValueError(f"data.kind must be 'smnist', got {cfg.kind!r}")
    splits, meta = smnist.load(cfg.path)
    out = {}
    for split, limit in (("train", cfg.train_subset), ("test", cfg.test_subset)):
        arrays = splits[split]
        n = len(arrays["labels"]) if limit is None else min(limit, len(arrays["labels"]))
        out[split] = IndexedTensorDataset(
            image=torch.from_numpy(arrays["images"][:n]),
            label=torch.from_numpy(arrays["labels"][:n]),
            shape=torch.from_numpy(arrays["shape"][:n]),
        )
    canvas = tuple(meta["image_shape"])
    return DataBundle(out["train"], out["test"], meta, num_classes=10, image_shape=canvas)


def make_loader(
    ds: IndexedTensorDataset, batch_size: int, *, shuffle: bool, seed: int = 0, num_workers: int = 0
) -> DataLoader:
    """Batches of ``batch_size`` (last one smaller), reshuffled each epoch from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    base = RandomSampler(ds, generator=generator) if shuffle else SequentialSampler(ds)
    return DataLoader(
        ds,
        sampler=BatchSampler(base, batch_size, drop_last=False),
        batch_size=None,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
    )
