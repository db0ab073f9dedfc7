"""Several processes (``torchrun --nproc_per_node=K -m train ...``): ``torch.distributed`` glue.

How the regularizer stays identical on every rank (docs/method/dual-ascent.md sec. 3b; ``reparam`` itself knows nothing
about processes):

* ``(eps, tau)`` are ordinary parameters with dense gradients; after ``backward`` they are averaged
  over ranks (``average_gradients_``), exactly as DDP averages the network's. ``L_B`` is a mean over
  the local batch (its scale uses the local batch size) and its sample-free terms are the same on
  every rank, so the average equals the gradient of the global batch. The same optimizer step
  then runs on every rank: ``eps, tau`` stay equal.
* The remembered scores ``u_i`` are written by the rank that saw sample ``i``. Before the epoch's
  dual step (and before a mid-epoch checkpoint) the loop calls the regularizer's
  ``merge_scores_(written, all_reduce_)``: the scores each rank wrote are summed over ranks with
  how many ranks wrote each one (2 for the samples ``DistributedSampler`` repeats to even out the
  shards), every rank takes the mean, and ``score_epoch`` is merged (``seen_ever``, derived from
  it, is OR-reduced). The projection and the dual step are deterministic functions of equal
  inputs, so ``eps, tau, lambda, mu`` stay equal.
* Metrics: confusion matrices and decision counts are summed over ranks (``all_reduce_``); the
  evaluation shards ``range(rank, n, K)`` are disjoint and cover the split (no padding).

Without ``torchrun`` (no ``WORLD_SIZE`` in the environment) nothing here initializes anything and
every function is the identity.
"""

from __future__ import annotations

import datetime
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass(frozen=True)
class Context:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world > 1 or dist.is_initialized()

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def torchrun_command(processes: int) -> list[str]:
    """``torchrun --standalone --nproc_per_node=P -m train`` with this interpreter: one machine,
    ``processes`` training processes (append the trainer's arguments)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
        "-m",
        "train",
    ]


def init_from_env(device: str, timeout_s: float = 600.0) -> Context:
    """Join the process group that ``torchrun`` describes in the environment (NCCL on CUDA,
    gloo on CPU), whose collectives fail after ``timeout_s`` seconds without an answer from a
    process (``train.dist_timeout_s``); a plain ``python -m train`` returns the single-process
    context."""
    if "WORLD_SIZE" not in os.environ or dist.is_initialized():
        if dist.is_initialized():
            return Context(dist.get_rank(), dist.get_world_size(), _local_rank())
        return Context()
    cuda = device != "cpu" and torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(_local_rank())
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(backend="nccl" if cuda else "gloo", timeout=timeout)
    return Context(dist.get_rank(), dist.get_world_size(), _local_rank())


def _local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def broadcast_path(path: Path | None) -> Path:
    """Rank 0's ``path`` on every rank (rank 0 chooses the run folder)."""
    if not is_initialized():
        assert path is not None
        return path
    box = [str(path) if path is not None else None]
    dist.broadcast_object_list(box, src=0)
    return Path(box[0])


def shutdown(finished: bool = True) -> None:
    """Leave the process group. After a finished run every rank first waits for the others: a
    rank that tears gloo down while its peer still talks to it aborts that peer (SIGABRT,
    "terminate called without an active exception"). After an error nobody waits (the peer may
    be gone, and a barrier would hang until gloo's timeout)."""
    if dist.is_initialized():
        if finished and dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()


def all_reduce_(t: Tensor) -> Tensor:
    """Sum ``t`` over ranks in place (identity in one process)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t


@torch.no_grad()
def average_gradients_(params: list[torch.nn.Parameter]) -> None:
    """``p.grad <- mean over ranks`` (one flattened all-reduce for all of ``params``)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1) or not params:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for p, g in zip(params, grads, strict=True):
        n = g.numel()
        p.grad = flat[offset : offset + n].view_as(g).clone()
        offset += n


def world_size() -> int:
    """The number of processes (1 without torch.distributed)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def all_gather(t: Tensor) -> Tensor:
    """The concatenation (rank order) of every process's ``t``, all of one shape: a collective on
    the tensors' device, no host read; ``t`` itself in one process."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return t
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts)


def all_gather_cat(t: Tensor) -> Tensor:
    """The concatenation of every process's ``t`` (rank order; the shapes may differ in their first
    dimension); ``t`` itself in one process. Through pickled objects: meant for small CPU tensors
    such as one score per evaluation sample."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return t
    parts: list[Tensor | None] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, t.cpu())
    return torch.cat(parts)
