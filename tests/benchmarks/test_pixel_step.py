"""``benchmarks.pixel_step`` and ``benchmarks.gpu``: the per-pixel step's table on a small batch,
and the GPU command's one-line skip where there is no CUDA device."""

from __future__ import annotations

import pytest
import torch

from benchmarks import gpu, pixel_step


def test_pixel_step_table_quick(tmp_path):
    argv = ["--side", "16", "--images", "2", "--rounds", "2", "--threads", "1"]
    assert pixel_step.main([*argv, "--out", str(tmp_path)]) == 0
    text = (tmp_path / "pixel_step.md").read_text()
    assert "layout (512 pixels, cpu)" in text
    for layout in pixel_step.LAYOUTS:
        assert f"| {layout} |" in text
    assert (tmp_path / "pixel_step.png").stat().st_size > 0


@pytest.mark.slow
def test_the_compiled_arm_steps_as_the_eager_one(tmp_path):
    """``--compile``: the user's compiled loss (``fullgraph``) and ``opt.step`` on a regularizer
    of their own, its column and ratio in the table; both steps end at the same ``tau``."""
    argv = ["--side", "8", "--images", "2", "--rounds", "1", "--threads", "1", "--compile"]
    assert pixel_step.main([*argv, "--out", str(tmp_path)]) == 0
    text = (tmp_path / "pixel_step_compiled.md").read_text()
    assert "compiled / eager step" in text
    for layout in pixel_step.LAYOUTS:
        calls = pixel_step.arms(layout, 8, 2, "cpu", 4, compiled=True)
        for _ in range(3):
            calls["step"]()
            calls["compiled step"]()
        eager, compiled = calls["step"].reg, calls["compiled step"].reg
        assert int(eager.sparse_tau.step) == int(compiled.sparse_tau.step) == 3
        torch.testing.assert_close(compiled.tau, eager.tau, rtol=1e-5, atol=1e-6)


def test_keep_freed_runs_and_says_so(tmp_path):
    """``--keep-freed`` in its own process (it changes the process's ``malloc``)."""
    import subprocess
    import sys

    argv = ["--side", "8", "--images", "2", "--rounds", "1", "--keep-freed", "--out", str(tmp_path)]
    subprocess.run([sys.executable, "-m", "benchmarks.pixel_step", *argv], check=True)
    text = (tmp_path / "pixel_step_kept.md").read_text()
    assert "glibc malloc keeps freed blocks up to 32 MiB" in text.splitlines()[1]


def test_pixel_batches_are_whole_images():
    labels, groups, batches = pixel_step.pixel_batches(4, 2, 5, 3, "cpu")
    assert labels.shape == groups.shape == (80,)
    for u, idx in batches:
        assert u.shape == idx.shape == (32,)
        images = groups[idx].view(2, 16)
        assert bool((images == images[:, :1]).all()) and images[0, 0] != images[1, 0]


def test_gpu_command_says_one_line_without_cuda(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu.main([]) == 0
    assert capsys.readouterr().out.strip().splitlines() == [
        "[gpu] skipped: no CUDA device (torch.cuda.is_available() is False)"
    ]


def test_gpu_parts_start_with_the_cuda_tests(tmp_path):
    (name, argv, limit_s, _), *rest = gpu.parts(tmp_path)
    assert name == "CUDA tests" and argv[argv.index("-m", 2) + 1] == "cuda"
    assert sum(part[2] for part in [(name, argv, limit_s, ()), *rest]) <= 8 * 60
    assert any("benchmarks.pixel_step" in part[1] for part in rest)
