r"""The per-sample state sharded across processes (method note sec. 13): each of ``K``
processes owns the rows of one contiguous block of the ``N`` samples, so nothing of size ``O(N)``
is replicated.

Process ``r`` owns the samples ``[floor(r N / K), floor((r + 1) N / K))``: their shape labels,
remembered scores and epochs, and for its positives ``tau``, ``lambda``, the sparse optimizer's
moments and the tracked active set's share. What is ``O(P)`` (``eps``, ``mu``, ``nu``, the
active set's sums, the step count) stays replicated and equal on every process.

A batch reaches its rows in one of two ways (``Shard`` ``sampling``):

* ``"owner"``: each process draws its batches from the samples it owns (as web-scale loaders read
  their own shards); no exchange per step, ``O(B)`` local work.
* ``"global"``: any sampler (``DistributedSampler``); the batch's scores and indices go to their
  owners with one ``all_to_all`` and their gradients come back with another in the backward pass
  (``_AllToAll``): ``O(B)`` traffic per process and step.

Either way process ``r``'s loss is ``L_r = beta^2 eps + N / (n B) sum_{e in R_r} l_e`` over the
entries ``R_r`` it owns (``B``: the per-process batch size), so the mean of the ``L_r`` is the
minibatch Lagrangian of the global batch of ``K B`` entries: the replicated parameters' gradients
are averaged over the processes in the backward pass (as DDP averages a network's), and a row's
gradient is ``1/K`` of its owner's, the share of the average.

The epoch end runs on the shards with collectives of ``O(1)`` or ``O(buckets)`` size: sums and
means by ``all_reduce``; the projection's root (``projections.projection_root`` with the
processes' communicator), the F-beta-optimal
threshold and the certified bound (``reparam.functional`` with a ``ProcessComm``) by value
buckets whose counts are summed over the processes, the few candidates left gathered at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from projections.collective import LOCAL, LocalComm, ProcessComm, routing

from . import _checks
from .compiling import compiled_form

__all__ = ["LOCAL", "SAMPLINGS", "LocalComm", "ProcessComm", "Shard", "route"]

SAMPLINGS = ("owner", "global")


@dataclass(frozen=True)
class Shard:
    """Which samples this process owns, and how batches reach them.

    Args:
        n_total: ``N``, the samples of the whole training set.
        rank: this process (``from_process_group`` reads it from ``torch.distributed``).
        world: the number of processes ``K`` (``from_process_group`` reads it too).
        sampling: ``"owner"`` (each batch holds only samples this process owns; the default) or
            ``"global"`` (any sample; the batch is routed to the owners, module docstring).
        group: the ``torch.distributed`` process group (``None``: the default group).
        unit: the blocks are whole units of ``unit`` consecutive samples (per-group objectives:
            the pixels of one image, ``H W``, so that no group is split between processes);
            ``n_total`` must be a multiple of it. Process ``r`` owns the units
            ``[floor(r M / K), floor((r + 1) M / K))`` of the ``M = N / unit``.

    Examples:
        >>> import torch
        >>> from reparam import Shard
        >>> shard = Shard(10, rank=1, world=2)  # no process group needed to build one
        >>> shard.bounds()
        (5, 10)
        >>> shard.owner(torch.tensor([0, 4, 5, 9]))
        tensor([0, 0, 1, 1])
        >>> shard.local_labels(torch.tensor([0, 1, 1, 0, 1, 0, 0, 1, 1, 0]))
        tensor([0, 0, 1, 1, 0])
        >>> Shard(12, 1, 2, unit=4).bounds()  # 3 whole units of 4: rank 1 owns the last 2
        (4, 12)
    """

    n_total: int
    rank: int
    world: int
    sampling: str = "owner"
    group: object = None
    unit: int = 1

    def __post_init__(self) -> None:
        for name in ("n_total", "rank", "world", "unit"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int, got {value!r}")
        if self.world < 1 or not 0 <= self.rank < self.world:
            raise ValueError(
                f"rank must be in [0, world) and world >= 1, got rank={self.rank}, "
                f"world={self.world}"
            )
        if self.unit < 1 or self.n_total % self.unit:
            raise ValueError(
                f"unit must be >= 1 and divide n_total={self.n_total} (the samples per group), "
                f"got {self.unit}"
            )
        if self.n_total < self.world * self.unit:
            raise ValueError(
                f"n_total must be at least the number of processes ({self.world}) times unit "
                f"({self.unit}), got {self.n_total}"
            )
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {SAMPLINGS}, got {self.sampling!r}")

    @classmethod
    def from_process_group(
        cls, n_total: int, *, sampling: str = "owner", group=None, unit: int = 1
    ) -> Shard:
        """This process's shard of ``n_total`` samples in the initialized process group."""
        if not dist.is_initialized():
            raise ValueError(
                "Shard.from_process_group needs torch.distributed initialized "
                "(torch.distributed.init_process_group, or torchrun)"
            )
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        return cls(n_total, rank, world, sampling, group, unit)

    def bounds(self, rank: int | None = None) -> tuple[int, int]:
        """``[start, stop)``: the samples process ``rank`` (default: this one) owns."""
        return block(self.n_total, self.rank if rank is None else rank, self.world, self.unit)

    @property
    def start(self) -> int:
        return self.bounds()[0]

    @property
    def stop(self) -> int:
        return self.bounds()[1]

    def owner(self, idx: Tensor) -> Tensor:
        """The process owning each dataset index (``idx`` in ``[0, N)``)."""
        units = self.n_total // self.unit
        return ((idx // self.unit + 1) * self.world - 1) // units

    def local_labels(self, shape_labels: Tensor) -> Tensor:
        """This process's block of the whole training set's labels (a view)."""
        return shape_labels[self.start : self.stop]

    def layout(self) -> dict[str, int]:
        """What a saved shard records (checked when it is loaded; ``unit`` when it is not 1)."""
        unit = {"unit": self.unit} if self.unit > 1 else {}
        return {"n_total": self.n_total, "rank": self.rank, "world": self.world, **unit}


def block(n_total: int, rank: int, world: int, unit: int = 1) -> tuple[int, int]:
    """``[start, stop)``: the samples process ``rank`` of ``world`` owns (``Shard``): whole
    units of ``unit`` samples."""
    units = n_total // unit
    return rank * units // world * unit, (rank + 1) * units // world * unit


class ShardedRows:
    """What ``ShapeObjective`` adds for a sharded state (a mixin): the shard and its collectives
    (``self._comm``: ``LOCAL`` when not sharded, so the unsharded path is unchanged), the
    batch's way to its owners, and reductions of the per-sample state over the processes."""

    def _init_shard(self, shard: Shard | None, n_here: int) -> None:
        """The sharded state (``reparam.sharding``): this process holds the rows of the samples
        ``shard`` gives it, ``shape_labels`` being theirs; ``N`` and the positives' counts are
        summed over the processes."""
        self.shard, self._comm, self._n_total = shard, LOCAL, n_here
        if shard is None:
            return
        if not isinstance(shard, Shard):
            raise ValueError(f"shard must be a reparam.Shard or None, got {shard!r}")
        start, stop = shard.bounds()
        if n_here != stop - start:
            raise ValueError(
                f"shape_labels must hold this process's {stop - start} samples [{start}, {stop}) "
                f"of shard {shard.rank} of {shard.world} (n_total={shard.n_total}), got {n_here}: "
                "pass shard.local_labels(all_labels) or the labels of your own block"
            )
        self._comm, self._n_total = ProcessComm(shard.group), shard.n_total
        # which block of how many this state is: a saved shard loads only into the same layout
        layout = torch.tensor(list(shard.layout().values()), dtype=torch.int64)
        self.register_buffer("shard_layout", layout)

    def _check_layout(self, state_dict: dict, prefix: str, error_msgs: list[str]) -> bool:
        """Whether a saved state fits this objective's sharding (else a message in
        ``error_msgs``: a shard of another layout, or a sharded state into an unsharded
        objective and back)."""
        saved = state_dict.get(prefix + "shard_layout")
        mine = getattr(self, "shard_layout", None)
        if saved is None and mine is None:
            return True
        name = type(self).__name__
        if saved is None or mine is None:
            what = "an unsharded" if saved is None else "a sharded"
            error_msgs.append(
                f"{name}: the state is {what} objective's and this one is "
                f"{'sharded' if saved is None else 'unsharded'}: build the objective as it was "
                "saved (shard=... or none), or load reparam.reshard_state(reg, saved blocks)"
            )
            return False
        if not torch.equal(saved.cpu(), mine.cpu()):
            k = int(saved[2])
            error_msgs.append(
                f"{name}: the state is {_describe(saved)}, this objective is {_describe(mine)}: "
                f"resume with {k} processes (each loading its own shard), or load "
                "reparam.reshard_state(reg, saved blocks) (another number of processes)"
            )
            return False
        return True

    @property
    def sharded(self) -> bool:
        """Whether the per-sample state is sharded across processes (``shard`` given)."""
        return self.shard is not None

    _routed_batch: int | None = None  # sampling "global": the caller's batch size B

    def _batch_of(self, idx: Tensor) -> int:
        """``B`` of the scale ``N / (n B)``: the caller's batch (routed: not what reached here)."""
        return idx.shape[0] if self._routed_batch is None else self._routed_batch

    @property
    def _samples_per_epoch(self) -> int:
        """An epoch's worth of samples here: this process's (sharded: + the samplers' padding)."""
        return self.shape_labels.numel() + (0 if self.shard is None else self._comm.world)

    def _to_owner(self, scores: Tensor, idx: Tensor) -> tuple[Tensor, Tensor]:
        """Sharded: the batch's entries this process owns, with indices into its block (not
        sharded: the batch as it is). Sampling ``"owner"``: all of them must be (a
        ``ValueError`` otherwise); ``"global"``: they are routed to their owners
        (``reparam.sharding.route``), every process taking part."""
        shard = self.shard
        if shard is None:
            return scores, idx
        if shard.sampling == "global":
            return self._routed(scores, idx)
        start, stop = shard.bounds()
        if not (isinstance(idx, Tensor) and idx.dtype == torch.int64 and idx.dim() == 1):
            return scores, idx  # the forward's own check names what is wrong
        if idx.numel() and not compiled_form("owner"):  # (compiled: an index of another
            # block is out of this one's range, masked and reported at the epoch end, _monitor)
            lo, hi = (int(v) for v in idx.aminmax())
            if lo < start or hi >= stop:
                raise ValueError(
                    f"idx must hold the samples this process owns, [{start}, {stop}) of "
                    f"{shard.n_total} (shard {shard.rank} of {shard.world}, sampling='owner'), "
                    f"got values in [{lo}, {hi}]: draw batches from shard.bounds(), or use "
                    "sampling='global'"
                )
        return scores, idx - start

    @torch.compiler.disable  # the one graph break of a compiled step (sizes are the data's)
    def _routed(self, scores: Tensor, idx: Tensor) -> tuple[Tensor, Tensor]:
        """Sampling ``"global"``: the batch checked before it leaves (the owner checks it again),
        then routed (``route``); eager also inside ``torch.compile``: how many entries each
        process receives is data (``ReparamRegularizer.compile`` compiles without ``fullgraph``)."""
        shard = self.shard
        _checks.batch(scores, idx, self.classes, self.n_samples, self.shape_labels.device)
        if idx.numel():
            _checks._index_range(idx, self.n_samples)
        self._routed_batch = idx.numel()
        scores, idx = route(shard, scores, idx.to(self.shape_labels.device))
        return scores, idx - shard.start

    @torch.no_grad()
    def _average_grad_(self, p: Tensor) -> None:
        """A replicated parameter's gradient: the mean over the processes (a hook after each
        accumulation; equal gradients stay equal, so gradient accumulation is exact)."""
        p.grad.copy_(self._comm.sum(p.grad) / self._comm.world)

    # reductions of per-row values over the processes (the communicator's; one process: the
    # plain ones, unchanged)

    def _mean(self, x: Tensor) -> Tensor:
        return self._comm.mean_of(x)

    def _max(self, x: Tensor) -> Tensor:
        return self._comm.max_of(x)

    def _min(self, x: Tensor) -> Tensor:
        return self._comm.min_of(x)

    def _any(self, x: Tensor) -> bool:
        return self._comm.any_of(x)


def _describe(layout: Tensor) -> str:
    """A saved ``shard_layout`` in words."""
    n, r, k, *unit = layout.tolist()
    return f"shard {r} of {k} of {n} samples" + (f" in units of {unit[0]}" if unit else "")


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of the rows of ``x`` (split sizes ``send`` out, ``recv`` in); its
    backward sends the gradients back the same way."""

    @staticmethod
    def forward(ctx, x: Tensor, send: list[int], recv: list[int], group) -> Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return _exchange(x.detach(), send, recv, group)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _exchange(grad.contiguous(), ctx.recv, ctx.send, ctx.group), None, None, None


def _exchange(x: Tensor, send: list[int], recv: list[int], group) -> Tensor:
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
    return out


def route(shard: Shard, u: Tensor, idx: Tensor) -> tuple[Tensor, Tensor]:
    """Sampling ``"global"``: the batch's scores (with autograd) and dataset indices sent to the
    processes that own them; returns what this process received: ``(scores, indices)``."""
    order, send_sizes, recv_sizes = routing(shard.owner(idx), shard.world, shard.group)
    u_sorted = u.index_select(0, order)
    got_u = _AllToAll.apply(u_sorted, send_sizes, recv_sizes, shard.group)
    got_idx = _exchange(idx.index_select(0, order), send_sizes, recv_sizes, shard.group)
    return got_u, got_idx
