r"""The projection's schedule (method note sec. 3b): where ``Pi_C`` is applied to the constrained
variables, one small module per schedule, a child ``reg.schedule`` of the regularizer.

* ``EpochEndSchedule`` (``EpochEnd()``, ``"epoch"``, Algorithm 3 of the paper): the loss sees the raw parameters; the
  epoch end projects them in place.
* ``InlineSchedule`` (``Inline()``, ``"inline"``): the loss sees ``Pi_C`` of the raw parameters, with autograd
  through it: the exact projection (``strength = 0``) or the smooth one of method note sec. 5.
* ``reparam.tracked.TrackedThreshold`` (``"tracked"``, F-beta's default): the loss sees the exact
  projection's threshold over an active set kept in step in ``O(B)`` per step.

A schedule says what the loss takes (``Schedule.view``, with autograd), what the loss sees
(``Schedule.seen``, detached: ``reg.eps`` / ``reg.tau``), whether the per-step path traces whole
under ``torch.compile`` and whether the epoch end projects. What a schedule needs of the
objective comes in as arguments: the raw variables and the objective's projection ``project``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from . import _checks

Project = Callable[..., tuple[Tensor, ...]]  # project(*raw, strength=s): Pi_C (s > 0: smooth)


class Schedule(nn.Module):
    """Base of the schedules: the loss takes the raw variables and sees them as they are."""

    name = ""
    projects_at_epoch_end = False  # project the raw parameters in place before the dual step
    traces_whole = True  # the per-step path is one graph under torch.compile (fullgraph)

    def view(self, raw: tuple[Tensor, ...], project: Project) -> tuple[Tensor, ...]:
        """The constrained variables the loss takes (with autograd)."""
        return raw

    def seen(
        self, raw: tuple[Tensor, ...], project: Project, groups: Tensor | None = None
    ) -> tuple[Tensor, ...]:
        """The constrained variables as the loss sees them (``reg.eps`` / ``reg.tau``; ``groups``:
        each row's problem, ``None`` with one)."""
        return raw

    def extra_repr(self) -> str:
        return repr(self.name)


class EpochEndSchedule(Schedule):
    """``"epoch"``: the raw parameters in the loss, projected in place at every epoch end."""

    name = "epoch"
    projects_at_epoch_end = True


class InlineSchedule(Schedule):
    """``"inline"``: the loss takes ``Pi_C`` of the raw parameters (``strength > 0``: the smooth
    projection of that strength), differentiated through. The exact projection of all of
    F-beta's ``tau`` searches its root on values: it does not trace whole."""

    name = "inline"

    traces_whole = False

    def __init__(self, strength: float = 0.0) -> None:
        super().__init__()
        self.strength = _checks.number("inline_strength", strength, 0)

    def view(self, raw: tuple[Tensor, ...], project: Project) -> tuple[Tensor, ...]:
        return project(*raw, strength=self.strength)

    @torch.no_grad()
    def seen(
        self, raw: tuple[Tensor, ...], project: Project, groups: Tensor | None = None
    ) -> tuple[Tensor, ...]:
        return tuple(x.detach() for x in project(*raw, strength=self.strength))

    def extra_repr(self) -> str:
        return f"{self.name!r}, strength={self.strength:g}" if self.strength else repr(self.name)
