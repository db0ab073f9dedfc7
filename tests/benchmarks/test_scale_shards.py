"""``python -m benchmarks.scale_shards`` at its smallest size: one, two and four processes, both
samplings, the table and the figure (no timing is asserted)."""

from __future__ import annotations

import pytest

from benchmarks import scale_shards

pytestmark = pytest.mark.slow  # four multi-process runs


@pytest.mark.parametrize("groups", [0, 2500])
def test_scale_shards_measures_every_setup(tmp_path, groups):
    """The plain layout, and groups of 2500 samples (``--groups``: 4 groups at 1e4)."""
    extra = ["--groups", str(groups)] if groups else []
    assert (
        scale_shards.main(["--max-n", "1e4", "--steps", "2", "--out", str(tmp_path), *extra]) == 0
    )
    name = f"scale_shards_groups{groups}" if groups else "scale_shards"
    lines = (tmp_path / f"{name}.md").read_text().splitlines()
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in lines
        if line.startswith("| ") and "1e+04" in line
    ]
    assert [(r[0], r[1]) for r in rows] == [(str(k), s) for k, s in scale_shards.SETUPS]
    for world, _, _, _, ratio, *_, share in rows:
        assert ratio == "1.00"  # the ratio to the smallest n is 1 at the smallest n
        # the per-sample state split K ways (+ the per-class buffers and Adam's state of eps)
        assert 1 / int(world) <= float(share) <= 1 / int(world) + 0.01
    assert (tmp_path / f"{name}.png").stat().st_size > 0


def test_the_compiled_arm_runs_the_compiled_step():
    """``--compile``: the regularizer's compile() is what the timed steps call."""
    import torch._dynamo.utils as dynamo_utils

    dynamo_utils.counters.clear()  # (what earlier tests of this process compiled)
    r = scale_shards._measure(1000, "none", 8, 2, compiled=True)
    assert r["step_s"] > 0 and r["state_bytes"] > 0
    # the forward (its backward holds the sparse step; after_step_ has nothing to do: not called)
    assert dynamo_utils.counters["stats"]["unique_graphs"] >= 1
