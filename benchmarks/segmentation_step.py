"""The DeepLabV3+ training step with and without the F-beta regularizer on one class's pixels: the
regularizer's share of a real segmentation step (``benchmarks.reg_loop --segmentation``)."""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from reparam import FBetaRegularizer

# (name, encoder, image size, images, autocast dtype): the small case on any device; the large
# one (ResNet-50 at 512x512 in bf16) on an accelerator
CASES = (
    ("ResNet-18, 120x160, batch 8", "resnet18", (120, 160), 100, None),
    ("ResNet-50, 512x512, batch 8, bf16", "resnet50", (512, 512), 16, torch.bfloat16),
)


def segmentation_share(device: str, modes: list[str], steps: int, alpha: float) -> list[list[str]]:
    """DeepLabV3+ training steps, batch 8 (random images, 11 classes; smp, no pretrained
    weights), with and without the F-beta defaults on class 3's pixels (``regularizer.target:
    pixels``: every pixel a sample), per case of ``CASES`` (the second on CUDA only) and mode:
    the step's median ms and the regularizer's share of it. The project's network
    (``train.seg_models``, which pads to the encoder's stride); ``alpha`` weighs the
    regularizer. Rows for ``reg_loop``'s second table."""
    from train.torchvision_compat import ensure_torchvision_importable

    ensure_torchvision_importable()  # before smp imports torchvision
    rows = []
    for case in CASES[: 2 if device.startswith("cuda") else 1]:
        for mode in modes:
            times = {}
            for with_reg in (False, True):
                try:
                    times[with_reg] = _case_step(device, case, mode, with_reg, steps, alpha)
                except Exception as e:  # a mode that fails is reported and skipped
                    print(f"DeepLabV3+ {case[0]} {mode} failed: {str(e)[:300]}")
                    break
            if len(times) == 2:
                share = (times[True] - times[False]) / times[True]
                base, reg = f"{times[False] * 1e3:.2f}", f"{times[True] * 1e3:.2f}"
                rows.append([case[0], mode, base, reg, f"{share:.1%}"])
    return rows


def _case_step(device: str, case: tuple, mode: str, with_reg: bool, steps: int, alpha: float):
    """Median seconds of one case's training step in ``mode``, with or without the regularizer."""
    from train.seg_models import build_segmentation_model

    _, encoder, size, images, autocast = case
    classes, gen = 11, torch.Generator().manual_seed(0)
    labels = torch.randint(0, classes, (images, *size), generator=gen)
    x = torch.randn(images, 3, *size, generator=gen)
    torch.manual_seed(0)
    net = build_segmentation_model("deeplabv3plus", encoder, None, classes).to(device)
    reg = FBetaRegularizer(labels.reshape(-1) == 3).to(device) if with_reg else None
    opt = torch.optim.Adam([*net.parameters(), *(reg.parameters() if reg else [])])
    if reg is not None:
        reg.attach(opt)  # the sparse tau steps at opt.step()

    def loss_fn(xb, yb, idx):
        with torch.autocast(xb.device.type, dtype=autocast, enabled=autocast is not None):
            logits, _ = net(xb)  # (logits, shape node)
        logits = logits.float()
        loss = F.cross_entropy(logits, yb)
        if reg is not None:
            margin = logits[:, 3] - logits.detach().max(1).values  # class 3's pixels
            loss = loss + alpha * reg(margin.reshape(-1), idx)
        return loss

    step_loss = loss_fn
    if mode != "eager":
        options = {"mode": "reduce-overhead"} if mode == "cudagraphs" else {}
        step_loss = torch.compile(loss_fn, fullgraph=True, **options)
    return _segmentation_steps(step_loss, opt, (x, labels), steps)


def _segmentation_steps(step_loss, opt, data, steps: int) -> float:
    """Median seconds of a segmentation training step over ``steps`` (after 5), batches of 8
    random images of ``data``; a pixel's dataset index is image * pixels + its position."""
    x, labels = data
    gen = torch.Generator().manual_seed(1)
    pixels, device = labels[0].numel(), next(iter(opt.param_groups[0]["params"])).device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    ts = []
    for _ in range(steps + 5):
        pick = torch.randperm(len(x), generator=gen)[:8]
        idx = (pick[:, None] * pixels + torch.arange(pixels)).reshape(-1)
        xb, yb = x[pick].to(device), labels[pick].to(device)
        sync()
        t0 = time.perf_counter()
        torch.compiler.cudagraph_mark_step_begin()  # a no-op unless CUDA graphs
        step_loss(xb, yb, idx.to(device)).backward()
        opt.step()
        opt.zero_grad()
        sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts[5:])
