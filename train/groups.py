r"""Evening out the task loss over the shape groups: the two things a practitioner would use instead
of a shape-node regularizer (``train.group_weighting``; docs/segmentation/camvid.md).

The groups are the training samples' shape labels ``s_i`` (small / big, or ``p`` bins). For a batch,
``sum_g`` and ``count_g`` are the task loss summed over the batch's samples of group ``g`` and their
number of loss terms (pixels with a label for segmentation, samples for classification), summed over
processes.

* ``balanced`` -- group-balanced reweighting (importance weights of a group-uniform distribution):
  every loss term of group ``g`` gets the weight ``w_g = N / (G N_g)`` (``N_g`` training samples in
  group ``g``, ``G`` groups), and the loss is the weighted mean
  ``sum_g w_g sum_g / sum_g w_g count_g``.
* ``dro`` -- online group DRO (Sagawa et al., ICLR 2020, Algorithm 1): group weights ``q`` on the
  simplex (start uniform), per step ``q_g <- q_g exp(eta L_g)`` for the groups in the batch with
  ``L_g = sum_g / count_g`` (detached), then ``q <- q / sum q``; the loss is ``sum_g q_g L_g``.
  ``eta`` is ``train.dro_step`` (their default 0.01). Their "generalization adjustment" ``C / sqrt(n_g)``
  is not implemented (it is 0 in their main results).

Everything stays on the device (no host read per step); under ``torch.distributed`` the group sums
are all-reduced so ``q`` is the same on every process, and each process's loss is scaled so that
DDP's gradient average gives the gradient of the global loss. ``q`` is part of the train state
(checkpoints, exact resume).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

GROUP_WEIGHTINGS = ("none", "balanced", "dro")


class GroupWeighting:
    """The task-loss weighting of ``train.group_weighting`` (module docstring)."""

    def __init__(
        self,
        mode: str,
        train_groups: Tensor,
        num_groups: int,
        dro_step: float = 0.01,
        all_reduce: Callable[[Tensor], Tensor] | None = None,
        world: int = 1,
    ) -> None:
        if mode not in GROUP_WEIGHTINGS[1:]:
            raise ValueError(f"mode must be one of {GROUP_WEIGHTINGS[1:]}, got {mode!r}")
        if not dro_step > 0:
            raise ValueError(f"dro_step must be > 0, got {dro_step!r}")
        self.mode, self.num_groups, self.dro_step = mode, num_groups, float(dro_step)
        self.all_reduce, self.world = all_reduce, world
        sizes = torch.bincount(train_groups.long().cpu(), minlength=num_groups).double()
        # a group without training samples gets weight 0 (it never occurs in a batch)
        self.weights = torch.where(sizes > 0, sizes.sum() / (num_groups * sizes.clamp_min(1)), 0.0)
        self.q = torch.full((num_groups,), 1.0 / num_groups, dtype=torch.float64)

    def to(self, device: torch.device) -> GroupWeighting:
        self.weights, self.q = self.weights.to(device), self.q.to(device)
        return self

    def loss(self, per_term: Tensor, group: Tensor, valid: Tensor | None = None) -> Tensor:
        """The weighted task loss from the per-term losses ``per_term`` (``(B,)`` or ``(B, H, W)``),
        the samples' groups ``(B,)`` and the mask of terms that count (``valid``, same shape as
        ``per_term``; ``None``: all). Under ``dro`` also takes the step on ``q``."""
        b = per_term.shape[0]
        per_term = per_term.reshape(b, -1)
        valid = (
            torch.ones_like(per_term, dtype=torch.bool) if valid is None else valid.reshape(b, -1)
        )
        per_sample = torch.where(valid, per_term, 0.0).sum(1)
        counts = valid.sum(1).to(per_term.dtype)
        g = group.to(per_term.device).long().clamp(0, self.num_groups - 1)
        sums = per_term.new_zeros(self.num_groups).index_add(0, g, per_sample)
        totals = per_term.new_zeros(self.num_groups).index_add(0, g, counts)
        n_terms = totals.detach().clone()
        if self.all_reduce is not None:  # the global counts (and sums for q): one small all-reduce
            reduced = self.all_reduce(torch.cat([sums.detach(), n_terms]))
            global_sums, n_terms = reduced[: self.num_groups], reduced[self.num_groups :]
        else:
            global_sums = sums.detach()
        w = self.weights.to(per_term.dtype)
        if self.mode == "balanced":
            denominator = (w * n_terms).sum().clamp_min(1e-12)
            return self.world * (w * sums).sum() / denominator
        present = n_terms > 0
        mean = global_sums / n_terms.clamp_min(1)
        q = self.q * torch.exp(self.dro_step * torch.where(present, mean, 0.0)).double()
        q = q / q.sum()
        self.q.copy_(torch.where(torch.isfinite(q).all(), q, self.q))  # a non-finite step: kept
        group_mean = sums / n_terms.clamp_min(1)
        return self.world * (self.q.to(per_term.dtype) * group_mean).sum()

    def state_dict(self) -> dict[str, Tensor]:
        return {"q": self.q.detach().cpu().clone()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.q.copy_(state["q"].to(self.q.device))

    def stats(self) -> dict[str, list[float]]:
        return {"group_q": self.q.tolist()} if self.mode == "dro" else {}
