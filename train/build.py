"""What ``train.loop`` builds before the first step: seeds, device, run folder, regularizer,
optimizer and lr schedule (the data and the models are built by ``train.data`` / ``train.models``)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from reparam import Shard

from .config import REGULARIZERS, Config, RegularizerConfig


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002  (seeds the legacy global state that libraries use)
    torch.manual_seed(seed)


def resolve_device(name: str, local_rank: int | None = None) -> torch.device:
    """``auto``: CUDA when available; under ``torchrun`` the process's own GPU (``LOCAL_RANK``)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and local_rank is not None:
        name = f"cuda:{local_rank}"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"train.device is {name!r} but CUDA is not available on this machine")
    return device


def run_folder(cfg: Config, create: bool = True) -> Path:
    """``train.out`` (must be new or empty), else ``runs/<experiment>/<tag>[-k]`` (first free),
    created unless ``create`` is false (then nothing on disk is touched: the check before a run's
    inputs are checked)."""
    if cfg.train.out is not None:
        out = Path(cfg.train.out)
        if out.exists() and any(out.iterdir()):
            raise ValueError(
                f"train.out {str(out)!r} exists and is not empty; choose a new folder or delete it"
            )
    else:
        r = cfg.regularizer
        # the projection as resolved on loading (null: an objective that takes none)
        tag = "baseline" if r.name == "none" else f"{r.name}-a{r.alpha:g}-{r.projection or 'none'}"
        base = Path("runs") / cfg.experiment / f"{tag}-seed{cfg.train.seed}"
        out, k = base, 1
        while out.exists() and any(out.iterdir()):
            k += 1
            out = base.with_name(f"{base.name}-{k}")
    if create:
        out.mkdir(parents=True, exist_ok=True)
    return out


def _processes() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


SHARDABLE = ("fbeta", "precision_at_recall", "recall_at_precision", "roc_auc")  # .shard


def build_regularizer(
    r: RegularizerConfig,
    shape_labels: torch.Tensor,
    groups: torch.Tensor | None = None,
    shard: Shard | None = None,
) -> nn.Module | None:
    """The regularizer ``r.name`` with its options (``None`` for ``none``); a bad option is a
    ``ValueError`` naming its config key. ``groups``: per-sample groups (``target: pixels``: each
    pixel's image); ``shard``: this process's block of the per-sample state (``shape_labels`` its
    block's)."""
    if r.name == "none":
        return None
    try:
        extra = {} if groups is None else {"groups": groups}
        if shard is not None:
            if r.name not in SHARDABLE:
                raise ValueError(
                    f"regularizer.shard={r.shard} supports regularizer.name "
                    f"{', '.join(SHARDABLE)}, got name={r.name}"
                )
            extra["shard"] = shard
        kwargs = r.kwargs()
        if "dual_every" in kwargs and _processes() > 1 and shard is None:
            # the per-step dual step writes the local batch's rows of tau and lambda and steps nu
            # on the local batch, so ranks would drift apart; the epoch step runs on merged scores
            if kwargs["dual_every"] == "step":
                raise ValueError(
                    f"regularizer.{r.name}.dual_every=step runs in one process only (each rank "
                    f"would step nu on its own batches): use dual_every=epoch under torchrun"
                )
            kwargs["dual_every"] = "epoch"
        return REGULARIZERS[r.name](shape_labels, **kwargs, **extra)
    except ValueError as e:
        raise ValueError(f"regularizer ({r.name}): {e}") from e


def pixel_scores(logits: Tensor, classes: list[int]) -> Tensor:
    r"""``(B, H, W, P)``: each pixel's one-vs-rest margin for each class ``c`` of ``classes``,
    ``u_c = z_c - max_{c' != c} z_{c'}`` (``z`` the logits), so ``u_c > 0`` exactly where the
    argmax decides ``c``: the F-beta of ``u > 0`` over an image's pixels is its Dice of class
    ``c`` (``regularizer.target: pixels``).

    From the top two logits of each pixel, reduced over the class dimension in place (``max``,
    then ``amax`` with the winner masked): ``max_{c' != c} z_{c'}`` is the second when ``c`` wins,
    else the first. A ``topk`` over a channels-last view took 1.4x as long (forward + backward,
    batch 8 at 120x160, 2 classes)."""
    z = logits.float()
    first, winner = z.max(1, keepdim=True)  # (B, 1, H, W)
    second = z.scatter(1, winner, float("-inf")).amax(1, keepdim=True)
    wins = winner == torch.tensor(classes, device=z.device).view(1, -1, 1, 1)
    return (z[:, classes] - torch.where(wins, second, first)).movedim(1, -1)


def labelled_pixel_scores(
    logits: Tensor, classes: list[int], labels: Tensor, pixels: Tensor, ignore_index: int
) -> tuple[Tensor, Tensor]:
    """The samples a batch gives the pixel objective: ``(u, idx)``, the margins
    (:func:`pixel_scores`, ``(M, P)``) and the training-set pixel indices (``(M,)``) of its ``M``
    pixels whose label is not ``ignore_index`` (unlabelled and padded pixels are no samples). One
    ``nonzero`` and two gathers, not two boolean-mask indexings (each its own ``nonzero``)."""
    keep = (labels != ignore_index).view(-1).nonzero().squeeze(1)
    u = pixel_scores(logits, classes).reshape(-1, len(classes)).index_select(0, keep)
    return u, pixels.reshape(-1).index_select(0, keep)


def shape_score_columns(positive_classes: list[int]) -> int:
    """Columns of the shape head: 1 for one positive class, else one per shape class
    (the regularizer reads column ``c`` as the one-vs-rest score of class ``c``)."""
    return 1 if len(positive_classes) == 1 else max(positive_classes) + 1


def build_optimizer(cfg: Config, model: nn.Module, reg: nn.Module | None) -> torch.optim.Optimizer:
    o = cfg.optim
    groups = [{"params": list(model.parameters())}]
    if reg is not None:  # (eps, tau) are primal variables: the same optimizer steps them
        groups.append(
            {
                "params": list(reg.parameters()),
                "weight_decay": 0.0,
                "lr": o.lr if o.regularizer_lr is None else o.regularizer_lr,
            }
        )
    # fused: one kernel per step instead of ~10 per tensor (the per-sample tau has N_pos entries)
    if o.name == "adam":
        return torch.optim.Adam(groups, lr=o.lr, weight_decay=o.weight_decay, fused=True)
    return torch.optim.SGD(
        groups, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay, fused=True
    )


def build_scheduler(
    cfg: Config, optimizer: torch.optim.Optimizer, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """``poly``: ``lr_t = lr (1 - t / T)^0.9`` per step, ``T`` = all steps (DeepLab's schedule)."""
    if cfg.optim.schedule == "constant":
        return None
    total = cfg.train.epochs * steps_per_epoch
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: max(0.0, 1.0 - t / total) ** 0.9)


def autocast_dtype(precision: str) -> torch.dtype | None:
    """``None`` for ``fp32``, else the autocast dtype of ``bf16`` / ``fp16``."""
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
