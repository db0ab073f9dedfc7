"""The per-pixel path: a batch of whole images, one problem over the pixels or one per image.

An accelerator's path keeps every entry (fixed shapes, no size read from the data); the CPU drops
the negatives first. Both must end where the other does, no step may read a size or a value to the
host, scan with indices or sort, and no scatter may put many of a batch's entries on one row."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import reparam.sparse
from reparam import FBetaRegularizer
from reparam.layout import batch_slots, kept_keys, run_sums

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:.*since the last end_epoch_\(\):RuntimeWarning"),
]

SIDE, OF, IMAGES = 48, 6, 3  # 3 whole 48x48 images a batch (6912 pixels) of 6
LAYOUTS = ("one problem", "per image")


def _run(layout: str, steps: int = 6) -> FBetaRegularizer:
    """``steps`` steps of the defaults on batches of whole images, Adam, ``attach``."""
    hw = SIDE * SIDE
    gen = torch.Generator().manual_seed(0)
    labels = (torch.rand(OF * hw, generator=gen) < 0.2).long()
    groups = torch.arange(OF * hw) // hw if layout == "per image" else None
    reg = FBetaRegularizer(labels, groups=groups)
    opt = torch.optim.Adam(reg.parameters(), lr=1e-2)
    reg.attach(opt)
    for _ in range(steps):
        pick = torch.randperm(OF, generator=gen)[:IMAGES]
        idx = (pick[:, None] * hw + torch.arange(hw)).reshape(-1)
        u = torch.randn(idx.numel(), generator=gen).requires_grad_()
        reg(u, idx).backward()
        opt.step()
        opt.zero_grad()
    return reg


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_accelerators_path_ends_where_the_cpus_does(layout, monkeypatch):
    """Every entry kept (an accelerator's shapes) against the negatives dropped (the CPU's):
    the same state, to float32 rounding of sums taken in another order."""
    compacted = _run(layout).state_dict()
    monkeypatch.setattr(reparam.sparse, "COMPACT_FROM", 1 << 62)
    kept = _run(layout).state_dict()
    assert compacted.keys() == kept.keys()
    for name, value in compacted.items():
        if value.is_floating_point():
            torch.testing.assert_close(kept[name], value, rtol=1e-6, atol=1e-6, msg=name)
        else:
            assert torch.equal(kept[name], value), name


@pytest.mark.parametrize("compact", [True, False])
def test_a_batch_with_no_positive_counts_a_step_on_either_path(compact, monkeypatch):
    """A batch of whole images with no positive: the CPU notes none of its rows, and still
    counts the step (Adam's bias correction), as every entry kept does."""
    if not compact:
        monkeypatch.setattr(reparam.sparse, "COMPACT_FROM", 1 << 62)
    hw = SIDE * SIDE
    labels = torch.zeros(OF * hw, dtype=torch.long)
    labels[:10] = 1  # image 0's only
    reg = FBetaRegularizer(labels)
    opt = torch.optim.Adam(reg.parameters(), lr=1e-2)
    reg.attach(opt)
    idx = torch.arange(hw, (IMAGES + 1) * hw)  # images 1-3
    reg(torch.randn(idx.numel(), requires_grad=True), idx).backward()
    opt.step()
    assert int(reg.sparse_tau.step) == 1


class _Watch(TorchDispatchMode):
    """The operations dispatched, and the most entries any scatter put on one row."""

    SCATTERS = ("index_add_", "index_copy_", "index_fill_", "index_put_", "scatter")

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []
        self.most = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__
        self.names.append(name.split(".")[0])
        if any(name.startswith(s) for s in self.SCATTERS) and args[2].numel() > 1000:
            self.most = max(self.most, int(torch.bincount(args[2].long()).max()))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_pixel_step_reads_nothing_to_the_host_and_queues_no_scatter(layout, monkeypatch):
    """The accelerator's path: no ``nonzero``, ``.item()`` (``_local_scalar_dense``) but the
    CPU's own check of the scores, sort or ``cummax``; the scatters of 6912 entries put at most 8 on one row (the negatives once
    stood on row 0, and every image's pixels on its problem's place)."""
    monkeypatch.setattr(reparam.sparse, "COMPACT_FROM", 1 << 62)
    reg = _run(layout, steps=1)
    watch = _Watch()
    hw = SIDE * SIDE
    idx = (torch.tensor([4, 0, 2])[:, None] * hw + torch.arange(hw)).reshape(-1)
    u = torch.randn(idx.numel()).requires_grad_()
    with watch:
        reg(u, idx).backward()
        reg.after_step_()
    forbidden = {"nonzero", "sort", "cummax", "unique", "masked_select"}
    assert not forbidden & set(watch.names), forbidden & set(watch.names)
    # one read: the CPU's eager check that the scores are finite (a device masks them instead)
    assert watch.names.count("_local_scalar_dense") == 1
    assert 0 < watch.most <= 8, watch.most


@pytest.mark.parametrize("seed", range(6))
def test_batch_slots_and_run_sums_against_a_sort(seed):
    """Slots: entries of one problem share a slot, other problems' entries do not, ``at`` is
    each used slot's problem; run sums equal ``index_add_``'s, on whole images, runs split
    apart, shuffled entries and entries in no problem."""
    gen = torch.Generator().manual_seed(seed)
    k = 9
    runs = torch.randint(-1, k, (12,), generator=gen).repeat_interleave(
        torch.randint(1, 30, (12,), generator=gen)
    )
    problem = runs if seed % 2 else runs[torch.randperm(runs.numel(), generator=gen)]
    scratch = torch.randint(-5, 10**6, (k + reparam.layout.SPARE,), generator=gen)
    slot, at = batch_slots(problem, scratch)
    assert torch.equal(slot < 0, problem < 0)
    kept = problem >= 0
    same = problem[kept].unsqueeze(0) == problem[kept].unsqueeze(1)
    assert torch.equal(slot[kept].unsqueeze(0) == slot[kept].unsqueeze(1), same)
    assert torch.equal(at[slot[kept]], problem[kept])
    assert at.min() >= 0 and at.max() < k  # (a slot no entry uses: some problem's)
    counts = run_sums(kept, problem.clamp_min(0), k)  # integers: exact, in int32
    assert counts.dtype == torch.int32
    assert torch.equal(counts.long(), torch.bincount(problem[kept], minlength=k))
    values = torch.randn(problem.numel(), 2, generator=gen, dtype=torch.float64)
    key = problem.clamp_min(0)
    expected = torch.zeros(k, 2, dtype=torch.float64).index_add_(0, key, values)
    torch.testing.assert_close(run_sums(values, key, k), expected, rtol=1e-12, atol=1e-12)
    keep = torch.rand(problem.numel(), generator=gen) < 0.3  # the others: zeros, any key
    noise = torch.randint(0, k, (problem.numel(),), generator=gen)
    kept = torch.where(keep.unsqueeze(1), values, 0.0)
    expected = torch.zeros(k, 2, dtype=torch.float64).index_add_(0, key, kept)
    order, in_runs = kept_keys(keep, torch.where(keep, key, noise), k)
    got = run_sums(kept, in_runs, k, order)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
