"""The measurements of the segmentation benchmark: loader throughput (the cache against decoding
every sample), what the regularizer costs a training step of DeepLabV3+ / ResNet-18 on COCO-Stuff's
scale, and the step time of the paper configs' models."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from .spec import COCO_TRAIN_IMAGES, PAPER_MODELS, SIZE


def _trainer(classes: int, tau: Any) -> tuple[Any, Any, Any]:
    """``(model, regularizer or None, SGD)``: DeepLabV3+ / ResNet-18 from seed 0 and, unless
    ``tau`` is ``None``, an F-beta regularizer (``schedule=EpochEnd()``, ``tau`` its option:
    ``DenseTau()`` or ``SparseTau()``) over COCO-Stuff train."""
    from reparam import EpochEnd, FBetaRegularizer
    from train.config import ModelConfig
    from train.models import build_model

    torch.manual_seed(0)
    config = ModelConfig(name="deeplabv3plus", encoder="resnet18", encoder_weights=None)
    model = build_model(config, SIZE, classes)
    reg = None
    if tau is not None:
        labels = torch.arange(COCO_TRAIN_IMAGES) % 2
        reg = FBetaRegularizer(labels, schedule=EpochEnd(), tau=tau)
    params = [{"params": list(model.parameters())}]
    if reg is not None:
        params.append({"params": list(reg.parameters()), "weight_decay": 0.0})
    return model, reg, torch.optim.SGD(params, lr=1e-2, momentum=0.9, fused=True)


def _step(trainer: tuple[Any, Any, Any], x: Any, y: Any, k: int) -> float:
    """Seconds of one training step (forward, loss, backward, SGD, ``after_step_``: the sparse
    ``tau``'s step)."""
    from train.loop import task_loss

    model, reg, opt = trainer
    idx = torch.randperm(COCO_TRAIN_IMAGES, generator=torch.Generator().manual_seed(k))[: len(x)]
    start = time.perf_counter()
    logits, u = model(x)
    loss = task_loss(logits, y)
    if reg is not None:
        loss = loss + 1e-3 * reg(u, idx)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if reg is not None:
        reg.after_step_()
    return time.perf_counter() - start


def step_overhead(batch: int, steps: int, classes: int, threads: int) -> dict[str, float]:
    """Median step times of the baseline, the regularized trainer (``tau`` stepped densely) and
    the sparse one, interleaved after 2 warm-up rounds; the epoch end of the regularized one."""
    from reparam import DenseTau, SparseTau

    torch.set_num_threads(threads)
    rules = {"base": None, "reg": DenseTau(), "sparse": SparseTau()}
    trainers = {name: _trainer(classes, rule) for name, rule in rules.items()}
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (batch, 3, *SIZE), dtype=torch.uint8, generator=gen)
    y = torch.randint(0, classes, (batch, *SIZE), generator=gen)
    times: dict[str, list[float]] = {"base": [], "reg": [], "sparse": []}
    for k in range(steps + 2):
        for name in ("base", "reg", "sparse") if k % 2 == 0 else ("sparse", "reg", "base"):
            t = _step(trainers[name], x, y, k)
            if k >= 2:  # warm-up
                times[name].append(t)
    reg = trainers["reg"][1]
    ends = []
    for _ in range(5):
        start = time.perf_counter()
        reg.end_epoch_()
        ends.append(time.perf_counter() - start)
    base, regd = statistics.median(times["base"]), statistics.median(times["reg"])
    sparse = statistics.median(times["sparse"])
    epoch_s = regd * COCO_TRAIN_IMAGES / batch
    return {
        "base_s": base,
        "reg_s": regd,
        "ratio": regd / base,
        "extra_ms": (regd - base) * 1e3,
        "sparse_s": sparse,
        "sparse_ratio": sparse / base,
        "end_s": statistics.median(ends),
        "end_fraction": statistics.median(ends) / epoch_s,
    }


def config_step_times(threads: int, steps: int = 3) -> list[tuple[str, float]]:
    """Seconds per regularized training step (forward, backward, SGD) of the paper configs'
    models on this CPU at 106x160 (median of ``steps`` after one warm-up)."""
    from reparam import FBetaRegularizer, SparseTau
    from train.config import ModelConfig
    from train.loop import task_loss
    from train.models import build_model

    torch.set_num_threads(threads)
    out = []
    for label, name, encoder, batch, classes in PAPER_MODELS:
        torch.manual_seed(0)
        model = build_model(
            ModelConfig(name=name, encoder=encoder, encoder_weights=None), (106, 160), classes
        )
        # (the rows' own Adam rule at SGD's lr: SparseTau(lr=None) refuses an SGD at attach)
        reg = FBetaRegularizer(torch.arange(COCO_TRAIN_IMAGES) % 2, tau=SparseTau(lr=1e-2))
        opt = torch.optim.SGD([*model.parameters(), *reg.parameters()], lr=1e-2, momentum=0.9)
        reg.attach(opt)  # the sparse tau steps at opt.step()
        x = torch.randint(0, 256, (batch, 3, 106, 160), dtype=torch.uint8)
        y = torch.randint(0, classes, (batch, 106, 160))
        times = []
        for k in range(steps + 1):
            start = time.perf_counter()
            logits, u = model(x)
            loss = task_loss(logits, y) + 1e-3 * reg(u, torch.arange(batch) * 7 + k)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - start)
        out.append((label, statistics.median(times[1:])))
    return out


class DecodePerSample(Dataset):
    """The same batches as the cache, made from the JPEG + RLE masks of every sample (the
    ``data_prep.cocostuff`` jobs) by the trainer's augmentation."""

    def __init__(self, jobs: list[Any], augment: Any) -> None:
        self.jobs, self.augment = jobs, augment

    def __len__(self) -> int:
        return len(self.jobs)

    def __getitem__(self, idx: list[int]) -> dict[str, torch.Tensor]:
        from torchvision import tv_tensors

        from data_prep import cocostuff

        images, labels = [], []
        for i in idx:
            image, label, _ = cocostuff.process_image(self.jobs[i])
            a, b = self.augment(
                tv_tensors.Image(torch.tensor(image).permute(2, 0, 1)),
                tv_tensors.Mask(torch.from_numpy(label)),
            )
            images.append(a.as_subclass(torch.Tensor))
            labels.append(b.as_subclass(torch.Tensor))
        return {"image": torch.stack(images), "label": torch.stack(labels)}


def _rate(ds: Dataset, samples: int, batch: int, workers: int, epochs: int) -> float:
    """Images/s over one long pass of ``samples`` random images (as inside a real epoch of 118k
    images: no per-epoch worker restart), the median of ``epochs`` passes after a warm-up pass."""
    from train.data import ResumableBatchSampler

    order = torch.utils.data.RandomSampler(
        ds, replacement=True, num_samples=samples, generator=torch.Generator().manual_seed(0)
    )
    loader = torch.utils.data.DataLoader(
        ds,
        sampler=ResumableBatchSampler(order, batch),
        batch_size=None,
        num_workers=workers,
        persistent_workers=workers > 0,
    )
    rates = []
    for _ in range(epochs + 1):
        start = time.perf_counter()
        n = sum(len(b["image"]) for b in loader)
        rates.append(n / (time.perf_counter() - start))
    return statistics.median(rates[1:])


def loader_throughput(
    root: Path | None,
    n_images: int,
    photo_size: tuple[int, int],
    workers: int,
    batch: int,
    epochs: int,
    tmp: Path,
) -> dict[str, float]:
    """Images/s through a loader of the cache and of decoding every sample, and the cache's
    preparation time (on a generated COCO-Stuff when ``root`` is ``None``)."""
    import numpy as np

    from data_prep import cocostuff
    from train.config import DataConfig
    from train.data import SegmentationCacheDataset, segmentation_augment

    if root is None:
        from data_prep.cocostuff_synthetic import write_synthetic_cocostuff

        root = write_synthetic_cocostuff(tmp / "coco", n_train=n_images, n_val=2, size=photo_size)
    options = cocostuff.Options(
        out=tmp / "cache", root=root, setup="stuff", limit=n_images, workers=workers
    )
    start = time.perf_counter()
    cocostuff.prepare(options, log=lambda *_: None)
    prep_s = time.perf_counter() - start
    augment = segmentation_augment(DataConfig(kind="cocostuff", hflip=True), tuple(options.size))
    cached = SegmentationCacheDataset(options.out, "train", augment=augment)
    inputs = cocostuff.find_inputs(options)
    src = cocostuff.read_split(inputs.annotations["train"], options)
    keep = set(np.load(Path(options.out) / "train" / "image_ids.npy").tolist())
    jobs = [
        j for j in cocostuff.make_jobs("train", src, inputs, options, 92) if j.record["id"] in keep
    ]
    cache_rate = _rate(cached, 32 * n_images, batch, workers, epochs)
    decode_rate = _rate(DecodePerSample(jobs, augment), 2 * n_images, batch, workers, epochs)
    return {
        "images": len(jobs),
        "cache": cache_rate,
        "decode": decode_rate,
        "ratio": cache_rate / decode_rate,
        "prep_s": prep_s,
    }
