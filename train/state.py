"""``TrainState``: everything a checkpoint holds and a resume restores, in one object.

The loop keeps its counters here (epochs done, the step within the epoch, optimizer steps, skipped
steps, the metrics history and the running loss sums of the current epoch) next to the objects it
trains; ``state_dict()`` is the checkpoint and ``load_state_dict()`` the resume, so the two cannot
drift apart. The checkpoint also carries the RNG states (python, numpy, torch, CUDA), the sampler
generator's state at the start of the current epoch (a resumed epoch redraws the same order and
skips the batches already taken) and the resolved config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from . import checkpoint

FORMAT = 2  # the layout of TrainState.state_dict(); checked on resume (check_format)


# what load_state_dict reads ("groups" and "epoch_totals" are optional)
_KEYS = (
    "epoch",
    "step_in_epoch",
    "global_step",
    "skipped_steps",
    "model",
    "optimizer",
    "scheduler",
    "scaler",
    "regularizer",
    "rng",
    "sampler_generator",
    "history",
)


def check_format(state: Any, path: object) -> None:
    """Check that ``state``, read from the checkpoint file ``path``, is a training checkpoint of
    this trainer's layout ``FORMAT``: :class:`train.checkpoint.CheckpointError` for an object that
    is no training checkpoint (not a dict with the keys a resume reads; ``latest`` skips such a
    file), ``ValueError`` for a training checkpoint of another layout (also one of a trainer from
    before the layouts were numbered, without ``format``; there are no migrations)."""
    if not isinstance(state, dict):
        raise checkpoint.CheckpointError(
            f"{path} is not a checkpoint of this project (it holds an object of type "
            f"{type(state).__name__}, not a training state)"
        )
    found = state.get("format")
    missing = [k for k in _KEYS if k not in state]
    if found is None and missing:
        raise checkpoint.CheckpointError(
            f"{path} is not a checkpoint of this project (it holds a dict without the key "
            f"'format', not a training state)"
        )
    if found != FORMAT:
        raise ValueError(
            f"checkpoint {path} has format {found!r}, this trainer reads format {FORMAT}: it was "
            f"written by another version of the trainer; resume it with that version or start a "
            f"new run"
        )
    if missing:
        raise checkpoint.CheckpointError(
            f"{path} is not a checkpoint of this project (format {FORMAT}, but no "
            f"{', '.join(map(repr, missing))})"
        )


@dataclass
class TrainState:
    """The trained objects (by reference) and the loop's counters.

    ``epoch``: epochs completed; ``step_in_epoch``: batches taken in the current (unfinished) epoch,
    0 at an epoch boundary; ``global_step``: optimizer steps; ``skipped_steps``: non-finite steps
    dropped in completed epochs; ``totals``: float64 ``(4,)`` sums of the current epoch (task loss x
    samples, regularizer loss x samples, samples, skipped steps); ``epoch_start``: the sampler
    generator's state when the current epoch began (``None`` without a generator).
    """

    config: dict[str, Any]
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    scaler: torch.amp.GradScaler | None
    regularizer: nn.Module | None
    generator: torch.Generator | None  # the training sampler's (None under DistributedSampler)
    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    skipped_steps: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    totals: Tensor | None = None
    epoch_start: Tensor | None = None
    groups: Any = None  # train.group_weighting's state (group DRO's q), or None

    def begin_epoch(self, device: torch.device) -> None:
        """Mark the start (or, after a resume, the continuation) of an epoch."""
        if self.generator is not None:
            self.epoch_start = self.generator.get_state()
        if self.totals is None:
            self.totals = torch.zeros(4, dtype=torch.float64, device=device)

    def end_epoch(self, row: dict[str, Any]) -> None:
        """The epoch is complete: count it, keep its metrics row, reset the per-epoch state."""
        self.epoch = row["epoch"]
        self.step_in_epoch = 0
        self.skipped_steps += int(self.totals[3])
        self.history.append(row)
        self.totals = None
        if self.generator is not None:  # where the next epoch's order starts
            self.epoch_start = self.generator.get_state()

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint: at an epoch boundary or inside an epoch (``step_in_epoch > 0``)."""
        inside = self.step_in_epoch > 0
        return {
            "format": FORMAT,
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "global_step": self.global_step,
            "skipped_steps": self.skipped_steps,
            "config": self.config,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "scaler": None if self.scaler is None else self.scaler.state_dict(),
            "regularizer": None if self.regularizer is None else self.regularizer.state_dict(),
            "rng": checkpoint.rng_state(),
            "sampler_generator": self.epoch_start,
            "history": self.history,
            "epoch_totals": self.totals.cpu() if inside and self.totals is not None else None,
            "groups": None if self.groups is None else self.groups.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the objects' states, the counters, the sampler position and the RNG states."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        for obj, key in (
            (self.scheduler, "scheduler"),
            (self.scaler, "scaler"),
            (self.regularizer, "regularizer"),
        ):
            if obj is not None:
                obj.load_state_dict(state[key])
        if self.groups is not None and state.get("groups") is not None:
            self.groups.load_state_dict(state["groups"])
        self.epoch, self.step_in_epoch = state["epoch"], state["step_in_epoch"]
        self.global_step, self.skipped_steps = state["global_step"], state["skipped_steps"]
        self.history = state["history"]
        # (a run of several processes saves none: their sampler draws from the epoch number)
        if self.generator is not None and state["sampler_generator"] is not None:
            self.generator.set_state(state["sampler_generator"])
        totals = state.get("epoch_totals")
        device = next(iter(self.model.parameters())).device
        self.totals = None if not self.step_in_epoch or totals is None else totals.to(device)
        checkpoint.set_rng_state(state["rng"])
