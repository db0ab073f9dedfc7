"""The config tree: YAML -> dataclass defaults -> command-line ``key=value`` overrides.

Every section is a dataclass with typed defaults; loading rejects unknown keys (listing the valid
ones) and values of the wrong type or outside their choices, with a ``ValueError`` naming the dotted
key. The resolved tree is saved in the run folder (``config.yaml``) and in every checkpoint.

Choices are ``Literal`` types. The regularizer's sections come from the library's signatures, so
the library is the one source of truth (``tests/train/test_config.py`` checks that they agree);
the options the library takes as types (``schedule=Tracked()``, ``tau=SparseTau(lr)``) have YAML
names, mapped to the types in one place (``YAML_TYPES``).
"""

from __future__ import annotations

import collections.abc
import copy
import dataclasses
import inspect
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from reparam import (
    ROCAUC,
    DenseTau,
    EpochEnd,
    FBetaRegularizer,
    Inline,
    PrecisionAtRecall,
    RecallAtPrecision,
    SparseTau,
    Tracked,
)
from reparam.baselines import (
    LPAUC,
    CooperFBeta,
    FullProjectionsFBeta,
    LibAUCMargin,
    LPFBeta,
    PairwiseAUC,
    SoftFBeta,
)
from reparam.baselines.objectives import NEWTON
from reparam.fbeta import PAPER
from reparam.rate_base import NU_RULES

from .config_legacy import drop_removed, refuse_retired
from .dotted import build_dataclass, flatten, set_dotted
from .losses import CLASS_WEIGHT_RULES, TASK_LOSSES

# regularizer.name -> class (``none``: no regularizer); the class's options are the sub-section
# ``regularizer.<name>``, the options the reparameterized objectives share are in ``regularizer``
# itself. The others are the alternatives of ``reparam.baselines`` (docs/baselines.md), behind the
# same protocol, so comparisons run through the same trainer, configs, logs and metrics.
REGULARIZERS: dict[str, type] = {
    "fbeta": FBetaRegularizer,
    "fbeta_full_projections": FullProjectionsFBeta,
    "precision_at_recall": PrecisionAtRecall,
    "recall_at_precision": RecallAtPrecision,
    "roc_auc": ROCAUC,
    "lp_fbeta": LPFBeta,
    "lp_auc": LPAUC,
    "soft_fbeta": SoftFBeta,
    "pairwise_auc": PairwiseAUC,
    "cooper_fbeta": CooperFBeta,
    "libauc_auc": LibAUCMargin,
}
SMNIST_MODELS = ("linear", "mlp")
# the objectives whose target picks a decision threshold (train.shape_threshold=val)
THRESHOLD_OBJECTIVES = (
    "fbeta",
    "fbeta_full_projections",
    "precision_at_recall",
    "recall_at_precision",
)


def options(cls: type) -> dict[str, tuple[inspect.Parameter, Any]]:
    """``name -> (parameter, type hint)`` of the keyword options of ``cls``'s constructor, a
    ``**options`` it passes to its base expanded into the base's (the rate objectives declare
    their shared options once, in their base), but those the class fixes (``_fixed_options``): the
    signature the config sections are built from."""
    out: dict[str, tuple[inspect.Parameter, Any]] = {}
    fixed = getattr(cls, "_fixed_options", ())
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        hints = typing.get_type_hints(klass.__init__)
        params = list(inspect.signature(klass.__init__).parameters.values())[1:]
        for p in params:
            if (p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD) and (
                p.name not in fixed
            ):
                out.setdefault(p.name, (p, hints.get(p.name, Any)))
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return out
    return out


# The YAML names of the options the library takes as types: the one place they meet. A schedule
# (``regularizer.projection``, ``regularizer.inline_strength``) and F-beta's ``tau``
# (``regularizer.fbeta.tau_update``, ``.tau_lr``).
YAML_TYPES: dict[str, dict[str, type]] = {
    "projection": {"tracked": Tracked, "epoch": EpochEnd, "inline": Inline},
    "tau_update": {"sparse_adam_ahead": SparseTau, "dense": DenseTau},
}
PROJECTION_MODES = tuple(YAML_TYPES["projection"])
FBETA_PRESETS = (None, "paper")  # null: the library's defaults; "paper": FBetaRegularizer.paper
# the F-beta options a preset sets when the config leaves them at null
PRESET_KEYS = ("dual_lr_lambda", "dual_lr_mu", "cap_scores")
# the constructor's typed options, written in YAML by the names above
TYPED = ("schedule", "tau")


def schedule_of(projection: str, inline_strength: float) -> Tracked | EpochEnd | Inline:
    """The library's schedule type of the YAML ``projection`` (and ``inline_strength``)."""
    kind = YAML_TYPES["projection"][projection]
    return kind(inline_strength) if kind is Inline else kind()


def tau_of(tau_update: str, tau_lr: float | None) -> SparseTau | DenseTau:
    """The library's ``tau`` type of the YAML ``tau_update`` (and ``tau_lr``)."""
    kind = YAML_TYPES["tau_update"][tau_update]
    return kind(tau_lr) if kind is SparseTau else kind()


def _default(cls: type, name: str) -> Any:
    """The default of keyword argument ``name`` of ``cls`` (``None`` for a required one)."""
    value = options(cls)[name][0].default
    return None if value is inspect.Parameter.empty else value


@dataclass
class DataConfig:
    # "segmentation": a cache of data_prep.cocostuff or data_prep.camvid ("cocostuff": its old name)
    kind: Literal["smnist", "segmentation", "cocostuff"] = "smnist"
    # the folder written by `python -m data_prep.smnist` / `.cocostuff` / `.camvid`
    path: str = "data/smnist"
    train_subset: int | None = None  # use the first N training images (None: all)
    # first N images of the reported split (segmentation: test where the cache has one, else val)
    test_subset: int | None = None
    # S-MNIST: hold out the last fraction of the training images (after train_subset) as a val
    # split that selects the epoch (and, with train.shape_threshold=val, the shape threshold)
    val_fraction: float | None = None
    batch_size: int = 100
    eval_batch_size: int = 2000
    num_workers: int = 0
    hflip: bool = True  # segmentation training: random horizontal flip (image and mask together)
    # segmentation training: scale jitter [lo, hi], then a crop back to the image size
    scale_range: list[float] | None = None

    @property
    def segmentation(self) -> bool:
        return self.kind in ("segmentation", "cocostuff")


@dataclass
class ModelConfig:
    # smnist: "linear" (the paper's) | "mlp"; cocostuff: any segmentation-models-pytorch
    # architecture ("deeplabv3plus", "unet", ...) or "segnet" (VGG16-bn with pooling indices)
    name: str = "linear"
    hidden: list[int] = field(default_factory=lambda: [256])  # mlp hidden widths
    shape_input: Literal["features", "logits"] = (
        "features"  # shape head reads: pixels / last hidden, or logits
    )
    # smnist, shape_input "features": the class outputs and the shape node in one GEMM (the
    # paper's one linear layer with 11 outputs); same parameters and state_dict keys as false
    shared_gemm: bool = False
    encoder: str = "resnet50"  # cocostuff: smp encoder name ("vgg16_bn" for segnet)
    # cocostuff: "imagenet" (downloads once), null (random init) or a local weights file path
    encoder_weights: str | None = "imagenet"


@dataclass
class OptimConfig:
    name: Literal["adam", "sgd"] = "adam"
    lr: float = 1e-2
    weight_decay: float = 0.0
    momentum: float = 0.9  # sgd only
    regularizer_lr: float | None = None  # lr of (eps, tau); None: same as lr
    schedule: Literal["constant", "poly"] = "constant"  # poly: lr * (1 - step / total_steps) ** 0.9


# the constructor's data, not options: the trainer passes them from the data set
DATA_ARGUMENTS = (
    "shape_labels",
    "groups",
    "shard",
    "process_group",
)  # given by the trainer, not the config
# options the reparameterized objectives share (the alternatives take none of them): the YAML
# form of their ``schedule``
COMMON = ("projection", "inline_strength")
# the library's choices for options its signatures type as ``str``
CHOICES: dict[str, tuple[str, ...]] = {"newton": NEWTON, "nu_rule": NU_RULES}
# the YAML fields of a section whose class takes ``tau`` (F-beta) or presets (F-beta's and the
# full projections'): name -> (type, default); the PRESET_KEYS become null (the preset's)
TAU_FIELDS = {
    "tau_update": (Literal[("auto", *YAML_TYPES["tau_update"])], "auto"),
    "tau_lr": (float | None, None),
}
PRESET_FIELDS = {"preset": (Literal[FBETA_PRESETS], None)}


def _yaml_fields(cls: type) -> dict[str, tuple[Any, Any]]:
    """The YAML fields a class's typed options add to its section (``TAU_FIELDS``,
    ``PRESET_FIELDS``)."""
    fields = dict(TAU_FIELDS) if "tau" in options(cls) else {}
    if hasattr(cls, "paper"):
        fields |= PRESET_FIELDS
    return fields


def options_section(cls: type) -> type:
    """The config sub-section of a regularizer class, derived from its constructor: one field per
    keyword argument but ``shape_labels`` and the shared ones (``COMMON``), with its type (a
    ``Literal`` of the library's choices where it has some; ``list[int]`` for a sequence) and its
    default; a required argument (a target) becomes ``None`` until set. So the config cannot drift
    from the library, and the regularizer is built from the section as it is."""
    fields = []
    presets = hasattr(cls, "paper")
    for p, hint in options(cls).values():
        if p.name in DATA_ARGUMENTS or p.name in COMMON or p.name in TYPED:
            continue
        if presets and p.name in PRESET_KEYS:  # null: the preset's value (_resolve_defaults)
            fields.append((p.name, hint | None, None))
            continue
        hint = Literal[CHOICES[p.name]] if p.name in CHOICES else hint
        if typing.get_origin(hint) is collections.abc.Sequence:
            hint = list[typing.get_args(hint)[0]]
        if p.default is inspect.Parameter.empty:
            fields.append((p.name, hint | None, None))
        elif isinstance(p.default, tuple):
            fields.append((p.name, hint, field(default_factory=lambda d=p.default: list(d))))
        else:
            fields.append((p.name, hint, p.default))
    fields += [(name, hint, default) for name, (hint, default) in _yaml_fields(cls).items()]
    section = dataclasses.make_dataclass(f"{cls.__name__}Options", fields)
    section.__module__ = __name__
    section.__doc__ = f"The options of ``{cls.__module__}.{cls.__name__}`` (its signature)."
    return section


SECTIONS = {name: options_section(cls) for name, cls in REGULARIZERS.items()}


@dataclass
class _RegularizerBase:
    """``name`` picks the regularizer (``none``: the baseline) and ``alpha`` weighs it in the loss
    ``task + alpha * L_B``; the options every objective shares are here, each objective's own in
    its sub-section (``regularizer.fbeta.beta``, ``regularizer.precision_at_recall.recall``, ...),
    so one config carries settings for all of them and ``--regularizer`` switches. Every option is
    a keyword argument of the library class with the library's default (:meth:`kwargs`)."""

    name: Literal[("none", *REGULARIZERS)] = "none"
    alpha: float = 1e-3
    # what the objective scores: the shape node (the paper's extra output, one score per image)
    # or, segmentation with F-beta, the pixels of each image (the grouped F-beta, one problem per
    # image: the mean per-image Dice; docs/segmentation/pixels.md), scored by the logits' margins
    target: Literal["shape_node", "pixels"] = "shape_node"
    # several processes: each holds the per-sample state of its own block of the training set
    # (reparam.Shard; F-beta and precision_at_recall, target shape_node). "owner": each draws its
    # batches from its block; "global": DistributedSampler, the batch routed to the owners
    shard: Literal["none", "owner", "global"] = "none"
    # null: each objective's own default (F-beta: its preset's, ``regularizer.fbeta.preset``)
    projection: Literal[PROJECTION_MODES] | None = None
    inline_strength: float = 0.0
    # then one sub-section per regularizer, ``SECTIONS[name]`` (added below the class)

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``REGULARIZERS[name]``: the sub-section ``name``'s options,
        with the YAML names of the typed ones as the library's types (``schedule`` from the shared
        ``projection`` / ``inline_strength``, F-beta's ``tau`` from ``tau_update`` / ``tau_lr``;
        ``YAML_TYPES``). A shared option set away from its default for an objective that does
        not take it is a ``ValueError`` (it would be silently ignored)."""
        takes = options(REGULARIZERS[self.name])
        out = asdict(getattr(self, self.name))
        out.pop("preset", None)  # (resolved into the options it sets: _resolve_defaults)
        if "tau_update" in out:  # ("auto": the trainer's choice, once resolved)
            tau_update, tau_lr = out.pop("tau_update"), out.pop("tau_lr")
            if tau_update != "auto":
                out["tau"] = tau_of(tau_update, tau_lr)
        if "schedule" in takes:
            if self.projection is not None:  # None: the objective's own default
                out["schedule"] = schedule_of(self.projection, self.inline_strength)
            return out
        for key in COMMON:
            if getattr(self, key) != getattr(_RegularizerBase, key):
                raise ValueError(
                    f"regularizer.{key} does not apply to regularizer.name={self.name} (it is an "
                    f"option of the reparameterized objectives); leave it at its default "
                    f"{getattr(_RegularizerBase, key)!r}"
                    + (" (null)" if getattr(_RegularizerBase, key) is None else "")
                )
        return out

    def positive_classes(self) -> list[int]:
        """The shape classes the shape head scores (its columns; the shape node's metrics use the
        first): F-beta's ``positive_classes`` (also for the baseline), else ``[positive_class]``."""
        section = self.fbeta if self.name == "none" else getattr(self, self.name)
        if hasattr(section, "positive_classes"):
            return list(section.positive_classes)
        return [section.positive_class]


RegularizerConfig = dataclasses.make_dataclass(
    "RegularizerConfig",
    [(name, section, field(default_factory=section)) for name, section in SECTIONS.items()],
    bases=(_RegularizerBase,),
)
RegularizerConfig.__module__ = __name__


@dataclass
class TrainConfig:
    epochs: int = 40
    seed: int = 0
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:1" ...
    num_threads: int | None = None  # torch.set_num_threads; None: torch's default
    out: str | None = None  # run folder; None: runs/<experiment>/<tag>
    checkpoint: bool = True  # write checkpoints (run/checkpoints/step-N.pt)
    checkpoint_every: int | None = None  # also every N optimizer steps (None: per epoch only)
    keep_checkpoints: int = 1  # the newest N step-N.pt are kept (best.pt is kept apart)
    stop_after_steps: int | None = None  # stop (with a checkpoint) after N steps; --resume goes on
    precision: Literal["fp32", "bf16", "fp16"] = (
        "fp32"  # network arithmetic (autocast; fp16 scaled)
    )
    nonfinite: Literal["stop", "skip"] = "stop"  # NaN/inf loss: error naming the step | count it
    # stop: steps between host reads of the device-side non-finite flag (also read before every
    # checkpoint and at the epoch end); 1: every step. skip reads it every step (docs/robustness.md)
    nonfinite_check_every: int = 100
    # several processes (torchrun): how long a collective waits for a process that stopped
    # answering before it fails (torch.distributed's process group timeout), in seconds
    dist_timeout_s: float = 600.0
    # torch.compile the network (nn.Module.compile: checkpoints unchanged) and a reparameterized
    # objective's whole per-step path (reg.compile(): forward, backward, after_step_)
    compile: bool = False
    # even out the task loss over the shape groups (train/groups.py): "balanced" reweighting
    # (weight N / (G N_g) per group) or online group DRO (Sagawa et al. 2020) with step dro_step
    group_weighting: Literal["none", "balanced", "dro"] = "none"
    dro_step: float = 0.01
    # the task loss (train/losses.py; docs/segmentation/losses.md):
    # cross-entropy, or a segmentation_models_pytorch loss (segmentation only) ...
    loss: Literal[TASK_LOSSES] = "cross_entropy"
    # ... plus this times the cross-entropy (0: the smp loss alone; loss != cross_entropy only)
    loss_ce_weight: float = 0.0
    loss_per_image: bool = False  # lovasz: the loss of each image, averaged (smp's per_image)
    # segmentation: class weights from the training labels' pixel counts, for the cross-entropy
    # and the smp losses that take them (all but lovasz)
    class_weights: Literal[CLASS_WEIGHT_RULES] = "none"
    progress: bool = True  # tqdm bar (shown only on a terminal)
    log_images: int = 4  # segmentation: validation images shown in TensorBoard per epoch
    # the shape node's decision threshold the test split is also reported at (test_shape_*_at_
    # threshold), saved in checkpoints/best.pt for train.predict: "learned": the objective's own
    # (F-beta's and the rate objectives' decision_threshold); "val": chosen each epoch on the val
    # split (the rate objectives' calibrate, F-beta's best cut), needs a val split
    shape_threshold: Literal["learned", "val"] = "learned"


@dataclass
class Config:
    experiment: str = "smnist"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    regularizer: RegularizerConfig = field(default_factory=RegularizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


POSITIVE = {
    "data.batch_size",
    "data.eval_batch_size",
    "train.epochs",
    "optim.lr",
    "train.keep_checkpoints",
    "train.dro_step",
}
NON_NEGATIVE = {
    "data.num_workers",
    "regularizer.alpha",
    "optim.weight_decay",
    "train.log_images",
}


def from_dict(raw: dict[str, Any]) -> Config:
    """Build a validated ``Config`` from nested plain data (YAML); the options of the chosen
    objective left at ``null`` get the values it will use (:func:`_resolve_defaults`)."""
    raw = copy.deepcopy(raw)
    drop_removed(raw)
    refuse_retired(raw)
    cfg = build_dataclass(Config, raw, "")
    _validate(cfg)
    _check_pixel_target(cfg)
    _resolve_defaults(cfg)
    _check_sparse_tau(cfg)
    return cfg


# a sparse tau update under fp16 (its own step reads the gradient the loss scale multiplies)
_NO_FP16 = (
    "does not support train.precision=fp16 (its gradient would carry the loss scale): use bf16 "
    "or fp32, or tau_update=dense"
)


def _check_sparse_tau(cfg: Config) -> None:
    """F-beta's sparse ``tau`` update steps ``tau`` itself, reading its gradient: under fp16 that
    gradient would carry the loss scale, so the combination is refused. (``tau_lr: null`` is the
    step a dense ``tau`` takes: the lr of the regularizer's optimizer group, ``optim.regularizer_lr``
    else ``optim.lr``, at every step, the lr schedule included; it stays ``null`` in the saved
    config, which means exactly that.)"""
    r = cfg.regularizer
    if r.name == "fbeta" and r.fbeta.tau_update != "dense" and cfg.train.precision == "fp16":
        raise ValueError(f"regularizer.fbeta.tau_update={r.fbeta.tau_update!r} {_NO_FP16}")
    sparse = r.name == "fbeta" and r.fbeta.tau_update == "sparse_adam_ahead"
    if sparse and r.fbeta.tau_lr is None and cfg.optim.name != "adam":
        raise ValueError(
            f"regularizer.fbeta.tau_update='sparse_adam_ahead' with tau_lr: null steps the rows "
            f"of tau by Adam at the optimizer's lr, which optim.name={cfg.optim.name!r} does not "
            "follow: set regularizer.fbeta.tau_lr (the rows keep their Adam rule at that lr) or "
            "tau_update: dense (the optimizer steps tau)"
        )


def _check_pixel_target(cfg: Config) -> None:
    """``regularizer.target: pixels``: F-beta on segmentation only, and not with a dense inline
    projection of every pixel's ``tau`` at every step."""
    r = cfg.regularizer
    if r.target != "pixels":
        return
    if r.name != "fbeta" or not cfg.data.segmentation:
        raise ValueError(
            f"regularizer.target=pixels needs regularizer.name=fbeta and a segmentation data set "
            f"(the grouped F-beta per image), got regularizer.name={r.name!r}, "
            f"data.kind={cfg.data.kind!r}"
        )
    if r.projection == "inline" and r.fbeta.tau_update != "dense":
        raise ValueError(
            "regularizer.target=pixels with regularizer.projection=inline: every pixel's tau "
            "enters each step's projection (O(n) per step); use regularizer.projection=tracked "
            "(or null: the library's O(B) choice)"
        )


def _resolve_defaults(cfg: Config) -> None:
    """Write into the config the values the chosen objective takes for options left at ``null``
    or ``auto`` (F-beta: its preset's, ``tau_update`` and the projection; a rate objective: its
    projection), so the saved config pins them even if the library's defaults change.
    ``tau_update: auto`` is the trainer's choice: sparse with the library's preset and schedule
    (the projection and the preset left at null), and for the objective on the pixels
    (``target: pixels``: every training pixel a sample) whatever the schedule; dense otherwise,
    and with an optimizer other than Adam or fp16 (the sparse rule is Adam's, and reads the
    unscaled gradient)."""
    r = cfg.regularizer
    if r.name == "none":
        return
    cls = REGULARIZERS[r.name]
    if hasattr(cls, "paper"):  # F-beta's presets: the options left at null
        section = getattr(r, r.name)
        base = PAPER if section.preset == "paper" else {k: _default(cls, k) for k in PRESET_KEYS}
        for key in PRESET_KEYS:
            if getattr(section, key) is None:
                setattr(section, key, base[key])
    if r.name == "fbeta":
        library = r.fbeta.preset is None and r.projection is None
        if r.fbeta.tau_update == "auto":
            adam = cfg.optim.name == "adam" and cfg.train.precision != "fp16"
            sparse = r.target == "pixels" or (adam and library)
            r.fbeta.tau_update = "sparse_adam_ahead" if sparse else "dense"
        if r.projection is None:
            sparse = r.fbeta.tau_update != "dense"
            r.projection = "epoch" if r.fbeta.preset == "paper" else _library_schedule(sparse)
    elif r.projection is None and "schedule" in options(cls):
        r.projection = _default(cls, "schedule").name


def _library_schedule(sparse: bool) -> str:
    """The trainer's schedule for F-beta's library preset: the tracked threshold with a sparse
    ``tau`` (O(B) per step), the exact inline projection with a dense one."""
    return "tracked" if sparse else "inline"


def load(path: str | Path, overrides: list[str] = ()) -> Config:
    """Read a YAML config and apply ``key=value`` overrides (values parsed as YAML)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--config {path}: no such file")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ValueError(
            f"--config {path}: expected a mapping at the top level, got {type(raw).__name__}"
        )
    for item in overrides:
        set_dotted(raw, item)
    return from_dict(raw)


def save(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def _validate(cfg: Config) -> None:
    flat = flatten(cfg.to_dict())
    for key in POSITIVE:
        if not flat[key] > 0:
            raise ValueError(f"{key} must be > 0, got {flat[key]!r}")
    for key in NON_NEGATIVE:
        if not flat[key] >= 0:
            raise ValueError(f"{key} must be >= 0, got {flat[key]!r}")
    for key in (
        "data.train_subset",
        "data.test_subset",
        "train.checkpoint_every",
        "train.stop_after_steps",
    ):
        if flat[key] is not None and flat[key] < 1:
            raise ValueError(f"{key} must be None or >= 1, got {flat[key]!r}")
    if not cfg.train.dist_timeout_s > 0:
        raise ValueError(
            f"train.dist_timeout_s must be > 0 (seconds a collective waits for a silent process), "
            f"got {cfg.train.dist_timeout_s!r}"
        )
    every = cfg.train.nonfinite_check_every
    if every < 1:
        raise ValueError(
            f"train.nonfinite_check_every must be an integer >= 1 (the steps between reads of the "
            f"non-finite flag; 1 reads it every step), got {every!r}"
        )
    r = cfg.regularizer
    if r.name != "none":
        r.kwargs()  # shared options that the chosen objective does not take are an error
    for name, key in (("precision_at_recall", "recall"), ("recall_at_precision", "precision")):
        if r.name == name and getattr(getattr(r, name), key) is None:
            raise ValueError(
                f"regularizer.{name}.{key} must be set for regularizer.name={name} "
                f"(the target {key} in (0, 1)), e.g. regularizer.{name}.{key}=0.8"
            )
    smnist = not cfg.data.segmentation
    vf = cfg.data.val_fraction
    if vf is not None and not (smnist and 0 < vf < 1):
        raise ValueError(
            f"data.val_fraction must be null or in (0, 1) and is for S-MNIST only (segmentation "
            f"caches bring their val split), got {vf!r} with data.kind {cfg.data.kind!r}"
        )
    if cfg.train.shape_threshold == "val" and (
        r.name not in THRESHOLD_OBJECTIVES or r.target != "shape_node"
    ):
        raise ValueError(
            f"train.shape_threshold=val chooses the threshold of a target on the val split: it "
            f"needs regularizer.name in {THRESHOLD_OBJECTIVES} on the shape node, got "
            f"regularizer.name={r.name} (target {r.target})"
        )
    if smnist != (cfg.model.name in SMNIST_MODELS):
        expected = (
            f"one of {SMNIST_MODELS}"
            if smnist
            else "a segmentation architecture (e.g. 'deeplabv3plus', 'segnet')"
        )
        raise ValueError(
            f"model.name must be {expected} for data.kind {cfg.data.kind!r}, got {cfg.model.name!r}"
        )
    sr = cfg.data.scale_range
    if sr is not None and not (len(sr) == 2 and 0 < sr[0] <= sr[1]):
        raise ValueError(f"data.scale_range must be null or [lo, hi] with 0 < lo <= hi, got {sr}")
    if cfg.model.name == "mlp" and (not cfg.model.hidden or min(cfg.model.hidden) < 1):
        raise ValueError(
            f"model.hidden must be a non-empty list of widths >= 1, got {cfg.model.hidden}"
        )
    from .losses import validate_task_loss  # the task loss's own rules, next to it

    validate_task_loss(cfg)
