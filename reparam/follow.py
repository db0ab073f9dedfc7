r"""A dense ``tau`` under ``Tracked()`` (method note sec. 3b): its rows clipped at the threshold take
the step's gradient of ``eps``, whatever the calls, backward passes and processes a step's batch
was split into.

The loss sees ``e*`` for a positive row above it; the exact projection's Jacobian gives that row
``d e*/d tau_i * dL/de* = share * dL/de*``, which is ``eps``'s gradient. Computed call by call,
a row would take its own call's part of it only. Here a batch's clipped entries pass no gradient
of their own (``FollowGradient``) and count per row; after each backward pass ``tau.grad`` is
brought to ``count * eps.grad`` on those rows (the change of that product since the last pass),
so after the last pass of a step ``clip_grad_norm_``, ``GradScaler`` and the optimizer read the
step's gradient. ``zero_grad()`` clears the counts with ``eps.grad``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class DenseFollow(nn.Module):
    """The follow counts of a dense ``tau``'s rows (``TrackedThreshold.dense_follow``; no saved
    state). ``pass_counts`` (``(n,)``): the clipped entries of the running backward pass, per row;
    ``counts``: of the step's passes so far. ``eps``'s hooks keep them: its gradient hook (before
    its accumulation, after this pass's counts came in, ``FollowGradient`` having ``eps`` as an
    input) notes whether ``eps.grad`` was cleared since the last pass, and its post-accumulate
    hook then starts the counts from this pass's or adds them, and moves ``tau.grad`` by the
    change of ``counts * eps.grad`` (the previous pass's ``eps.grad`` kept for it). Replicated processes (``at_step``, set by ``attach``): the counts are
    summed over them before the optimizer's step instead (``apply_``), where both gradients are
    averaged. O(n) per backward pass, as the dense step is."""

    def __init__(self, eps: Tensor, tau: Tensor, layout: nn.Module) -> None:
        super().__init__()
        n = tau.shape[0]
        self._refs = [eps, tau, layout]  # (a list: not registered as this module's)
        self.pass_counts = torch.zeros(n)  # (not buffers: DDP would broadcast them over ours)
        self.counts = torch.zeros(n)
        self.at_step = False
        self._fresh = True  # eps.grad cleared before this pass: the counts start from it
        self._seen_grad: Tensor | None = None  # eps.grad as the last pass left it
        self._eps_grad: Tensor | None = None  # (a copy of it: the part tau.grad holds)
        self._watch(eps)

    def _watch(self, eps: Tensor) -> None:
        eps.register_hook(self._before_pass)
        eps.register_post_accumulate_grad_hook(self._after_pass)

    def __setstate__(self, state: dict) -> None:
        # a copy (copy.deepcopy, pickle, torch.save of the module) has an eps without hooks
        super().__setstate__(state)
        self._watch(self._refs[0])

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        device = self._refs[1].device
        self.pass_counts, self.counts = self.pass_counts.to(device), self.counts.to(device)
        self._eps_grad = None if self._eps_grad is None else self._eps_grad.to(device)
        return self

    def rows(self, values: Tensor, rows: Tensor, clipped: Tensor, eps: Tensor) -> Tensor:
        """The batch's rows through ``FollowGradient`` (``clipped``: 1 for an entry above
        ``e*``)."""
        return FollowGradient.apply(eps, values, rows, clipped, self.pass_counts)

    def _before_pass(self, grad: Tensor) -> None:
        eps = self._refs[0]
        if eps.grad is None or eps.grad is not self._seen_grad:  # cleared since the last pass
            self._fresh = True

    @torch.no_grad()
    def _after_pass(self, eps: Tensor) -> None:
        self._seen_grad = eps.grad
        written = None
        if self._fresh:  # the pass's counts are the step's (in place: the nodes hold them)
            self.counts.copy_(self.pass_counts)
            self._fresh = False
        else:
            if not self.at_step:
                written = self.counts * self._per_row(self._eps_grad)
            self.counts.add_(self.pass_counts)
        self.pass_counts.zero_()
        if self.at_step:
            return
        self._write_(eps.grad, written)
        self._eps_grad = eps.grad.detach().clone()

    def _per_row(self, eps_grad: Tensor) -> Tensor:
        """``eps_grad`` of each row's problem."""
        _, tau, layout = self._refs
        groups, flat = layout.row_groups, eps_grad.detach().reshape(-1)
        return flat[:1].expand(tau.shape[0]) if groups is None else flat[groups.long()]

    def _write_(self, eps_grad: Tensor, written: Tensor | None) -> None:
        """``tau.grad += counts * eps_grad - written`` (``written``: the part it holds, or
        ``None``)."""
        tau = self._refs[1]
        term = self.counts * self._per_row(eps_grad)
        if written is not None:
            term = term.sub_(written)
        if tau.grad is None:  # (this pass's accumulation into tau comes after: it adds)
            tau.grad = term
        else:
            tau.grad.add_(term)

    @torch.no_grad()
    def apply_(self, group: object, world: int) -> None:
        """Replicated processes, before the optimizer's step: the counts summed over the
        ``world`` processes of ``group``, then ``tau.grad += counts * eps.grad``."""
        eps = self._refs[0]
        if eps.grad is not None and not self._fresh:
            torch.distributed.all_reduce(self.counts, group=group)
            self._write_(eps.grad, None)
        self.counts.zero_()
        self._fresh = True


class FollowGradient(torch.autograd.Function):
    """The identity on a dense ``tau``'s batch rows whose backward passes no gradient for the
    entries clipped at ``e*`` and adds one per such entry to ``store``'s row counts. ``eps`` is
    an input (no gradient to it), so ``eps``'s gradient is accumulated after this backward, with
    the counts in. Traced by ``torch.compile`` with the loss."""

    @staticmethod
    def forward(ctx, eps: Tensor, values: Tensor, rows: Tensor, clipped: Tensor, store: Tensor):
        ctx.store = store
        ctx.save_for_backward(rows, clipped)
        return values.clone()

    @staticmethod
    def backward(ctx, grad: Tensor):
        rows, clipped = ctx.saved_tensors
        with torch.no_grad():
            ctx.store.index_add_(0, rows.long(), clipped.to(ctx.store.dtype))
        return None, grad * (1 - clipped), None, None, None
