"""Config tree: YAML + dotted overrides, unknown keys and bad values rejected, CLI wiring."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from reparam import FBetaRegularizer
from train import config as C
from train.__main__ import main

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_loads(path):
    cfg = C.load(path)
    assert cfg.experiment == path.stem


def test_overrides_are_typed():
    cfg = C.load(
        ROOT / "configs" / "smnist_linear.yaml",
        [
            "train.epochs=3",
            "regularizer.alpha=1e-4",
            "regularizer.name=fbeta",
            "model.hidden=[32, 16]",
            "data.train_subset=100",
            "optim.regularizer_lr=null",
            "regularizer.fbeta.mu_init=-2",
        ],
    )
    assert cfg.train.epochs == 3 and cfg.regularizer.alpha == 1e-4
    assert isinstance(cfg.regularizer.alpha, float) and cfg.regularizer.fbeta.mu_init == -2.0
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
        (
            "train.nonfinite_check_every=0",
            r"train.nonfinite_check_every must be an integer >= 1 \(.*\), got 0",
        ),
        ("train.nonfinite_check_every=true", r"train.nonfinite_check_every must be int, got True"),
        ("train.dist_timeout_s=0", r"train.dist_timeout_s must be > 0 \(seconds .*\), got 0"),
        ("train.compile=yes please", r"train.compile must be bool, got 'yes please'"),
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
    rc = main(
        [
            "--config",
            str(ROOT / "configs" / "smnist_linear.yaml"),
            "--regularizer",
            "fbeta",
            "--alpha",
            "1e-2",
            "train.epochs=2",
            "--print-config",
        ]
    )
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
    """One source of truth: for every objective, the resolved config's options are exactly the
    keyword arguments of its class, with the library's defaults where the config leaves them (a
    required target is set here); the typed ones come from their YAML names, through the one
    map ``YAML_TYPES``."""
    import inspect
    import typing

    targets = {"precision_at_recall": {"recall": 0.8}, "recall_at_precision": {"precision": 0.8}}
    for name, cls in C.REGULARIZERS.items():
        # the constructor's options, a **options forwarded to the base expanded (rate objectives)
        params = {k: p for k, (p, _) in C.options(cls).items() if k not in C.DATA_ARGUMENTS}
        assert all(p.kind is p.KEYWORD_ONLY for p in params.values()), name
        raw = {"regularizer": {"name": name, name: targets.get(name, {})}}
        kwargs = C.from_dict(raw).regularizer.kwargs()
        assert set(kwargs) == set(params), name
        for key, value in kwargs.items():
            default = params[key].default
            if key in targets.get(name, {}) or default is inspect.Parameter.empty:
                continue
            assert value == (list(default) if isinstance(default, tuple) else default), key
    hints = typing.get_type_hints(C.RegularizerConfig)
    hint = next(a for a in typing.get_args(hints["projection"]) if a is not type(None))
    assert typing.get_args(hint) == tuple(C.YAML_TYPES["projection"])
    assert typing.get_args(hints["name"]) == ("none", *C.REGULARIZERS)
    fbeta = typing.get_type_hints(C.SECTIONS["fbeta"])
    assert typing.get_args(fbeta["preset"]) == C.FBETA_PRESETS
    assert typing.get_args(fbeta["tau_update"]) == ("auto", *C.YAML_TYPES["tau_update"])
    # every YAML name maps to the library's type of that name
    for names in C.YAML_TYPES.values():
        assert all(kind.name == yaml for yaml, kind in names.items())
    # the rate objectives' shared options, declared once in their base, reach every section
    for name in ("precision_at_recall", "recall_at_precision", "roc_auc"):
        assert {"nu_max", "dual_lr_nu", "lambda_init"} <= set(
            typing.get_type_hints(C.SECTIONS[name])
        )


def test_build_regularizer_passes_every_option():
    from train.build import build_regularizer

    cfg = C.load(
        ROOT / "configs" / "demo.yaml",
        [
            "regularizer.fbeta.beta=0.5",
            "regularizer.projection=inline",
            "regularizer.inline_strength=0.05",
            "regularizer.fbeta.dual_lr_lambda=0.3",
            "regularizer.fbeta.dual_lr_mu=0.2",
            "regularizer.fbeta.mu_init=-3",
            "regularizer.fbeta.lambda_init=0.5",
            "regularizer.fbeta.cap_scores=false",
            "regularizer.fbeta.positive_classes=[1, 2]",
        ],
    )
    reg = build_regularizer(cfg.regularizer, torch.tensor([0, 1, 2, 1, 0, 2]))
    assert (reg.beta, reg.projection, reg.inline_strength) == (0.5, "inline", 0.05)
    assert (reg.dual_lr_lambda, reg.dual_lr_mu, reg.cap_scores) == (0.3, 0.2, False)
    assert reg.classes == (1, 2)
    assert reg.mu.tolist() == [-3.0, -3.0] and set(reg.lam.tolist()) == {0.5}
    assert build_regularizer(C.RegularizerConfig(), torch.tensor([0, 1])) is None
    labels = torch.tensor([0, 1, 1, 0, 1, 0])
    rate = C.load(
        ROOT / "configs" / "demo.yaml",
        [
            "regularizer.name=recall_at_precision",
            "regularizer.recall_at_precision.precision=0.7",
            "regularizer.recall_at_precision.nu_max=5",
            "regularizer.projection=inline",
        ],
    )
    reg = build_regularizer(rate.regularizer, labels)
    assert (type(reg).__name__, reg.precision, reg.nu_max, reg.projection) == (
        "RecallAtPrecision",
        0.7,
        5.0,
        "inline",
    )
    auc = C.load(
        ROOT / "configs" / "demo.yaml", ["regularizer.name=roc_auc", "regularizer.roc_auc.grid=4"]
    )
    assert build_regularizer(auc.regularizer, labels).offsets.shape == (4,)


def test_rate_objectives_need_their_target_and_name_bad_options():
    from train.build import build_regularizer

    demo = ROOT / "configs" / "demo.yaml"
    with pytest.raises(ValueError, match=r"regularizer\.precision_at_recall\.recall must be set"):
        C.load(demo, ["regularizer.name=precision_at_recall"])
    cfg = C.load(
        demo, ["regularizer.name=precision_at_recall", "regularizer.precision_at_recall.recall=1.5"]
    )
    with pytest.raises(ValueError, match=r"regularizer \(precision_at_recall\): recall must be"):
        build_regularizer(cfg.regularizer, torch.tensor([0, 1, 1, 0]))
    with pytest.raises(ValueError, match=r"unknown key regularizer\.roc_auc\.recall"):
        C.load(demo, ["regularizer.roc_auc.recall=0.5"])


def test_config_selects_the_paper_preset_and_pins_what_it_resolves():
    cfg = C.from_dict({"regularizer": {"name": "fbeta", "fbeta": {"preset": "paper"}}})
    r = cfg.regularizer
    # the saved config pins the values the preset gave (not null)
    assert (r.projection, r.fbeta.dual_lr_lambda, r.fbeta.dual_lr_mu, r.fbeta.cap_scores) == (
        "epoch",
        1e-3,
        1e-5,
        False,
    )
    reg = FBetaRegularizer(torch.tensor([0, 1, 1]), **r.kwargs())
    assert (reg.projection, reg.cap_scores, reg.dual_lr_mu) == ("epoch", False, 1e-5)
    again = C.from_dict(cfg.to_dict())
    assert again.to_dict() == cfg.to_dict()
    ours_cfg = C.from_dict({"regularizer": {"name": "fbeta"}})
    ours = ours_cfg.regularizer
    # tau_update auto and the projection that goes with it: resolved and pinned on loading
    assert (ours.projection, ours.fbeta.dual_lr_lambda, ours.fbeta.cap_scores) == (
        "tracked",
        0.1,
        True,
    )
    assert ours.fbeta.tau_update == "sparse_adam_ahead"
    reg = FBetaRegularizer(torch.tensor([0, 1, 1]), **ours.kwargs())
    assert (reg.projection, reg.tau_update) == ("tracked", "sparse_adam_ahead")
    # a paper config switched to an alternative: the shared projection stays unset, no error
    alt = C.load(ROOT / "configs" / "smnist_mlp.yaml", ["regularizer.name=soft_fbeta"])
    assert alt.regularizer.projection is None
    with pytest.raises(ValueError, match=r"regularizer\.fbeta\.preset must be one of"):
        C.from_dict({"regularizer": {"name": "fbeta", "fbeta": {"preset": "fast"}}})


def test_a_saved_config_with_removed_options_at_their_only_meaning_still_loads(tmp_path):
    """A run saved before options were removed resumes: each removed option at the value that
    means what the library does now is dropped; any other value is an error naming it."""
    raw = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    raw.setdefault("regularizer", {}).update({"rho": 0.0, "dual_schedule": "constant"})
    raw["regularizer"].setdefault("fbeta", {}).update({"negative_loss": "hinge", "eps_init": 1.0})
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(raw))
    cfg = C.load(tmp_path / "old.yaml")
    assert (
        cfg.regularizer.fbeta.beta == C.load(ROOT / "configs" / "demo.yaml").regularizer.fbeta.beta
    )
    raw["regularizer"]["rho"] = 0.5
    (tmp_path / "al.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match=r"regularizer\.rho=0\.5: this option was removed"):
        C.load(tmp_path / "al.yaml")


@pytest.mark.parametrize(
    ("override", "instead"),
    [
        ("regularizer.projection=clip", "'tracked'"),
        ("regularizer.projection=step", "regularizer.name=fbeta_full_projections"),
        ("regularizer.projection=none", "'tracked'"),
        ("regularizer.fbeta.tau_update=sparse_adam", "'sparse_adam_ahead'"),
        ("regularizer.fbeta.tau_update=sparse_sgd", "'sparse_adam_ahead'"),
        ("regularizer.precision_at_recall.projection=clip", "'inline'"),
    ],
)
def test_a_retired_mode_in_a_config_names_what_to_use_instead(override, instead):
    """A config (or a checkpoint's saved config) naming a mode the library no longer has: one
    line naming the key and what to use instead."""
    key, value = override.split("=")
    raw: dict = {}
    C.set_dotted(raw, override)
    with pytest.raises(
        ValueError, match=rf"{key}='{value}' was removed in version 0\.3\.0: .*{instead}"
    ):
        C.from_dict(raw)


def test_full_projections_is_a_regularizer_of_its_own():
    """``regularizer.name=fbeta_full_projections``: its section has F-beta's options but the
    projection and the tau update it fixes; its preset's values are pinned in the config, and a
    shared ``regularizer.projection`` is refused."""
    cfg = C.from_dict(
        {
            "regularizer": {
                "name": "fbeta_full_projections",
                "fbeta_full_projections": {"preset": "paper"},
            }
        }
    )
    section = cfg.regularizer.fbeta_full_projections
    assert not hasattr(section, "projection") and not hasattr(section, "tau_update")
    assert (section.dual_lr_lambda, section.dual_lr_mu, section.cap_scores) == (1e-3, 1e-5, False)
    reg = C.REGULARIZERS["fbeta_full_projections"](
        torch.tensor([0, 1, 1]), **cfg.regularizer.kwargs()
    )
    assert type(reg).__name__ == "FullProjectionsFBeta" and reg.dual_lr_mu == 1e-5
    assert cfg.regularizer.positive_classes() == [1]
    with pytest.raises(ValueError, match=r"regularizer\.projection does not apply"):
        C.from_dict(
            {"regularizer": {"name": "fbeta_full_projections", "projection": "epoch"}}
        ).regularizer.kwargs()


def test_auto_tau_update_is_pinned_in_the_config():
    """``tau_update: auto`` (the default): the library's defaults resolve to ``sparse_adam_ahead``
    with the tracked projection at every size, at the regularizer group's lr (the step a dense
    ``tau`` takes; ``tau_lr`` stays null), written into the config on loading (a resumed run
    rebuilds it from there); an explicit projection or the
    paper preset keeps the dense update, and so do ``optim.name: sgd`` and fp16; an explicit
    sparse update under fp16 is refused."""
    labels = torch.tensor([0, 1, 1, 1, 0])
    for given, optim, expected in (
        ({}, {}, ("tracked", "sparse_adam_ahead")),
        ({"projection": "inline"}, {}, ("inline", "dense")),
        ({"fbeta": {"preset": "paper"}}, {}, ("epoch", "dense")),
        ({}, {"name": "sgd"}, ("inline", "dense")),
    ):
        cfg = C.from_dict({"regularizer": {"name": "fbeta", **given}, "optim": optim})
        assert (cfg.regularizer.projection, cfg.regularizer.fbeta.tau_update) == expected
        reg = FBetaRegularizer(labels, **cfg.regularizer.kwargs())
        assert (reg.projection, reg.tau_update) == expected
        again = FBetaRegularizer(labels, **C.from_dict(cfg.to_dict()).regularizer.kwargs())
        assert (again.projection, again.tau_update) == expected
    assert FBetaRegularizer(labels[:3]).tau_update == "sparse_adam_ahead"  # 2 positives too
    # ahead's tau_lr stays null: the trainer gives it the group's lr at every step (test_train)
    cfg = C.from_dict({"regularizer": {"name": "fbeta"}, "optim": {"regularizer_lr": 0.05}})
    assert cfg.regularizer.fbeta.tau_lr is None
    cfg = C.from_dict(cfg.to_dict())
    assert cfg.regularizer.fbeta.tau_lr is None
    cfg = C.from_dict({"regularizer": {"name": "fbeta"}, "train": {"precision": "fp16"}})
    assert cfg.regularizer.fbeta.tau_update == "dense"
    explicit = {"name": "fbeta", "fbeta": {"tau_update": "sparse_adam_ahead"}}
    with pytest.raises(ValueError, match=r"tau_update='sparse_adam_ahead'.*fp16"):
        C.from_dict({"regularizer": explicit, "train": {"precision": "fp16"}})
