"""The objectives' state per training sample is stated and minimal (docs/method/cost.md sec. 11): the
smallest exact integer dtypes, ``seen_ever`` derived from ``score_epoch`` instead of stored, and a
bound on the bytes per sample that a regression would exceed."""

from __future__ import annotations

import threading

import pytest
import torch

import reparam.layout
import reparam.sparse
from reparam import (
    ROCAUC,
    DenseTau,
    EpochEnd,
    FBetaRegularizer,
    Inline,
    PrecisionAtRecall,
    SparseTau,
)
from reparam.layout import index_dtype as _index_dtype
from reparam.layout import smallest_int as _smallest_int

# bytes per sample + bytes per positive (docs/method/cost.md sec. 11); scalars add a few bytes in all
PER_SAMPLE = 1 + 4 + 4 + 4  # shape_labels int8, slot int32, scores float32, score_epoch int32
PER_POSITIVE = {  # pos_index int32, tau_group int8, tau_param, lam (+ the sparse Adam state)
    "dense": 4 + 1 + 4 + 4,
    # + moments (n, 2), the gradient's accumulator acc (n, 3: the gradient, touches, the
    # follow weight of a row clipped at the tracked threshold), last, the step's scratch elect
    "sparse_adam_ahead": 4 + 1 + 4 + 4 + 8 + 12 + 4 + 4,
}


def _half_positive(n: int) -> torch.Tensor:
    labels = torch.zeros(n, dtype=torch.int64)
    labels[::2] = 1
    return labels


# state whose size is fixed, not set by the data: the tables of the rules
PER_BATCH = ("sparse_tau.ahead",)


def _state_bytes(reg: torch.nn.Module) -> int:
    """The bytes the objective holds: parameters, buffers and the sparse step's working tensors
    (attributes, not buffers: DDP broadcasts buffers)."""
    buffers = [b for name, b in reg.named_buffers() if name not in PER_BATCH]
    sparse = getattr(reg, "sparse_tau", None)
    # (the scratches of the elections: one slot per row or problem, and SPARE past them, fixed)
    work = [] if sparse is None else [sparse.acc, sparse.elect[: -reparam.layout.SPARE]]
    buffers = [b[: -reparam.layout.SPARE] if b is _scratch(reg) else b for b in buffers]
    return sum(t.numel() * t.element_size() for t in [*reg.parameters(), *buffers, *work])


def _scratch(reg: torch.nn.Module) -> torch.Tensor | None:
    return getattr(reg.layout, "slot_scratch", None)


def test_smallest_exact_dtypes():
    assert [_smallest_int(h) for h in (1, 127, 128, 32767, 32768, 2**31 - 1, 2**31)] == [
        torch.int8,
        torch.int8,
        torch.int16,
        torch.int16,
        torch.int32,
        torch.int32,
        torch.int64,
    ]
    assert _index_dtype(2**31) == torch.int32 and _index_dtype(2**31 + 1) == torch.int64
    reg = FBetaRegularizer(_half_positive(100))
    dtypes = {name: b.dtype for name, b in reg.named_buffers()}
    assert dtypes["shape_labels"] == torch.int8 and dtypes["layout.tau_group"] == torch.int8
    assert dtypes["layout.slot"] == dtypes["layout.pos_index"] == torch.int32
    assert dtypes["score_epoch"] == torch.int32
    state = reg.state_dict()
    assert "seen_ever" not in state and "class_of" not in state and "class_start" not in state
    # casting the module with the network leaves the integer state alone
    assert reg.half().layout.slot.dtype == torch.int32 and reg.scores.dtype == torch.float32
    labels = torch.tensor([0, 1, 2, 40000])
    assert PrecisionAtRecall(labels, recall=0.5).shape_labels.dtype == torch.int32
    assert ROCAUC(labels.numpy(), grid=2).shape_labels.tolist() == labels.tolist()


@pytest.mark.parametrize("classes", [(300,), (5, 300)])
def test_a_label_range_needing_int16_trains_end_to_end(classes):
    gen = torch.Generator().manual_seed(0)
    labels = torch.tensor([0, 5, 300, 7] * 10)
    reg = FBetaRegularizer(labels, positive_classes=classes, schedule=Inline(), tau=DenseTau())
    assert reg.shape_labels.dtype == torch.int16 and reg.shape_labels.tolist() == labels.tolist()
    opt = torch.optim.Adam(reg.parameters(), lr=1e-2)
    k = 1 if len(classes) == 1 else 301  # one column per shape class
    for _ in range(2):
        for idx in torch.randperm(40, generator=gen).split(8):
            u = torch.randn(8, k, generator=gen).squeeze(1).requires_grad_()
            loss = reg(u, idx)
            opt.zero_grad()
            loss.backward()
            assert torch.isfinite(loss) and torch.isfinite(u.grad).all()
            for c in classes:  # column c: -lambda pulls class c's positives, the hinge pushes
                g, own = (u.grad if k == 1 else u.grad[:, c]), labels[idx] == c
                assert bool((g[own] <= 0).all()) and bool((g[~own] >= 0).all())
            opt.step()
            reg.after_step_()
        reg.end_epoch_()
    assert int(reg.epoch) == 2 and bool(reg.seen_ever.all())
    stats = reg.stats()
    assert stats["scored_fraction"] == 1.0 and stats["train_fbeta"] is not None
    for j, c in enumerate(classes):  # tau's rows of class j belong to the samples labelled c
        rows = reg.layout.tau_group == j
        assert bool((labels[reg.layout.pos_index[rows].long()] == c).all())


@pytest.mark.parametrize("tau", [DenseTau(), SparseTau()], ids=repr)
def test_bytes_per_sample_of_a_half_positive_problem(tau):
    n = 10_000
    reg = FBetaRegularizer(_half_positive(n), tau=tau, schedule=EpochEnd())
    tau_update = reg.tau_update  # "dense" or "sparse_adam_ahead"
    reg(torch.randn(64), torch.arange(64))
    per_sample = _state_bytes(reg) / n
    bound = PER_SAMPLE + PER_POSITIVE[tau_update] / 2
    assert bound <= per_sample <= bound + 0.05, per_sample  # version 1: 49 / 57


def test_seen_ever_is_derived_from_score_epoch():
    reg = FBetaRegularizer(_half_positive(20))
    assert not reg.seen_ever.any() and "seen_ever" not in dict(reg.named_buffers())
    reg(torch.randn(5), torch.tensor([0, 3, 4, 4, 9]))
    reg.end_epoch_()
    reg(torch.randn(2), torch.tensor([1, 3]))
    assert torch.equal(reg.seen_ever, reg.score_epoch >= 0)
    assert reg.seen_ever.nonzero()[:, 0].tolist() == [0, 1, 3, 4, 9]
    assert reg.score_epoch[[0, 1, 3, 4, 9]].tolist() == [0, 1, 1, 0, 0]
    assert reg.stats()["scored_fraction"] == 5 / 20


def _fake_world(size: int):
    """An in-place sum over ``size`` threads (each one a "process"), for ``merge_scores_``."""
    barrier, parts, lock = threading.Barrier(size), [], threading.Lock()

    def all_reduce(t: torch.Tensor) -> None:
        with lock:
            parts.append(t)
        barrier.wait()
        total = torch.stack(parts).sum(0)
        barrier.wait()
        t.copy_(total)

    return all_reduce


def test_merge_scores_dates_the_writers_and_ors_seen_ever():
    """Sample 0: written by both processes (epoch 1); 1: written by process 0 only; 2: scored by
    process 1 before the last merge (epoch 0) and not written since: it stays seen everywhere;
    3: never scored."""
    regs = [FBetaRegularizer(torch.tensor([1, 0, 1, 0])) for _ in range(2)]
    regs[1](torch.tensor([5.0]), torch.tensor([2]))
    for reg in regs:
        reg.end_epoch_()
    regs[0](torch.tensor([1.0, 2.0]), torch.tensor([0, 1]))
    regs[1](torch.tensor([3.0]), torch.tensor([0]))
    written = [torch.tensor([True, True, False, False]), torch.tensor([True, False, False, False])]
    all_reduce = _fake_world(2)
    threads = [
        threading.Thread(target=reg._merge_scores_, args=(w, all_reduce))
        for reg, w in zip(regs, written, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for reg in regs:
        assert reg.scores[:2, 0].tolist() == [2.0, 2.0]
        assert reg.score_epoch.tolist() == [1, 1, 0, -1] and reg.score_epoch.dtype == torch.int32
        assert reg.seen_ever.tolist() == [True, True, True, False]
