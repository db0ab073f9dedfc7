"""Mixed precision and multiple processes on this machine's CPU, measured in one run.

    python -m benchmarks.scale --out docs/figures

1. Step time fp32 vs bf16 (autocast) for DeepLabV3+ / ResNet-18 at 106x160, batch ``--batch``, with
   the regularizer: the two trainers' steps alternate, medians of ``--steps`` after warm-up.
2. Training throughput of ``torchrun --nproc_per_node=2`` (gloo, 1 thread each) vs one process
   (2 threads) with the same global batch on a generated COCO-Stuff fixture (official format,
   ``--images`` training images at 106x160): images/s = images / summed training-pass seconds
   (``metrics.json``), so start-up and evaluation do not count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from train.torchvision_compat import ensure_torchvision_importable

from ._report import markdown_table, save_figure, subplots
from ._timing import machine_line

ROOT = Path(__file__).resolve().parents[1]


def precision_steps(batch: int, steps: int, threads: int) -> dict[str, float]:
    import torch

    from reparam import FBetaRegularizer, SparseTau
    from train.build import autocast_dtype
    from train.config import ModelConfig
    from train.loop import task_loss
    from train.models import build_model

    torch.set_num_threads(threads)
    trainers = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = build_model(
            ModelConfig(name="deeplabv3plus", encoder="resnet18", encoder_weights=None),
            (106, 160),
            92,
        )
        # (the rows' own Adam rule at SGD's lr: SparseTau(lr=None) refuses an SGD at attach)
        reg = FBetaRegularizer(torch.arange(118287) % 2, tau=SparseTau(lr=1e-2))
        opt = torch.optim.SGD([*model.parameters(), *reg.parameters()], lr=1e-2, momentum=0.9)
        reg.attach(opt)  # the sparse tau steps at opt.step()
        trainers[precision] = (model, reg, opt)
    x = torch.randint(0, 256, (batch, 3, 106, 160), dtype=torch.uint8)
    y = torch.randint(0, 92, (batch, 106, 160))

    def step(precision: str, k: int) -> float:
        model, reg, opt = trainers[precision]
        dtype = autocast_dtype(precision)
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            logits, u = model(x)
            loss = task_loss(logits, y)
        loss = loss + 1e-3 * reg(u.float(), torch.arange(batch) * 11 + k)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return time.perf_counter() - start

    times: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for k in range(steps + 2):
        for precision in ("fp32", "bf16") if k % 2 == 0 else ("bf16", "fp32"):
            t = step(precision, k)
            if k >= 2:
                times[precision].append(t)
    return {p: statistics.median(v) for p, v in times.items()}


def process_throughput(images: int, batch: int, epochs: int, tmp: Path) -> dict[str, float]:
    from data_prep import cocostuff
    from data_prep.cocostuff_synthetic import write_synthetic_cocostuff
    from train import distributed

    root = write_synthetic_cocostuff(tmp / "coco", n_train=images, n_val=4, size=(120, 180))
    cocostuff.prepare(
        cocostuff.Options(out=tmp / "cache", root=root, setup="stuff", workers=2),
        log=lambda *_: None,
    )
    common = [
        "--config",
        str(ROOT / "configs" / "cocostuff_tiny.yaml"),
        "--regularizer",
        "fbeta",
        f"data.path={tmp / 'cache'}",
        f"data.batch_size={batch}",
        f"train.epochs={epochs}",
        "train.progress=false",
        "train.checkpoint=false",
        "train.log_images=0",
        "data.scale_range=null",
    ]
    rates = {}
    for name, launcher, threads in (
        ("1 process, 2 threads", [sys.executable, "-m", "train"], 2),
        ("2 processes (torchrun, gloo), 1 thread each", distributed.torchrun_command(2), 1),
    ):
        out = tmp / name.split()[0]
        cmd = [*launcher, *common, f"train.num_threads={threads}", "--out", str(out)]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        history = json.loads((out / "metrics.json").read_text())["history"]
        seconds = sum(h["train_seconds"] for h in history[1:])  # epoch 1 is warm-up
        rates[name] = images * (len(history) - 1) / seconds
    return rates


def main(argv: list[str] | None = None) -> int:
    ensure_torchvision_importable()  # before smp, timm and torchvision are imported
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--images", type=int, default=64, help="training images (process throughput)")
    p.add_argument("--epochs", type=int, default=3, help="epochs per run (the first is warm-up)")
    p.add_argument("--quick", action="store_true", help="tiny sizes (smoke)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    a = p.parse_args(argv)
    if a.quick:
        a.batch, a.steps, a.images, a.epochs = 4, 1, 8, 2  # >= 2 per process: batch norm
    pr = precision_steps(a.batch, a.steps, a.threads)
    print(f"fp32 {pr['fp32']:.3f} s, bf16 {pr['bf16']:.3f} s", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        rates = process_throughput(a.images, a.batch, a.epochs, Path(tmp))
    one, two = rates.values()
    rows = [
        [
            f"DeepLabV3+ resnet18 step, batch {a.batch}, 106x160, regularized, {a.threads} threads",
            f"fp32 {pr['fp32']:.3f} s",
            f"bf16 {pr['bf16']:.3f} s",
            f"**{pr['bf16'] / pr['fp32']:.2f}** (bf16 / fp32 time)",
        ],
        [
            f"training throughput, DeepLabV3+ resnet18, global batch {a.batch}, {a.images} images",
            f"1 process {one:.1f} img/s",
            f"2 processes {two:.1f} img/s",
            f"**{two / one:.2f}** (2 / 1 throughput)",
        ],
    ]
    table = markdown_table(["measurement", "A", "B", "ratio"], rows)
    text = (
        f"<!-- python -m benchmarks.scale --batch {a.batch} --steps {a.steps} --images "
        f"{a.images} --epochs {a.epochs} -->\n{machine_line()}\n\n{table}\n"
    )
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "scale.md").write_text(text)
    _plot(pr, rates, a.out / "scale.png")
    print(table)
    return 0


def _plot(pr: dict[str, float], rates: dict[str, float], path: Path) -> None:
    fig, (ax1, ax2) = subplots(1, 2, figsize=(9, 3))
    ax1.bar(list(pr), list(pr.values()), color=["gray", "tab:blue"])
    ax1.set_ylabel("s / step")
    ax1.set_title("precision (CPU)")
    ax2.bar(["1 process", "2 processes"], list(rates.values()), color=["gray", "tab:blue"])
    ax2.set_ylabel("images / s")
    ax2.set_title("processes (CPU, 2 cores)")
    save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(main())
