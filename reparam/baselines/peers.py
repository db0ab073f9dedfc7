r"""Thin adapters to optional peer libraries (imported lazily; method note sec. 9).

* **Cooper** (``pip install cooper-optim``; Gallego-Posada, Ramirez, Hashemizadeh, Lacoste-Julien,
  "Cooper: a library for constrained optimization in deep learning", 2025): LP (3') of
  method note sec. 2 posed as a ``ConstrainedMinimizationProblem``, with one *indexed* multiplier
  per positive sample for ``tau_i <= u_i`` and ``tau_i <= eps`` (observed on the batch's positives,
  ``constraint_features`` = their slots), dense multipliers for ``eps >= 0`` and ``mean tau = 1``, and
  Cooper's simultaneous gradient descent-ascent. Nothing is projected: every constraint is
  Lagrangian, the generic-engine contrast to ``reparam`` (which keeps ``C`` and projects).
* **LibAUC** (``pip install --no-deps libauc``; Yuan, Yan, Sonka, Yang, "Large-scale robust deep AUC
  maximization", ICCV 2021): the AUC-margin loss ``AUCMLoss`` with its ``PESG`` optimizer.

``import reparam.baselines`` never imports either; the functions below raise ``ImportError`` with the
install command when the peer is missing.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from ._checks import check_choice, check_positive

INSTALL = {
    "cooper": "pip install -c constraints.txt cooper-optim==1.0.1",
    "libauc": "pip install -c constraints.txt --no-deps libauc==2.0.1",
}


def _require(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"this adapter needs the optional package {module!r}: {INSTALL[module.split('.')[0]]}"
        ) from err


# --- Cooper ---------------------------------------------------------------------------------------


def _binary_labels(shape_labels: Tensor) -> Tensor:
    """``shape_labels`` as a tensor, or a ``ValueError`` unless it is a non-empty ``(N,)`` 0/1."""
    labels = torch.as_tensor(shape_labels)
    if labels.dim() != 1 or labels.numel() == 0 or bool(((labels != 0) & (labels != 1)).any()):
        raise ValueError(
            f"shape_labels must be a non-empty (N,) tensor of 0/1, got shape {tuple(labels.shape)}"
        )
    return labels


def cooper_fbeta_problem(
    shape_labels: Tensor, *, beta: float = 1.0, eps_init: float = 1.0, tau_init: float = 1.0
) -> Any:
    r"""LP (3') as a Cooper ``ConstrainedMinimizationProblem`` over the whole training set.

    $$
    \min_{W, \epsilon, \tau}\ \beta^2\epsilon + \tfrac1n\sum_{S^-}\max(0, \epsilon + u_j)
    \ \text{s.t.}\ \tau_i - u_i \le 0,\ \tau_i - \epsilon \le 0\ (i \in S^+),\ -\epsilon \le 0,
    \ \mathrm{mean}_{S^+}\tau - 1 = 0
    $$

    ``shape_labels`` ``(N,)`` 0/1 over the data set. The returned object owns ``eps`` and ``tau``
    (``nn.Parameter``\ s, in ``primal_parameters()``) and its ``compute_cmp_state(scores, idx)``
    takes a batch's scores ``(B,)`` and dataset indices ``(B,)``. The objective's hinge sum and the
    per-sample violations are scaled by ``N / (n B)`` so that Cooper's Lagrangian is the minibatch
    estimate of (4') (method note sec. 3) with Cooper's indexed multipliers as ``lambda_i``;
    ``mean tau - 1`` is exact (``tau`` is a parameter). Build the optimizer with
    ``cooper_optimizer``.

    Args:
        shape_labels: ``(N,)`` 0/1 labels of the training set, at least one positive.
        beta: the ``beta`` of F-beta (``> 0``).
        eps_init: the initial ``eps``.
        tau_init: the initial ``tau_i`` of every positive.

    Raises:
        ImportError: Cooper is not installed (the message gives the install command).
        ValueError: ``shape_labels`` not a non-empty ``(N,)`` 0/1 tensor with a positive,
            ``beta`` not ``> 0``.

    Examples:
        >>> import torch
        >>> from reparam.baselines import cooper_fbeta_problem
        >>> cmp = cooper_fbeta_problem(torch.tensor([0, 1, 1, 0, 1]))  # eps = tau_i = 1
        >>> tuple(cmp.tau.shape)  # one tau per positive
        (3,)
        >>> state = cmp.compute_cmp_state(torch.tensor([0.5, 2.0, 1.5]), torch.tensor([0, 1, 2]))
        >>> round(state.loss.item(), 4)  # beta^2 eps + (5 / 9) max(0, eps + 0.5)
        1.8333
    """
    _require("cooper")
    labels = _binary_labels(shape_labels)
    if int(labels.sum()) == 0:
        raise ValueError("shape_labels must contain at least one positive (label 1), got none")
    beta = check_positive("beta", beta)
    return _cooper_problem_class()(labels.long(), beta, float(eps_init), float(tau_init))


def cooper_rate_problem(
    shape_labels: Tensor, *, recall: float | None = None, precision: float | None = None
) -> Any:
    r"""The hinge Lagrangian of a rate target as a Cooper ``ConstrainedMinimizationProblem``.

    What a Cooper user writes for precision at recall (``recall=r``) or recall at precision
    (``precision=a``), with one dense multiplier for the rate constraint (method note sec. 9).

    With ``fp^+ = sum_{S-} max(0, 1 + u_j)`` over the ``m`` negatives and
    ``tp^- = sum_{S+} min(u_i, 1)`` over the ``n`` positives (the hinge bounds of sec. 8):

    $$
        ext{P@R:}\ \min\ 	frac1m fp^+\ 	ext{s.t.}\ r - 	frac1n tp^- \le 0;\qquad
        ext{R@P:}\ \min\ -	frac1n tp^-\ 	ext{s.t.}\ 	frac1n (a\, fp^+ - (1 - a)\, tp^-) \le 0,
    $$

    every sum estimated on the batch (``N / (mB)``, ``N / (nB)``). The false positives are over the
    negatives, as a user states a false-positive rate; ``PrecisionAtRecall``'s objective is
    ``fp^+ / n``, so its multiplier is Cooper's times ``m / n``. ``compute_cmp_state(scores, idx)``
    takes a batch's scores ``(B,)`` and dataset indices ``(B,)``. Step it with
    ``cooper_optimizer(cmp, model.parameters(), alternation="dual_primal")``.

    Args:
        shape_labels: ``(N,)`` 0/1 labels of the training set, with positives and negatives.
        recall: the target ``r`` in (0, 1) of precision at recall, or
        precision: the target ``a`` in (0, 1) of recall at precision (exactly one of the two).

    Raises:
        ImportError: Cooper is not installed (the message gives the install command).
        ValueError: labels not a ``(N,)`` 0/1 tensor with both classes; not exactly one target,
            or a target outside (0, 1).

    Examples:
        >>> import torch
        >>> from reparam.baselines import cooper_rate_problem
        >>> cmp = cooper_rate_problem(torch.tensor([0, 1, 1, 0, 1]), recall=0.8)
        >>> state = cmp.compute_cmp_state(torch.tensor([0.5, 2.0, 0.4]), torch.tensor([0, 1, 2]))
        >>> round(state.loss.item(), 4)  # (5 / (2 * 3)) max(0, 1 + 0.5)
        1.25
        >>> state.observed_constraints[cmp.rate].violation  # 0.8 - (5 / (3 * 3)) (1 + 0.4)
        tensor([0.0222])
    """
    _require("cooper")
    labels = _binary_labels(shape_labels)
    if int(labels.sum()) in (0, labels.numel()):
        raise ValueError(
            f"shape_labels must contain positives and negatives, got {int(labels.sum())} "
            f"positives of {labels.numel()}"
        )
    if (recall is None) == (precision is None):
        raise ValueError(
            f"give exactly one target, recall= or precision=, got recall={recall!r}, "
            f"precision={precision!r}"
        )
    name, value = ("recall", recall) if recall is not None else ("precision", precision)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ValueError(f"{name} must be a number in (0, 1), got {value!r}")
    return _cooper_rate_class()(labels.long(), name, float(value))


def cooper_optimizer(
    cmp: Any,
    primal_parameters: Iterable[torch.nn.Parameter] = (),
    *,
    primal_lr: float = 1e-2,
    dual_lr: float = 1e-1,
    alternation: str = "simultaneous",
) -> Any:
    """Cooper's optimizer for ``cmp``: Adam descent and SGD ascent.

    ``SimultaneousOptimizer``, or with ``alternation="dual_primal"`` its
    ``AlternatingDualPrimalOptimizer`` (the multipliers step first).

    Adam on the model's and ``cmp``'s primal parameters, SGD ascent (``maximize=True``,
    sparse-gradient friendly) on the multipliers, as Cooper's documentation sets up indexed
    multipliers. Step with ``opt.roll(compute_cmp_state_kwargs=...)``.

    Args:
        cmp: the problem (``cooper_fbeta_problem``, ``cooper_rate_problem``).
        primal_parameters: the model's parameters, stepped by the same Adam as ``cmp``'s own.
        primal_lr: Adam's learning rate (``> 0``).
        dual_lr: the multipliers' ascent step (``> 0``).
        alternation: ``"simultaneous"`` (both steps on the same Lagrangian) or ``"dual_primal"``
            (the multipliers step first, then the primal step sees them: the schedule of the
            rate objectives' ``dual_every="step"``).

    Examples:
        >>> import torch
        >>> from reparam.baselines import cooper_fbeta_problem, cooper_optimizer
        >>> u = torch.nn.Parameter(torch.tensor([0.5, 2.0, 1.5, -1.0, 0.3]))  # a score per sample
        >>> cmp = cooper_fbeta_problem(torch.tensor([0, 1, 1, 0, 1]))
        >>> opt = cooper_optimizer(cmp, [u])
        >>> idx = torch.tensor([0, 1, 2])
        >>> _ = opt.roll(compute_cmp_state_kwargs={"scores": u[idx], "idx": idx})
        >>> round(cmp.eps.item(), 4), round(u[0].item(), 4)  # Adam's first step, lr 1e-2
        (0.99, 0.49)
    """
    cooper = _require("cooper")
    alternation = check_choice("alternation", alternation, ("simultaneous", "dual_primal"))
    params = [*primal_parameters, *cmp.primal_parameters()]
    primal = torch.optim.Adam(params, lr=check_positive("primal_lr", primal_lr))
    dual = torch.optim.SGD(
        cmp.dual_parameters(), lr=check_positive("dual_lr", dual_lr), maximize=True, foreach=False
    )
    kind = (
        cooper.optim.SimultaneousOptimizer
        if alternation == "simultaneous"
        else cooper.optim.AlternatingDualPrimalOptimizer
    )
    return kind(primal_optimizers=primal, dual_optimizers=dual, cmp=cmp)


@functools.cache
def _cooper_rate_class() -> type:
    cooper = _require("cooper")

    class RateHingeProblem(cooper.ConstrainedMinimizationProblem):
        """A rate target's hinge Lagrangian, one dense multiplier (see ``cooper_rate_problem``)."""

        def __init__(self, labels: Tensor, target: str, value: float):
            super().__init__()
            self.labels, self.target, self.value = labels, target, value
            self.N, self.n = labels.numel(), int(labels.sum())
            self.m = self.N - self.n
            self.rate = cooper.Constraint(
                cooper.ConstraintType.INEQUALITY,
                multiplier=cooper.multipliers.DenseMultiplier(num_constraints=1),
            )

        def primal_parameters(self) -> list[torch.nn.Parameter]:
            return []

        def compute_cmp_state(self, scores: Tensor, idx: Tensor) -> Any:
            is_pos = self.labels.to(idx.device)[idx] == 1
            batch = idx.numel()
            fp = self.N / batch * torch.where(is_pos, 0, torch.relu(1 + scores)).sum()
            tp = self.N / (self.n * batch) * torch.where(is_pos, scores.clamp(max=1), 0).sum()
            if self.target == "recall":  # fp / m  s.t.  r - tp / n <= 0
                loss, violation = fp / self.m, self.value - tp
            else:  # -tp / n  s.t.  (a fp - (1 - a) tp) / n <= 0
                a = self.value
                loss, violation = -tp, a * fp / self.n - (1 - a) * tp
            state = cooper.ConstraintState(violation=violation.reshape(1))
            return cooper.CMPState(loss=loss, observed_constraints={self.rate: state})

    return RateHingeProblem


@functools.cache
def _cooper_problem_class() -> type:
    cooper = _require("cooper")

    class FBetaLPProblem(cooper.ConstrainedMinimizationProblem):
        """LP (3') with per-sample indexed multipliers (see ``cooper_fbeta_problem``)."""

        def __init__(self, labels: Tensor, beta: float, eps_init: float, tau_init: float):
            super().__init__()
            self.N, self.n, self.beta = labels.numel(), int(labels.sum()), beta
            # slot[k] = position of dataset index k among the positives, -1 for a negative
            self.slot = torch.full((self.N,), -1, dtype=torch.long)
            self.slot[labels == 1] = torch.arange(self.n)
            self.eps = torch.nn.Parameter(torch.tensor(eps_init))
            self.tau = torch.nn.Parameter(torch.full((self.n,), tau_init))
            ineq, eq = cooper.ConstraintType.INEQUALITY, cooper.ConstraintType.EQUALITY
            self.tau_le_u = cooper.Constraint(
                ineq, multiplier=cooper.multipliers.IndexedMultiplier(num_constraints=self.n)
            )
            self.tau_le_eps = cooper.Constraint(
                ineq, multiplier=cooper.multipliers.IndexedMultiplier(num_constraints=self.n)
            )
            self.eps_nonneg = cooper.Constraint(
                ineq, multiplier=cooper.multipliers.DenseMultiplier(num_constraints=1)
            )
            self.mean_tau = cooper.Constraint(
                eq, multiplier=cooper.multipliers.DenseMultiplier(num_constraints=1)
            )

        def primal_parameters(self) -> list[torch.nn.Parameter]:
            return [self.eps, self.tau]

        def compute_cmp_state(self, scores: Tensor, idx: Tensor) -> Any:
            slot = self.slot.to(idx.device)[idx]
            is_pos = slot >= 0
            scale = self.N / (self.n * idx.numel())
            loss = self.beta**2 * self.eps + scale * torch.relu(self.eps + scores[~is_pos]).sum()
            s = slot[is_pos]
            states = {
                self.tau_le_u: cooper.ConstraintState(
                    violation=scale * (self.tau[s] - scores[is_pos]), constraint_features=s
                ),
                self.tau_le_eps: cooper.ConstraintState(
                    violation=scale * (self.tau[s] - self.eps), constraint_features=s
                ),
                self.eps_nonneg: cooper.ConstraintState(violation=-self.eps.reshape(1)),
                self.mean_tau: cooper.ConstraintState(violation=(self.tau.mean() - 1).reshape(1)),
            }
            return cooper.CMPState(loss=loss, observed_constraints=states)

    return FBetaLPProblem


# --- LibAUC ---------------------------------------------------------------------------------------


def libauc_aucm_pesg(
    params: Iterable[torch.nn.Parameter],
    *,
    margin: float = 1.0,
    lr: float = 0.1,
    epoch_decay: float = 2e-3,
    weight_decay: float = 1e-5,
    momentum: float = 0.9,
    imratio: float | None = None,
    version: str = "v1",
    device: str | torch.device | None = None,
) -> tuple[Any, Any]:
    r"""LibAUC's AUC-margin loss and its PESG optimizer, configured as LibAUC documents them.

    ``AUCMLoss`` (``v1``, ``p`` the positive ratio, ``a, b, alpha`` its own parameters, ``h`` the
    scores, which LibAUC expects in ``[0, 1]``: pass ``torch.sigmoid(logits)``):

    $$
    (1-p)\,\mathbb{E}[(h - a)^2 1_{y=1}] + p\,\mathbb{E}[(h - b)^2 1_{y=0}]
    + 2\alpha\big(p(1-p)m + \mathbb{E}[p h 1_{y=0} - (1-p) h 1_{y=1}]\big) - p(1-p)\alpha^2,
    $$

    whose min over ``a, b`` and max over ``alpha >= 0`` is
    ``p(1-p) [Var_+ h + Var_- h + max(0, m - (mean_+ h - mean_- h))^2]``, the class-mean form of
    the pairwise squared hinge. ``PESG`` descends on the model and ``(a, b)``, ascends on
    ``alpha``. Returns ``(loss_fn, optimizer)``; call ``optimizer.update_regularizer(decay)`` at the
    epoch ends as LibAUC's examples do. ``device``: where ``a, b, alpha`` live (LibAUC's default:
    CUDA when available).

    Args:
        params: the model's parameters (PESG steps them with ``a, b, alpha``).
        margin: the AUC margin ``m`` (``>= 0``).
        lr: PESG's learning rate (``> 0``).
        epoch_decay: PESG's ``epoch_decay`` (``>= 0``), the pull towards the reference point.
        weight_decay: PESG's weight decay (``>= 0``).
        momentum: PESG's momentum (``>= 0``).
        imratio: the positive ratio ``p`` (``None``: LibAUC estimates it on each batch).
        version: ``"v1"`` or ``"v2"``, LibAUC's two forms of ``AUCMLoss``.
        device: where ``a, b, alpha`` live (``None``: LibAUC's default).

    Examples:
        >>> import torch
        >>> from reparam.baselines import libauc_aucm_pesg
        >>> u = torch.nn.Parameter(torch.zeros(4))  # a score per sample, for the example
        >>> loss_fn, opt = libauc_aucm_pesg([u], imratio=0.5, device="cpu")
        >>> y = torch.tensor([1.0, 0.0, 1.0, 0.0])
        >>> loss = loss_fn(torch.sigmoid(u), y)  # a = b = alpha = 0: (1/2)^2 / 2
        >>> round(loss.item(), 4)
        0.125
        >>> for _ in range(3):  # PESG: descent on u, a, b, ascent on alpha
        ...     opt.zero_grad(); loss_fn(torch.sigmoid(u), y).backward(); opt.step()
        >>> bool(u[0] > u[1]), round(loss_fn.alpha.item(), 2)  # positives above negatives
        (True, 0.49)
    """
    losses = _require("libauc.losses")
    optimizers = _require("libauc.optimizers")
    version = check_choice("version", version, ("v1", "v2"))
    loss_fn = losses.AUCMLoss(
        margin=check_positive("margin", margin, allow_zero=True),
        imratio=imratio,
        version=version,
        device=device,
    )
    opt = optimizers.PESG(
        list(params),
        loss_fn=loss_fn,
        lr=check_positive("lr", lr),
        epoch_decay=check_positive("epoch_decay", epoch_decay, allow_zero=True),
        weight_decay=check_positive("weight_decay", weight_decay, allow_zero=True),
        momentum=check_positive("momentum", momentum, allow_zero=True),
    )
    return loss_fn, opt
