"""Exact resume (CPU, bit for bit): 2N steps in one run == N steps, then ``python -m train
--resume`` in a fresh process for the rest; periodic checkpoints and their pruning."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from train import checkpoint, run_info
from train import config as C
from train.__main__ import main
from train.loop import run

from .run_utils import (
    TINY,
    assert_bitwise_equal,
    assert_same_training_state,
    cli,
    final_checkpoint,
    quiet,
    smnist_args,
    smnist_cfg,
    steps_per_epoch,
    without_timing,
)

REG_STATE = (
    "eps_param",
    "tau_param",
    "lam",
    "mu",
    "scores",
    "epoch",
    "projections",
    "projections_epoch",
    "projections_last_epoch",
    "score_epoch",
)
# dual_every="step" (the rate objectives' default): no per-sample tau or lambda is kept
RATE_STATE = ("nu", "scores", "score_epoch", "epoch")


def _metrics(run_dir: Path) -> dict:
    return without_timing(json.loads((run_dir / "metrics.json").read_text()))


def _stop_then_resume(args: list[str], out: Path, stop: int) -> dict:
    """Run ``args`` in this process until global step ``stop``, then finish it with
    ``python -m train --resume`` in a fresh process; returns the checkpoint at the stop."""
    assert main([*args, f"train.stop_after_steps={stop}"]) == 0
    stopped = final_checkpoint(out)
    assert stopped["global_step"] == stop
    proc = cli("--resume", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resuming from {checkpoint.path_for(out, stop)}" in proc.stdout
    return stopped


def _slow(*values: str) -> object:
    return pytest.param(*values, marks=pytest.mark.slow)


STOPS = {  # where run B stops, from the steps per epoch
    "mid-epoch-1-then-across-the-epoch-boundary": lambda per_epoch: 5,
    "mid-epoch-2-after-a-dual-step": lambda per_epoch: per_epoch + 5,
    "at-the-epoch-boundary": lambda per_epoch: per_epoch,
}


@pytest.mark.parametrize(
    ("where", "projection", "objective"),
    [
        # (the default suite: the defaults, a rate objective, the full projections)
        _slow("mid-epoch-1-then-across-the-epoch-boundary", "inline", "fbeta"),
        _slow("mid-epoch-2-after-a-dual-step", "epoch", "fbeta"),
        ("at-the-epoch-boundary", "null", "fbeta_full_projections"),
        ("mid-epoch-2-after-a-dual-step", "epoch", "roc_auc"),
        _slow("mid-epoch-1-then-across-the-epoch-boundary", "inline", "recall_at_precision"),
        _slow("mid-epoch-2-after-a-dual-step", "epoch", "fbeta-sparse_adam_ahead"),  # shared_gemm
        ("mid-epoch-1-then-across-the-epoch-boundary", "tracked", "fbeta-sparse_adam_ahead"),
    ],
)
def test_smnist_stop_and_resume_in_a_fresh_process_is_bitwise_exact(
    digits_smnist, tmp_path, where, projection, objective
):
    objective, _, tau_update = objective.partition("-")
    extra = (
        f"regularizer.projection={projection}",
        f"regularizer.name={objective}",
        "regularizer.recall_at_precision.precision=0.8",
    )
    reg_state = REG_STATE if objective.startswith("fbeta") else RATE_STATE
    if tau_update:  # the fast step: tau's Adam state is the regularizer's, checkpointed
        extra += (f"regularizer.fbeta.tau_update={tau_update}", "model.shared_gemm=true")
        reg_state += ("sparse_tau.moments", "sparse_tau.step", "sparse_tau.last")
    if projection == "tracked":  # the threshold's tracked active set and its sums
        reg_state += ("schedule.tau_active", "schedule.active_sums")
    cfg = smnist_cfg(digits_smnist, tmp_path / "a", *extra)
    per_epoch = steps_per_epoch(cfg)
    stop = STOPS[where](per_epoch)
    assert per_epoch > 5
    run(cfg, log=quiet)
    a = final_checkpoint(tmp_path / "a")
    assert a["global_step"] == 2 * per_epoch and a["epoch"] == 2

    b_dir = tmp_path / "b"
    stopped = _stop_then_resume(smnist_args(digits_smnist, b_dir, *extra), b_dir, stop)
    assert (stopped["epoch"], stopped["step_in_epoch"]) == divmod(stop, per_epoch)
    b = final_checkpoint(b_dir)
    assert b["global_step"] == 2 * per_epoch and b["epoch"] == 2
    # the comparison is not vacuous: the state moved after the stop, the regularizer is all there
    assert not torch.equal(stopped["model"]["classifier.weight"], b["model"]["classifier.weight"])
    assert set(reg_state) <= set(b["regularizer"]) and b["optimizer"]["state"]
    r = b["regularizer"]
    assert int(r["epoch"]) == 2 and bool((r["score_epoch"] >= 0).all())  # every sample seen
    if "lam" in reg_state:
        assert not torch.equal(r["lam"], torch.zeros_like(r["lam"]))
    else:  # the multiplier moved from its start (nu_init = 1)
        assert not torch.equal(r["nu"], torch.ones_like(r["nu"]))

    assert_same_training_state(a, b)
    for name in reg_state:  # named again so that a failure says which one
        assert_bitwise_equal(a["regularizer"][name], b["regularizer"][name], name)
    ma, mb = _metrics(tmp_path / "a"), _metrics(b_dir)
    assert ma["history"] == mb["history"] and ma["final"] == mb["final"]
    assert [h["epoch"] for h in mb["history"]] == [1, 2]


@pytest.mark.parametrize(
    "workers", [0, pytest.param(2, marks=pytest.mark.slow)]
)  # 2 workers: ~30 s
def test_cocostuff_augmented_poly_schedule_stop_and_resume_is_bitwise_exact(
    coco_cache_stuff, tmp_path, workers
):
    """DeepLabV3+ (random-init ResNet-18, dropout in ASPP), hflip + scale jitter, poly lr schedule,
    the regularizer: 2 epochs of batches of 4, stopped after step 2 and resumed in a fresh process;
    with 2 loader processes too (the augmentations are drawn from the batch's own seed)."""

    def args(out: Path) -> list[str]:
        return [
            "--config",
            str(TINY),
            "--out",
            str(out),
            "--regularizer",
            "fbeta",
            "--alpha",
            "0.1",
            f"data.path={coco_cache_stuff}",
            "data.batch_size=4",
            "optim.schedule=poly",
            "data.hflip=true",
            "data.scale_range=[0.75, 1.25]",
            "train.epochs=2",
            "train.progress=false",
            "train.num_threads=1",
            "train.log_images=0",
            f"data.num_workers={workers}",
        ]

    per_epoch = steps_per_epoch(C.load(TINY, [f"data.path={coco_cache_stuff}"]))
    assert per_epoch >= 3
    assert main(args(tmp_path / "a")) == 0
    a = final_checkpoint(tmp_path / "a")
    assert a["global_step"] == 2 * per_epoch and a["scheduler"]["last_epoch"] == 2 * per_epoch

    stopped = _stop_then_resume(args(tmp_path / "b"), tmp_path / "b", stop=2)
    assert stopped["epoch"] == 0 and stopped["step_in_epoch"] == 2
    assert stopped["scheduler"]["last_epoch"] == 2
    b = final_checkpoint(tmp_path / "b")
    assert_same_training_state(a, b)
    lr = [g["lr"] for g in b["optimizer"]["param_groups"]]
    assert lr == [g["lr"] for g in a["optimizer"]["param_groups"]] and lr[0] < 1e-3
    assert _metrics(tmp_path / "a")["history"] == _metrics(tmp_path / "b")["history"]


@pytest.mark.parametrize("every", ["5", "steps-per-epoch"])
def test_checkpoint_every_writes_mid_epoch_checkpoints_prunes_and_resumes_exactly(
    digits_smnist, tmp_path, monkeypatch, every
):
    """Every ``checkpoint_every`` steps a checkpoint (plus one per epoch end), the newest
    ``keep_checkpoints`` kept; a run that crashed after the last mid-epoch one resumes exactly
    (with ``every`` = steps per epoch that one was written after the epoch's last step, before
    the epoch end)."""
    per_epoch = steps_per_epoch(smnist_cfg(digits_smnist, tmp_path / "run"))
    every = 5 if every == "5" else per_epoch
    cfg = smnist_cfg(
        digits_smnist,
        tmp_path / "run",
        f"train.checkpoint_every={every}",
        "train.keep_checkpoints=2",
    )
    saved, keep = [], tmp_path / "copies"
    keep.mkdir()
    save_atomic = checkpoint.save_atomic

    def recording_save(obj, path):
        save_atomic(obj, path)
        if Path(path).name == run_info.BEST:  # the selected epoch's weights, not a step checkpoint
            return
        saved.append((obj["global_step"], obj["epoch"], obj["step_in_epoch"]))
        shutil.copy(path, keep / f"{len(saved)}.pt")  # every checkpoint as it was written

    monkeypatch.setattr(checkpoint, "save_atomic", recording_save)
    run(cfg, log=quiet)
    total = 2 * per_epoch
    mid = [
        (s, (s - 1) // per_epoch, (s - 1) % per_epoch + 1) for s in range(every, total + 1, every)
    ]
    ends = [(per_epoch, 1, 0), (total, 2, 0)]
    assert saved == sorted(mid + ends, key=lambda t: (t[0], -t[2]))  # a mid-epoch one comes first
    newest = [
        checkpoint.path_for(tmp_path / "run", s)
        for s in (total, max(s for s, *_ in mid if s < total))
    ]
    assert checkpoint.listing(tmp_path / "run") == newest
    assert not list((tmp_path / "run" / "checkpoints").glob(".*"))  # no temp files left

    # a crash after the last mid-epoch checkpoint of epoch 2: the run folder holds only it
    last_mid = max(i for i, (_, epoch, k) in enumerate(saved) if k and epoch == 1)
    crashed = tmp_path / "crashed"
    (crashed / "checkpoints").mkdir(parents=True)
    C.save(
        C.load(tmp_path / "run" / "config.yaml", [f"train.out={crashed}"]), crashed / "config.yaml"
    )
    shutil.copy(keep / f"{last_mid + 1}.pt", checkpoint.path_for(crashed, saved[last_mid][0]))
    monkeypatch.setattr(checkpoint, "save_atomic", save_atomic)
    assert main(["--resume", str(crashed)]) == 0
    assert_same_training_state(final_checkpoint(tmp_path / "run"), final_checkpoint(crashed))
    assert _metrics(tmp_path / "run")["history"] == _metrics(crashed)["history"]


def test_resume_refuses_a_checkpoint_of_another_format(digits_smnist, tmp_path):
    out = tmp_path / "run"
    cfg = smnist_cfg(digits_smnist, out, "train.epochs=1")
    run(cfg, log=quiet)
    path, state = checkpoint.latest(out)
    state["format"] = 1  # as an earlier trainer would have written it
    torch.save(state, path)
    with pytest.raises(ValueError, match=r"has format 1, this trainer reads format 2"):
        run(C.load(out / "config.yaml"), log=quiet, resume=out)
    del state["format"]
    torch.save(state, path)
    with pytest.raises(ValueError, match=r"has format None"):
        run(C.load(out / "config.yaml"), log=quiet, resume=out)
