"""The sharded per-sample state (reparam.sharding) against one process, with gloo on the CPU: K
processes train a linear head (tests/reparam/_sharded_worker.py); rank 0 replays the same
batches in one process with the unsharded objective. Every parameter and the dual state agree to
1e-5 after 7 steps and 2 epoch ends; a saved shard resumes bit for bit; at K = 2 a process holds
at most 0.55x of one process's state (per group: the per-sample state is split, nothing of it
held twice; the per-problem state is replicated)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from .sharded_processes import ENV, POOLED, ROOT, spawn

# the state that is not per sample or compared elsewhere: forward calls are counted per process
NOT_COMPARED = {
    "batches",
    "shape_labels",
    "layout.slot",
    "layout.pos_index",
    "layout.tau_group",
    "shard_layout",
}


def run(tmp_path: Path, k: int, kind: str, sampling: str = "global") -> dict:
    out = tmp_path / f"{kind}-{k}-{sampling}.pt"
    spawn(k, kind, sampling, out)
    return torch.load(out, weights_only=False)


def result(request, tmp_path: Path, k: int, kind: str, sampling: str = "global") -> dict:
    """The case's result: from the pooled group when it is one of ``POOLED``, else its own."""
    if k == 2 and (kind, sampling) in POOLED:
        folder = request.getfixturevalue("sharded_pool")
        return torch.load(folder / f"{kind}-{sampling}.pt", weights_only=False)
    return run(tmp_path, k, kind, sampling)


def assert_matches_one_process(r: dict, k: int) -> None:
    state, ref = r["state"], r["ref_state"]
    assert set(ref) - NOT_COMPARED <= set(state)
    for name, value in ref.items():
        if name in NOT_COMPARED:
            continue
        got = state[name]
        assert got.shape == value.shape, name
        if value.dtype == torch.bool:
            assert torch.equal(got, value), name
        else:
            torch.testing.assert_close(got.double(), value.double(), atol=1e-5, rtol=0, msg=name)
    for name, value in r["ref_head"].items():
        torch.testing.assert_close(r["head"][name], value, atol=1e-5, rtol=0)
    for key, value in r["ref_stats"].items():  # the statistics, computed on the shards
        if isinstance(value, float) or (
            isinstance(value, list) and value and isinstance(value[0], float)
        ):
            assert r["stats"][key] == pytest.approx(value, abs=1e-5), key
        else:
            assert r["stats"][key] == value, key
    # a saved shard, loaded into a fresh objective, continues exactly as the one in memory
    assert [p["resume"] for p in r["all"]] == [[]] * k


@pytest.mark.parametrize(
    ("kind", "k", "sampling"),
    [
        ("fbeta", 2, "global"),
        pytest.param("pr", 3, "global", marks=pytest.mark.slow),
        ("fbeta", 2, "owner"),
        ("fbeta_ordered", 2, "global"),  # the first block holds no positive
        ("fbeta_classes", 2, "global"),  # two positive classes: two problems
        pytest.param("fbeta_classes", 3, "owner", marks=pytest.mark.slow),
        pytest.param("fbeta_classes_epoch", 3, "global", marks=pytest.mark.slow),
        pytest.param("rap", 2, "global", marks=pytest.mark.slow),
        ("roc", 2, "global"),
        # per group: each group's samples in one block (Shard unit), its problem at its owner
        ("fbeta_groups", 2, "global"),
        pytest.param("fbeta_groups", 3, "owner", marks=pytest.mark.slow),
        pytest.param("fbeta_groups_epoch", 2, "owner", marks=pytest.mark.slow),
        pytest.param("fbeta_groups_compiled", 2, "owner", marks=pytest.mark.slow),  # fullgraph
        # reg.compile(): owner sampling traces whole (fullgraph), global breaks at the routing
        pytest.param("fbeta_compiled", 2, "owner", marks=pytest.mark.slow),
        pytest.param("fbeta_compiled", 2, "global", marks=pytest.mark.slow),
        pytest.param("roc", 3, "owner", marks=pytest.mark.slow),
        pytest.param("roc_ordered", 2, "global", marks=pytest.mark.slow),  # a block of no positive
        pytest.param("rap", 3, "owner", marks=pytest.mark.slow),
        pytest.param("fbeta", 3, "global", marks=pytest.mark.slow),
        pytest.param("pr", 2, "global", marks=pytest.mark.slow),
        pytest.param("pr", 3, "owner", marks=pytest.mark.slow),
        pytest.param("fbeta_epoch", 3, "global", marks=pytest.mark.slow),
    ],
)
def test_sharded_run_matches_one_process(request, tmp_path, kind, k, sampling):
    r = result(request, tmp_path, k, kind, sampling)
    assert_matches_one_process(r, k)
    for process in r["all"]:  # where a compiled step's graphs broke
        if sampling == "owner":
            assert process["breaks"] == {}
        else:
            assert all("ShardedRows._routed" in why for why in process["breaks"])
    if kind.startswith("fbeta_groups"):  # O(problems) replicated, nothing per sample
        assert sum(p["sample_bytes"] for p in r["all"]) <= 1.01 * r["ref_sample_bytes"]
    elif k == 2 and not kind.endswith(
        "_ordered"
    ):  # nothing of size O(N) replicated: each process holds about half
        assert max(p["bytes"] for p in r["all"]) <= 0.55 * r["ref_bytes"]


@pytest.mark.slow
def test_epoch_end_selections_match_one_process(tmp_path):
    """The value-bucket searches on scores spread unevenly over 3 processes: the same threshold,
    F-beta, rate cut and projection root as one process on all the scores (exactly; the bound to
    the rounding of its sum)."""
    results = run(tmp_path, 3, "statistics")
    for case, values in results.items():
        for name, (sharded, whole) in values.items():
            if name == "bound":  # a float64 sum over the negatives, added up in another order
                assert sharded == pytest.approx(whole, rel=1e-12), (case, name)
            elif name == "margin":  # sums of the processes' tp and fp: another order
                assert sharded == pytest.approx(whole, abs=1e-9), (case, name)
            else:
                assert sharded == whole, (case, name)


@pytest.mark.parametrize("sampling", ["owner", pytest.param("global", marks=pytest.mark.slow)])
def test_a_non_finite_gradient_on_one_rank_skips_the_step_on_every_rank(
    request, tmp_path, sampling
):
    """Rank 1's rows get a NaN gradient at step 3: both ranks skip that sparse step (6 of the 7
    steps counted on each), and every replicated value (eps, the tracked sums, the step count) is
    equal on the two ranks afterwards, all finite."""
    every = result(request, tmp_path, 2, "faults", sampling)
    first, second = (r["replicated"] for r in every)
    assert int(first["sparse_tau.step"]) == int(second["sparse_tau.step"]) == 6
    assert set(first) == set(second) and "schedule.active_sums" in first
    for name, value in first.items():
        assert torch.equal(value, second[name]), name
    assert all(r["finite"] for r in every)


def test_errors(request, tmp_path):
    messages = result(request, tmp_path, 2, "errors")
    assert "shape_labels must hold this process's 120 samples [0, 120)" in messages["labels"]
    assert "idx must hold the samples this process owns, [0, 120)" in messages["owner_idx"]
    assert (
        "tau=DenseTau() with a shard: a sharded F-beta needs tau=SparseTau()" in messages["dense"]
    )
    assert "groups must each lie in one process's block" in messages["split"]
    assert "1 split between processes (group 7 first)" in messages["split"]
    assert "shard 1 of 2" in messages["other_rank"]
    assert "resume with 2 processes" in messages["other_rank"]
    assert "unsharded objective's" in messages["unsharded"]
    assert messages["same"] is None


@pytest.mark.slow
def test_the_guide_example_runs(tmp_path):
    """docs/guide/sharded.md's loop, as written, under torchrun with 2 processes."""
    import re

    from train import distributed

    page = (ROOT / "docs" / "guide" / "sharded.md").read_text()
    script = tmp_path / "sharded_loop.py"
    script.write_text(re.search(r"```python\n(.*?)```", page, re.S).group(1))
    command = [*distributed.torchrun_command(2)[:-2], str(script)]  # a script, not -m train
    proc = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=ENV,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = re.findall(r"epoch (\d): eps ([\d.]+), train F1 ([\d.]+)", proc.stdout)
    assert [line[0] for line in printed] == ["1", "2", "3"]
    first, second, third = printed  # what the page says it prints
    assert f"`epoch 1: eps {first[1]}, train F1 {first[2]}`" in page
    assert f"`{second[2]}` and `{third[2]}`" in page
