"""The README's first two commands: the test command is the one CI runs; the main job runs."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.strip().splitlines()]


def test_first_block_has_setup_plus_main_job_then_tests():
    setup_and_job, tests = _readme_commands()
    assert setup_and_job.startswith("bash .ci/setup && ")
    assert "pytest" in tests


def test_ci_runs_exactly_the_readme_test_command():
    _, tests = _readme_commands()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert any(line.strip().startswith(tests + " ||") or line.strip() == tests for line in ci)


def test_main_job_runs(tmp_path):
    setup_and_job, _ = _readme_commands()
    job = shlex.split(setup_and_job.split("&&", 1)[1])
    assert job[0] == ".venv/bin/python"
    args = [sys.executable, *job[1:]]
    args[args.index("--out") + 1] = str(tmp_path)  # do not write into the checkout
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "linear / torch.sort" in proc.stdout
    assert (tmp_path / "projection.md").stat().st_size > 0
    assert (tmp_path / "projection.png").stat().st_size > 0


def test_regularizer_snippet_runs(capsys):
    text = (ROOT / "README.md").read_text()
    section = text.split("## Use the regularizer in your own training loop", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert 10 <= len([line for line in code.splitlines() if line.strip()]) <= 15
    exec(compile(code, "README.md", "exec"), {})
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["0", "1", "2"]
