"""The README's first two commands (the test command is the one CI runs; the main job runs), and the
code of the README and of the guide pages it links to (docs/guide/), run as written."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from train import checkpoint

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guide"
# the README's commands run in a scratch folder; the application runs from the checkout
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


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


def _run_in(tmp_path: Path, commands: list[list[str]]) -> subprocess.CompletedProcess:
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    for args in commands:
        assert args[0] == ".venv/bin/python"
        proc = subprocess.run(
            [sys.executable, *args[1:]],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
            env=ENV,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_main_job_runs(tmp_path):
    """The README's main job in a scratch folder: the comparison table it shows is the one it
    prints, and the objective's gain it describes holds."""
    setup_and_job, _ = _readme_commands()
    proc = _run_in(tmp_path, [shlex.split(c) for c in setup_and_job.split("&&")[1:]])
    readme = (ROOT / "README.md").read_text()
    printed = re.search(r"^\| digit .*?(?=\n\n)", proc.stdout, re.S | re.M).group(0)
    assert (
        printed.splitlines()[:4]
        == re.search(r"^\| digit .*?(?=\n\n)", readme, re.S | re.M).group(0).splitlines()[:4]
    )
    record = json.loads((tmp_path / "runs" / "demo" / "demo.json").read_text())
    ce, pr = (record["results"][arm] for arm in ("cross-entropy", "precision at recall"))
    assert len(ce) == len(pr) == len(record["settings"]["seeds"]) == 5
    gains = [b["precision"] - a["precision"] for a, b in zip(ce, pr, strict=True)]
    assert sum(gains) / len(gains) > 0.05, gains
    assert all(o["certified_recall"] is None for o in ce)
    assert all(0.5 < o["certified_recall"] <= 1 for o in pr)


@pytest.mark.slow  # (the default suite's time budget)
def test_the_trainer_demo_runs(tmp_path):
    """The trainer's demo of docs/getting-started.md: S-MNIST from the bundled digits, then the
    F-beta regularizer on an MLP (its commands, as written there)."""
    text = (ROOT / "docs" / "getting-started.md").read_text()
    section = text[text.index("## The trainer's demo on S-MNIST") :]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    proc = _run_in(tmp_path, [shlex.split(line) for line in block.strip().splitlines()])
    assert "epoch  15" in proc.stdout
    (run,) = (tmp_path / "runs" / "demo").iterdir()
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["final"]["test_accuracy"] > 0.9
    assert checkpoint.latest(run) is not None and (run / "config.yaml").is_file()
    assert (tmp_path / "data" / "smnist-digits" / "size_histograms.png").is_file()


def test_regularizer_snippet_runs(capsys):
    text = (ROOT / "README.md").read_text()
    section = text.split("## Use the regularizer in your own training loop", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert 10 <= len([line for line in code.splitlines() if line.strip()]) <= 17
    torch.manual_seed(0)
    exec(compile(code, "README.md", "exec"), {})
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["20", "40", "60"]
    assert float(lines[-1].split()[1]) > 0.7  # the documented settings converge in this budget
    assert 0.5 < float(lines[-1].split()[2]) <= float(lines[-1].split()[1])  # certified, as said


def test_the_guide_runs_the_readme_loop():
    """docs/guide/own-loop.md starts from the README's loop, unchanged (the README's test runs it)."""
    readme = (ROOT / "README.md").read_text()
    loop = re.search(r"```python\n(.*?)```", readme.split("## Use the regularizer", 1)[1], re.S)
    guide = (GUIDE / "own-loop.md").read_text().split("## The loop", 1)[1]
    assert re.search(r"```python\n(.*?)```", guide, re.S).group(1) == loop.group(1)


def test_rate_objective_snippet_builds_each_objective():
    text = (GUIDE / "own-loop.md").read_text()
    section = text.split("## Rate objectives", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope = {"s": torch.tensor([0, 1, 1, 0, 1, 0])}
    exec(compile(code, "README.md", "exec"), scope)
    assert type(scope["reg"]).__name__ == "PrecisionAtRecall" and scope["reg"].recall == 0.9
    # the second block: calibrate on held-out scores, predict on others
    second = re.findall(r"```python\n(.*?)```", section, re.S)[1]
    scope |= {
        "val_scores": torch.tensor([2.0, 1.0, 0.5, -1.0, 0.2]),
        "val_labels": torch.tensor([1, 1, 0, 0, 1]),
        "test_scores": torch.tensor([1.5, -2.0, 0.3]),
    }
    exec(compile(second, "README.md", "exec"), scope)
    assert scope["cut"].met and scope["cut"].recall == 1.0
    assert scope["predict"].tolist() == [True, False, True]


def _command_lines(block: str) -> list[str]:
    """A bash block's commands, one a line: ` \\` continuations joined, comment lines left out."""
    lines = block.replace("\\\n", " ").strip().splitlines()
    return [line for line in lines if not line.lstrip().startswith("#")]


@pytest.mark.slow  # (the default suite's time budget: tests/train/test_train_segmentation.py)
def test_offline_segmentation_commands_run(tmp_path):
    """The segmentation guide's offline COCO-Stuff commands (synthetic data, prep, 2 epochs with the
    regularizer), run in a scratch folder."""
    text = (GUIDE / "segmentation.md").read_text()
    block = text.split("# offline, ~12 s:", 1)[1].split("```", 1)[0]
    commands = [shlex.split(line) for line in _command_lines(block)[1:]]
    assert [c[2] for c in commands] == [
        "data_prep.cocostuff_synthetic",
        "data_prep.cocostuff",
        "train",
    ]
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    for args in commands:
        assert args[0] == ".venv/bin/python"
        proc = subprocess.run(
            [sys.executable, *args[1:]],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
            env=ENV,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert "epoch   2" in proc.stdout and "miou" in proc.stdout
    (run,) = (tmp_path / "runs" / "cocostuff_tiny").iterdir()
    assert json.loads((run / "metrics.json").read_text())["final"]["reg_projections"] is not None


CAMVID = ROOT.parent / "shared" / "data" / "camvid"


@pytest.mark.slow  # (default suite: tests/data_prep/test_camvid.py, tests/train/test_groups.py)
@pytest.mark.skipif(not (CAMVID / "train").is_dir(), reason="no CamVid copy here")
def test_camvid_commands_run_on_real_frames(tmp_path):
    """The segmentation guide's CamVid commands on the real frames (6 per split, 1 epoch), in a
    scratch folder."""
    text = (GUIDE / "segmentation.md").read_text()
    block = text.split("## CamVid:", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [
        shlex.split(line.split("#")[0].replace("<CamVid dir>", str(CAMVID)))
        for line in _command_lines(block)
    ]
    assert [c[2] for c in commands].count("data_prep.camvid") == 2
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    for args in commands:
        assert args[0] == ".venv/bin/python"
        extra = (
            ["--limit", "6"]
            if args[2] == "data_prep.camvid"
            else ["train.epochs=1", "train.log_images=0"]
        )
        proc = subprocess.run(
            [sys.executable, *args[1:], *extra],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
            env=ENV,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    runs = sorted((tmp_path / "runs").glob("*/*/metrics.json"))
    assert len(runs) == 4
    for path in runs:
        m = json.loads(path.read_text())
        assert m["selected"]["epoch"] == 1 and "val_miou" in m["selected"]
