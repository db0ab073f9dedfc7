"""Bad input end to end: what ``python -m train`` / the prep scripts / the tensor APIs tell the user.

Every row of docs/robustness.md names the test that checks it; the last test here checks that
each cited ``file::test`` exists.
"""

from __future__ import annotations

import ast
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from data_prep import smnist
from reparam import FBetaRegularizer
from train import checkpoint, distributed
from train import config as C
from train.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "demo.yaml"
TINY = ROOT / "configs" / "cocostuff_tiny.yaml"
DOC = ROOT / "docs" / "robustness.md"


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    """``python -m train ARGV`` in this process: (exit code, stderr)."""
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's p.error
        rc = e.code
    return rc, capsys.readouterr().err


def _demo(tmp: Path, *extra: str) -> list[str]:
    return [
        "--config",
        str(DEMO),
        "--out",
        str(tmp / "run"),
        f"data.path={tmp / 'no-data'}",
        "train.progress=false",
        *extra,
    ]


def _run_folder(tmp: Path, checkpoints: dict[int, bytes] | None = None) -> Path:
    """A run folder: the saved config and, optionally, checkpoint files with the given bytes."""
    run = tmp / "old-run"
    run.mkdir()
    C.save(C.load(DEMO, [f"data.path={tmp / 'no-data'}"]), run / "config.yaml")
    for step, data in (checkpoints or {}).items():
        checkpoint.path_for(run, step).parent.mkdir(exist_ok=True)
        checkpoint.path_for(run, step).write_bytes(data)
    return run


def _not_empty(tmp: Path) -> list[str]:
    (tmp / "run").mkdir()
    (tmp / "run" / "metrics.json").write_text("{}")
    return _demo(tmp)


CLI_CASES: list[tuple[str, Callable[[Path], list[str]], int, str, str | None]] = [
    # (id, argv from tmp_path, exit code, stderr pattern, warning pattern)
    (
        "unknown-key",
        lambda t: _demo(t, "optim.learning_rate=1"),
        2,
        r"unknown key optim\.learning_rate; valid keys in optim: name, lr, ",
        None,
    ),
    (
        "unknown-section",
        lambda t: _demo(t, "trian.epochs=3"),
        2,
        r"unknown key trian; valid keys in config: experiment, data, ",
        None,
    ),
    (
        "wrong-type",
        lambda t: _demo(t, "train.epochs=three"),
        2,
        r"train\.epochs must be int, got 'three'",
        None,
    ),
    (
        "wrong-type-list",
        lambda t: _demo(t, "model.hidden=5"),
        2,
        r"model\.hidden must be a list, got 5",
        None,
    ),
    (
        "bad-choice",
        lambda t: _demo(t, "regularizer.projection=sometimes"),
        2,
        r"regularizer\.projection must be one of \('tracked', 'epoch', 'inline'\), got 'sometimes'",
        None,
    ),
    (
        "removed-option",
        lambda t: _demo(t, "regularizer.projection=clip"),
        2,
        r"regularizer\.projection='clip' was removed in version 0\.3\.0: use 'tracked'",
        None,
    ),
    (
        "negative-lr",
        lambda t: _demo(t, "optim.lr=-0.1"),
        2,
        r"optim\.lr must be > 0, got -0\.1",
        None,
    ),
    (
        "zero-batch",
        lambda t: _demo(t, "data.batch_size=0"),
        2,
        r"data\.batch_size must be > 0, got 0",
        None,
    ),
    (
        "negative-alpha",
        lambda t: _demo(t, "--alpha", "-1"),
        2,
        r"regularizer\.alpha must be >= 0, got -1\.0",
        None,
    ),
    (
        "zero-checkpoint-every",
        lambda t: _demo(t, "train.checkpoint_every=0"),
        2,
        r"train\.checkpoint_every must be None or >= 1, got 0",
        None,
    ),
    (
        "model-for-other-data",
        lambda t: _demo(t, "model.name=deeplabv3plus"),
        2,
        r"model\.name must be one of \('linear', 'mlp'\) for data\.kind 'smnist'",
        None,
    ),
    (
        "override-without-value",
        lambda t: _demo(t, "train.epochs"),
        2,
        r"override 'train\.epochs' must look like key=value",
        None,
    ),
    (
        "missing-config-file",
        lambda t: ["--config", str(t / "nope.yaml")],
        2,
        r"--config .*nope\.yaml: no such file",
        None,
    ),
    (
        "config-and-resume",
        lambda t: ["--config", str(DEMO), "--resume", str(t)],
        2,
        r"give exactly one of --config \(a new run\) and --resume RUN_DIR",
        None,
    ),
    ("neither-config-nor-resume", lambda t: [], 2, r"give exactly one of --config", None),
    (
        "resume-not-a-run-folder",
        lambda t: ["--resume", str(t / "nothing")],
        2,
        r"--resume .*nothing: no config\.yaml \(not a run folder\?\)",
        None,
    ),
    (
        "resume-with-out",
        lambda t: ["--resume", str(_run_folder(t)), "--out", str(t / "x")],
        2,
        r"--out cannot be combined with --resume",
        None,
    ),
    (
        "resume-without-checkpoints",
        lambda t: ["--resume", str(_run_folder(t))],
        2,
        r"^error: --resume .*old-run': no readable checkpoint in .*checkpoints\n$",
        None,
    ),
    (
        "resume-only-corrupt-checkpoints",
        lambda t: ["--resume", str(_run_folder(t, {1: b"PK\x03\x04 cut", 2: b""}))],
        2,
        r"^error: --resume .*: no readable checkpoint in .*checkpoints \(2 unusable, each named "
        r"in a warning\)\n$",
        None,
    ),
    (
        "run-folder-not-empty",
        _not_empty,
        2,
        r"^error: train\.out '.*run' exists and is not empty; choose a new folder",
        None,
    ),
    (
        "missing-smnist-cache",
        lambda t: _demo(t),
        2,
        r"^error: .*no-data does not hold a complete S-MNIST build .* python -m data_prep\.smnist",
        None,
    ),
    (
        "missing-cocostuff-cache",
        lambda t: ["--config", str(TINY), "--out", str(t / "run"), f"data.path={t / 'no-data'}"],
        2,
        r"^error: .*no-data does not hold a complete segmentation cache: no meta\.json.*"
        r"python -m data_prep\.cocostuff",
        None,
    ),
]


@pytest.mark.parametrize(
    ("make_argv", "rc", "err", "warns"), [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES]
)
def test_cli_bad_input(tmp_path, capsys, make_argv, rc, err, warns):
    argv = make_argv(tmp_path)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        code, stderr = _cli(argv, capsys)
    assert code == rc, stderr
    assert re.search(err, stderr), stderr
    assert "Traceback" not in stderr
    if warns is not None:
        assert any(re.search(warns, str(w.message)) for w in record), [str(w) for w in record]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error needs a machine without CUDA")
def test_cli_cuda_device_without_cuda(tmp_path, capsys):
    code, stderr = _cli(_demo(tmp_path, "train.device=cuda"), capsys)
    assert code == 2 and "train.device is 'cuda' but CUDA is not available" in stderr


def test_cli_batch_not_divisible_by_processes(tmp_path, capsys, monkeypatch):
    """As under ``torchrun --nproc_per_node=3``: the global batch must split evenly."""
    monkeypatch.setattr(distributed, "init_from_env", lambda *_: distributed.Context(0, 3, 0))
    code, stderr = _cli(_demo(tmp_path, "data.batch_size=50"), capsys)
    assert code == 2
    assert (
        "data.batch_size 50 (the global batch) must be divisible by the number of processes 3"
        in stderr
    )


def test_cli_incomplete_smnist_cache(digits_smnist, tmp_path, capsys):
    copy = Path(shutil.copytree(digits_smnist, tmp_path / "data"))
    npz = copy / smnist.NPZ_NAME
    npz.write_bytes(npz.read_bytes()[:1000])  # a copy cut short
    code, stderr = _cli(_demo(tmp_path, f"data.path={copy}"), capsys)
    assert code == 2 and "does not hold a complete S-MNIST build" in stderr


def test_cli_incomplete_cocostuff_cache(coco_cache_stuff, tmp_path, capsys):
    copy = Path(shutil.copytree(coco_cache_stuff, tmp_path / "data"))
    (copy / "val" / "labels.npy").unlink()
    argv = ["--config", str(TINY), "--out", str(tmp_path / "run"), f"data.path={copy}"]
    code, stderr = _cli(argv, capsys)
    assert code == 2
    assert "does not hold a complete segmentation cache: val/labels.npy is missing" in stderr


def test_smnist_prep_md5_mismatch_names_the_file(tmp_path, capsys):
    """Without the real MNIST: four files with the official names and the wrong bytes."""
    for name in smnist.MNIST_MD5:
        (tmp_path / f"{name}.gz").write_bytes(b"not mnist")
    assert smnist.main(["--mnist-dir", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert re.search(
        r"^error: .*train-images-idx3-ubyte\.gz: md5 [0-9a-f]{32} does not match "
        r"the official MNIST file \(expected f68b3c2d",
        err,
    )
    assert "re-download it" in err and not (tmp_path / "out" / smnist.META_NAME).exists()


@pytest.mark.parametrize(
    ("labels", "scores", "idx", "match"),
    [
        (
            torch.tensor([[0, 1], [1, 0]]),
            None,
            None,
            r"shape_labels must have shape \(N,\) with N > 0, got \(2, 2\)",
        ),
        (torch.zeros(0, dtype=torch.int64), None, None, r"shape_labels must have shape \(N,\)"),
        ([0.0, 1.0, 1.0], None, None, r"shape_labels must hold integer class ids"),
        (
            None,
            torch.randn(3),
            torch.tensor([0, 1, 2], dtype=torch.int32),
            r"idx must be an int64 tensor of shape \(B,\), got tensor of dtype torch\.int32",
        ),
        (
            None,
            torch.randn(3),
            torch.tensor([[0, 1, 2]]),
            r"idx must be an int64 tensor of shape \(B,\), got .*shape \(1, 3\)",
        ),
        (
            None,
            torch.tensor([0.0, float("inf"), 1.0]),
            torch.tensor([0, 1, 2]),
            "scores must be finite, got NaN or inf",
        ),
        (
            None,
            [0.5, 0.1],
            torch.tensor([0, 1]),
            "scores must be a floating-point tensor, got list",
        ),
        (None, torch.randn(3, 1).double(), torch.tensor([0, 1, 2]), None),  # float64 is fine
    ],
)
def test_regularizer_tensor_inputs(labels, scores, idx, match):
    if labels is not None:
        with pytest.raises(ValueError, match=match):
            FBetaRegularizer(labels)
        return
    reg = FBetaRegularizer(torch.tensor([0, 1, 1, 0, 1]))
    if match is None:
        assert torch.isfinite(reg(scores, idx))
        return
    with pytest.raises(ValueError, match=match):
        reg(scores, idx)


def test_multiclass_scores_need_a_column_per_shape_class():
    reg = FBetaRegularizer(torch.tensor([0, 1, 2, 0, 1, 2]), positive_classes=(1, 2))
    with pytest.raises(
        ValueError, match=r"scores must have shape \(B, K\) with K > 2.*got \(3, 2\)"
    ):
        reg(torch.randn(3, 2), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"got \(3,\)"):
        reg(torch.randn(3), torch.tensor([0, 1, 2]))


# --- the table in docs/robustness.md cites real tests ---------------------------------------------

CITATION = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_every_test_cited_in_the_robustness_table_exists():
    text = DOC.read_text()
    cited = CITATION.findall(text)
    assert len(cited) >= 40
    missing = []
    for file, name in cited:
        path = ROOT / file
        if not name.startswith("test_") or not path.is_file() or name not in _test_names(path):
            missing.append(f"{file}::{name}")
    assert not missing, f"docs/robustness.md cites tests that do not exist: {missing}"
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    without = [r for r in rows if not CITATION.search(r) and not r.startswith("| input |")]
    assert not without, f"rows without a test: {without}"
