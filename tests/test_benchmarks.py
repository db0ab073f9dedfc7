"""Benchmark scripts run and write their tables (smoke tests: no timing is asserted)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks import overhead, reg_step
from benchmarks.projection import __main__ as projection
from benchmarks.segmentation import __main__ as segmentation


def test_projection_benchmark_quick(tmp_path, capsys):
    projection.main(["--quick", "--out", str(tmp_path)])
    assert "linear / torch.sort" in capsys.readouterr().out
    assert (tmp_path / "projection.md").stat().st_size > 0
    assert (tmp_path / "projection.png").stat().st_size > 0


def test_projection_benchmark_memory_only_against_a_revision(tmp_path, capsys):
    """``--memory-only --against REF``: the tree at REF (here HEAD, a temporary copy) in the table."""
    root = Path(projection.__file__).resolve().parents[2]
    git = ["git", "cat-file", "-e", "HEAD:projections/__init__.py"]
    if subprocess.run(git, cwd=root, check=False, capture_output=True).returncode:
        pytest.skip("not a git checkout with projections/ at HEAD")
    args = ["--quick", "--memory-only", "--against", "HEAD", "--repeats", "1", "--threads", "1"]
    projection.main([*args, "--out", str(tmp_path)])
    text = (tmp_path / "projection_memory.md").read_text()
    assert "tree at HEAD / minimum" in text and "| 1e5 |" in text
    assert "tree at HEAD" in capsys.readouterr().out


def test_projection_benchmark_by_clipped_coordinates(tmp_path):
    """``--clipped --against REF``: the tree by the number of clipped coordinates, beside REF's
    (here HEAD), both giving the same threshold."""
    root = Path(projection.__file__).resolve().parents[2]
    git = ["git", "cat-file", "-e", "HEAD:projections/__init__.py"]
    if subprocess.run(git, cwd=root, check=False, capture_output=True).returncode:
        pytest.skip("not a git checkout with projections/ at HEAD")
    args = ["--quick", "--clipped", "--against", "HEAD", "--repeats", "1", "--out", str(tmp_path)]
    projection.main(args)
    rows = [r for r in (tmp_path / "projection_clipped.md").read_text().splitlines() if "| 1e" in r]
    # sizes 1e4 and 1e5; every count below n: 0 .. 3000 at 1e4, 0 .. 1e4 at 1e5
    assert len(rows) == 6 + 7 and all(r.endswith("| True |") for r in rows)


def test_overhead_benchmark_quick(tmp_path, digits_smnist, capsys):
    assert (
        overhead.main(
            [
                "--quick",
                "--epochs",
                "1",
                "--repeats",
                "1",
                "--data",
                str(digits_smnist),
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    text = (tmp_path / "overhead.md").read_text()
    assert "linear, batch 100 (paper)" in text and "epoch end / epoch" in text
    for variant, _ in overhead.VARIANTS:  # before and after in one table
        assert f"| {variant} |" in text, variant
    assert (tmp_path / "overhead.png").stat().st_size > 0


def test_segmentation_benchmark_quick(tmp_path, capsys):
    assert segmentation.main(["--quick", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "segmentation.md").read_text()
    assert "cache" in text and "decode + resize" in text and "DeepLabV3+ resnet18 step" in text
    assert (tmp_path / "segmentation.png").stat().st_size > 0


@pytest.mark.slow  # ~30 s: trains with torchrun
def test_scale_benchmark_quick(tmp_path):
    from benchmarks import scale

    assert scale.main(["--quick", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "scale.md").read_text()
    assert "bf16 / fp32 time" in text and "2 / 1 throughput" in text
    assert (tmp_path / "scale.png").stat().st_size > 0


def test_reg_step_benchmark_quick(tmp_path, capsys):
    assert reg_step.main(["--sizes", "1e2,1e3", "--steps", "3", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "reg_step.md").read_text()
    for mode in reg_step.MODES:
        assert f"| {mode} |" in text, mode
    assert "ratio 1e+03 / 1e+02" in text and (tmp_path / "reg_step.png").stat().st_size > 0
