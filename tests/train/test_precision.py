"""Mixed precision on the CPU: ``train.precision`` bf16 (autocast) and fp16 (autocast + GradScaler).

The network runs in the low precision; the regularizer always sees ``u.float()`` and keeps its
state (eps, tau, lambda, mu, remembered scores) in float32; the parameters stay float32.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from train import checkpoint, loop
from train import config as C
from train import setup as train_setup

ROOT = Path(__file__).resolve().parents[2]
REG_FLOAT_STATE = ("eps_param", "tau_param", "lam", "mu", "scores")


def _cfg(data: Path, out: Path, precision: str, *extra: str) -> C.Config:
    return C.load(
        ROOT / "configs" / "demo.yaml",
        [
            f"data.path={data}",
            f"train.out={out}",
            f"train.precision={precision}",
            "train.epochs=1",
            "train.progress=false",
            "model.name=mlp",
            "data.batch_size=20",
            "regularizer.name=fbeta",
            "regularizer.projection=epoch",
            *extra,
        ],
    )


def test_bf16_epoch_keeps_float32_state(digits_smnist, tmp_path):
    summary = loop.run(_cfg(digits_smnist, tmp_path / "run", "bf16"), log=lambda *_: None)
    (row,) = summary["history"]
    assert math.isfinite(row["train_loss"]) and math.isfinite(row["reg_loss"])
    assert row["skipped_steps_total"] == 0 and row["reg_projections"] == 1
    assert row["test_accuracy"] > 0.3  # 1 epoch on 600 digit images: well above chance
    state = checkpoint.latest(tmp_path / "run")[1]
    assert state["config"]["train"]["precision"] == "bf16"
    reg = state["regularizer"]
    for k in REG_FLOAT_STATE:
        assert reg[k].dtype == torch.float32, k
    assert float(reg["lam"].max()) > 0  # the dual step ran on the (float32) remembered scores
    assert {v.dtype for v in state["model"].values()} == {torch.float32}
    for per_param in state["optimizer"]["state"].values():  # Adam moments follow the params
        assert all(v.dtype == torch.float32 for k, v in per_param.items() if k != "step")
    assert state["scaler"] is None  # bf16 needs no loss scaling


@pytest.mark.parametrize(
    ("precision", "expected"), [("bf16", torch.bfloat16), ("fp32", torch.float32)]
)
def test_network_runs_in_the_chosen_precision_and_the_regularizer_in_float32(
    digits_smnist, tmp_path, monkeypatch, precision, expected
):
    linear_out: dict[str, set[torch.dtype]] = {}
    reg_in: set[torch.dtype] = set()
    build_model, build_regularizer = train_setup.build_model, train_setup.build_regularizer

    def hooked_model(*args, **kwargs):
        model = build_model(*args, **kwargs)
        for name, m in model.named_modules():
            if isinstance(m, nn.Linear):
                linear_out[name] = set()
                m.register_forward_hook(
                    lambda mod, inp, out, name=name: linear_out[name].add(out.dtype)
                )
        return model

    def hooked_regularizer(*args, **kwargs):
        reg = build_regularizer(*args, **kwargs)
        reg.register_forward_pre_hook(lambda mod, args: reg_in.add(args[0].dtype))
        return reg

    monkeypatch.setattr(train_setup, "build_model", hooked_model)
    monkeypatch.setattr(train_setup, "build_regularizer", hooked_regularizer)
    cfg = _cfg(digits_smnist, tmp_path / "run", precision, "train.checkpoint=false")
    loop.run(cfg, log=lambda *_: None)
    # every linear layer: body, the 10 class outputs and the shape node
    assert set(linear_out) == {"body.1", "classifier", "shape_head.linear"}
    assert all(dtypes == {expected} for dtypes in linear_out.values()), linear_out
    assert reg_in == {torch.float32}


def test_fp16_saves_the_gradient_scaler(digits_smnist, tmp_path):
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            torch.nn.Linear(4, 2)(torch.ones(3, 4)).sum()
    except RuntimeError as e:  # older builds: no float16 autocast on the CPU
        pytest.skip(f"float16 autocast is not supported on this CPU build: {e}")
    summary = loop.run(_cfg(digits_smnist, tmp_path / "run", "fp16"), log=lambda *_: None)
    (row,) = summary["history"]
    assert math.isfinite(row["train_loss"]) and row["test_accuracy"] > 0.3
    state = checkpoint.latest(tmp_path / "run")[1]
    scaler = state["scaler"]
    assert scaler is not None and {"scale", "_growth_tracker"} <= set(scaler)
    # it stepped: 15 steps without overflow at the initial scale, else the scale backed off
    steps = 600 // 20  # 300 digits + their rescaled copies, global batch 20
    if scaler["scale"] == 2.0**16:
        assert scaler["_growth_tracker"] == steps
    else:
        assert 0 < scaler["scale"] < 2.0**16 and scaler["_growth_tracker"] < steps
    assert all(state["regularizer"][k].dtype == torch.float32 for k in REG_FLOAT_STATE)
    assert {v.dtype for v in state["model"].values()} == {torch.float32}


@pytest.mark.parametrize("shape", [(6, 10), (2, 5, 3, 4)], ids=["classification", "segmentation"])
def test_task_loss_under_bf16_autocast_is_float32(shape):
    torch.manual_seed(0)
    channels = shape[1]
    layer = nn.Linear(channels, channels)
    x = torch.randn(*shape).movedim(1, -1)  # channels last for the linear layer
    y = torch.randint(0, channels, (shape[0], *shape[2:]))
    if len(shape) == 4:
        y[0, 0] = loop.IGNORE_INDEX
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = layer(x).movedim(-1, 1)
        assert logits.dtype == torch.bfloat16
        loss = loop.task_loss(logits, y)
    assert loss.dtype == torch.float32
    reference = loop.task_loss(logits.float(), y)  # the same bf16 logits, float32 arithmetic
    torch.testing.assert_close(loss, reference, rtol=1e-3, atol=1e-3)
