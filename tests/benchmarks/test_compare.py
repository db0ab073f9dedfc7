"""``python -m benchmarks.compare``: the dispatcher and the quick forms of parts 1 and 3 (part 2:
test_compare_mnist.py). Smoke tests of what the tables contain; no timing is asserted."""

from __future__ import annotations

import json

from benchmarks.compare import __main__ as compare
from benchmarks.compare.fixed import spec as fixed


def test_dispatcher_rejects_an_unknown_part(capsys):
    assert compare.main(["cifar"]) == 2
    assert (
        "must be one of ('fixed', 'mnist', 'smnist', 'rates'), got 'cifar'"
        in capsys.readouterr().err
    )
    assert compare.main([]) == 2


def test_fixed_quick_tabulates_every_method_against_the_references(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "out"
    args = ["fixed", "--quick", "--jobs", "2", "--runs", str(runs), "--out", str(out)]
    assert compare.main(args) == 0
    records = [json.loads(f.read_text()) for f in runs.glob("*.json")]
    n_runs = sum(len(family.grid) for family in fixed.FAMILIES.values())
    assert len(records) == n_runs  # every family at every grid value, seed 0
    text = (out / "compare_fixed.md").read_text()
    for family in fixed.FAMILIES:
        assert f"| {family} |" in text, family
    assert "LP-optimal head (HiGHS)" in text and "learned threshold" in text
    reparam = [r for r in records if r["family"].startswith("reparam F-beta")]
    # the learned threshold is the exact F1-optimal cut of the last remembered scores
    assert all(0 <= r["f1_learned_threshold"] <= 1 for r in reparam)
    assert all(r["f1_tuned_threshold"] >= r["f1"] - 1e-12 for r in records)
    before = {f.name: f.stat().st_mtime_ns for f in runs.glob("*.json")}
    assert compare.main(args) == 0  # resumes: nothing is run again
    assert before == {f.name: f.stat().st_mtime_ns for f in runs.glob("*.json")}


def test_smnist_quick_trains_every_shape_term_through_the_trainer(tmp_path, digits_smnist):
    from benchmarks.compare import smnist

    out = tmp_path / "out"
    args = [
        "smnist",
        "--quick",
        "--data",
        str(digits_smnist),
        "--runs",
        str(tmp_path / "runs"),
        "--out",
        str(out),
        "--jobs",
        "2",
    ]
    assert compare.main(args) == 0
    text = (out / "compare_smnist.md").read_text()
    assert "### linear, logits" in text
    for method in smnist.METHODS:
        assert f"| {method} |" in text, method
    row = next(line for line in text.splitlines() if line.startswith("| reparam F-beta, defaults"))
    assert "n/a" not in row.split("|")[7]  # F-beta's test F1 at its learned threshold


def test_projection_modes_table_counts_feasible_runs_and_every_arm(tmp_path):
    """``benchmarks.projection_modes.table`` on hand-made records: one row per problem and arm,
    the LP gap over the runs with a feasible eps only, the count of those in the cell."""
    from benchmarks import projection_modes as pm

    records = [
        {
            "problem": problem,
            "family": family,
            "f1": 0.9,
            "lp_objective": None if seed == 2 else 1.1,
            "f1_last20_sd": 0.01,
            "seconds_per_epoch": 0.002,
        }
        for problem in pm.PROBLEMS
        for family, _ in pm.ARMS
        for seed in pm.SEEDS
    ]
    text = pm.table(records, {problem: 1.0 for problem in pm.PROBLEMS})
    assert len(text.splitlines()) == 2 + len(pm.PROBLEMS) * len(pm.ARMS)
    assert "| inline, exact (dense tau) |" in text and "| projection epoch |" in text
    assert "10.0 ± 0.0 % (2/3 feasible)" in text
