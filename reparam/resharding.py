"""A state saved by ``K`` processes loaded by ``K'`` (docs/guide/sharded.md, "Resuming on another
number of processes"): this process's block assembled from the saved blocks that overlap it.

Every block of a sharded state (``reparam.Shard``) is a contiguous range of the ``N`` samples, and
its per-positive rows are its positives in dataset order. So a new block ``[a, b)`` is the
concatenation, in rank order, of the overlapping saved blocks' samples in ``[a, b)`` and of their
rows whose sample is in ``[a, b)``; what is replicated (``eps``, ``mu``, the step count) is taken
from one of them; what is per problem and current at the problem's owner (``_problem_state``: the
active set's sums, sharded with groups) from a saved block holding the problem's rows; what is
derived from the labels (``layout.*``, ``shard_layout``) is the new objective's own. Each module
names its per-row state (``_row_state``); the objective names its per-sample state
(``_sample_state``).

Why not ``torch.distributed.checkpoint``: its resharding works on DTensor / ShardedTensor, whose
shards are fixed ranges of a global tensor. A block's rows are its positives, whose number depends
on the labels, so the per-row state has no such global layout unless every block writes its offset
into a global row order, which costs an all-gather of the positive counts per save and the whole
state's re-layout; the blocks here are read as saved.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from .sharding import block

# rebuilt from the labels by the new objective
DERIVED_PREFIXES = ("layout.", "shard_layout")


def saved_world(state: Mapping[str, Tensor]) -> tuple[int, int, int]:
    """``(N, rank, K)`` of a saved state (unsharded: ``(N, 0, 1)``)."""
    layout = state.get("shard_layout")
    if layout is None:
        return int(state["shape_labels"].numel()), 0, 1
    n, rank, world = (int(v) for v in layout.tolist()[:3])
    return n, rank, world


def saved_unit(state: Mapping[str, Tensor]) -> int:
    """The ``unit`` of a saved state's blocks (``reparam.Shard``; 1 when it has none)."""
    layout = state.get("shard_layout")
    return 1 if layout is None or layout.numel() < 4 else int(layout[3])


def overlapping(n_total: int, start: int, stop: int, world: int, unit: int = 1) -> list[int]:
    """The ranks of a ``world``-process layout (blocks of whole ``unit``s) whose blocks overlap
    ``[start, stop)``."""
    blocks = [block(n_total, r, world, unit) for r in range(world)]
    return [r for r, (a, b) in enumerate(blocks) if a < stop and b > start]


def needed_blocks(reg: nn.Module, world: int, unit: int | None = None) -> list[int]:
    """The ranks of a saved state that ``reshard_state`` needs for ``reg``'s block.

    The state was saved by ``world`` processes in blocks of whole ``unit`` samples (``None``:
    ``reg``'s own unit); an unsharded ``reg`` needs all of them.

    Args:
        reg: the objective to load into (its ``shard``, or none).
        world: the number of processes that saved the state.
        unit: the saved blocks' unit (``None``: ``reg``'s).

    Examples:
        >>> import torch
        >>> from reparam import FBetaRegularizer, needed_blocks
        >>> reg = FBetaRegularizer(torch.tensor([0, 1, 1, 0, 1]))  # unsharded
        >>> needed_blocks(reg, 2)
        [0, 1]
        >>> needed_blocks(reg, 1)
        [0]
    """
    shard = getattr(reg, "shard", None)
    start, stop = (0, reg.n_samples) if shard is None else shard.bounds()
    if unit is None:
        unit = 1 if shard is None else shard.unit
    return overlapping(reg.n_samples, start, stop, world, unit)


def _module_keys(reg: nn.Module, attribute: str) -> set[str]:
    return {
        f"{prefix}.{name}" if prefix else name
        for prefix, module in reg.named_modules()
        for name in getattr(module, attribute, ())
    }


def row_keys(reg: nn.Module) -> set[str]:
    """The ``state_dict`` keys of ``reg``'s per-row state (each module's ``_row_state``)."""
    return _module_keys(reg, "_row_state")


@torch.no_grad()
def reshard_state(reg: nn.Module, saved: Mapping[int, Mapping[str, Tensor]]) -> dict[str, Tensor]:
    """The ``state_dict`` of ``reg``'s block, assembled from the saved blocks.

    ``reg``'s block is its ``shard``, or all samples when it is unsharded; ``saved``: saved rank ->
    that rank's state, every saved block that overlaps ``reg``'s (``overlapping``); others are
    ignored. ``ValueError`` when one is missing or the states are of another training set. A key the
    saved blocks lack is left out (``load_state_dict`` reports it, or a load hook fills it in, as a
    sparse ``tau``'s fresh moments).

    Args:
        reg: the objective to load into.
        saved: saved rank -> that rank's ``state_dict``.

    Examples:
        >>> import torch
        >>> from reparam import FBetaRegularizer, reshard_state
        >>> labels = torch.tensor([0, 1, 1, 0, 1])
        >>> reg, reg2 = FBetaRegularizer(labels), FBetaRegularizer(labels)
        >>> _ = reg.lam.fill_(0.5)  # some saved state differing from reg2's
        >>> reg2.load_state_dict(reshard_state(reg2, {0: reg.state_dict()}))
        <All keys matched successfully>
        >>> torch.equal(reg2.lam, reg.lam)
        True
    """
    if not saved:
        raise ValueError("saved must hold at least one saved block, got none")
    layouts = {r: saved_world(s) for r, s in saved.items()}
    n_total, _, world = next(iter(layouts.values()))
    unit = saved_unit(next(iter(saved.values())))
    for r, (n, rank, k) in layouts.items():
        if (n, rank, k) != (n_total, r, world):
            raise ValueError(
                f"saved[{r}] must be block {r} of {world} of {n_total} samples, got block {rank} "
                f"of {k} of {n}"
            )
    shard = getattr(reg, "shard", None)
    mine_n = reg.n_samples
    if mine_n != n_total:
        raise ValueError(
            f"the saved state is of {n_total} samples and this objective of {mine_n}: resume with "
            "the training set it was saved with"
        )
    start, stop = (0, n_total) if shard is None else shard.bounds()
    needed = overlapping(n_total, start, stop, world, unit)
    missing = [r for r in needed if r not in saved]
    if missing:
        raise ValueError(
            f"saved must hold the blocks {needed} of {world} (those overlapping samples "
            f"[{start}, {stop})), missing {missing}"
        )
    mine = reg.state_dict()
    rows, samples = row_keys(reg), set(reg._sample_state)
    problems = _module_keys(reg, "_problem_state")
    first = saved[needed[0]]
    # each saved row's sample (dataset index), and where each of this block's rows is among them
    at = torch.cat(
        [
            saved[r]["layout.pos_index"].long().cpu() + block(n_total, r, world, unit)[0]
            for r in needed
        ]
    )
    wanted = mine["layout.pos_index"].long().cpu() + start
    order = torch.argsort(at)
    found = order[torch.searchsorted(at[order], wanted).clamp_max(max(at.numel() - 1, 0))]
    if wanted.numel() and not torch.equal(at[found], wanted):
        raise ValueError(
            f"the saved blocks do not hold a row for every positive of samples [{start}, {stop}): "
            "were they saved with the same labels and positive classes?"
        )
    out: dict[str, Tensor] = {}
    for key, value in mine.items():
        if key.startswith(DERIVED_PREFIXES):
            out[key] = value
        elif key not in first:  # (load_state_dict names it, or its pre-hook fills it in)
            continue
        elif key in samples:
            parts = []
            for r in needed:
                a, b = block(n_total, r, world, unit)
                parts.append(saved[r][key][max(start, a) - a : min(stop, b) - a])
            out[key] = torch.cat(parts)
        elif key in rows:
            gathered = torch.cat([saved[r][key] for r in needed])
            out[key] = gathered.index_select(0, found.to(gathered.device))
        elif key in problems:  # each problem's from a block holding its rows (its owner's)
            out[key] = first[key].clone()
            for r in needed:
                held = torch.unique(saved[r]["layout.tau_group"].long())
                out[key][held] = saved[r][key][held.to(saved[r][key].device)]
        else:  # replicated: equal on every process
            out[key] = first[key]
        if out[key].shape != value.shape:
            raise ValueError(
                f"{key}: the saved blocks give shape {tuple(out[key].shape)} for samples "
                f"[{start}, {stop}), this objective has {tuple(value.shape)}: were they saved "
                "with the same labels and options?"
            )
    return out
