"""``python -m benchmarks.shard_cases`` at a small N: every case at K = 2 holds about half of one
process's state (no timing)."""

from __future__ import annotations

import pytest

from benchmarks import shard_cases

pytestmark = pytest.mark.slow  # ten process groups


def test_shard_cases_reports_every_case(tmp_path):
    assert shard_cases.main(["--n", "3e4", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "shard_cases.md").read_text()
    rows = [line.strip("|").split("|") for line in text.splitlines() if line.startswith("| ")]
    cells = {row[0].strip(): row[2].strip() for row in rows[1:]}
    assert set(cells) == set(shard_cases.CASES)
    for title, share in cells.items():  # every case sharded, per group too
        assert 0.49 <= float(share.rstrip("x")) <= 0.55, title
