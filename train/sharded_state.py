"""The trainer's side of ``regularizer.shard`` (``reparam.Shard``): each of the K processes holds the
per-sample state of its own block of the training set, and writes it to its own checkpoint file.

* ``checkpoints/step-<N>.pt`` (rank 0, as in every run) holds the model, the optimizer, the
  counters and rank 0's block of the regularizer; ``checkpoints/shards/step-<N>.rank-<r>-of-<K>.pt``
  holds rank ``r``'s block (``r >= 1``), written atomically by that rank. The shards are written
  before rank 0's file (a barrier between): a step's main file exists only once its shards do.
* Resume: every rank reads the newest main file and rank ``r >= 1`` its own shard instead of rank
  0's block; shards of a later step (a write interrupted before rank 0's file) are skipped, and
  named. A checkpoint of another number of processes is resharded: each rank reads the saved
  blocks that overlap its own (``reparam.resharding``), and the run logs one line saying so. A
  missing or unreadable shard is a one-line ``ValueError`` that names the file; nothing is
  written before that check.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from reparam import Shard, resharding

from . import checkpoint
from .config import Config
from .distributed import Context

FOLDER = "shards"
_NAME = re.compile(r"^step-(\d+)\.rank-(\d+)-of-(\d+)\.pt$")


def regularizer_shard(cfg: Config, ctx: Context, n_total: int, unit: int = 1) -> Shard | None:
    """This process's block when ``regularizer.shard`` is set and there are several processes
    (one process holds the whole state: ``None``); ``unit``: the samples of one group (target
    pixels: an image's pixels), never split between processes."""
    mode = cfg.regularizer.shard
    if mode == "none" or cfg.regularizer.name == "none" or not ctx.enabled or ctx.world == 1:
        return None
    return Shard.from_process_group(n_total, sampling=mode, unit=unit)


def shard_path(run_dir: Path, step: int, rank: int, world: int) -> Path:
    return Path(run_dir) / checkpoint.FOLDER / FOLDER / f"step-{step:09d}.rank-{rank}-of-{world}.pt"


def save_shards(reg: torch.nn.Module, run_dir: Path, step: int, ctx: Context, keep: int) -> None:
    """Every rank but 0 writes its block (atomically) and prunes its old ones; then all wait, so
    that rank 0's file, written after this, marks a complete checkpoint."""
    if ctx.rank > 0:
        path = shard_path(run_dir, step, ctx.rank, ctx.world)
        path.parent.mkdir(parents=True, exist_ok=True)
        checkpoint.save_atomic({"regularizer": reg.state_dict()}, path)
        mine = sorted(
            (int(m.group(1)), p)
            for p in path.parent.glob(f"step-*.rank-{ctx.rank}-of-{ctx.world}.pt")
            if (m := _NAME.match(p.name))
        )
        for _, old in mine[:-keep] if keep else []:
            old.unlink(missing_ok=True)
    dist.barrier()


def unfinished(found: Path) -> list[Path]:
    """The shards written after the checkpoint ``found`` (a checkpoint whose write was interrupted:
    its shards are written before rank 0's file, so a process killed in between leaves shards of a
    step with no main file). The resume names them and removes them (rank 0), so that no later
    checkpoint mixes them with its own."""
    step = checkpoint.step_of(found)
    folder = found.parent / FOLDER
    return sorted(
        p
        for p in folder.glob("step-*.rank-*.pt")
        if (m := _NAME.match(p.name)) and int(m.group(1)) > step
    )


def restore(
    found: Path, state: dict[str, Any], ctx: Context, shard: Shard | None, reg: Any
) -> str | None:
    """Put this rank's block of the regularizer into the checkpoint ``state`` read from ``found``
    (in place). A checkpoint of another number of processes (or sharded one way and resumed the
    other) is resharded (``reparam.resharding``): this rank reads the saved blocks that overlap
    its own; returns the line that says so (``None``: same layout)."""
    reg_state = state.get("regularizer")
    if reg_state is None or reg is None:
        return None
    n, _, saved_world = resharding.saved_world(reg_state)
    world = shard.world if shard is not None else 1
    if n != reg.n_samples:
        raise ValueError(
            f"checkpoint {found} holds the regularizer's state of {n} samples, this run has "
            f"{reg.n_samples}: resume it with the training set it was saved with"
        )
    if saved_world == world:
        if ctx.rank > 0 and shard is not None:
            state["regularizer"] = _shard(found, ctx.rank, ctx.world)
        return None
    needed = resharding.needed_blocks(reg, saved_world)
    blocks = {r: reg_state if r == 0 else _shard(found, r, saved_world) for r in needed}
    state["regularizer"] = resharding.reshard_state(reg, blocks)
    return (
        f"resharded the regularizer's state of {n} samples from {saved_world} to {world} "
        f"process(es) (checkpoint {found.name}; rank {ctx.rank} read blocks {needed})"
    )


def _shard(found: Path, rank: int, world: int) -> dict[str, Any]:
    """The regularizer block of ``rank`` of the ``world``-process checkpoint ``found``."""
    path = shard_path(found.parent.parent, checkpoint.step_of(found), rank, world)
    if not path.exists():
        raise ValueError(
            f"checkpoint {found}: the regularizer shard of rank {rank}, {path}, is missing: "
            "restore it, or start a new run"
        )
    try:
        shard = checkpoint.load(path)
    except checkpoint.CheckpointError as e:  # one line naming the file and why
        raise ValueError(
            f"checkpoint {found}: the regularizer shard of rank {rank} is unusable: {e}; "
            f"restore it, or start a new run"
        ) from None
    if not isinstance(shard, dict) or not isinstance(shard.get("regularizer"), dict):
        raise ValueError(
            f"checkpoint {found}: the regularizer shard of rank {rank}, {path}, is not a "
            f"checkpoint of this project (no 'regularizer' state): restore it, or start a new run"
        )
    return shard["regularizer"]
