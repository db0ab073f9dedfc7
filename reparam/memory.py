r"""The score memory (method note sec. 3b): each sample's last score ``u_i`` and the epoch it was
recorded in, written by the forward pass, read by the epoch end's dual step and by ``stats()``, so no
extra pass over the data is needed.

The buffers are the objective's (``scores`` ``(N, P)``, ``score_epoch`` ``(N,)``, ``-1``: never
scored); these functions write them: ``remember_`` per forward call, ``gather_written_`` (per
step) and ``merge_`` (per epoch) across data-parallel processes. ``Memo`` keeps what the epoch end computes from them once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch import Tensor

from . import _checks


@torch.no_grad()
def remember_(
    scores: Tensor,
    score_epoch: Tensor,
    epoch: Tensor,
    u: Tensor,
    idx: Tensor,
    ok: tuple[Tensor, Tensor] | None,
) -> None:
    """Record a batch's scores ``u`` (``(B,)`` or ``(B, P)``) at the dataset indices ``idx``, with
    the current ``epoch`` (explicit index ops: ~3x cheaper than Python indexing per call). A masked
    entry (``ok = (finite, in_range)``, ``False`` in either) writes back the row's own values."""
    u = u.unsqueeze(1) if u.dim() == 1 else u
    at = epoch.expand(idx.numel())  # index_fill_ with a tensor value would read it on the host
    if ok is not None:
        keep = ok[0] & ok[1]
        u = torch.where(keep.unsqueeze(1), u, scores.index_select(0, idx))
        at = torch.where(keep, at, score_epoch.index_select(0, idx))
    scores.index_copy_(0, idx, u)
    score_epoch.index_copy_(0, idx, at)


def all_gather_rows(mine: Tensor, group: object, world: int) -> Tensor:
    """Every process's ``(E_p, k)`` ``mine`` stacked in rank order, ``(sum E_p, k)``, through
    ``torch.distributed.all_gather`` over ``group`` (the sizes first: processes may hold
    different numbers of entries)."""
    size = torch.tensor([mine.shape[0]], dtype=torch.int64, device=mine.device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    counts = [int(s) for s in sizes]
    padded = mine.new_zeros(max(counts), mine.shape[1])
    padded[: mine.shape[0]] = mine
    parts = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([part[:count] for part, count in zip(parts, counts, strict=True)])


@torch.no_grad()
def gather_written_(
    scores: Tensor,
    score_epoch: Tensor,
    written: list[tuple[Tensor, Tensor]],
    group: object,
    world: int,
) -> None:
    """Replicated data parallelism: the scores ``written`` (``(indices, values)`` per forward) by
    every one of the ``world`` processes of ``group`` (``torch.distributed``) since the last step,
    written on every process in rank order with the epoch of this process's (``all_gather``,
    O(world B)), so the score memory is the same on every process after every step."""
    if written:
        idx = torch.cat([w[0] for w in written])
        values = torch.cat([w[1] for w in written])
    else:
        idx = score_epoch.new_zeros(0, dtype=torch.int64)
        values = scores.new_zeros(0, scores.shape[1])
    dated = score_epoch.index_select(0, idx).double().unsqueeze(1)
    every = all_gather_rows(
        torch.cat([idx.double().unsqueeze(1), dated, values.double()], 1), group, world
    )
    at = every[:, 0].long()
    scores.index_copy_(0, at, every[:, 2:].to(scores.dtype))
    score_epoch.index_copy_(0, at, every[:, 1].to(score_epoch.dtype))


@torch.no_grad()
def merge_(
    scores: Tensor, score_epoch: Tensor, written: Tensor, all_reduce: Callable[[Tensor], object]
) -> None:
    """Make the remembered scores equal across data-parallel processes (``ShapeObjective.
    _merge_scores_``): every sample takes the mean of the scores written for it since the last
    merge (``written``: bool ``(N,)``, this process's), samples no process wrote keep their value,
    ``score_epoch`` takes the writers' value, or for a sample no process wrote the value of the
    processes that have a score for it. One ``all_reduce`` (an in-place sum) of ``(N, P + 4)``."""
    if (
        not isinstance(written, Tensor)
        or written.shape != score_epoch.shape
        or not (written.dtype == torch.bool)
    ):
        raise ValueError(
            f"written must be a bool tensor of shape {tuple(score_epoch.shape)}, "
            f"got {_checks.describe(written)}"
        )
    w = written.to(scores.device, scores.dtype).unsqueeze(1)
    # score_epoch + 1: 0 for a sample never scored; the writers agree on it (one epoch), and so
    # do the processes that have a score, so a sum over them / their count is exact
    dated = (score_epoch + 1).to(w.dtype).unsqueeze(1)
    buf = torch.cat([scores * w, w, dated * w, dated, (dated > 0).to(w.dtype)], 1)
    all_reduce(buf)
    total, count = buf[:, :-4], buf[:, -4:-3]
    epoch_sum, seen_sum, seen_count = buf[:, -3], buf[:, -2], buf[:, -1]
    scores.copy_(torch.where(count > 0, total / count.clamp_min(1), scores))
    written_epoch = epoch_sum / count[:, 0].clamp_min(1)
    seen_epoch = seen_sum / seen_count.clamp_min(1)  # 0 (-> -1) where no process has a score
    merged = torch.where(count[:, 0] > 0, written_epoch, seen_epoch).round() - 1
    score_epoch.copy_(merged)


class Memo:
    """Values computed once inside a window (the epoch end, ``stats()``), keyed by tuples whose
    first entry is their kind. ``end_epoch_`` and ``stats()`` read each problem's split of the
    scores and the constrained variables several times, ``O(N)`` / ``O(n)`` each: the scores are
    fixed while they run, the constrained variables until a projection writes them (which
    ``forget`` their kind). ``values`` is ``None`` outside a window: an attribute from the
    start, so a compiled step that reads it is guarded on a value, not on its presence."""

    def __init__(self) -> None:
        self.values: dict | None = None

    @contextlib.contextmanager
    def window(self) -> Iterator[None]:
        """Memoize inside the block (nested blocks share the outer one)."""
        if self.values is not None:
            yield
            return
        self.values = {}
        try:
            yield
        finally:
            self.values = None

    def get(self, key: tuple, compute: Callable[[], object]) -> object:
        """``compute()``, computed once per ``key`` inside a window."""
        if self.values is None:
            return compute()
        if key not in self.values:
            self.values[key] = compute()
        return self.values[key]

    def forget(self, kind: str) -> None:
        """Drop the values of ``kind`` (their inputs were written)."""
        if self.values is not None:
            for key in [k for k in self.values if k[0] == kind]:
                del self.values[key]
