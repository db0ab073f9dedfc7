"""``regularizer.shard`` in the trainer (torchrun, 2 gloo processes, the S-MNIST digits): each rank
writes its own block of the regularizer next to rank 0's checkpoint; a run stopped inside an epoch
and resumed ends bit for bit where the uninterrupted run does; a run resumed on another number of
processes is resharded; a missing shard is a one-line error and nothing is written."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from train import checkpoint, distributed

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # four torchrun runs of two processes


def _train(args: list[str], processes: int = 2) -> subprocess.CompletedProcess:
    command = (
        [*distributed.torchrun_command(processes)]
        if processes > 1
        else [sys.executable, "-m", "train"]
    )
    return subprocess.run([*command, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def _overrides(data: Path, out: Path, mode: str) -> list[str]:
    return [
        f"data.path={data}",
        f"train.out={out}",
        "model.name=mlp",
        "model.hidden=[32]",
        "data.batch_size=20",
        "train.epochs=2",
        "train.device=cpu",
        "train.num_threads=1",
        "train.progress=false",
        "regularizer.name=fbeta",
        "regularizer.alpha=0.1",
        f"regularizer.shard={mode}",
    ]


def _final(run: Path) -> tuple[dict, dict]:
    """Rank 0's last checkpoint and rank 1's shard of the same step."""
    main = checkpoint.listing(run)[0]
    shard = run / "checkpoints" / "shards" / f"step-{checkpoint.step_of(main):09d}.rank-1-of-2.pt"
    return checkpoint.load(main), checkpoint.load(shard)


def _assert_equal_ends(a: tuple[dict, dict], b: tuple[dict, dict]) -> None:
    """Two runs' last checkpoints (:func:`_final`): the model and both blocks bit for bit."""
    (main_a, shard_a), (main_b, shard_b) = a, b
    for x, y in ((main_a["regularizer"], main_b["regularizer"]), (shard_a, shard_b)):
        y = y.get("regularizer", y)
        for name, value in x.get("regularizer", x).items():
            assert torch.equal(value, y[name]), name
    for name, value in main_a["model"].items():
        assert torch.equal(value, main_b["model"][name]), name


@pytest.mark.parametrize("mode", ["owner", "global"])
def test_sharded_stop_and_resume_is_exact(digits_smnist, tmp_path, mode):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    ran = _train(["--config", "configs/demo.yaml", *_overrides(digits_smnist, whole, mode)])
    assert ran.returncode == 0, ran.stderr[-3000:]
    args = _overrides(digits_smnist, parts, mode)
    stopped = _train(["--config", "configs/demo.yaml", *args, "train.stop_after_steps=20"])
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    resumed = _train(["--resume", str(parts)])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (main_a, shard_a), (main_b, shard_b) = _final(whole), _final(parts)
    assert main_a["regularizer"]["shard_layout"].tolist() == [600, 0, 2]
    assert shard_a["regularizer"]["shard_layout"].tolist() == [600, 1, 2]
    _assert_equal_ends((main_a, shard_a), (main_b, shard_b))


def test_the_shards_of_an_unfinished_checkpoint_are_skipped_and_named(digits_smnist, tmp_path):
    """A process killed while a checkpoint is written: its shards exist, rank 0's file of that step
    does not (it is written last). The resume takes the newest complete checkpoint, says which
    shards it skipped, and ends where the uninterrupted run does."""
    whole, run = tmp_path / "whole", tmp_path / "run"
    ran = _train(["--config", "configs/demo.yaml", *_overrides(digits_smnist, whole, "global")])
    assert ran.returncode == 0, ran.stderr[-3000:]
    args = [*_overrides(digits_smnist, run, "global"), "train.stop_after_steps=20"]
    stopped = _train(["--config", "configs/demo.yaml", *args])
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    written = next((run / "checkpoints" / "shards").glob("step-*.rank-1-of-2.pt"))
    stray = written.with_name("step-000000025.rank-1-of-2.pt")  # rank 1 wrote it, then the kill
    stray.write_bytes(written.read_bytes())
    resumed = _train(["--resume", str(run)])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "skipped step-000000025.rank-1-of-2.pt" in resumed.stdout + resumed.stderr
    assert not stray.exists()
    (main_a, shard_a), (main_b, shard_b) = _final(whole), _final(run)
    for name, value in main_a["model"].items():
        assert torch.equal(value, main_b["model"][name]), name
    for name, value in shard_a["regularizer"].items():
        assert torch.equal(value, shard_b["regularizer"][name]), name


def test_another_process_count_reshards_and_a_missing_shard_is_an_error(digits_smnist, tmp_path):
    """A run stopped on 2 processes resumes on 3 (the log says it resharded; the checkpoints are
    then of 3), and on 1 process, which stops again and resumes on 2: each finishes its epochs.
    A missing shard is a one-line error naming it, and nothing is written."""
    import shutil

    run = tmp_path / "run"
    args = [*_overrides(digits_smnist, run, "global"), "train.stop_after_steps=10"]
    ran = _train(["--config", "configs/demo.yaml", *args, "data.batch_size=30"])  # 1, 2 or 3
    assert ran.returncode == 0, ran.stderr[-3000:]
    three, one = tmp_path / "three", tmp_path / "one"
    shutil.copytree(run, three)
    shutil.copytree(run, one)
    resumed = _train(["--resume", str(three)], processes=3)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resharded the regularizer's state of 600 samples from 2 to 3 process(es)" in (
        resumed.stdout + resumed.stderr
    )
    last = checkpoint.listing(three)[0]
    assert checkpoint.load(last)["epoch"] == 2
    shards = sorted(p.name for p in (three / "checkpoints" / "shards").glob(f"{last.stem}.*"))
    assert shards == [f"{last.stem}.rank-1-of-3.pt", f"{last.stem}.rank-2-of-3.pt"]
    alone = _train(["--resume", str(one), "train.stop_after_steps=30"], processes=1)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert "from 2 to 1 process(es)" in alone.stdout + alone.stderr
    assert "shard_layout" not in checkpoint.load(checkpoint.listing(one)[0])["regularizer"]
    again = _train(["--resume", str(one), "train.stop_after_steps=null"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert "from 1 to 2 process(es)" in again.stdout + again.stderr
    assert checkpoint.load(checkpoint.listing(one)[0])["epoch"] == 2
    before = sorted(p.name for p in (run / "checkpoints").rglob("*.pt"))
    for shard in (run / "checkpoints" / "shards").glob("*.pt"):
        shard.unlink()
    missing = _train(["--resume", str(run)])
    assert missing.returncode != 0
    assert "the regularizer shard of rank 1" in missing.stderr and "is missing" in missing.stderr
    after = sorted(p.name for p in (run / "checkpoints").rglob("*.pt"))
    assert [p for p in after if "shards" not in p] == [p for p in before if "rank-1" not in p]


@pytest.fixture(scope="module")
def camvid_sky(tmp_path_factory) -> Path:
    """A CamVid-layout cache of 8 small frames (the sky task)."""
    from tests.data_prep.test_camvid import write_cache

    return write_cache(tmp_path_factory.mktemp("camvid"), task="sky", n=8, hw=(24, 32))


def test_the_per_image_fbeta_sharded_stops_resumes_and_reshards(camvid_sky, tmp_path):
    """``regularizer.target: pixels`` sharded (each process owns its images' pixels, blocks of
    whole images): a run stopped inside epoch 1 and resumed ends bit for bit where the
    uninterrupted run does, model and both blocks; the stopped run resumed on 1 process is
    resharded and finishes."""
    import shutil

    def args(out: Path) -> list[str]:
        return [
            "--config",
            "configs/camvid_sky.yaml",
            f"data.path={camvid_sky}",
            f"train.out={out}",
            "data.batch_size=4",
            "train.epochs=2",
            "train.device=cpu",
            "train.num_threads=1",
            "train.progress=false",
            "regularizer.name=fbeta",
            "regularizer.alpha=1.0",
            "regularizer.target=pixels",
            "regularizer.shard=global",
        ]

    whole, parts = tmp_path / "whole", tmp_path / "parts"
    ran = _train(args(whole))
    assert ran.returncode == 0, ran.stderr[-3000:]
    stopped = _train([*args(parts), "train.stop_after_steps=1"])
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    alone = tmp_path / "alone"
    shutil.copytree(parts, alone)
    resumed = _train(["--resume", str(parts)])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (main_a, shard_a), (main_b, shard_b) = _final(whole), _final(parts)
    pixels = 8 * 24 * 32
    assert main_a["regularizer"]["shard_layout"].tolist() == [pixels, 0, 2, 24 * 32]
    assert int(main_a["regularizer"]["sparse_tau.step"]) == 4  # 2 epochs of 2 steps
    _assert_equal_ends((main_a, shard_a), (main_b, shard_b))
    one = _train(["--resume", str(alone)], processes=1)
    assert one.returncode == 0, one.stderr[-3000:]
    assert f"state of {pixels} samples from 2 to 1 process(es)" in one.stdout + one.stderr
    assert checkpoint.load(checkpoint.listing(alone)[0])["epoch"] == 2


KILLED = """
import os, signal, sys
sys.path.insert(0, os.getcwd())  # the repository: the trainer is not installed
import train.loop as loop
from train.__main__ import main

step, calls = loop.train_step, [0]


def dying(*args, **kwargs):
    calls[0] += 1
    if os.environ["RANK"] == "1" and calls[0] == 3:
        os.kill(os.getpid(), signal.SIGKILL)  # the process dies in the middle of its step 3
    return step(*args, **kwargs)


loop.train_step = dying
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("mode", ["none", "global"])
def test_a_rank_killed_mid_step_stops_the_run_without_a_hang(digits_smnist, tmp_path, mode):
    """Rank 1 killed (SIGKILL) at its step 3: the run ends within seconds, far inside
    ``train.dist_timeout_s``, with an error naming rank 1; the surviving rank does not wait."""
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    command = [*distributed.torchrun_command(2)[:-2], str(script)]
    args = [*_overrides(digits_smnist, tmp_path / "run", mode), "train.dist_timeout_s=60"]
    t0 = time.perf_counter()
    ran = subprocess.run(
        [*command, "--config", "configs/demo.yaml", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    took = time.perf_counter() - t0
    assert ran.returncode != 0 and took < 60, (took, ran.stderr[-2000:])
    assert "rank      : 1" in ran.stderr or "rank: 1" in ran.stderr, ran.stderr[-2000:]
    assert "Signal 9 (SIGKILL)" in ran.stderr or "exitcode  : -9" in ran.stderr, ran.stderr[-2000:]
