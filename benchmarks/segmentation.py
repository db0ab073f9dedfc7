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

from train.torchvision_compat import ensure_torchvision_importable

from ._timing import machine_line, markdown_table

COCO_TRAIN_IMAGES = 118287


def loader_throughput(
    root: Path | None,
    n_images: int,
    photo_size: tuple[int, int],
    workers: int,
    batch: int,
    epochs: int,
    tmp: Path,
) -> dict[str, float]:
    import numpy as np
    import torch
    from torch.utils.data import Dataset

    from data_prep import cocostuff
    from train.config import DataConfig
    from train.data import ResumableBatchSampler, SegmentationCacheDataset, segmentation_augment

    if root is None:
        from data_prep.cocostuff_synthetic import write_synthetic_cocostuff

        root = write_synthetic_cocostuff(tmp / "coco", n_train=n_images, n_val=2, size=photo_size)
    options = cocostuff.Options(
        out=tmp / "cache", root=root, setup="stuff", limit=n_images, workers=workers
    )
    start = time.perf_counter()
    cocostuff.prepare(options, log=lambda *_: None)
    prep_s = time.perf_counter() - start
    size = tuple(options.size)
    augment = segmentation_augment(DataConfig(kind="cocostuff", hflip=True), size)
    cached = SegmentationCacheDataset(options.out, "train", augment=augment)

    inputs = cocostuff.find_inputs(options)
    src = cocostuff.read_split(inputs.annotations["train"], options)
    keep = set(np.load(Path(options.out) / "train" / "image_ids.npy").tolist())
    jobs = [
        j for j in cocostuff.make_jobs("train", src, inputs, options, 92) if j.record["id"] in keep
    ]

    class DecodePerSample(Dataset):
        """The same batches as the cache, made from the JPEG + RLE masks of every sample."""

        def __len__(self) -> int:
            return len(jobs)

        def __getitem__(self, idx: list[int]) -> dict[str, torch.Tensor]:
            from torchvision import tv_tensors

            images, labels = [], []
            for i in idx:
                image, label, _ = cocostuff.process_image(jobs[i])
                a, b = augment(
                    tv_tensors.Image(torch.tensor(image).permute(2, 0, 1)),
                    tv_tensors.Mask(torch.from_numpy(label)),
                )
                images.append(a.as_subclass(torch.Tensor))
                labels.append(b.as_subclass(torch.Tensor))
            return {"image": torch.stack(images), "label": torch.stack(labels)}

    def rate(ds: Dataset, samples: int) -> float:
        """Images/s over one long pass of ``samples`` random images (as inside a real epoch of
        118k images: no per-epoch worker restart), after a warm-up pass."""
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

    cache_rate, decode_rate = rate(cached, 32 * n_images), rate(DecodePerSample(), 2 * n_images)
    return {
        "images": len(jobs),
        "cache": cache_rate,
        "decode": decode_rate,
        "ratio": cache_rate / decode_rate,
        "prep_s": prep_s,
    }


def step_overhead(batch: int, steps: int, classes: int, threads: int) -> dict[str, float]:
    import torch

    from reparam import FBetaRegularizer
    from train.config import ModelConfig
    from train.loop import task_loss
    from train.models import build_model

    torch.set_num_threads(threads)
    h, w = 106, 160
    shape_labels = torch.arange(COCO_TRAIN_IMAGES) % 2
    trainers = {}
    for name in ("base", "reg", "sparse"):
        torch.manual_seed(0)
        model = build_model(
            ModelConfig(name="deeplabv3plus", encoder="resnet18", encoder_weights=None),
            (h, w),
            classes,
        )
        reg = None
        if name != "base":
            reg = FBetaRegularizer(
                shape_labels,
                projection="epoch",
                tau_update="sparse_adam" if name == "sparse" else "dense",
            )
        params = [{"params": list(model.parameters())}]
        if reg is not None:
            params.append({"params": list(reg.parameters()), "weight_decay": 0.0})
        opt = torch.optim.SGD(params, lr=1e-2, momentum=0.9, fused=True)
        trainers[name] = (model, reg, opt)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (batch, 3, h, w), dtype=torch.uint8, generator=gen)
    y = torch.randint(0, classes, (batch, h, w), generator=gen)

    def step(name: str, k: int) -> float:
        model, reg, opt = trainers[name]
        idx = torch.randperm(COCO_TRAIN_IMAGES, generator=torch.Generator().manual_seed(k))[:batch]
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

    times: dict[str, list[float]] = {"base": [], "reg": [], "sparse": []}
    for k in range(steps + 2):
        for name in ("base", "reg", "sparse") if k % 2 == 0 else ("sparse", "reg", "base"):
            t = step(name, k)
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
    import torch

    from reparam import FBetaRegularizer
    from train.config import ModelConfig
    from train.loop import task_loss
    from train.models import build_model

    torch.set_num_threads(threads)
    out = []
    for label, name, encoder, batch, classes in (
        (
            "DeepLabV3+ resnet50 (cocostuff_deeplabv3plus.yaml), batch 8",
            "deeplabv3plus",
            "resnet50",
            8,
            92,
        ),
        ("SegNet vgg16_bn (coco_sky_segnet.yaml), batch 7 (paper)", "segnet", "vgg16_bn", 7, 2),
    ):
        torch.manual_seed(0)
        model = build_model(
            ModelConfig(name=name, encoder=encoder, encoder_weights=None), (106, 160), classes
        )
        reg = FBetaRegularizer(torch.arange(COCO_TRAIN_IMAGES) % 2)
        opt = torch.optim.SGD([*model.parameters(), *reg.parameters()], lr=1e-2, momentum=0.9)
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


def main(argv: list[str] | None = None) -> int:
    ensure_torchvision_importable()  # before smp, timm and torchvision are imported
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
    src = "generated " + "x".join(map(str, a.photo_size)) if a.root is None else str(a.root)
    rows = [
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
    table = markdown_table(["measurement", "with", "without", "ratio", "target"], rows)
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3))
    ax1.bar(["decode per sample", "cache"], [lo["decode"], lo["cache"]], color=["gray", "tab:blue"])
    ax1.set_yscale("log")
    ax1.set_ylabel("images / s")
    ax1.set_title(f"loader: {lo['ratio']:.0f}x")
    ax2.bar(["baseline", "regularized"], [st["base_s"], st["reg_s"]], color=["gray", "tab:blue"])
    ax2.set_ylabel("s / step")
    ax2.set_title(f"DeepLabV3+ r18 step: {st['ratio']:.3f}x")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
