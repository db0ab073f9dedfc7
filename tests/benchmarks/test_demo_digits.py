"""``benchmarks.demo_digits``: one row per digit and target, from the demo's own arms."""

from __future__ import annotations

import pytest

from benchmarks import demo_digits


@pytest.mark.slow  # (the default suite's time budget)
def test_a_quick_run_writes_every_digit_and_target(tmp_path, monkeypatch):
    monkeypatch.setattr(demo_digits, "TARGETS", (0.95,))
    assert demo_digits.main(["--out", str(tmp_path), "--seeds", "1", "--epochs", "1"]) == 0
    rows = [r for r in (tmp_path / "demo_digits.md").read_text().splitlines() if r[:2] == "| "]
    assert [r.split(" | ")[0] for r in rows[1:]] == [f"| {d}" for d in range(10)]
    assert all(r.split(" | ")[3].rstrip(" |")[-5:] in ("(0/1)", "(1/1)") for r in rows[1:])
    assert "the lowest test recall of a val cut: " in (tmp_path / "demo_digits.md").read_text()
    assert (tmp_path / "demo_digits.png").stat().st_size > 0
