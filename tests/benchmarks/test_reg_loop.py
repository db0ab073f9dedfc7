"""``benchmarks.reg_loop``: every arm runs the user's loop with and without the regularizer and the
script writes its table (no timing is asserted); the DeepLabV3+ case steps on the CPU."""

from __future__ import annotations

import pytest

from benchmarks import reg_loop, segmentation_step


@pytest.mark.slow  # compiles the loop twice (a minute on 2 cores)
def test_the_loop_benchmark_writes_every_arm(tmp_path):
    reg_loop.main(["--steps", "2", "--threads", "1", "--out", str(tmp_path)])
    text = (tmp_path / "reg_loop.md").read_text()
    for arm in ("eager", "reg.compile", "compiled"):
        assert f"| {arm} | " in text
    assert "operations |" in text and "kernels (generated) |" in text


@pytest.mark.slow  # DeepLabV3+ steps on the CPU
def test_the_segmentation_case_reports_the_regularizers_share():
    (row,) = segmentation_step.segmentation_share("cpu", ["eager"], 1, 0.1)
    name, arm, base, with_reg, share = row
    assert name.startswith("ResNet-18") and arm == "eager"
    assert float(with_reg) > 0 and float(base) > 0 and share.endswith("%")
