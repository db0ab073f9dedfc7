"""``python -m benchmarks.scale_n`` at its smallest size: one and two processes, both modes, the
table and the figure (no timing is asserted)."""

from __future__ import annotations

import pytest

from benchmarks import scale_n


@pytest.mark.slow  # every mode in fresh processes, 1 and 2 of them (~30 s)
def test_scale_n_measures_every_mode_and_process_count(tmp_path):
    args = ["--max-n", "1e4", "--steps", "2", "--processes", "1", "2", "--out", str(tmp_path)]
    assert scale_n.main(args) == 0
    lines = (tmp_path / "scale_n.md").read_text().splitlines()
    rows = [line for line in lines if line.startswith("| ") and "1e+04" in line]
    assert len(rows) == len(scale_n.MODES) * 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[4] == "1.00"  # the ratio to the smallest n is 1 at the smallest n
        # state per sample (the scale_n docstring): 23.5 B with a dense tau, 32 B with the
        # default's (sparse_adam_ahead's moments, accumulator and last touch, the tracked set)
        bound = {"default": 32.0, "inline": 23.5}[cells[0].split()[0]]
        assert bound <= float(cells[-1]) <= bound + 0.1
    assert (tmp_path / "scale_n.png").stat().st_size > 0


def test_scale_n_runs_the_modes_asked_for(tmp_path):
    args = ["--max-n", "1e4", "--steps", "2", "--processes", "1", "--modes", "1"]
    assert scale_n.main([*args, "--out", str(tmp_path)]) == 0
    text = (tmp_path / "scale_n.md").read_text()
    assert "--modes 1 --processes 1 -->" in text  # the command that made it
    rows = [line for line in text.splitlines() if line.startswith("| ") and "1e+04" in line]
    assert [row.split("|")[1].strip() for row in rows] == [scale_n.MODES[1].name]
