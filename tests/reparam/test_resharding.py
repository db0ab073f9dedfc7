"""A sharded state saved by K processes, loaded by K' (reparam.resharding), with gloo on the CPU:
the state gathered after the load equals the state before it exactly, each process reads only the
saved blocks that overlap its own, and one more epoch on K' processes equals one process continuing
from the same state on the same batches (to 1e-5, as tests/reparam/test_sharded.py)."""

from __future__ import annotations

import pytest
import torch

from reparam import FBetaRegularizer
from reparam.resharding import block, overlapping, reshard_state

from ._sharded_worker import UNIT
from .sharded_processes import spawn

SAME = ("scores", "score_epoch", "tau_param", "lam", "sparse_tau.moments", "sparse_tau.last")
REPLICATED = ("eps_param", "mu", "epoch", "sparse_tau.step", "schedule.active_sums")


@pytest.mark.parametrize(
    ("k_from", "k_to", "objective"),
    [
        (2, 3, "fbeta"),
        pytest.param(3, 2, "fbeta", marks=pytest.mark.slow),
        pytest.param(2, 1, "fbeta", marks=pytest.mark.slow),
        pytest.param(1, 2, "fbeta", marks=pytest.mark.slow),
        # per group: blocks of whole groups, each problem's tracked sums from its owner (saved
        # mid-epoch, where only the owner's are current)
        pytest.param(3, 2, "fbeta_groups", marks=pytest.mark.slow),
        pytest.param(2, 3, "fbeta_groups", marks=pytest.mark.slow),
        pytest.param(1, 2, "fbeta_groups", marks=pytest.mark.slow),  # (2 to 1: the trainer's test)
    ],
)
def test_a_state_saved_by_k_processes_resumes_on_another_k(tmp_path, k_from, k_to, objective):
    env = {"SHARDED_TEST_NO_END": "1"} if objective == "fbeta_groups" else {}  # mid-epoch
    spawn(k_from, f"reshard_save@{objective}", "global", tmp_path, env)
    spawn(k_to, f"reshard_load:{k_from}@{objective}", "global", tmp_path, env)
    unit = UNIT if objective == "fbeta_groups" else 1
    before = torch.load(tmp_path / "before.pt", weights_only=False)
    r = torch.load(tmp_path / "result.pt", weights_only=False)
    for name in (*SAME, "schedule.tau_active", *REPLICATED):
        assert torch.equal(r["after"][name], before[name]), name
    # each rank read the saved blocks overlapping its own, no more
    n = before["scores"].shape[0]
    for rank, needed in enumerate(r["every_needed"]):
        start, stop = block(n, rank, k_to, unit)
        assert needed == overlapping(n, start, stop, k_from, unit)
        assert len(needed) <= -(-k_from // k_to) + 1
    # training goes on: one more epoch equals one process from the same state on the same batches
    for name, value in r["ref_state"].items():
        if name in SAME or name in REPLICATED:
            torch.testing.assert_close(
                r["state"][name].double(), value.double(), atol=1e-5, rtol=0, msg=name
            )
    for name, value in r["ref_head"].items():
        torch.testing.assert_close(r["head"][name], value, atol=1e-5, rtol=0)


def test_reshard_state_refuses_what_does_not_fit():
    """In one process: a missing block, another training set, a block of another layout."""
    labels = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1])
    whole = FBetaRegularizer(labels)
    state = whole.state_dict()
    halves = []
    for rank, (a, b) in enumerate(block(8, r, 2) for r in range(2)):
        part = {k: v for k, v in state.items()}
        part["shape_labels"], part["scores"] = state["shape_labels"][a:b], state["scores"][a:b]
        part["score_epoch"] = state["score_epoch"][a:b]
        pos = state["layout.pos_index"].long()
        keep = (pos >= a) & (pos < b)
        part["layout.pos_index"] = (pos[keep] - a).int()
        for key in ("tau_param", "lam", "sparse_tau.moments", "sparse_tau.last"):
            part[key] = state[key][keep]
        part["schedule.tau_active"] = state["schedule.tau_active"][keep]
        part["shard_layout"] = torch.tensor([8, rank, 2])
        halves.append(part)
    # the two halves give back the whole state, exactly
    again = reshard_state(FBetaRegularizer(labels), dict(enumerate(halves)))
    assert all(torch.equal(again[k], v) for k, v in state.items())
    with pytest.raises(
        ValueError, match=r"saved must hold the blocks \[0, 1\] of 2 .* missing \[1\]"
    ):
        reshard_state(whole, {0: halves[0]})
    with pytest.raises(ValueError, match="of 8 samples and this objective of 9"):
        reshard_state(FBetaRegularizer(torch.cat([labels, labels[:1]])), dict(enumerate(halves)))
    with pytest.raises(
        ValueError, match=r"saved\[1\] must be block 1 of 2 of 8 samples, got block 0"
    ):
        reshard_state(whole, {0: halves[0], 1: halves[0]})
    with pytest.raises(ValueError, match="do not hold a row for every positive"):
        other = labels.clone()
        other[0] = 1
        reshard_state(FBetaRegularizer(other), dict(enumerate(halves)))
