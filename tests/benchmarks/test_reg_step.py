"""``benchmarks.reg_step --no-sizes --against REF``: the parts of a step and the linear S-MNIST
step, this checkout against the library at a git revision (issue 31's before / after)."""

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
    assert "--no-sizes --against HEAD" in text and "load average" in text
    for title in [*reg_step.AGAINST_MODES, "Linear S-MNIST step, paper preset"]:
        assert title in text
    assert (
        "| input checks |" in text
        and "| reg(u, idx) |" in text
        and "regularized / baseline" in text
    )
