r"""Collectives for state whose rows are spread over processes (method note sec. 13), and the
projection's root over such rows.

A communicator reduces over the processes that hold the rows: ``sum``, ``min``, ``max`` (new
tensors, the same on every process), ``cat`` (every process's rows in rank order) and ``total``
(of a count). ``LOCAL`` is one process: every reduction is the identity, so code written
against a communicator runs unchanged, and exactly as before, in one process. ``ProcessComm``
reduces over a ``torch.distributed`` group.

``root_over`` is the root of ``project_onto_c`` (``projections.exact``) for one problem whose
``tau`` is spread over the processes: ``project_onto_c(..., comm=ProcessComm())`` and
``projection_root(..., comm=...)`` call it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


class LocalComm:
    """The collectives of one process: every reduction is the identity (the unsharded path)."""

    world, rank = 1, 0

    def total(self, count: int) -> int:
        return count

    def sum(self, t: Tensor) -> Tensor:
        return t

    def min(self, t: Tensor) -> Tensor:
        return t

    def max(self, t: Tensor) -> Tensor:
        return t

    def cat(self, t: Tensor) -> Tensor:
        return t

    def mean(self, t: Tensor) -> Tensor:
        """The elementwise mean of ``t`` over the processes (one process: ``t`` itself)."""
        return t

    # reductions of all the values of a tensor (one process: the plain ones)

    def mean_of(self, x: Tensor) -> Tensor:
        """``x.mean()`` over every process's values (NaN where none has one)."""
        return x.mean()

    def max_of(self, x: Tensor) -> Tensor:
        """``x.max()`` over every process's values (``-inf`` where none has one, with several
        processes)."""
        return x.max()

    def min_of(self, x: Tensor) -> Tensor:
        return x.min()

    def any_of(self, x: Tensor) -> bool:
        return bool(x.any())

    def all_of_flag(self, flag: Tensor) -> Tensor:
        """A 0-d bool flag, ``True`` iff it is on every process (on the device, no host read)."""
        return flag

    def route(self, x: Tensor, dest: Tensor) -> Tensor:
        """Row ``i`` of ``x`` sent to process ``dest[i]``; returns the rows this process received,
        in rank order (one process: ``x``)."""
        return x

    def agree(self, error: ValueError | None) -> None:
        """Raise on every process if a check failed on any (``error``: this process's, or
        ``None``): a check of a process's own rows that raised there alone would leave the others
        waiting in the next collective. One process: raise ``error`` if any."""
        if error is not None:
            raise error


LOCAL = LocalComm()


def routing(dest: Tensor, world: int, group: object = None) -> tuple[Tensor, list[int], list[int]]:
    """What an ``all_to_all`` of rows bound for processes ``dest`` needs: the rows' order (grouped
    by destination, stable), how many this process sends to each process and receives from each
    (one ``all_to_all`` of the counts)."""
    order = torch.argsort(dest, stable=True)
    send = torch.bincount(dest, minlength=world)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return order, send.tolist(), recv.tolist()


class ProcessComm(LocalComm):
    """The same reductions over the processes of a ``torch.distributed`` group (new tensors; the
    inputs are left alone)."""

    def __init__(self, group: object = None) -> None:
        self.group = group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)

    def _reduce(self, t: Tensor, op) -> Tensor:
        out = t.detach().clone()
        wide = out.dtype == torch.bool
        if wide:  # gloo reduces no bool
            out = out.to(torch.int64)
        dist.all_reduce(out, op=op, group=self.group)
        return out.bool() if wide else out

    def total(self, count: int) -> int:
        return int(self.sum(torch.tensor([count], dtype=torch.int64)))

    def sum(self, t: Tensor) -> Tensor:
        return self._reduce(t, dist.ReduceOp.SUM)

    def min(self, t: Tensor) -> Tensor:
        return self._reduce(t, dist.ReduceOp.MIN)

    def max(self, t: Tensor) -> Tensor:
        return self._reduce(t, dist.ReduceOp.MAX)

    def mean(self, t: Tensor) -> Tensor:
        return self.sum(t) / self.world

    def all_of_flag(self, flag: Tensor) -> Tensor:
        return self.min(flag)

    def agree(self, error: ValueError | None) -> None:
        failed = float(self.max(torch.tensor([float(error is not None)])))
        if failed:  # every process learns the first failed check's message
            every: list[str | None] = [None] * self.world
            mine = None if error is None else str(error)
            dist.all_gather_object(every, mine, group=self.group)
            if error is not None:
                raise error
            rank, message = next((r, m) for r, m in enumerate(every) if m is not None)
            raise ValueError(f"{message} (in process {rank}'s rows)")

    def route(self, x: Tensor, dest: Tensor) -> Tensor:
        order, sends, recvs = routing(dest, self.world, self.group)
        out = x.new_empty((sum(recvs), *x.shape[1:]))
        dist.all_to_all_single(out, x[order].contiguous(), recvs, sends, group=self.group)
        return out

    def mean_of(self, x: Tensor) -> Tensor:
        total = self.sum(torch.stack([x.double().sum(), torch.tensor(float(x.numel()))]))
        return (total[0] / total[1]).to(x.dtype)

    def max_of(self, x: Tensor) -> Tensor:
        here = x.max() if x.numel() else x.new_tensor(-float("inf"))
        return self.max(here.reshape(1))[0]

    def min_of(self, x: Tensor) -> Tensor:
        here = x.min() if x.numel() else x.new_tensor(float("inf"))
        return self.min(here.reshape(1))[0]

    def any_of(self, x: Tensor) -> bool:
        return bool(self.max(x.any().reshape(1))[0])

    def cat(self, t: Tensor) -> Tensor:
        """Every process's ``t`` concatenated in rank order along dim 0 (the lengths may
        differ): the lengths first, then one ``all_gather`` of the padded tensors."""
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(sizes, torch.tensor([t.shape[0]], dtype=torch.int64), group=self.group)
        lengths = [int(s) for s in sizes]
        longest = max(lengths)
        padded = t.new_zeros((longest, *t.shape[1:]))
        padded[: t.shape[0]] = t
        wide = padded.dtype == torch.bool
        if wide:
            padded = padded.to(torch.uint8)
        parts = [torch.empty_like(padded) for _ in range(self.world)]
        dist.all_gather(parts, padded.contiguous(), group=self.group)
        out = torch.cat([p[:n] for p, n in zip(parts, lengths, strict=True)])
        return out.bool() if wide else out


# the root search: buckets per round, and the window size gathered and solved exactly
_ROOT_BUCKETS = 4096
_ROOT_GATHER = 1 << 16
_CHUNK = 1 << 20


@torch.no_grad()
def root_over(eps: Tensor, tau: Tensor, comm: LocalComm) -> Tensor:
    r"""The projection's root ``r`` (method note sec. 4 and 13: ``e* = max(0, r)``, the active set
    ``A = {tau_i > r}``) of one problem whose rows ``tau`` are spread over the processes:

    $$
    g(r) = \epsilon + \sum_i \max(0, \tau_i - r) - r = 0,
    $$

    ``g`` continuous and strictly decreasing. The candidates start as the values in
    ``(eps, max tau]`` (``g(eps) >= 0 >= g(max(eps, max tau))``); each round sorts them into
    value buckets (a monotone index: equal values share a bucket, the buckets are ordered), sums
    each bucket's count, sum, smallest and largest value over the processes, and evaluates ``g``
    exactly at every bucket's largest value (the values above it are the higher buckets'); the
    root lies at or above the highest bucket maximum where ``g >= 0`` and below the next one, so
    the next bucket alone stays a candidate. When at most ``2^16`` candidates are left they are
    gathered and the root solved exactly: ``r = (eps + S_A) / (1 + |A|)`` for the one ``A``
    consistent with it. ``O(n / K)`` work per process and round (two rounds at ``n = 10^8``);
    float64 sums. Returns ``r`` in ``tau``'s dtype, 0-dim."""
    e = float(eps)
    above_count, above_sum = 0.0, 0.0  # the values above the window (all in A)
    lo = e
    hi = max(e, float(comm.max(tau.max().reshape(1) if tau.numel() else _neg_inf(tau))))
    window = _in_window(tau, lo, hi)
    while True:
        total = comm.total(window.numel())
        if total <= _ROOT_GATHER or hi <= lo:
            values = comm.cat(window.double())
            return _solve_root(e, values, above_count, above_sum).to(tau.dtype)
        m = _ROOT_BUCKETS
        scale = m / (hi - lo)
        stats = window.new_zeros(2, m, dtype=torch.float64)
        vmin = window.new_full((m,), float("inf"), dtype=torch.float64)
        vmax = window.new_full((m,), -float("inf"), dtype=torch.float64)
        for x in window.split(_CHUNK):
            x = x.double()
            b = _bucket(x, lo, scale, m)
            stats.index_add_(1, b, torch.stack([torch.ones_like(x), x]))
            vmin.scatter_reduce_(0, b, x, "amin")
            vmax.scatter_reduce_(0, b, x, "amax")
        stats, vmin, vmax = comm.sum(stats), comm.min(vmin), comm.max(vmax)
        count, sums = stats
        # values above each bucket: the higher buckets' and those above the window
        c_above = count.flip(0).cumsum(0).flip(0) - count + above_count
        s_above = sums.flip(0).cumsum(0).flip(0) - sums + above_sum
        g_at_max = e + (s_above - vmax * c_above) - vmax
        nonempty = count > 0
        reached = nonempty & (g_at_max >= 0)  # the root is at or above these maxima
        below = int(torch.nonzero(reached)[-1]) if bool(reached.any()) else -1
        later = torch.nonzero(nonempty & (torch.arange(m) > below))
        if later.numel() == 0:  # the root is above every candidate: A holds none of them
            values = window.new_zeros(0, dtype=torch.float64)
            return _solve_root(e, values, above_count, above_sum).to(tau.dtype)
        nxt = int(later[0])
        new_lo = float(vmax[below]) if below >= 0 else lo
        new_hi = float(vmax[nxt])
        above_count, above_sum = float(c_above[nxt]), float(s_above[nxt])
        kept = [x[_bucket(x.double(), lo, scale, m) == nxt] for x in window.split(_CHUNK)]
        window = torch.cat(kept) if kept else window
        lo, hi = new_lo, new_hi


def _neg_inf(tau: Tensor) -> Tensor:
    return tau.new_full((1,), -float("inf"))


def _in_window(tau: Tensor, lo: float, hi: float) -> Tensor:
    """The values of ``tau`` in ``(lo, hi]``, chunk by chunk."""
    parts = [x[(x > lo) & (x <= hi)] for x in tau.split(_CHUNK)]
    return torch.cat(parts) if parts else tau[:0]


def _bucket(x: Tensor, lo: float, scale: float, m: int) -> Tensor:
    """A monotone bucket index of ``x`` in ``(lo, hi]``: ``ceil((x - lo) scale) - 1`` in
    ``[0, m)`` (each step correctly rounded, so never decreasing in ``x``)."""
    return (x - lo).mul_(scale).ceil_().sub_(1).clamp_(0, m - 1).long()


def _solve_root(e: float, values: Tensor, above_count: float, above_sum: float) -> Tensor:
    """The root from the candidates ``values`` (float64, every process's) and the count and sum
    of the values above them: with the candidates descending ``w_1 >= w_2 >= ...``, the ``k``
    whose ``r_k = (e + S_above + w_1 + ... + w_k) / (1 + |above| + k)`` keeps exactly ``w_1 ..
    w_k`` above it (``w_k > r_k >= w_{k+1}``); the nearest one under rounding."""
    w = torch.sort(values, descending=True).values
    k = torch.arange(w.numel() + 1, dtype=torch.float64)
    prefix = torch.cat([w.new_zeros(1), torch.cumsum(w, 0)])
    r = (e + above_sum + prefix) / (1 + above_count + k)
    inf = w.new_full((1,), float("inf"))
    upper = torch.cat([inf, w])  # w_k (k = 0: nothing kept)
    lower = torch.cat([w, -inf])  # w_{k+1}
    miss = (r - upper).clamp_min(0) + (lower - r).clamp_min(0)
    return r[int(torch.argmin(miss))]
