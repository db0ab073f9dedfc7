"""``benchmarks.reg_step --no-sizes --against REF``: the parts of a step at S-MNIST's size, this
checkout against the library at a git revision, interleaved (a change's before / after)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from benchmarks import reg_step


def _git_has(ref: str) -> bool:
    if shutil.which("git") is None:
        return False
    probe = subprocess.run(
        ["git", "cat-file", "-e", f"{ref}:reparam/__init__.py"], cwd=reg_step.ROOT, check=False
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _git_has("HEAD"), reason="needs the git checkout")
def test_parts_against_a_revision_quick(tmp_path):
    argv = ["--no-sizes", "--against", "HEAD", "--steps", "2", "--out", str(tmp_path)]
    assert reg_step.main(argv) == 0
    text = (tmp_path / "reg_step_parts.md").read_text()
    assert "--against HEAD" in text and "--no-sizes" in text and "load average" in text
    for mode in reg_step.PARTS_MODES:
        assert f"| {mode} at HEAD | {mode} | {mode}: now / before |" in text
    for part in [*reg_step.SEGMENTS, "total"]:
        assert f"| {part} |" in text
