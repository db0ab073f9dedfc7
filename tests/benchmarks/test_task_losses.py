"""``python -m benchmarks.task_losses --quick`` runs and prints its table (no timing asserted)."""

from __future__ import annotations

from benchmarks import task_losses


def test_task_losses_benchmark_quick(capsys):
    assert task_losses.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert (
        "| 4, 16x16 |" in out and "smp's FocalLoss alone" in out and "lovasz per image + CE" in out
    )
