"""Config tree: YAML + dotted overrides, unknown keys and bad values rejected, CLI wiring."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from train import config as C
from train.__main__ import main

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_loads(path):
    cfg = C.load(path)
    assert cfg.experiment == path.stem


def test_overrides_are_typed():
    cfg = C.load(ROOT / "configs" / "smnist_linear.yaml", [
        "train.epochs=3", "regularizer.alpha=1e-4", "regularizer.name=fbeta",
        "model.hidden=[32, 16]", "data.train_subset=100", "optim.regularizer_lr=null",
        "regularizer.mu_init=-2",
    ])  # fmt: skip
    assert cfg.train.epochs == 3 and cfg.regularizer.alpha == 1e-4
    assert isinstance(cfg.regularizer.alpha, float) and cfg.regularizer.mu_init == -2.0
    assert cfg.model.hidden == [32, 16] and cfg.data.train_subset == 100
    assert cfg.optim.regularizer_lr is None


def test_defaults_fill_missing_sections(tmp_path):
    (tmp_path / "c.yaml").write_text("experiment: x\n")
    cfg = C.load(tmp_path / "c.yaml")
    assert cfg.optim == C.OptimConfig() and cfg.regularizer.name == "none"


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("train.epoch=3", r"unknown key train.epoch; valid keys in train: epochs, seed"),
        ("trian.epochs=3", r"unknown key trian; valid keys in config: experiment, data"),
        ("train.epochs=three", r"train.epochs must be int, got 'three'"),
        ("train.epochs=0", r"train.epochs must be > 0, got 0"),
        ("regularizer.projection=sometimes", r"regularizer.projection must be one of"),
        ("regularizer.alpha=-1", r"regularizer.alpha must be >= 0"),
        ("model.hidden=5", r"model.hidden must be a list"),
        ("train", r"must look like key=value"),
        ("data=3", r"data must be a mapping"),
    ],
)
def test_bad_overrides(override, match):
    with pytest.raises(ValueError, match=match):
        C.load(ROOT / "configs" / "smnist_linear.yaml", [override])


def test_missing_config_file():
    with pytest.raises(ValueError, match="no such file"):
        C.load("configs/nope.yaml")


def test_cli_flags_map_to_keys_and_print_config(capsys):
    rc = main(["--config", str(ROOT / "configs" / "smnist_linear.yaml"), "--regularizer", "fbeta",
               "--alpha", "1e-2", "train.epochs=2", "--print-config"])  # fmt: skip
    assert rc == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["regularizer"]["name"] == "fbeta" and printed["regularizer"]["alpha"] == 1e-2
    assert printed["train"]["epochs"] == 2


def test_cli_reports_unknown_keys(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--config", str(ROOT / "configs" / "demo.yaml"), "optim.learning_rate=1"])
    assert e.value.code == 2
    assert (
        "unknown key optim.learning_rate; valid keys in optim: name, lr" in capsys.readouterr().err
    )


def test_save_round_trip(tmp_path):
    cfg = C.load(ROOT / "configs" / "demo.yaml", ["train.seed=7"])
    C.save(cfg, tmp_path / "config.yaml")
    assert C.load(tmp_path / "config.yaml") == cfg


def test_regularizer_section_is_the_constructor_signature():
    """One source of truth: every option of ``regularizer`` (but name, alpha) is a keyword argument
    of the regularizer class with the same default, and the choices are the library's tuples."""
    import dataclasses
    import inspect
    import typing

    import projections
    import reparam

    params = inspect.signature(reparam.FBetaRegularizer).parameters
    section = C.RegularizerConfig()
    for f in dataclasses.fields(section):
        if f.name in ("name", "alpha"):
            continue
        assert f.name in params, f"regularizer.{f.name} is not an FBetaRegularizer argument"
        default = params[f.name].default
        value = getattr(section, f.name)
        assert value == (list(default) if isinstance(default, tuple) else default), f.name
    hints = typing.get_type_hints(C.RegularizerConfig)
    for name, choices in (("projection", reparam.PROJECTION_MODES),
                          ("negative_loss", reparam.NEGATIVE_LOSSES),
                          ("dual_schedule", reparam.DUAL_SCHEDULES),
                          ("projection_method", projections.PROJECTION_METHODS)):  # fmt: skip
        assert typing.get_args(hints[name]) == choices, name
    assert set(section.kwargs()) == {f.name for f in dataclasses.fields(section)} - {
        "name",
        "alpha",
    }


def test_build_regularizer_passes_every_option(tmp_path):
    import torch

    from train.build import build_regularizer

    cfg = C.load(ROOT / "configs" / "demo.yaml", [
        "regularizer.beta=0.5", "regularizer.projection=step", "regularizer.negative_loss=logistic",
        "regularizer.dual_lr_lambda=0.3", "regularizer.dual_lr_mu=0.2", "regularizer.rho=0.1",
        "regularizer.mu_init=-3", "regularizer.dual_schedule=inverse_epoch",
        "regularizer.projection_method=sort", "regularizer.positive_classes=[1, 2]",
    ])  # fmt: skip
    reg = build_regularizer(cfg.regularizer, torch.tensor([0, 1, 2, 1, 0, 2]))
    assert (reg.beta, reg.projection, reg.negative_loss) == (0.5, "step", "logistic")
    assert (reg.dual_lr_lambda, reg.dual_lr_mu, reg.rho) == (0.3, 0.2, 0.1)
    assert (reg.dual_schedule, reg.projection_method, reg.classes) == (
        "inverse_epoch",
        "sort",
        (1, 2),
    )
    assert reg.mu.tolist() == [-3.0, -3.0]
    assert build_regularizer(C.RegularizerConfig(), torch.tensor([0, 1])) is None
