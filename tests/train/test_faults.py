"""Runtime faults: a process killed while writing a checkpoint, corrupt checkpoints, ``--resume``
without one, and non-finite losses / shape scores (``train.nonfinite: stop | skip``)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from train import checkpoint
from train.__main__ import main
from train.data import load_data, make_loader
from train.loop import run
from train.nonfinite import NonFiniteLossError

from . import _nan_worker
from .run_utils import (
    ROOT,
    all_finite,
    assert_bitwise_equal,
    assert_same_training_state,
    final_checkpoint,
    poison_training_forwards,
    poison_training_samples,
    quiet,
    smnist_args,
    smnist_cfg,
    steps_per_epoch,
    without_timing,
)

# A torch.save that, on its ``block_on``-th call, writes ``block_after`` bytes of the file, tells
# the parent (a marker file) and then hangs until it is killed.
STUCK_SAVE = """
import os, sys, time, torch
marker, block_on, block_after = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
real_save, calls = torch.save, [0]
class Stuck:
    def __init__(self, f):
        self.f, self.n = f, 0
    def write(self, b):
        self.f.write(b)
        self.n += len(b)
        if self.n >= block_after:
            self.f.flush()
            os.fsync(self.f.fileno())
            open(marker, "w").close()
            time.sleep(600)
        return len(b)
    def flush(self):
        self.f.flush()
def save(obj, f, *args, **kwargs):
    calls[0] += 1
    return real_save(obj, Stuck(f) if calls[0] == block_on else f, *args, **kwargs)
torch.save = save
"""


def _kill_when_stuck(code: str, args: list[str], marker: Path, timeout: float = 120) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", STUCK_SAVE + code, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"the writer never got stuck (rc {proc.returncode}): {err[-2000:]}")
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def test_sigkill_while_saving_keeps_the_previous_checkpoint(tmp_path):
    run_dir, marker = tmp_path / "run", tmp_path / "stuck"
    writer = (
        "from train import checkpoint\n"
        "run = sys.argv[4]\n"
        "checkpoint.path_for(run, 1).parent.mkdir(parents=True)\n"
        "checkpoint.save_atomic({'step': 1, 'w': torch.arange(10.0)}, checkpoint.path_for(run, 1))\n"
        "checkpoint.save_atomic({'step': 2, 'w': torch.ones(1 << 22)}, checkpoint.path_for(run, 2))\n"
    )  # 16 MiB, stuck after 1 MiB
    _kill_when_stuck(writer, [str(marker), "2", str(1 << 20), str(run_dir)], marker)

    folder = run_dir / "checkpoints"
    assert not checkpoint.path_for(run_dir, 2).exists()  # no partial file under the final name
    (tmp,) = folder.glob(".step-000000002.pt.*.tmp")  # the interrupted write, half done
    assert tmp.stat().st_size >= 1 << 20
    assert checkpoint.listing(run_dir) == [checkpoint.path_for(run_dir, 1)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the temp file is not even looked at
        path, state = checkpoint.latest(run_dir)
    assert path == checkpoint.path_for(run_dir, 1) and state["step"] == 1
    assert torch.equal(state["w"], torch.arange(10.0))
    checkpoint.prune(run_dir, keep=2)
    assert sorted(p.name for p in folder.iterdir()) == ["step-000000001.pt"]


def test_training_killed_mid_checkpoint_resumes_from_the_previous_one_exactly(
    digits_smnist, tmp_path
):
    cfg = smnist_cfg(digits_smnist, tmp_path / "a")
    per_epoch = steps_per_epoch(cfg)
    run(cfg, log=quiet)
    # checkpoints at steps 5, 10, per_epoch, 15, ... (the epoch's end also writes best.pt, before
    # its step checkpoint): the 5th torch.save, step 15 (mid-epoch 2), hangs; SIGKILL
    out, marker = tmp_path / "b", tmp_path / "stuck"
    assert 10 < per_epoch < 15
    # two step checkpoints kept: the one before the interrupted write survives beside the newest
    args = smnist_args(digits_smnist, out, "train.checkpoint_every=5", "train.keep_checkpoints=2")
    code = "from train.__main__ import main\nmain(sys.argv[4:])\n"
    _kill_when_stuck(code, [str(marker), "5", "4096", *args], marker)
    assert [p.name for p in checkpoint.listing(out)] == [
        checkpoint.path_for(out, s).name for s in (per_epoch, 10)
    ]
    assert list((out / "checkpoints").glob(".*.tmp"))
    assert main(["--resume", str(out)]) == 0
    assert not list((out / "checkpoints").glob(".*.tmp"))  # pruned with the next checkpoint
    assert_same_training_state(final_checkpoint(tmp_path / "a"), final_checkpoint(out))


def _killed_writer_draws(run_dir: Path, seeds: range, keep: int = 2) -> dict[str, int]:
    """Each seed: a forked child writes checkpoints of a few MB (step after step, each followed
    by ``prune``) until the parent SIGKILLs it after a random delay. Every file left under a
    final name must then hold exactly what was written for its step (the newest complete one is
    what ``latest`` returns; the previous draw's newest is never lost) and ``prune`` removes the
    temp file of an interrupted write. Returns how many kills left such a temp file (a kill in
    the middle of a write) and how many left none."""
    # the contents, made before forking (the child only serializes): step k holds bases[k % 3],
    # so that a file mixing two steps' bytes would not equal either
    bases = [torch.rand(1 << 20, generator=torch.Generator().manual_seed(i)) for i in range(3)]

    def contents(step: int) -> dict:
        return {"step": step, "w": bases[step % 3], "tail": torch.full((5,), float(step))}

    def check(where: str) -> int:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no file under a final name is ever unreadable
            found = checkpoint.latest(run_dir)
        assert found is not None, f"{where}: no checkpoint"
        for path in checkpoint.listing(run_dir):
            step = checkpoint.step_of(path)
            assert_bitwise_equal(contents(step), checkpoint.load(path), f"{where}: {path.name}")
        return checkpoint.step_of(found[0])

    checkpoint.path_for(run_dir, 0).parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    checkpoint.save_atomic(contents(1), checkpoint.path_for(run_dir, 1))
    window = 4 * (time.perf_counter() - start)  # a random point of the next few writes
    newest, outcomes = 1, {"mid-write": 0, "between writes": 0}
    for seed in seeds:
        delay = random.Random(seed).uniform(0.0, window)
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: write step after step until killed; never returns to pytest
            try:
                os.close(ready_r)
                os.write(ready_w, b"1")
                for step in range(newest + 1, newest + 10_000):
                    checkpoint.save_atomic(contents(step), checkpoint.path_for(run_dir, step))
                    checkpoint.prune(run_dir, keep)
            finally:
                os._exit(1)
        os.close(ready_w)
        assert os.read(ready_r, 1) == b"1"
        os.close(ready_r)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        where = f"kill draw seed {seed} (SIGKILL after {delay * 1e3:.1f} ms)"
        assert os.WIFSIGNALED(status), f"{where}: the writer ended by itself ({status})"
        step = check(where)
        assert step >= newest, f"{where}: latest is step {step}, step {newest} was complete"
        newest = step
        temps = list((run_dir / checkpoint.FOLDER).glob(".*.tmp"))
        outcomes["mid-write" if temps else "between writes"] += 1
        checkpoint.prune(run_dir, keep)
        assert not list((run_dir / checkpoint.FOLDER).glob(".*.tmp")), where
        assert check(where) == newest
    return outcomes


def test_a_writer_killed_at_random_points_leaves_complete_checkpoints(tmp_path):
    outcomes = _killed_writer_draws(tmp_path, range(5))
    assert sum(outcomes.values()) == 5


@pytest.mark.slow
def test_a_writer_killed_at_60_random_points_leaves_complete_checkpoints(tmp_path):
    outcomes = _killed_writer_draws(tmp_path, range(100, 160))
    assert outcomes["mid-write"] >= 5, outcomes  # the draws do hit writes in progress


@pytest.mark.slow
def test_training_killed_at_random_times_resumes_like_uninterrupted(digits_smnist, tmp_path):
    """The trainer in a fresh process, a checkpoint every step (two kept), SIGKILLed at a random
    time once its first checkpoint exists; ``--resume`` ends bit for bit where the uninterrupted
    run ends. Three seeded draws."""
    reference = tmp_path / "reference"
    start = time.perf_counter()
    run(smnist_cfg(digits_smnist, reference), log=quiet)
    duration = time.perf_counter() - start
    expected = final_checkpoint(reference)
    for seed in range(3):
        out = tmp_path / f"killed-{seed}"
        args = smnist_args(
            digits_smnist, out, "train.checkpoint_every=1", "train.keep_checkpoints=2"
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "train", *args],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 120
        while not checkpoint.listing(out) and proc.poll() is None:
            assert time.monotonic() < deadline, "no first checkpoint within 120 s"
            time.sleep(0.01)
        delay = random.Random(seed).uniform(0.0, duration)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
        where = f"trainer kill seed {seed} (SIGKILL {delay:.2f} s after its first checkpoint)"
        assert proc.returncode in (0, -signal.SIGKILL), f"{where}: {err[-2000:]}"
        assert main(["--resume", str(out)]) == 0, where
        assert not list((out / "checkpoints").glob(".*.tmp")), where
        assert_same_training_state(expected, final_checkpoint(out))


def test_corrupt_newest_checkpoint_falls_back_to_the_previous_with_a_warning(tmp_path):
    for step in (1, 2, 3):
        path = checkpoint.path_for(tmp_path, step)
        path.parent.mkdir(exist_ok=True)
        checkpoint.save_atomic({"step": step, "w": torch.full((1000,), float(step))}, path)
    newest = checkpoint.path_for(tmp_path, 3)
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # truncated copy
    with pytest.warns(
        checkpoint.CheckpointWarning,
        match=r"^skipped: checkpoint .*step-000000003\.pt is truncated or corrupt \(\d+ bytes\); "
        r"trying an older one$",
    ):
        path, state = checkpoint.latest(tmp_path)
    assert path == checkpoint.path_for(tmp_path, 2) and state["step"] == 2

    checkpoint.path_for(tmp_path, 2).write_bytes(b"\x00" * 100)  # garbage, not a zip file
    with pytest.warns(checkpoint.CheckpointWarning) as record:
        path, state = checkpoint.latest(tmp_path)
    assert state["step"] == 1
    assert [str(w.message).split(" (")[0].split("/")[-1] for w in record] == [
        "step-000000003.pt is truncated or corrupt",
        "step-000000002.pt is not a checkpoint of this project",
    ]
    checkpoint.path_for(tmp_path, 1).write_bytes(b"")  # empty: every one unreadable
    with pytest.warns(checkpoint.CheckpointWarning) as record:
        assert checkpoint.latest(tmp_path) is None
    assert [re.search(r"step-00000000(\d)\.pt is ", str(w.message))[1] for w in record] == [
        "3",
        "2",
        "1",
    ]
    assert str(record[-1].message).endswith("(0 bytes); no older one")
    assert checkpoint.latest(tmp_path / "nothing") is None


def test_resume_skips_a_corrupt_newest_checkpoint(digits_smnist, tmp_path, capsys):
    out = tmp_path / "run"
    cfg = smnist_cfg(digits_smnist, out, "train.keep_checkpoints=3")
    run(cfg, log=quiet)
    per_epoch = steps_per_epoch(cfg)
    newest = checkpoint.path_for(out, 2 * per_epoch)
    complete = checkpoint.load(newest)
    newest.write_bytes(newest.read_bytes()[:1000])
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the CLI says it in one line of its log, no warning
        assert main(["--resume", str(out)]) == 0  # epoch 2 again, from the epoch-1 checkpoint
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        f"warning: skipped: checkpoint {newest} is truncated or corrupt (1000 bytes); "
        f"trying an older one"
    )
    assert lines[1] == f"resuming from {checkpoint.path_for(out, per_epoch)}"
    assert_same_training_state(complete, final_checkpoint(out))


def test_resume_without_a_checkpoint_exits_2(digits_smnist, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(smnist_args(digits_smnist, out, "train.checkpoint=false")) == 0
    capsys.readouterr()
    assert main(["--resume", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --resume") and "no readable checkpoint" in err
    with pytest.raises(SystemExit) as e:
        main(["--resume", str(tmp_path / "not-a-run")])
    assert e.value.code == 2 and "no config.yaml (not a run folder?)" in capsys.readouterr().err


# --- non-finite loss / shape score ----------------------------------------------------------------


@pytest.mark.parametrize("every", ["1", "100"])  # read per step | at the checkpoints' reads
@pytest.mark.parametrize("target", ["logits", "u"])
def test_nonfinite_stop_names_the_epoch_step_and_last_good_checkpoint(
    digits_smnist, tmp_path, monkeypatch, target, every
):
    """The first non-finite step is named exactly, whenever its flag is read; no checkpoint after
    it is written (the flag is read before every checkpoint)."""
    cfg = smnist_cfg(
        digits_smnist,
        tmp_path / "run",
        "train.checkpoint_every=2",
        f"train.nonfinite_check_every={every}",
    )
    per_epoch = steps_per_epoch(cfg)
    poison_training_forwards(monkeypatch, [per_epoch + 7], target)
    saved = [s for s in range(1, per_epoch + 7) if s % 2 == 0 or s == per_epoch]
    last = checkpoint.path_for(tmp_path / "run", saved[-1])  # a mid-epoch one
    assert saved[-1] > per_epoch
    with pytest.raises(
        NonFiniteLossError,
        match=rf"at epoch 2 step 7 \(.*\); last good checkpoint: {re.escape(str(last))}\. .*train\.nonfinite=skip",
    ):
        run(cfg, log=quiet)
    assert checkpoint.latest(tmp_path / "run")[0] == last
    history = json.loads((tmp_path / "run" / "metrics.json").read_text())["history"]
    assert [h["epoch"] for h in history] == [1]


def test_nonfinite_stop_after_a_resume_names_the_checkpoint_resumed_from(
    digits_smnist, tmp_path, monkeypatch
):
    out = tmp_path / "run"
    assert main(smnist_args(digits_smnist, out, "train.stop_after_steps=3")) == 0
    poison_training_forwards(monkeypatch, [1])
    last = re.escape(str(checkpoint.path_for(out, 3)))
    with pytest.raises(NonFiniteLossError, match=rf"epoch 1 step 4 .*checkpoint: {last}\."):
        run(smnist_cfg(digits_smnist, out), log=quiet, resume=out)


def test_nonfinite_stop_exits_1_on_the_command_line(digits_smnist, tmp_path, monkeypatch, capsys):
    poison_training_forwards(monkeypatch, [3])  # read at the end of epoch 1 (k = 100 > 6 steps)
    assert main(smnist_args(digits_smnist, tmp_path / "run")) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: non-finite loss or shape score at epoch 1 step 3")
    assert "last good checkpoint: none yet" in err
    assert checkpoint.latest(tmp_path / "run") is None  # raised before the epoch's checkpoint
    assert not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.parametrize("target", ["logits", "u"])
def test_nonfinite_skip_drops_exactly_the_bad_steps(digits_smnist, tmp_path, monkeypatch, target):
    cfg = smnist_cfg(digits_smnist, tmp_path / "run", "train.nonfinite=skip")
    per_epoch = steps_per_epoch(cfg)
    bad = [3, 8, per_epoch + 2]
    poison_training_forwards(monkeypatch, bad, target)  # the regularizer would raise on inf u
    summary = run(cfg, log=quiet)
    assert [h["skipped_steps_total"] for h in summary["history"]] == [2, 3]
    state = final_checkpoint(tmp_path / "run")
    assert state["skipped_steps"] == 3 and state["global_step"] == 2 * per_epoch - 3
    reg = state["regularizer"]
    assert all_finite(reg) and all_finite(state["model"])
    for name in ("lam", "mu", "eps_param", "tau_param", "scores"):
        assert bool(torch.isfinite(reg[name]).all()), name
    assert int(reg["epoch"]) == 2 and bool((reg["score_epoch"] >= 0).any())


@pytest.mark.parametrize(
    ("optim", "target"),
    [("adam", "logits"), ("adam", "u"), ("sgd", "logits"), ("sgd", "u"), ("adam", "u-sparse")],
)
def test_nonfinite_skip_reads_every_step_and_never_steps_on_a_bad_batch(
    digits_smnist, tmp_path, monkeypatch, optim, target
):
    """``skip`` reads the flag every step, whatever ``train.nonfinite_check_every`` says (the
    runs with 1 and 100 are bit for bit the same), and a dropped step reaches nothing: the
    optimizer's step count is the number of finite steps (also the very first step of fused
    SGD), the regularizer counted only the finite batches, and everything stays finite."""
    per_epoch = steps_per_epoch(smnist_cfg(digits_smnist, tmp_path / "x"))
    target, _, sparse = target.partition("-")  # sparse: the regularizer steps tau (after_step_)
    extra = (
        "regularizer.projection=epoch",
        "regularizer.fbeta.tau_update=sparse_adam_ahead",
    ) * bool(sparse)
    states, histories = [], []
    for every in ("1", "100"):
        out = tmp_path / f"every-{every}"
        cfg = smnist_cfg(
            digits_smnist,
            out,
            "train.nonfinite=skip",
            f"optim.name={optim}",
            f"train.nonfinite_check_every={every}",
            *extra,
        )
        with monkeypatch.context() as m:
            poison_training_forwards(m, [1, 4, per_epoch + 2], target)
            histories.append(without_timing(run(cfg, log=quiet)["history"]))
        states.append(final_checkpoint(out))
    assert [h["skipped_steps_total"] for h in histories[0]] == [2, 3]
    assert histories[0] == histories[1]
    a, b = ({k: v for k, v in s.items() if k not in ("config", "history")} for s in states)
    assert_bitwise_equal(a, b)
    assert a["global_step"] == 2 * per_epoch - 3
    assert int(a["regularizer"]["batches"]) == 2 * per_epoch - 3
    if optim == "adam":
        for row in a["optimizer"]["state"].values():
            assert int(row["step"]) == 2 * per_epoch - 3
    assert all_finite(a["model"]) and all_finite(a["regularizer"])


def test_nonfinite_skip_with_fp16_never_reaches_the_scaler(digits_smnist, tmp_path, monkeypatch):
    """fp16: a non-finite step (here a finite task loss, an infinite shape score) is dropped
    before the backward pass, so the gradient scaler never sees it and does not back off."""
    out = tmp_path / "run"
    cfg = smnist_cfg(digits_smnist, out, "train.nonfinite=skip", "train.precision=fp16")
    per_epoch = steps_per_epoch(cfg)
    with monkeypatch.context() as m:
        poison_training_forwards(m, [2, per_epoch + 3], "u")
        summary = run(cfg, log=quiet)
    assert [h["skipped_steps_total"] for h in summary["history"]] == [1, 2]
    a = final_checkpoint(out)
    assert a["global_step"] == 2 * per_epoch - 2
    assert a["scaler"]["scale"] == torch.amp.GradScaler("cpu").get_scale()  # no backoff
    for row in a["optimizer"]["state"].values():
        assert int(row["step"]) == 2 * per_epoch - 2
    assert all_finite(a["model"]) and all_finite(a["regularizer"])


def test_skipped_steps_and_epoch_loss_survive_a_mid_epoch_resume(
    digits_smnist, tmp_path, monkeypatch
):
    """A poisoned (NaN) sample in step 2 of epoch 1 and somewhere in epoch 2; run B stops after
    global step 4 (batch 5 of epoch 1: one step already skipped) and resumes."""
    cfg = smnist_cfg(digits_smnist, tmp_path / "a", "train.nonfinite=skip")
    epoch_1 = list(
        make_loader(
            load_data(cfg.data).train, cfg.data.batch_size, shuffle=True, seed=cfg.train.seed
        ).sampler
    )
    poison_training_samples(monkeypatch, [epoch_1[1][0]])
    run(cfg, log=quiet)
    out = tmp_path / "b"
    run(
        smnist_cfg(digits_smnist, out, "train.nonfinite=skip", "train.stop_after_steps=4"),
        log=quiet,
    )
    stopped = final_checkpoint(out)
    assert (stopped["global_step"], stopped["step_in_epoch"]) == (4, 5)
    run(smnist_cfg(digits_smnist, out, "train.nonfinite=skip"), log=quiet, resume=out)
    a, b = final_checkpoint(tmp_path / "a"), final_checkpoint(out)
    assert a["skipped_steps"] == 2
    assert_same_training_state(a, b)
    ha = without_timing(json.loads((tmp_path / "a" / "metrics.json").read_text())["history"])
    hb = without_timing(json.loads((out / "metrics.json").read_text())["history"])
    assert [h["skipped_steps_total"] for h in hb] == [1, 2] and ha == hb


def test_diverging_lr_stops_the_cli_with_exit_1(digits_smnist, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "train",
            *smnist_args(digits_smnist, tmp_path / "run", "optim.lr=1e38", "regularizer.name=none"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: non-finite loss or shape score at epoch 1 step ")
    assert "last good checkpoint: none yet" in last


# --- a non-finite step on one rank of several -----------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _nan_draws(tmp_path: Path, world: int, seeds: list[int]) -> None:
    """``world`` gloo processes (one group) play the draws ``seeds`` of ``_nan_worker``: NaN
    logits or an infinite shape score on a random rank at a random step, under ``skip`` or
    ``stop`` (read every 1, 2 or 100 steps). Every rank must take the same decision (drop exactly
    that step; or raise at the first read after it, naming it) and hold the same model and
    regularizer state, byte for byte."""
    folder = tmp_path / "records"
    folder.mkdir()
    context = mp.start_processes(
        _nan_worker.worker,
        args=(world, _free_port(), str(folder), seeds),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + 540
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for p in context.processes:
                p.kill()
            pytest.fail(f"the {world} ranks did not finish {len(seeds)} draws within 540 s")
    records = [torch.load(folder / f"rank{r}.pt", weights_only=False) for r in range(world)]
    for i, seed in enumerate(seeds):
        plan = _nan_worker.draw(seed, world)
        where = f"NaN draw seed {seed} ({plan})"
        ranks = [r[i] if i < len(r) else {"failure": "no record"} for r in records]
        for r, record in enumerate(ranks):
            assert "failure" not in record, f"{where}: rank {r}: {record['failure']}"
        decisions = [(r["dropped"], r["error_step"], r["global_step"]) for r in ranks]
        assert all(d == decisions[0] for d in decisions), f"{where}: ranks differ: {decisions}"
        assert all(r["state"] == ranks[0]["state"] for r in ranks), f"{where}: states differ"
        bad, steps = plan["step"], _nan_worker.STEPS
        if plan["mode"] == "skip":
            assert decisions[0] == ([bad], None, steps - 1), f"{where}: {decisions[0]}"
            assert ranks[0]["finite"], f"{where}: non-finite weights after a skipped step"
        else:  # raised at the first read after it: a checked step (before its update) or the end
            reads = [k for k in range(bad, steps + 1) if k % plan["check_every"] == 0]
            done = reads[0] - 1 if reads else steps
            assert decisions[0] == ([], bad, done), f"{where}: {decisions[0]}"


def test_a_non_finite_step_on_a_random_rank_gets_one_decision_everywhere(tmp_path):
    _nan_draws(tmp_path, 2, list(range(8)))


@pytest.mark.slow
def test_a_non_finite_step_on_a_random_rank_of_3_gets_one_decision_everywhere_60_draws(tmp_path):
    _nan_draws(tmp_path, 3, list(range(100, 160)))
