"""F-beta's options and their one resolution (method note sec. 3b, 11): the presets, the
library's defaults and ``tau_update="auto"``. ``FBetaRegularizer`` and the trainer's config both
call ``resolve_options``, so a saved config pins what the constructor resolves."""

from __future__ import annotations

from . import _checks
from .sparse import TAU_UPDATES

# tau_lr=None with a sparse tau update: the paper's primal step (sec. 4, Adam 1e-2 on eps and tau);
# Adam's own 1e-3 was too small next to a head at 1e-2 (method note sec. 3b: LP gap 17-97 %)
DEFAULT_TAU_LR = 1e-2

# tau_update="auto" with the library's defaults: "sparse_adam_ahead" (dense Adam's trajectory at
# O(B) per step, reparam/sparse.py) and the tracked projection at every n: the step is flat in n
# (docs/figures/scale_n.md), and the LP gap on the fixed-feature problems is dense Adam's
# (method note sec. 11: 2.0 / 1.3 / 1.7 % against inline's 2.2 / 1.4 / 1.5 %).
AUTO_TAU_UPDATE = "sparse_adam_ahead"

# The options a preset sets: the library's defaults (``preset=None``; chosen on the evidence of
# docs/comparison.md) and the paper's Algorithm 3 as published (``preset="paper"``). An option
# passed explicitly (not ``None``) overrides its preset's value.
FBETA_DEFAULTS: dict[str, object] = {
    "projection": "inline",
    "dual_lr_lambda": 0.1,
    "dual_lr_mu": 0.1,
    "cap_scores": True,
}
PAPER_PRESET: dict[str, object] = {
    "projection": "epoch",
    "dual_lr_lambda": 1e-3,
    "dual_lr_mu": 1e-5,
    "cap_scores": False,
}
FBETA_PRESETS = (None, "paper")


def resolve_preset(preset: str | None, **given: object) -> dict[str, object]:
    """The options a preset sets, each one not given (or ``None``) taking the preset's value.

    The options are ``FBETA_DEFAULTS``' keys; ``given`` may name any of them. The trainer's config
    uses it too, so a saved config pins what the constructor resolves.

    Args:
        preset: ``None`` (the library's ``FBETA_DEFAULTS``) or ``"paper"`` (``PAPER_PRESET``).
        **given: options given explicitly (``None``: the preset's value).

    Examples:
        >>> from reparam import resolve_preset
        >>> r = resolve_preset("paper", projection="inline")  # given: overrides the preset
        >>> r["projection"], r["dual_lr_mu"], r["cap_scores"]
        ('inline', 1e-05, False)
        >>> resolve_preset(None)["projection"]
        'inline'
    """
    base = PAPER_PRESET if _checks.choice("preset", preset, FBETA_PRESETS) else FBETA_DEFAULTS
    return {key: value if given.get(key) is None else given[key] for key, value in base.items()}


def resolve_options(
    preset: str | None = None,
    *,
    tau_update: str = "auto",
    sparse: bool | None = None,
    **given: object,
) -> dict[str, object]:
    """Every option the constructor resolves: the preset's and ``tau_update``.

    The preset's options come from ``resolve_preset``; here is the one place where ``"auto"`` is
    resolved. ``"auto"`` is ``"sparse_adam_ahead"`` (O(B) per step) with the library's schedule
    (``preset`` and ``projection`` left at ``None``), whose projection is then ``"tracked"``
    (inline's O(B) form), else ``"dense"``. ``sparse`` overrides that choice for ``"auto"``:
    ``True``, sparse whatever the schedule (the trainer's objective on every pixel); ``False``,
    dense (the trainer with an optimizer other than Adam, or fp16: the sparse rule is Adam's and
    reads the unscaled gradient). The trainer's config writes the result, so a saved config pins the
    run.

    Args:
        preset: ``None`` or ``"paper"`` (``resolve_preset``).
        tau_update: ``"auto"``, ``"dense"`` or ``"sparse_adam_ahead"``.
        sparse: ``"auto"``'s choice: ``True`` sparse, ``False`` dense, ``None`` by the schedule.
        **given: options given explicitly, as for ``resolve_preset``.

    Examples:
        >>> from reparam import resolve_options
        >>> r = resolve_options()  # the library's defaults
        >>> r["tau_update"], r["projection"]
        ('sparse_adam_ahead', 'tracked')
        >>> r = resolve_options("paper")
        >>> r["tau_update"], r["projection"], r["dual_lr_lambda"]
        ('dense', 'epoch', 0.001)
    """
    out = resolve_preset(preset, **given)
    tau_update = _checks.choice("tau_update", tau_update, ("auto", *TAU_UPDATES))
    library = preset is None and given.get("projection") is None
    if tau_update == "auto":
        sparse = library if sparse is None else sparse
        tau_update = AUTO_TAU_UPDATE if sparse else "dense"
    if tau_update != "dense" and library:  # inline needs every row: its O(B) form
        out["projection"] = "tracked"
    return {**out, "tau_update": tau_update}
