"""Non-finite steps (``train.nonfinite``: ``stop`` or ``skip``; docs/robustness.md, "Non-finite
steps"): the device flag, its reads (:class:`NonFiniteGuard`) and the error ``stop`` raises.
:func:`train.loop.train_step` applies them.

``skip`` reads the flag on the host every step and drops a non-finite step before it updates
anything. ``stop`` reads it every ``train.nonfinite_check_every`` steps, before every checkpoint
and at the epoch end, so on a GPU its steps do not wait for the device. (Earlier versions also
made ``skip`` read-free, with a no-op step on the device through the optimizer's ``found_inf``, a
NaN-scaled loss and a ``valid=`` argument of the regularizer; a read per step measured 0.01-0.8 % of
the smallest step we ship on a CPU, docs/figures/nonfinite_read.md, so that machinery was removed.)
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import distributed


class NonFiniteLossError(FloatingPointError):
    """A step produced a NaN / inf loss or shape score (``train.nonfinite: stop``)."""


class NonFiniteGuard:
    """``train.nonfinite`` (docs/robustness.md, "Non-finite steps").

    :meth:`record` keeps a step's finiteness flag on the device (or-reduced over processes) and
    counts a non-finite step there (``totals[3]``; ``stop``: also its step and task loss).
    :meth:`read` is the host read: every step under ``skip``; under ``stop`` every
    ``train.nonfinite_check_every`` steps, before every checkpoint and at the epoch end, raising
    :class:`NonFiniteLossError` there, naming the first non-finite step.
    """

    def __init__(self, mode: str, processes: bool, last_checkpoint: str) -> None:
        self.skip = mode == "skip"  # read every step
        self.processes = processes  # several: every process must drop the same steps
        self.last_checkpoint = last_checkpoint  # named by the error
        self.unread = 0  # steps taken since the last read whose flag is not known on the host

    def begin_epoch(self, epoch: int, totals: Tensor) -> None:
        self.epoch, self.totals = epoch, totals
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

    def read(self, ok: Tensor | None = None) -> bool:
        """The host read: raises for ``stop`` if a step since the epoch began was non-finite.
        ``ok``: the flag of the current step; returns whether it is finite (``True`` without one)."""
        if self.skip:  # nothing to raise: one bool() of the current step's flag
            self.unread = 0
            return ok is None or bool(ok)
        parts = [self.first_step.double().view(1), self.first_loss.view(1)]
        if ok is not None:
            parts.append(ok.double().view(1))
        first_step, first_loss, *current = torch.cat(parts).tolist()
        if first_step >= 0:
            raise NonFiniteLossError(
                f"non-finite loss or shape score at epoch {self.epoch} step {int(first_step)} "
                f"(task loss {first_loss}); last good checkpoint: {self.last_checkpoint}. Lower "
                f"the lr, check the data, or set train.nonfinite=skip to drop such steps"
            )
        self.unread = 0
        return not current or current[0] == 1.0
