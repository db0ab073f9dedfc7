"""Non-finite steps (``train.nonfinite``: ``stop`` or ``skip``) without a host read per step
(docs/robustness.md, "Non-finite steps"): the device flag and its periodic read
(:class:`NonFiniteGuard`), the error ``stop`` raises, and what makes a dropped step leave the
optimizer as it was (:func:`zero_momentum_buffers_`). :func:`train.loop.train_step` applies them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import distributed
from .state import TrainState


class NonFiniteLossError(FloatingPointError):
    """A step produced a NaN / inf loss or shape score (``train.nonfinite: stop``)."""


def zero_momentum_buffers_(optimizer: torch.optim.Optimizer) -> None:
    """Give fused SGD zero momentum buffers before its first step. A skipped step (``found_inf``,
    :func:`train_step`) must leave the optimizer as it was, but fused SGD allocates its buffers
    uninitialized on its first step and fills them only if the step runs, so a skipped first step
    would leave garbage momentum (torch 2.13, CPU). With zeros, ``buf = momentum * 0 + grad`` is
    what the first step sets anyway (dampening 0): bit for bit the same training."""
    if not isinstance(optimizer, torch.optim.SGD):
        return
    for group in optimizer.param_groups:
        if group["momentum"] != 0:
            for p in group["params"]:
                optimizer.state[p].setdefault("momentum_buffer", torch.zeros_like(p))


class NonFiniteGuard:
    """``train.nonfinite`` without a host read per step (docs/robustness.md, "Non-finite steps").

    :meth:`record` keeps a step's finiteness flag on the device (or-reduced over processes) and
    counts a non-finite step there (``totals[3]``; ``stop``: also its step and task loss), and
    :func:`train_step` makes such a step a no-op without reading the flag. :meth:`read` is the one
    host read: every ``train.nonfinite_check_every`` steps, before every checkpoint and at the epoch
    end. ``stop`` raises :class:`NonFiniteLossError` there, naming the first non-finite step;
    ``skip`` takes the window's non-finite steps back out of ``state.global_step`` (which counts
    the steps of a window as they are taken).
    """

    def __init__(self, mode: str, processes: bool, last_checkpoint: str) -> None:
        self.skip = mode == "skip"
        self.processes = processes  # several: every process must drop the same steps
        self.last_checkpoint = last_checkpoint  # named by the error
        self.unread = 0  # steps taken since the last read whose flag is not known on the host

    def begin_epoch(self, epoch: int, totals: Tensor) -> None:
        self.epoch, self.totals = epoch, totals
        self.skipped_read = int(totals[3])  # resumed mid-epoch: the epoch's count so far
        self.first_step = torch.full((), -1, dtype=torch.int64, device=totals.device)
        self.first_loss = torch.zeros((), dtype=torch.float64, device=totals.device)

    def record(self, k: int, task: Tensor, u: Tensor) -> Tensor:
        """The flag of step ``k`` (0-d bool, on the device): task loss and shape scores finite."""
        ok = torch.isfinite(task) & torch.isfinite(u).all()
        if self.processes:  # a step is dropped everywhere if it is non-finite anywhere
            ok = distributed.all_reduce_((~ok).float()) == 0
        bad = ~ok
        self.totals[3].add_(bad)
        if not self.skip:  # the first non-finite step of the epoch, for the error
            first = bad & (self.first_step < 0)
            self.first_step.masked_fill_(first, k)
            self.first_loss.copy_(torch.where(first, task.detach().double(), self.first_loss))
        return ok

    def read(self, state: TrainState, ok: Tensor | None = None) -> bool:
        """The host read: raises for ``stop`` if a step since the epoch began was non-finite;
        else corrects ``state.global_step``. ``ok``: the flag of the current step when it has not
        been taken yet; returns whether it is finite (``True`` without one)."""
        parts = [self.totals[3:], self.first_step.double().view(1), self.first_loss.view(1)]
        if ok is not None:
            parts.append(ok.double().view(1))
        skipped, first_step, first_loss, *current = torch.cat(parts).tolist()
        if first_step >= 0:
            raise NonFiniteLossError(
                f"non-finite loss or shape score at epoch {self.epoch} step {int(first_step)} "
                f"(task loss {first_loss}); last good checkpoint: {self.last_checkpoint}. Lower "
                f"the lr, check the data, or set train.nonfinite=skip to drop such steps"
            )
        finite = not current or current[0] == 1.0
        new = round(skipped) - self.skipped_read
        self.skipped_read = round(skipped)
        state.global_step -= new - (not finite)  # the current step was not counted yet
        self.unread = 0
        return finite
