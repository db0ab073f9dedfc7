"""The trainer end to end on small data: run folder contents, coupling, bad input, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from train import checkpoint
from train import config as C
from train.loop import run

from .run_utils import smnist_args

ROOT = Path(__file__).resolve().parents[2]


def _cfg(data_path, out, *extra):
    return C.load(
        ROOT / "configs" / "demo.yaml",
        [
            f"data.path={data_path}",
            f"train.out={out}",
            "train.epochs=1",
            "train.progress=false",
            *extra,
        ],
    )


def test_one_epoch_with_the_regularizer_writes_the_run_folder(digits_smnist, tmp_path):
    summary = run(
        _cfg(digits_smnist, tmp_path / "run", "regularizer.projection=epoch"), log=lambda *_: None
    )
    out = tmp_path / "run"
    assert C.load(out / "config.yaml").regularizer.name == "fbeta"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics == json.loads(json.dumps(summary))
    (row,) = metrics["history"]
    for key in (
        "test_accuracy",
        "test_accuracy_small",
        "test_accuracy_big",
        "test_accuracy_gap",
        "test_shape_fbeta",
        "reg_eps",
        "reg_mu",
        "reg_lambda_mean",
        "reg_projections",
        "train_seconds",
        "epoch_end_seconds",
        "eval_seconds",
        "reg_decision_threshold",
        "reg_train_fbeta_at_threshold",
        "test_shape_fbeta_at_threshold",
    ):
        assert key in row, key
    assert 0 <= row["test_shape_fbeta_at_threshold"] <= 1
    # the learned threshold is the exact F1-optimal cut of the training scores: never below u > 0
    assert row["reg_train_fbeta_at_threshold"] >= row["reg_train_fbeta"]
    assert row["reg_projections"] == 1 and 0 <= row["test_accuracy"] <= 1
    assert row["test_accuracy"] > 0.3  # 1 epoch on 600 digit images: well above chance
    ckpt = checkpoint.latest(out)[1]
    assert ckpt["epoch"] == 1 and ckpt["config"]["regularizer"]["name"] == "fbeta"
    assert set(ckpt) >= {"model", "optimizer", "regularizer"}
    assert int(ckpt["regularizer"]["epoch"]) == 1
    assert list((out / "tb").glob("events.out.tfevents.*"))


@pytest.mark.parametrize(
    "name, target, figures",
    [
        (
            "precision_at_recall",
            "regularizer.precision_at_recall.recall=0.9",
            ("reg_certified_recall", "reg_certified_precision", "reg_train_recall", "reg_nu"),
        ),
        (
            "recall_at_precision",
            "regularizer.recall_at_precision.precision=0.9",
            ("reg_certified_recall", "reg_certified_precision", "reg_certifiable_margin", "reg_nu"),
        ),
        (
            "roc_auc",
            "regularizer.roc_auc.grid=5",
            ("reg_train_auc", "reg_certified_auc", "reg_grid_tpr_mean", "reg_nu"),
        ),
    ],
)
def test_rate_objectives_train_through_the_cli(digits_smnist, tmp_path, name, target, figures):
    """``--regularizer <rate objective>``: the objective's figures and the shape node's test
    precision / recall / AUC reach metrics.json; the certificates sit below the true values."""
    from train.__main__ import main

    out = tmp_path / "run"
    args = smnist_args(digits_smnist, out, "regularizer.projection=inline", target)
    assert main([*args, "--regularizer", name]) == 0
    final = json.loads((out / "metrics.json").read_text())["final"]
    for key in (
        *figures,
        "test_shape_precision",
        "test_shape_recall",
        "test_shape_auc",
        "test_accuracy_small",
        "test_accuracy_big",
        "reg_scored_fraction",
    ):
        assert final[key] is not None, key
    assert final["test_shape_auc"] > 0.9 and final["reg_scored_fraction"] == 1.0
    if name == "roc_auc":
        assert final["reg_certified_auc"] <= final["reg_train_auc"]
    else:
        assert final["reg_certified_recall"] <= final["reg_train_recall"]
    saved = C.load(out / "config.yaml").regularizer
    assert saved.name == name and "nu" in checkpoint.latest(out)[1]["regularizer"]


def test_one_epoch_on_real_mnist(mnist_dir, tmp_path):
    from data_prep import smnist

    smnist.prepare(
        tmp_path / "data", smnist.Options(limit=1000), mnist_dir=mnist_dir, log=lambda *_: None
    )
    cfg = C.load(
        ROOT / "configs" / "smnist_linear.yaml",
        [
            f"data.path={tmp_path / 'data'}",
            f"train.out={tmp_path / 'run'}",
            "train.epochs=1",
            "regularizer.name=fbeta",
            "train.progress=false",
        ],
    )
    final = run(cfg, log=lambda *_: None)["final"]
    assert final["test_accuracy"] > 0.5 and final["reg_projections"] == 1
    assert checkpoint.listing(tmp_path / "run")


def _classifier_after_one_epoch(data, out, model, reg):
    cfg = _cfg(
        data,
        out,
        f"model.name={model}",
        f"regularizer.name={reg}",
        "regularizer.alpha=1.0",
        "train.checkpoint=true",
    )
    run(cfg, log=lambda *_: None)
    state = checkpoint.latest(out)[1]["model"]
    return state["classifier.weight"]


def test_linear_shape_node_cannot_change_the_classifier(digits_smnist, tmp_path):
    """The paper's linear model: the extra node shares no weight with the 10 class outputs."""
    base = _classifier_after_one_epoch(digits_smnist, tmp_path / "a", "linear", "none")
    reg = _classifier_after_one_epoch(digits_smnist, tmp_path / "b", "linear", "fbeta")
    assert torch.equal(base, reg)


def test_mlp_regularizer_shapes_the_shared_representation(digits_smnist, tmp_path):
    base = _classifier_after_one_epoch(digits_smnist, tmp_path / "a", "mlp", "none")
    reg = _classifier_after_one_epoch(digits_smnist, tmp_path / "b", "mlp", "fbeta")
    assert not torch.equal(base, reg)


def test_existing_run_folder_is_not_overwritten(digits_smnist, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.json").write_text("{}")
    with pytest.raises(ValueError, match="exists and is not empty"):
        run(_cfg(digits_smnist, tmp_path / "run"), log=lambda *_: None)


def test_default_run_folders_do_not_collide(digits_smnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = _cfg(digits_smnist, "x", "train.out=null", "train.checkpoint=false")
    run(cfg, log=lambda *_: None)
    run(cfg, log=lambda *_: None)
    names = sorted(p.name for p in (tmp_path / "runs" / "demo").iterdir())
    assert names == ["fbeta-a0.01-tracked-seed0", "fbeta-a0.01-tracked-seed0-2"]


def test_missing_data_says_how_to_build_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"python -m data_prep\.smnist"):
        run(_cfg(tmp_path / "nothing", tmp_path / "run"), log=lambda *_: None)


def test_same_seed_same_result(digits_smnist, tmp_path):
    a = run(_cfg(digits_smnist, tmp_path / "a"), log=lambda *_: None)["final"]
    b = run(_cfg(digits_smnist, tmp_path / "b"), log=lambda *_: None)["final"]
    keys = ("test_accuracy", "test_shape_fbeta", "reg_eps", "reg_mu", "reg_lambda_mean")
    assert [a[k] for k in keys] == [b[k] for k in keys]


def test_atomic_checkpoint_keeps_the_previous_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    checkpoint.save_atomic({"epoch": 1}, path)

    def broken_save(obj, f):
        f.write(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save_atomic({"epoch": 2}, path)
    assert checkpoint.load(path) == {"epoch": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_cli_trains_the_demo(digits_smnist, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "train",
            "--config",
            "configs/demo.yaml",
            "--out",
            str(tmp_path / "r"),
            f"data.path={digits_smnist}",
            "train.epochs=2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "epoch   2" in proc.stdout
    history = json.loads((tmp_path / "r" / "metrics.json").read_text())["history"]
    assert [h["epoch"] for h in history] == [1, 2]


def test_cli_error_is_one_line(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "train",
            "--config",
            "configs/demo.yaml",
            f"data.path={tmp_path}",
            "--out",
            str(tmp_path / "r"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and "data_prep.smnist" in proc.stderr


def test_sparse_tau_and_shared_gemm_train(digits_smnist, tmp_path):
    """The fast step: ``tau`` stepped sparsely by the regularizer, one GEMM for the class outputs
    and the shape node. ``tau_lr: null`` stays null in the saved config: the step follows the lr
    of the regularizer's group (``optim.regularizer_lr``); the Adam state of ``tau`` is
    checkpointed (a resumed run is bitwise equal: tests/train/test_resume.py)."""
    fast = (
        "regularizer.projection=epoch",
        "regularizer.fbeta.tau_update=sparse_adam_ahead",
        "model.shared_gemm=true",
        "optim.regularizer_lr=0.02",
    )
    summary = run(_cfg(digits_smnist, tmp_path / "run", *fast), log=lambda *_: None)
    saved = C.load(tmp_path / "run" / "config.yaml")
    assert saved.regularizer.fbeta.tau_lr is None and saved.model.shared_gemm
    assert saved.optim.regularizer_lr == 0.02
    ckpt = checkpoint.latest(tmp_path / "run")[1]
    row = summary["history"][-1]
    assert int(ckpt["regularizer"]["sparse_tau.step"]) == row["steps"]
    assert len(ckpt["optimizer"]["param_groups"][1]["params"]) == 1  # eps only: tau is not in it
    assert row["test_accuracy"] > 0.3 and row["reg_tau_mean"] != 1.0  # tau moved


def test_sparse_tau_is_refused_with_fp16_and_inline(digits_smnist, tmp_path):
    with pytest.raises(ValueError, match=r"does not support train\.precision=fp16"):
        _cfg(
            digits_smnist,
            tmp_path,
            "regularizer.projection=epoch",
            "regularizer.fbeta.tau_update=sparse_adam_ahead",
            "train.precision=fp16",
        )
    inline = ("regularizer.fbeta.tau_update=sparse_adam_ahead", "regularizer.projection=inline")
    cfg = _cfg(digits_smnist, tmp_path / "r", *inline)
    with pytest.raises(ValueError, match=r"regularizer \(fbeta\): schedule=Inline.*tau=SparseTau"):
        run(cfg, log=lambda *_: None)


def test_auto_tau_update_is_resolved_and_pinned(digits_smnist, tmp_path):
    """The default ``tau_update: auto``: the run trains with ``sparse_adam_ahead`` and the tracked
    projection (O(B) per step), and its saved config.yaml says so (a resumed run rebuilds the
    same regularizer from it)."""
    summary = run(_cfg(digits_smnist, tmp_path / "run"), log=lambda *_: None)
    saved = C.load(tmp_path / "run" / "config.yaml")
    assert (saved.regularizer.projection, saved.regularizer.fbeta.tau_update) == (
        "tracked",
        "sparse_adam_ahead",
    )
    ckpt = checkpoint.latest(tmp_path / "run")[1]
    steps = summary["history"][-1]["steps"]
    assert int(ckpt["regularizer"]["sparse_tau.step"]) == steps
    last = ckpt["regularizer"]["sparse_tau.last"]
    assert 0 < int(last.max()) <= steps
    assert 0 < float(ckpt["regularizer"]["schedule.active_sums"][0, 1])  # rows at the threshold


def test_ahead_tau_step_follows_the_lr_schedule(digits_smnist, tmp_path, monkeypatch):
    """The defaults' sparse ``tau`` step (``sparse_adam_ahead``, ``tau_lr: null``) takes the lr the
    regularizer's group used in that step, under the poly schedule as a dense ``tau`` in that
    group would; an explicit ``tau_lr`` is kept as given. Both are what the saved config says."""
    import reparam.sparse as sparse

    seen: list[float] = []
    step = sparse.sparse_step_

    def spy(*args, **kwargs):
        seen.append(float(kwargs["lr"]))  # (a tensor the trainer fills before each backward)
        return step(*args, **kwargs)

    monkeypatch.setattr(sparse, "sparse_step_", spy)
    poly = ("optim.schedule=poly", "optim.regularizer_lr=0.02", "train.epochs=2")
    run(_cfg(digits_smnist, tmp_path / "run", *poly), log=lambda *_: None)
    saved = C.load(tmp_path / "run" / "config.yaml")
    assert saved.regularizer.fbeta.tau_update == "sparse_adam_ahead"
    assert saved.regularizer.fbeta.tau_lr is None
    total = len(seen)
    assert total == checkpoint.latest(tmp_path / "run")[1]["global_step"] > 10
    expected = [0.02 * (1 - t / total) ** 0.9 for t in range(total)]
    assert seen == pytest.approx(expected, rel=1e-7)  # (held in float32)
    seen.clear()
    given = (*poly, "regularizer.fbeta.tau_lr=0.005")
    run(_cfg(digits_smnist, tmp_path / "given", *given), log=lambda *_: None)
    assert set(seen) == {torch.tensor(0.005).item()}  # (float32)
    assert C.load(tmp_path / "given" / "config.yaml").regularizer.fbeta.tau_lr == 0.005
