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
