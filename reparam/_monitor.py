"""Misuse detection for the objectives on the shape node's scores (``ShapeObjective`` owns one).

Three mistakes leave an objective silently doing nothing, and each gets one ``RuntimeWarning``
(once per kind and objective):

* ``end_epoch_()`` not called for more than one epoch's worth of samples (no dual step, no
  projection in schedule ``epoch``);
* ``after_step_()`` not called for more than one epoch's worth of samples while it has work to do
  (a sparse ``tau`` is stepped there);
* the objective's parameters get gradients that no optimizer applies (they were left out of it).

The first two are counted in plain Python per forward call (no device read on the hot path);
inside ``torch.compile``, where a Python counter would be guarded on step by step, on the device
(``calls_since``), read at the epoch end and by ``stats()``. The monitor also masks what a forward
call inside ``torch.compile`` or on an accelerator cannot refuse without a host read (a non-finite
score, an index out of range) and counts it in ``input_faults``, for the epoch end to raise. The
third is checked at each epoch end (before its projection), where the objective reads device
values anyway: equal fingerprints of the parameters (float64 sum and sum of squares of each) after
the previous epoch end and now, while their gradient is non-zero, mean that nothing stepped them
(parameters left out of the optimizer keep their gradients: its ``zero_grad`` never clears them).
Nothing is registered with torch: no global optimizer hook, so building and
dropping objectives leaves no trace in the process.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

from . import _checks
from .compiling import compiled_form

Duties = Callable[[], tuple[bool, str | None, str]]
# the score a masked entry is given: a negative this far below 0 has a hinge of 0 at any eps
MASKED_SCORE = -1e6


class MisuseMonitor(nn.Module):
    """The counters and fingerprints behind the warnings of the module docstring (a child module
    of the objective, ``reg._monitor``; its buffers are not saved)."""

    def __init__(self, owner: str) -> None:
        super().__init__()
        self.owner = owner  # the objective's class name, for the messages
        # samples since the last end_epoch_(), since the last after_step_(): a list mutated in
        # place (an nn.Module's attribute store is its slow path, and these change every call)
        self.since = [0, 0]
        # attached hooks that run after_step_ at every optimizer step (attach): while any is,
        # nothing forgets it, and nothing is counted (a compiled optimizer step would guard on
        # a Python counter it writes, and recompile at every step)
        self.hooks = 0
        self.fingerprint: Tensor | None = None  # of the parameters after the last epoch end
        self.warned: set[str] = set()
        # inside torch.compile the counters are on the device: [samples since the last
        # end_epoch_(), since the last after_step_()], read at the epoch end
        self.register_buffer("calls_since", torch.zeros(2, dtype=torch.int64), persistent=False)
        self.device_counted = False  # whether a compiled forward has counted there
        # masked entries (mask_faults_): [non-finite scores, indices out of range, first call]
        faults = torch.tensor([0, 0, -1], dtype=torch.int64)
        self.register_buffer("input_faults", faults, persistent=False)

    def count_forward(self, batch: int, n: int, duties: Duties) -> None:
        """A forward call of ``batch`` samples (``n``: samples per epoch): ``on_forward``, or
        inside ``torch.compile`` a count on the device."""
        if compiled_form("monitor"):  # Python counters would be guarded on, step by step
            if self.hooks:  # (attached: after_step_ runs at every step, nothing to count)
                self.calls_since[0].add_(batch)
            else:
                self.calls_since.add_(batch)
            self.device_counted = True
        else:
            self.on_forward(batch, n, duties)

    def hooked(self, *handles: torch.utils.hooks.RemovableHandle) -> Handles:
        """The handles of ``attach``'s hooks, which call ``after_step_`` at every optimizer
        step: counted while attached, counted off by the returned handle's ``remove()``."""
        self.hooks += 1
        return Handles(*handles, on_remove=self._unhooked)

    def _unhooked(self) -> None:
        self.hooks -= 1

    def count_after_step(self) -> None:
        """An ``after_step_()`` call: the counters since the last one restart (plain stores, also
        inside ``torch.compile``); nothing while ``attach``'s hook calls it."""
        if self.hooks:
            return
        self.since[1] = 0
        if self.device_counted:  # (a flag set once, by the first compiled forward)
            self.calls_since[1].zero_()

    def mask_faults_(
        self,
        u: Tensor,
        rows: Tensor,
        finite: Tensor,
        in_range: Tensor,
        batches: Tensor,
        record: bool = True,
    ) -> tuple[Tensor, Tensor]:
        """Inside ``torch.compile`` or on an accelerator (``_checks.batch``): an entry with a
        non-finite score or an index out of range becomes a negative with a score of ``-1e6``
        (its loss term and every gradient of it are 0; the state takes nothing from it), and is
        counted in ``input_faults`` (with ``batches``, the forward call of the first) for
        ``check_device_`` to report (``record``: a training forward; others are masked only).
        O(B), no host read."""
        ok = finite & in_range
        if record:
            self._count_faults_(finite, in_range, batches)
        keep = ok.view(-1, *([1] * (u.dim() - 1)))
        return torch.where(keep, u, MASKED_SCORE), torch.where(ok, rows, -1)

    @torch.no_grad()
    def _count_faults_(self, finite: Tensor, in_range: Tensor, batches: Tensor) -> None:
        counts = torch.stack([(~finite).sum(), (~in_range).sum()])
        first = self.input_faults[2]
        self.input_faults[2].copy_(torch.where((first < 0) & (counts.sum() > 0), batches, first))
        self.input_faults[:2].add_(counts)

    def check_device_(self, n: int, duties: Duties) -> None:
        """The device's side of the warnings and the input faults (one read; ``n``: samples per
        epoch): a ``ValueError`` naming the masked entries since the last check."""
        if not self.device_counted and self.input_faults.device.type == "cpu":
            return  # eager on the CPU: counted and checked in Python
        state = torch.cat([self.calls_since, self.input_faults]).tolist()
        since_end, since_after = state[:2]
        if since_end or since_after:
            self.on_device_counts(since_end, since_after, n, duties)
            self.calls_since[0].zero_()
        message = _checks.fault_message(state[2:], n)
        if message is not None:
            self.input_faults.copy_(torch.tensor([0, 0, -1], device=self.input_faults.device))
            raise ValueError(message)

    def report_device_counts(self, n: int, duties: Duties) -> None:
        """``stats()``: the warnings from the device's counters (a compiled forward's)."""
        if self.device_counted:
            since_end, since_after = self.calls_since.tolist()
            self.on_device_counts(since_end, since_after, n, duties)

    def warn_once(self, kind: str, message: str, stacklevel: int = 4) -> None:
        """``warnings.warn(message)`` the first time ``kind`` is reported."""
        if kind not in self.warned:
            self.warned.add(kind)
            warnings.warn(message, RuntimeWarning, stacklevel=stacklevel)

    def on_forward(self, batch: int, n: int, duties: Duties) -> None:
        """Count a forward call of ``batch`` samples (``n``: samples per epoch); past one epoch's
        worth since the last ``end_epoch_()`` or ``after_step_()``, ask ``duties()`` what the
        objective needs -- ``(needs_end_epoch, needs_after_step, epoch_work)``: whether it needs
        ``end_epoch_()``, what is lost without ``after_step_()`` (``None``: nothing) and what the
        epoch end does, for the message -- and warn once for what was forgotten. Plain Python
        counters: nothing else per call."""
        since = self.since
        since[0] += batch
        if not self.hooks:  # (attached: after_step_ runs at every step)
            since[1] += batch
        if since[0] <= n and since[1] <= n:
            return
        self._check(since[0], since[1], n, duties, stacklevel=7)

    def on_device_counts(self, since_end: int, since_after: int, n: int, duties: Duties) -> None:
        """The same warnings from the counters a compiled forward keeps on the device, read at
        the epoch end and by ``stats()``: inside ``torch.compile`` a forgotten ``end_epoch_()``
        is reported at the next ``stats()`` or ``end_epoch_()``."""
        if since_end > n or since_after > n:
            self._check(since_end, since_after, n, duties, stacklevel=5)

    def _check(
        self,
        since_end: int,
        since_after: int,
        n: int,
        duties: Duties,
        stacklevel: int,
    ) -> None:
        needs_end_epoch, needs_after_step, epoch_work = duties()
        if needs_end_epoch and since_end > n:
            self.warn_once(
                "end_epoch",
                f"{self.owner}: {since_end} samples (more than one epoch of {n}) "
                f"since the last end_epoch_(): without it there is no {epoch_work}. Call "
                "reg.end_epoch_() once per epoch, or loop with `for epoch in reg.epochs(E):`.",
                stacklevel=stacklevel,
            )
        if since_after > n and needs_after_step is not None:
            self.warn_once(
                "after_step",
                f"{self.owner}: reg.after_step_() has not been called for more than one epoch of "
                f"samples, but {needs_after_step}. Call it after every optimizer.step(), or "
                "reg.attach(optimizer) once.",
                stacklevel=stacklevel,
            )

    @torch.no_grad()
    def before_epoch_end(
        self, named_parameters: Callable[[], Iterable[tuple[str, Tensor]]]
    ) -> None:
        """At the start of ``end_epoch_()``: warn if the parameters have gradients but did not
        change since the previous epoch end although the epoch had forward calls (no optimizer
        steps them)."""
        trained = self.since[0] > 0
        self.since[0] = 0
        params = list(named_parameters())
        reference = self.fingerprint
        if reference is None or not params or not trained:
            return
        fingerprint = _fingerprint(p for _, p in params)
        gradient = _any_gradient(p for _, p in params)
        # an all-zero gradient may leave the parameters where they were (Adam with no momentum)
        if bool(gradient) and torch.equal(reference, fingerprint):
            self.warn_once(
                "unstepped",
                f"{self.owner}: its parameters {[k for k, _ in params]} receive gradients but no "
                "optimizer stepped them during the last epoch: pass reg.parameters() to the "
                "optimizer (reg.attach(optimizer) checks it).",
            )

    @torch.no_grad()
    def after_epoch_end(self, parameters: Iterable[Tensor]) -> None:
        """At the end of ``end_epoch_()`` (after its projection): the reference fingerprint."""
        params = list(parameters)
        self.fingerprint = _fingerprint(params) if params else None


def _fingerprint(params: Iterable[Tensor]) -> Tensor:
    """``[sum, sum of squares]`` of each tensor in float64: any optimizer step changes it."""
    return torch.stack([s for p in params for s in (p.double().sum(), p.double().square().sum())])


def _any_gradient(params: Iterable[Tensor]) -> Tensor:
    """Whether any parameter has a non-zero gradient, as a 0-d bool tensor (no device read)."""
    flags = [p.grad.ne(0).any() for p in params if p.grad is not None]
    return torch.stack(flags).any() if flags else torch.tensor(False)


class Handles:
    """The handles of several hooks, removed together (``attach``); ``on_remove``: called at the
    first ``remove()``."""

    def __init__(
        self, *handles: torch.utils.hooks.RemovableHandle, on_remove: Callable[[], None]
    ) -> None:
        self.handles, self._on_remove = handles, on_remove

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        if self._on_remove is not None:
            self._on_remove, on_remove = None, self._on_remove
            on_remove()
