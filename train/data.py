"""Data sets for the trainer: every sample carries its dataset index (the regularizer needs it).

Both data sets are indexed by batches: ``__getitem__`` takes a list of indices and ``DataLoader``
runs with ``batch_size=None`` over a ``BatchSampler``.

* S-MNIST lives in memory (uint8, 440 MB for the full build); a batch is one fancy-indexing op
  (~100x less Python per epoch than one ``__getitem__`` + collate per sample).
* Segmentation (COCO-Stuff, CamVid) is read from the memory-mapped cache (``train.caches.segmentation``,
  built by ``data_prep.cocostuff`` or ``data_prep.camvid``), already resized to the training size (no
  image decoding while training). A cache with a test split (CamVid) gives a ``val`` split to select
  the epoch on and a ``test`` split to report; COCO-Stuff's val is both. Training batches get joint image/mask
  augmentations from ``torchvision.transforms.v2`` per sample (flip, optional scale jitter + crop
  with the mask padded by the ignore index). Images stay uint8 until the model (less to copy
  between worker processes).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

from .caches import segmentation, smnist
from .config import DataConfig
from .torchvision_compat import ensure_torchvision_importable

IGNORE_INDEX = segmentation.IGNORE  # unlabelled pixels (255); the loss and metrics skip them


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

    @property
    def shape_labels(self) -> Tensor:
        return self.tensors["shape"]


class SegmentationCacheDataset(Dataset):
    """One split of a segmentation cache: ``ds[[i, ...]]`` -> ``image`` uint8 ``(B, 3, H, W)``,
    ``label`` uint8 ``(B, H, W)`` (255 = ignore; widened on the device), ``shape`` ``(B,)``, ``index`` ``(B,)``.

    The arrays are memory-mapped lazily in each process (a pickled ``np.memmap`` would copy the
    whole split into every DataLoader worker).
    """

    def __init__(
        self,
        root: str | Path,
        split: str,
        limit: int | None = None,
        augment: JointAugment | None = None,
        seed: int = 0,
        pixel_index: bool = False,
    ) -> None:
        self.dir = Path(root) / split
        self.seed = seed
        self.pixel_index = pixel_index  # also yield each output pixel's dataset index
        shape = np.load(self.dir / "shape.npy")
        self.n = len(shape) if limit is None else min(limit, len(shape))
        self.shape_labels = torch.from_numpy(shape[: self.n].astype(np.int64))
        self.augment = augment
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return self.n

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_arrays": None}

    def _open(self) -> tuple[np.ndarray, np.ndarray]:
        if self._arrays is None:
            self._arrays = (
                np.load(self.dir / "images.npy", mmap_mode="r"),
                np.load(self.dir / "labels.npy", mmap_mode="r"),
            )
        return self._arrays

    def __getitem__(self, idx: list[int] | int) -> dict[str, Tensor]:
        i = torch.as_tensor(idx, dtype=torch.int64).reshape(-1)
        images, labels = self._open()
        order = np.sort(i.numpy())  # sorted reads from the memmap, then back to batch order
        back = np.searchsorted(order, i.numpy())
        image = torch.from_numpy(np.ascontiguousarray(images[order][back])).permute(0, 3, 1, 2)
        label = torch.from_numpy(np.ascontiguousarray(labels[order][back]))
        h, w = label.shape[-2:]
        # each output pixel's position in its image (y * W + x), moved by the augmentation with
        # the image: flips and crops move pixels, scale jitter resamples them (NEAREST: an output
        # pixel is its nearest source pixel, a source pixel may appear 0-4 times); padding is 255
        # in the label, so the loop drops those pixels (docs/segmentation/pixels.md)
        where = torch.arange(h * w, dtype=torch.int32).view(1, h, w).expand(len(i), h, w)
        if self.augment is not None:
            # the random draws are a function of (seed, the batch's indices): the same with any
            # number of loader workers and after a resume; the global RNG is left untouched
            batch_seed = np.random.SeedSequence([self.seed, *i.tolist()]).generate_state(1)[0]
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(batch_seed))
                # one draw per sample whatever is transformed: with or without the pixel index,
                # the images and labels are the same (tests/train/test_pixel_objective.py)
                more = [(c,) if self.pixel_index else () for c in where]
                out = [
                    self.augment.pair(a, b, *c) for a, b, c in zip(image, label, more, strict=True)
                ]
            image = torch.stack([p[0] for p in out])
            label = torch.stack([p[1] for p in out])
            if self.pixel_index:
                where = torch.stack([p[2] for p in out])
        batch = {
            "index": i,
            "image": image.contiguous(),
            "label": label,
            "shape": self.shape_labels[i],
        }
        if self.pixel_index:
            batch["pixel"] = i.view(-1, 1, 1) * (h * w) + where.long()
        return batch

    def pixel_problem(self) -> tuple[Tensor, Tensor]:
        """The training pixels as the samples of a per-image objective: ``(labels, groups)``,
        both ``(N H W,)`` int64 in dataset-pixel order (image ``i``'s pixel ``(y, x)`` is
        ``i H W + y W + x``, the index the batches' ``pixel`` holds): each pixel's class, and its
        image as its group (``-1`` for an unlabelled pixel: in no group)."""
        labels = torch.from_numpy(np.array(self._open()[1][: self.n], dtype=np.int64)).reshape(-1)
        groups = torch.arange(self.n).repeat_interleave(labels.numel() // max(self.n, 1))
        unlabelled = labels == IGNORE_INDEX
        return labels.masked_fill(unlabelled, 0), groups.masked_fill(unlabelled, -1)


class JointAugment:
    """Joint image/mask training augmentation with ``torchvision.transforms.v2``: optional scale
    jitter then a crop back to ``size`` (the mask resized NEAREST and padded with the ignore index),
    optional horizontal flip.

    Picklable without torchvision: it holds the recipe and builds the transform on first use, so
    a DataLoader worker (forked or spawned) imports torchvision only after the import cure
    (``train.torchvision_compat``) has run in it.
    """

    def __init__(self, size: tuple[int, int], hflip: bool, scale_range: list[float] | None) -> None:
        self.size, self.hflip, self.scale_range = tuple(size), hflip, scale_range
        self._transform = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_transform": None}

    def transform(self):
        """The ``v2.Compose`` (built once per process)."""
        if self._transform is None:
            ensure_torchvision_importable()
            from torchvision import tv_tensors
            from torchvision.transforms import v2

            steps: list = []
            if self.scale_range is not None:
                steps += [
                    v2.ScaleJitter(self.size, scale_range=tuple(self.scale_range)),
                    v2.RandomCrop(
                        self.size,
                        pad_if_needed=True,
                        fill={tv_tensors.Image: 0, tv_tensors.Mask: IGNORE_INDEX},
                    ),
                ]
            if self.hflip:
                steps.append(v2.RandomHorizontalFlip())
            self._transform = v2.Compose(steps)
        return self._transform

    def __call__(self, image, mask):
        """``v2`` semantics: ``tv_tensors.Image`` / ``tv_tensors.Mask`` in, the same types out."""
        return self.transform()(image, mask)

    def pair(self, image: Tensor, mask: Tensor, *more: Tensor) -> tuple[Tensor, ...]:
        """Plain tensors ``(3, H, W)``, ``(H, W)`` in and out; ``more`` masks ``(H, W)`` (a pixel
        index map) get the same draw (resized NEAREST, padded with 255)."""
        transform = self.transform()  # applies the import cure before torchvision is imported
        from torchvision import tv_tensors

        out = transform(tv_tensors.Image(image), tv_tensors.Mask(mask), *map(tv_tensors.Mask, more))
        return tuple(x.as_subclass(Tensor) for x in out)


def segmentation_augment(cfg: DataConfig, size: tuple[int, int]) -> JointAugment | None:
    """The training augmentation ``cfg`` asks for (``None`` when it asks for none)."""
    if cfg.scale_range is None and not cfg.hflip:
        return None
    return JointAugment(size, cfg.hflip, cfg.scale_range)


@dataclass
class DataBundle:
    train: IndexedTensorDataset | SegmentationCacheDataset
    test: IndexedTensorDataset | SegmentationCacheDataset  # the split the run reports
    meta: dict
    num_classes: int
    image_shape: tuple[int, int]
    class_names: list[str] | None = None
    # the split the run selects its epoch on, when it is not the reported one (CamVid: val)
    val: SegmentationCacheDataset | IndexedTensorDataset | None = None

    @property
    def train_shape_labels(self) -> Tensor:
        return self.train.shape_labels


def load_data(cfg: DataConfig, seed: int = 0, pixel_index: bool = False) -> DataBundle:
    """Read the prepared cache for ``cfg.kind`` (first ``*_subset`` samples when set); ``seed``
    drives the training augmentations (COCO-Stuff); ``pixel_index``: training batches also hold
    each pixel's dataset index (``pixel``, segmentation only)."""
    if cfg.segmentation:
        return _load_segmentation(cfg, seed, pixel_index)
    if cfg.kind != "smnist":
        raise ValueError(f"data.kind must be 'smnist' or 'segmentation', got {cfg.kind!r}")
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
    val = None
    if cfg.val_fraction is not None:
        out["train"], val = _hold_out(out["train"], cfg.val_fraction)
    return DataBundle(out["train"], out["test"], meta, num_classes=10, image_shape=canvas, val=val)


def _hold_out(
    train: IndexedTensorDataset, fraction: float
) -> tuple[IndexedTensorDataset, IndexedTensorDataset]:
    """``(train, val)``: ``fraction`` of the images, drawn by a fixed permutation (the same val
    split for every training seed; the cache is ordered, e.g. by shape class), held out. Each
    part is its own dataset, indexed ``0 .. len - 1`` (the regularizer's sample indices)."""
    n_val = max(1, round(fraction * len(train)))
    if n_val >= len(train):
        raise ValueError(f"data.val_fraction={fraction} leaves no training image of {len(train)}")
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(0))
    keep, held = order[n_val:].sort().values, order[:n_val].sort().values
    train_part, val = (
        IndexedTensorDataset(**{k: v[rows] for k, v in train.tensors.items()})
        for rows in (keep, held)
    )
    return train_part, val


def _load_segmentation(cfg: DataConfig, seed: int, pixel_index: bool = False) -> DataBundle:
    _, meta = segmentation.load(cfg.path)  # validates the cache (complete, files present)
    size = tuple(meta["image_size"])
    select, report = segmentation.eval_splits(meta)
    train = SegmentationCacheDataset(
        cfg.path, "train", cfg.train_subset, segmentation_augment(cfg, size), seed, pixel_index
    )
    test = SegmentationCacheDataset(cfg.path, report, cfg.test_subset)
    val = SegmentationCacheDataset(cfg.path, select) if select != report else None
    return DataBundle(
        train,
        test,
        meta,
        num_classes=meta["num_classes"],
        image_shape=size,
        class_names=meta.get("class_names"),
        val=val,
    )


class ResumableBatchSampler(BatchSampler):
    """``BatchSampler`` whose next pass can start after ``skip`` batches (resume inside an epoch):
    the sampler draws the epoch's order as usual and the first batches are not loaded at all."""

    def __init__(self, sampler: Sampler | list[int], batch_size: int) -> None:
        super().__init__(sampler, batch_size, drop_last=False)
        self.skip = 0

    def __iter__(self) -> Iterator[list[int]]:
        # a generator: ``skip`` is taken at the first batch, not when iter() is called (the
        # multi-process DataLoader calls iter() twice when it starts and drops the first one)
        skip, self.skip = self.skip, 0
        yield from itertools.islice(super().__iter__(), skip, None)


class BlockSampler(Sampler[int]):
    """The samples ``[start, stop)`` of one process (``regularizer.shard=owner``: each process
    draws from the block whose per-sample state it holds), in a permutation drawn from
    ``seed + epoch`` (call ``set_epoch``, as with ``DistributedSampler``), padded by its first
    samples to ``length`` so that every process takes the same number of batches."""

    def __init__(self, start: int, stop: int, length: int, seed: int) -> None:
        self.start, self.stop, self.length, self.seed, self.epoch = start, stop, length, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.stop - self.start, generator=g) + self.start
        order = order.repeat(-(-self.length // len(order)))[: self.length]
        return iter(order.tolist())

    def __len__(self) -> int:
        return self.length


def make_loader(
    ds: Dataset,
    batch_size: int,
    *,
    shuffle: bool,
    seed: int = 0,
    num_workers: int = 0,
    rank: int = 0,
    world: int = 1,
    distributed: bool = False,
    block: tuple[int, int] | None = None,
) -> DataLoader:
    """Batches of ``batch_size`` (last one smaller) for this process.

    One process: reshuffled each epoch by a generator seeded with ``seed`` (the order behind
    docs/results.md). Under ``torch.distributed`` (``distributed=True``, any number of processes):
    training uses ``DistributedSampler`` (permutation from ``seed + epoch``, call ``set_epoch``), so
    global step ``t`` covers the same samples whatever the number of processes; evaluation takes
    the disjoint shard ``range(rank, n, world)`` (no padding: every sample counted once).
    ``block``: training draws from the samples ``[start, stop)`` alone (:class:`BlockSampler`).
    """
    if block is not None:
        base = BlockSampler(*block, -(-len(ds) // world), seed)
    elif distributed and shuffle:
        base: Sampler | list[int] = DistributedSampler(
            ds, num_replicas=world, rank=rank, shuffle=True, seed=seed
        )
    elif distributed:
        base = list(range(rank, len(ds), world))
    elif shuffle:
        base = RandomSampler(ds, generator=torch.Generator().manual_seed(seed))
    else:
        base = SequentialSampler(ds)
    return DataLoader(
        ds,
        sampler=ResumableBatchSampler(base, batch_size),
        batch_size=None,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        generator=torch.Generator().manual_seed(seed + 1),
    )
