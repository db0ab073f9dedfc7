r"""The options of an objective as public types (method note sec. 3b, 11).

Where the projection onto ``C`` is applied (the **schedule**) and who steps ``tau`` (its
**storage**). Each is a small frozen value: it validates itself, prints what it is, and changes
no other option; an objective refuses a pair it cannot run, at construction.

* Schedules: ``Tracked()`` (F-beta's default: the exact projection's threshold over an active set
  kept in step, O(B) per step), ``EpochEnd()`` (Algorithm 3 of the paper: the projection once per
  epoch), ``Inline(strength=0.0)`` (the loss on ``Pi_C`` of the parameters, exact or smooth; the
  rate objectives' default).
* ``tau``: ``SparseTau(lr=None)`` (F-beta's default: the rows a batch touched stepped at the
  optimizer's step, on dense Adam's trajectory, O(B); ``lr=None`` follows the optimizer's group
  after ``attach``) or ``DenseTau()`` (``tau`` an ``nn.Parameter`` your optimizer steps, O(n)).

The paper's Algorithm 3 as published is ``FBetaRegularizer.paper(shape_labels)``.

Examples:
    >>> from reparam import DenseTau, EpochEnd, Inline, SparseTau, Tracked
    >>> Inline(strength=0.1), SparseTau(lr=1e-2), Tracked().name
    (Inline(strength=0.1), SparseTau(lr=0.01), 'tracked')
    >>> Inline(strength=-1.0)
    Traceback (most recent call last):
    ...
    ValueError: Inline(strength=...) must be >= 0, got -1.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# SparseTau(lr=None) without attach: the paper's primal step (sec. 4, Adam 1e-2 on eps and tau);
# Adam's own 1e-3 was too small next to a head at 1e-2 (method note sec. 3b: LP gap 17-97 %)
DEFAULT_TAU_LR = 1e-2


@dataclass(frozen=True)
class Tracked:
    """The schedule that shows the loss the exact projection's threshold, kept in step.

    The threshold ``e*`` is over an active set kept in step with the rows each step moves, in
    O(B) per step with a ``SparseTau`` (method note sec. 3b). F-beta's default.

    Examples:
        >>> import torch
        >>> from reparam import FBetaRegularizer, Tracked
        >>> FBetaRegularizer(torch.tensor([0, 1, 1]), schedule=Tracked()).projection
        'tracked'
    """

    name = "tracked"


@dataclass(frozen=True)
class EpochEnd:
    """The schedule that projects the parameters onto ``C`` in place at every epoch end.

    The loss sees the raw parameters (Algorithm 3 of the paper).

    Examples:
        >>> import torch
        >>> from reparam import EpochEnd, FBetaRegularizer
        >>> FBetaRegularizer(torch.tensor([0, 1, 1]), schedule=EpochEnd()).projection
        'epoch'
    """

    name = "epoch"


@dataclass(frozen=True)
class Inline:
    """The schedule whose loss takes ``Pi_C`` of the parameters, with autograd through it.

    Exact (``strength = 0``) or the smooth projection of that strength (method note sec. 5); it
    couples every row of ``tau`` in each step, so F-beta needs ``DenseTau()`` with it. The rate
    objectives' default.

    Examples:
        >>> import torch
        >>> from reparam import DenseTau, FBetaRegularizer, Inline
        >>> reg = FBetaRegularizer(torch.tensor([0, 1, 1]), schedule=Inline(0.1), tau=DenseTau())
        >>> reg.projection, reg.inline_strength
        ('inline', 0.1)
    """

    strength: float = 0.0
    name = "inline"

    def __post_init__(self) -> None:
        _check_number("Inline(strength=...)", self.strength, strict=False)


@dataclass(frozen=True)
class SparseTau:
    """The storage of ``tau`` whose rows a batch touched step at the optimizer's step.

    The rows step on dense Adam's trajectory (``"sparse_adam_ahead"``, method note sec. 11),
    O(B) per step. ``lr``: its step size; ``None``: the lr of the optimizer's group that steps
    ``eps`` once attached (else ``DEFAULT_TAU_LR``). F-beta's default.

    Examples:
        >>> import torch
        >>> from reparam import FBetaRegularizer, SparseTau
        >>> reg = FBetaRegularizer(torch.tensor([0, 1, 1]), tau=SparseTau(lr=0.05))
        >>> reg.tau_update, reg.tau_lr, [name for name, _ in reg.named_parameters()]
        ('sparse_adam_ahead', 0.05, ['eps_param'])
    """

    lr: float | None = None
    name = "sparse_adam_ahead"

    def __post_init__(self) -> None:
        if self.lr is not None:
            _check_number("SparseTau(lr=...)", self.lr, strict=True)


@dataclass(frozen=True)
class DenseTau:
    """The storage of ``tau`` as an ``nn.Parameter`` that your optimizer steps.

    Every row steps at every step (O(n)).

    Examples:
        >>> import torch
        >>> from reparam import DenseTau, FBetaRegularizer
        >>> reg = FBetaRegularizer(torch.tensor([0, 1, 1]), tau=DenseTau())
        >>> reg.tau_update, [name for name, _ in reg.named_parameters()]
        ('dense', ['eps_param', 'tau_param'])
    """

    name = "dense"


# the paper's Algorithm 3 as published (FBetaRegularizer.paper)
PAPER: dict[str, object] = {
    "schedule": EpochEnd(),
    "tau": DenseTau(),
    "dual_lr_lambda": 1e-3,
    "dual_lr_mu": 1e-5,
    "cap_scores": False,
}

# SparseTau()'s rule: Adam (torch.optim.Adam / SparseAdam defaults), no weight decay
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
RULE = {"betas": ADAM_BETAS, "eps": ADAM_EPS, "weight_decay": 0.0, "amsgrad": False}
RULE_NAME = f"adam(betas={ADAM_BETAS}, eps={ADAM_EPS:g})"


def check_rule(optimizer: torch.optim.Optimizer, group: dict) -> None:
    """``ValueError`` unless ``group`` of ``optimizer`` (the one that steps ``eps``) steps by the
    rule the rows follow (``SparseTau(lr=None)``): ``torch.optim.Adam`` or ``AdamW`` with
    ``RULE``'s betas and eps, no weight decay, no AMSGrad, not maximizing. The rows take the
    group's lr at every step; any other rule would be ignored, so it is refused."""
    differ = [
        f"{key}={group.get(key)!r}"
        for key, want in (*RULE.items(), ("maximize", False))
        if key in group and _differs(group[key], want)
    ]
    adam = isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW)
    if adam and not differ:
        return
    what = type(optimizer).__name__ + (f" with {', '.join(differ)}" if adam else "")
    raise ValueError(
        f"tau=SparseTau(lr=None) steps the rows of tau by its own rule, {RULE_NAME} with no "
        f"weight decay, at the lr of the optimizer's group that steps eps; that group is "
        f"{what}, whose rule the rows would not follow. Pass tau=DenseTau() (your optimizer "
        f"steps tau, O(n) per step), or tau=SparseTau(lr=...) (the rows keep the {RULE_NAME} "
        f"rule at that fixed lr, whatever optimizer steps the rest)"
    )


def _differs(value: object, want: object) -> bool:
    if isinstance(want, tuple):
        return tuple(float(v) for v in value) != want
    return value != want


SCHEDULES = (Tracked, EpochEnd, Inline)
TAU_STORAGES = (SparseTau, DenseTau)


def _check_number(what: str, value: object, *, strict: bool) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (strict and value == 0):
        raise ValueError(f"{what} must be {'> 0' if strict else '>= 0'}, got {value!r}")


def check_option(name: str, value: object, allowed: tuple[type, ...]) -> object:
    """``value`` if it is an instance of one of ``allowed``, else a ``ValueError`` naming the
    argument (a string names the type to use)."""
    if isinstance(value, allowed):
        return value
    names = " | ".join(f"{t.__name__}()" for t in allowed)
    hint = ""
    if isinstance(value, str):
        by_name = {t.name: t.__name__ for t in (*SCHEDULES, *TAU_STORAGES)}
        if value in by_name:
            hint = f" (the option is a type: {name}={by_name[value]}())"
    raise ValueError(f"{name} must be {names}, got {value!r}{hint}")
