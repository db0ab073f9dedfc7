"""The training-step half of ``benchmarks.segmentation``: what the regularizer costs a step of
DeepLabV3+ / ResNet-18 on COCO-Stuff's scale, and the step time of the paper configs' models."""

from __future__ import annotations

import statistics
import time
from typing import Any

COCO_TRAIN_IMAGES = 118287
SIZE = (106, 160)  # H, W of the timed steps


def _trainer(classes: int, tau_update: str | None) -> tuple[Any, Any, Any]:
    """``(model, regularizer or None, SGD)``: DeepLabV3+ / ResNet-18 from seed 0 and, unless
    ``tau_update`` is ``None``, an F-beta regularizer (mode ``epoch``) over COCO-Stuff train."""
    import torch

    from reparam import FBetaRegularizer
    from train.config import ModelConfig
    from train.models import build_model

    torch.manual_seed(0)
    config = ModelConfig(name="deeplabv3plus", encoder="resnet18", encoder_weights=None)
    model = build_model(config, SIZE, classes)
    reg = None
    if tau_update is not None:
        labels = torch.arange(COCO_TRAIN_IMAGES) % 2
        reg = FBetaRegularizer(labels, projection="epoch", tau_update=tau_update)
    params = [{"params": list(model.parameters())}]
    if reg is not None:
        params.append({"params": list(reg.parameters()), "weight_decay": 0.0})
    return model, reg, torch.optim.SGD(params, lr=1e-2, momentum=0.9, fused=True)


def _step(trainer: tuple[Any, Any, Any], x: Any, y: Any, k: int) -> float:
    """Seconds of one training step (forward, loss, backward, SGD, ``after_step_``)."""
    import torch

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
    import torch

    torch.set_num_threads(threads)
    rules = {"base": None, "reg": "dense", "sparse": "sparse_adam"}
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
