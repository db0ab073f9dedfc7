"""COCO-Stuff: what the cache buys the loader, and what the regularizer costs a training step.

    python -m benchmarks.segmentation --out docs/figures      # builds its own official-format data

1. Loader throughput (images/s through a ``DataLoader`` with ``--workers`` processes, the trainer's
   augmentations included; median of ``--loader-epochs`` passes of 32x / 2x the images drawn
   with replacement, after a warm-up pass): the memory-mapped cache of ``data_prep.cocostuff`` vs decoding each
   JPEG, painting its RLE masks and resizing per sample (``data_prep.cocostuff.process_image``, the
   work the cache does once). Without ``--root`` the images are a generated COCO-Stuff in the
   official format at COCO's photo size (``--photo-size``, default 480x640, JPEG quality 90).
2. Training step time, regularized / baseline, DeepLabV3+ with a ResNet-18 encoder (random init)
   on CPU at 106x160, batch ``--batch``: the two trainers' steps are interleaved (base, reg, ...),
   medians over ``--steps`` steps after warm-up; the regularizer has one state per training image
   of COCO-Stuff train2017 (118287, half of them positive) and runs in mode ``epoch``, with ``tau``
   stepped densely by the optimizer and, as a third interleaved trainer, sparsely
   (``tau_update="sparse_adam"``, docs/method.md sec. 11); its epoch end (projection + dual step)
   is timed too and set against an epoch of 118287 images.
3. Seconds per training step of the paper configs' models on this CPU (README numbers).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from train.torchvision_compat import ensure_torchvision_importable

from ._report import markdown_table, save_figure, subplots
from ._timing import machine_line
from .segmentation_steps import COCO_TRAIN_IMAGES, config_step_times, step_overhead


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


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=None, help="a COCO-Stuff root (default: generated)")
    p.add_argument("--images", type=int, default=128, help="training images for the loader test")
    p.add_argument("--photo-size", type=int, nargs=2, default=(480, 640), metavar=("H", "W"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--loader-batch", type=int, default=120, help="the paper's regularized batch")
    p.add_argument("--loader-epochs", type=int, default=3, help="timed passes (median)")
    p.add_argument("--batch", type=int, default=8, help="training batch for the step timing")
    p.add_argument("--steps", type=int, default=30, help="timed steps per trainer")
    p.add_argument("--classes", type=int, default=92)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="tiny sizes, no config timings (smoke)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    a = p.parse_args(argv)
    if a.quick:
        a.images, a.photo_size, a.loader_batch, a.loader_epochs = 8, (60, 80), 4, 1
        a.batch, a.steps = 2, 1
    return a


def _rows(a: argparse.Namespace, lo: dict[str, float], st: dict[str, float]) -> list[list[str]]:
    """The measurements against their targets: the loader, the step (dense and sparse ``tau``),
    the epoch end."""
    src = "generated " + "x".join(map(str, a.photo_size)) if a.root is None else str(a.root)
    return [
        [
            f"loader, {lo['images']} images ({src}), {a.workers} workers, batch {a.loader_batch}",
            f"cache {lo['cache']:.0f} img/s",
            f"decode + resize {lo['decode']:.1f} img/s",
            f"**{lo['ratio']:.1f}x**",
            "≥ 10x",
        ],
        [
            f"DeepLabV3+ resnet18 step, batch {a.batch}, 106x160, {a.classes} classes, CPU "
            f"{a.threads} threads",
            f"regularized {st['reg_s']:.3f} s",
            f"baseline {st['base_s']:.3f} s",
            f"**{st['ratio']:.4f}**",
            "≤ 1.02",
        ],
        [
            "the same, tau_update=sparse_adam",
            f"regularized {st['sparse_s']:.3f} s",
            f"baseline {st['base_s']:.3f} s",
            f"**{st['sparse_ratio']:.4f}**",
            "≤ 1.02",
        ],
        [
            f"epoch end (projection of {COCO_TRAIN_IMAGES // 2} tau + dual step)",
            f"{st['end_s'] * 1e3:.1f} ms",
            f"epoch ≈ {st['reg_s'] * COCO_TRAIN_IMAGES / a.batch / 60:.0f} min",
            f"**{100 * st['end_fraction']:.5f} %**",
            "-",
        ],
    ]


def main(argv: list[str] | None = None) -> int:
    """Measure the loader and the step; write ``segmentation.md`` and ``segmentation.png``."""
    ensure_torchvision_importable()  # before smp, timm and torchvision are imported
    a = _arguments(argv)
    with tempfile.TemporaryDirectory() as tmp:
        lo = loader_throughput(
            a.root,
            a.images,
            tuple(a.photo_size),
            a.workers,
            a.loader_batch,
            a.loader_epochs,
            Path(tmp),
        )
    print(
        f"loader: cache {lo['cache']:.0f} img/s, decode {lo['decode']:.1f} img/s, "
        f"ratio {lo['ratio']:.1f}",
        flush=True,
    )
    st = step_overhead(a.batch, a.steps, a.classes, a.threads)
    print(f"step: ratio {st['ratio']:.4f} (sparse tau {st['sparse_ratio']:.4f})", flush=True)
    configs = [] if a.quick else config_step_times(a.threads)
    table = markdown_table(["measurement", "with", "without", "ratio", "target"], _rows(a, lo, st))
    steps_table = markdown_table(
        ["model, CPU, 106x160, regularized", "seconds per training step"],
        [[name, f"{t:.2f}"] for name, t in configs],
    )
    cmd = "python -m benchmarks.segmentation" + ("" if a.root is None else f" --root {a.root}")
    text = (
        f"<!-- {cmd} --images {a.images} --steps {a.steps} --batch {a.batch} -->\n"
        f"{machine_line()}; cache prep of the loader set: {lo['prep_s']:.1f} s; step medians "
        f"of {a.steps} interleaved steps (extra {st['extra_ms']:.1f} ms/step)\n\n{table}\n\n"
        f"{steps_table}\n"
    )
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "segmentation.md").write_text(text)
    _plot(lo, st, a.out / "segmentation.png")
    print(table)
    print(steps_table)
    return 0


def _plot(lo: dict[str, float], st: dict[str, float], path: Path) -> None:
    fig, (ax1, ax2) = subplots(1, 2, figsize=(9, 3))
    ax1.bar(["decode per sample", "cache"], [lo["decode"], lo["cache"]], color=["gray", "tab:blue"])
    ax1.set_yscale("log")
    ax1.set_ylabel("images / s")
    ax1.set_title(f"loader: {lo['ratio']:.0f}x")
    ax2.bar(["baseline", "regularized"], [st["base_s"], st["reg_s"]], color=["gray", "tab:blue"])
    ax2.set_ylabel("s / step")
    ax2.set_title(f"DeepLabV3+ r18 step: {st['ratio']:.3f}x")
    save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(main())
