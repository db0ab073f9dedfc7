r"""Rate objectives by the same reparameterization (docs/method.md sec. 8): ``PrecisionAtRecall``
(8a), ``RecallAtPrecision`` (8b) and ``ROCAUC`` (8c, a grid of point metrics).

Recall and precision are rates, so unlike F-beta they need no Charnes-Cooper scaling (no ``eps``):
the true positives are bounded below by ``sum tau_i`` with ``tau_i <= min(u_i, 1)`` (dualized, one
``lambda_i`` per positive; with the box it is the same constraint as ``tau_i <= u_i``, but its
Lagrangian term stops pulling a score up at 1) and ``tau_i <= 1`` (the box ``C_box``, projected by
``min(tau, 1)``), the
false positives above by ``fp+(u) = sum_{S-} max(0, 1 + u_j)``. Each rate constraint has one
multiplier ``nu >= 0`` (per grid point for ROC-AUC). Every per-sample sum is estimated on the
minibatch with the factor ``N / B`` (unbiased, as for F-beta), and the dual step runs once per
epoch on the remembered scores:

.. math::
    \lambda_i \leftarrow \max(0, \lambda_i + \eta_\lambda (\tau_i - \min(u_i, 1))),\qquad
    \nu \leftarrow \min(\nu_{\max}, \max(0, \nu + \eta_\nu\, \mathrm{violation})).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from . import _checks
from . import rate_functional as R
from .base import ReparamRegularizer

# RecallAtPrecision reports a target as out of reach when no rescaling of the remembered scores has
# certified it for INFEASIBLE_PATIENCE epochs and INFEASIBLE_MIN_BATCHES optimizer steps (feasible
# toys needed up to ~30 epochs / ~200 steps to get there), checking after epoch 1 and then every
# INFEASIBLE_CHECK_EVERY epochs (the check sorts the scores: ~10 ms per 1e5 samples)
INFEASIBLE_PATIENCE = 20
INFEASIBLE_MIN_BATCHES = 500
INFEASIBLE_CHECK_EVERY = 5
# dual_every: "step" (the per-sample block at its saddle at every touch, nu stepped on every batch,
# the exact epoch-end step as the correction) or "epoch" (the paper's Algorithm 3 schedule)
DUAL_EVERY = ("step", "epoch")
# the per-step nu step on the batch's estimate of the violation (docs/rates.md: measured on real
# MNIST, 390 steps an epoch, against 0.01 and 0.03)
DEFAULT_NU_STEP = 0.1


class _RateObjective(ReparamRegularizer):
    """Shared by the rate objectives: ``tau`` in the box ``tau <= 1``, multipliers ``nu >= 0``
    with an optional cap, the per-batch gathers. Its keyword arguments are the options every rate
    objective takes (each subclass adds its target and passes the rest through ``**options``).

    Args:
        shape_labels: ``(N,)`` integer labels; ``positive_class`` is ``S+``, every other is ``S-``.
        projection, inline_strength: as for ``FBetaRegularizer`` (the projection is onto
            ``tau <= 1``: ``min(tau, 1)``, or with ``inline_strength = s > 0`` the smooth
            ``tau - s softplus((tau - 1)/s)``).
        dual_lr_lambda, dual_lr_nu: constant dual step sizes (defaults: what converges on the
            fixed-feature problems of docs/rates.md with ``projection="inline"``); plain
            attributes, so a schedule is set from the user's loop.
        nu_max: cap on ``nu`` (``None``: no cap; with a cap the constraint becomes a penalty of
            bounded weight, the remedy for an unreachable target); nu_init: the initial ``nu``.
        lambda_init: initial ``lambda``; ``None``: the value that makes every ``tau_i`` stationary
            inside the box (``dL/dtau_i = 0``; docs/method.md sec. 8). With 0, the head gets no
            pull toward the positives until the dual steps have grown ``lambda``.
        dual_every: when the multipliers move (docs/method.md sec. 8). ``"step"``: at every
            batch, first the per-sample block, then ``nu``: each of the batch's positives gets the
            saddle point of its own ``(tau_i, lambda_i)`` given its fresh score and ``nu``
            (``tau_i = min(u_i, 1)``, ``lambda_i`` = the stationary value), then
            ``nu <- clip(nu + dual_lr_nu_step * violation_B)`` on the batch's unbiased estimate;
            the once-per-epoch step on the remembered scores stays as the correction.
            ``"epoch"``: only the once-per-epoch step (the paper's Algorithm 3). ``None``: the
            objective's default (``"step"``; ``"epoch"`` for ROC-AUC).
        dual_lr_nu_step: the per-step ``nu`` step size of ``dual_every="step"``.
    """

    _constrained_names = ("tau_param",)
    _default_dual_every = "step"
    # 3: the per-sample block's step ("dual_every"), the learned decision threshold
    _version = 3

    def __init__(
        self,
        shape_labels: object,
        *,
        positive_class: int = 1,
        projection: str = "inline",
        inline_strength: float = 0.0,
        dual_lr_lambda: float = 0.1,
        dual_lr_nu: float = 1.0,
        nu_max: float | None = None,
        nu_init: float = 1.0,
        lambda_init: float | None = None,
        dual_every: str | None = None,
        dual_lr_nu_step: float = DEFAULT_NU_STEP,
    ) -> None:
        if isinstance(positive_class, bool) or not isinstance(positive_class, int):
            raise ValueError(f"positive_class must be an int class id, got {positive_class!r}")
        if projection == "tracked":
            raise ValueError(
                "projection='tracked' tracks F-beta's shared threshold eps; a rate objective's "
                "box tau <= 1 has none (its projection is separable): use 'clip', which is "
                "then the exact projection at O(B) per step, or 'inline'"
            )
        super().__init__(
            shape_labels,
            positive_classes=(positive_class,),
            projection=projection,
            inline_strength=inline_strength,
            dual_lr_lambda=dual_lr_lambda,
        )
        self.positive_class = positive_class
        self.dual_lr_nu = _checks.number("dual_lr_nu", dual_lr_nu, 0)
        self.nu_max = math.inf if nu_max is None else _checks.number("nu_max", nu_max, 0)
        self._nu_init = _checks.number("nu_init", nu_init, 0, hi=self.nu_max)
        self._lambda_init = (
            None if lambda_init is None else _checks.number("lambda_init", lambda_init, 0)
        )
        self.dual_every = _checks.choice(
            "dual_every", self._default_dual_every if dual_every is None else dual_every, DUAL_EVERY
        )
        self.dual_lr_nu_step = _checks.number("dual_lr_nu_step", dual_lr_nu_step, 0)

    def _init_rows(self, columns: int, stationary_lambda: float) -> None:
        """``tau`` (parameter, 1), ``lambda`` (``lambda_init``, else ``stationary_lambda``) per
        positive, ``(n,)`` or ``(n, columns)``; ``nu`` per constraint. Called by the subclass."""
        n_pos = self.pos_index.numel()
        shape = (n_pos,) if columns == 0 else (n_pos, columns)
        lam = stationary_lambda if self._lambda_init is None else self._lambda_init
        self.tau_param = nn.Parameter(torch.ones(shape))
        self.register_buffer("lam", torch.full(shape, lam))
        self.register_buffer("nu", torch.full((max(columns, 1),), self._nu_init))

    @property
    def tau(self) -> Tensor:
        """The ``tau`` the loss uses (in mode ``"inline"``, ``min(tau_param, 1)``)."""
        return self._effective(0)

    @property
    def n_negatives(self) -> float:
        return self._n_neg_list[0]

    def _project(self, tau: Tensor, strength: float = 0.0) -> tuple[Tensor]:
        """``min(tau, 1)``; with ``strength s > 0`` the smooth ``tau - s softplus((tau - 1)/s)``
        (also ``<= min(tau, 1)``, so always feasible, and exact as ``s -> 0``)."""
        if strength > 0:
            return (tau - strength * torch.nn.functional.softplus((tau - 1) / strength),)
        return (torch.clamp(tau, max=1),)

    def _gather(self, idx: Tensor, slots: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(is_pos (B,), tau rows, lambda rows, scale N / (n B))`` for the batch (``slots``:
        its rows of ``tau``, ``-1`` for a negative). The box's projection is separable, so modes
        ``"inline"`` and ``"clip"`` project the batch's rows only (O(B); the same values and
        gradients as projecting all of ``tau``), and the graph keeps no reference to ``tau``
        itself: the per-step dual step may write its rows before an earlier batch's backward
        (gradient accumulation)."""
        is_pos = slots >= 0
        slots = slots.clamp_min(0)
        scale = self.n_samples / (self._n_pos_list[0] * idx.numel())
        rows = self.tau_param.index_select(0, slots)
        if self.projection == "inline":
            (rows,) = self._project(rows, strength=self.inline_strength)
        elif self.projection == "clip":
            rows = rows.clamp(max=1)
        return is_pos, rows, self.lam.index_select(0, slots), scale

    @torch.no_grad()
    def _step_duals_(self, z: Tensor, slots: Tensor) -> None:
        r"""``dual_every="step"``, before the batch's loss: ``nu`` steps on the batch's estimate
        of the violation, then each positive of the batch takes the saddle point of its own block
        given its fresh score ``z_i`` (``u_i``, or ``u_i + b_k``) and the new ``nu``. ``L`` is
        linear in ``tau_i`` with the coefficient ``lambda_i - c(nu)`` (``c = nu`` for P@R,
        ``1 + nu (1 - a)`` for R@P, 1 for ROC-AUC), so the block's saddle is
        ``lambda_i = c(nu)``, ``tau_i = min(z_i, 1)`` (docs/method.md sec. 8): the slack sits
        on its score and the score is pulled up with weight ``c(nu)``. O(B)."""
        if self.dual_every != "step":
            return
        z = z.detach().float()
        is_pos = slots >= 0
        violation = self._batch_violation(z, is_pos)
        # a new tensor, not an in-place write: an earlier batch's graph may hold the old nu
        self.nu = (self.nu + self.dual_lr_nu_step * violation).clamp(0, self.nu_max)
        rows = slots[is_pos].long()
        self.tau_param.index_copy_(0, rows, R.capped(z[is_pos]))
        stationary = self._stationary_lambda().to(self.lam.dtype)
        self.lam.index_copy_(0, rows, stationary.expand((rows.numel(), *self.lam.shape[1:])))

    def _batch_violation(self, z: Tensor, is_pos: Tensor) -> Tensor:
        """The batch's unbiased estimate of :meth:`_violation` (shaped like ``nu``)."""
        raise NotImplementedError

    def _stationary_lambda(self) -> Tensor:
        """``c(nu)``: the ``lambda`` that makes ``L`` flat in ``tau`` (shaped like ``nu``)."""
        raise NotImplementedError

    def _scale_pos(self, batch: int) -> float:
        return self.n_samples / (self._n_pos_list[0] * batch)

    def _clipped(self, position: int) -> Tensor:
        return self.tau_param.detach().clamp(max=1)

    def _dual_step_(self) -> None:
        """``nu <- min(nu_max, max(0, nu + dual_lr_nu violation))``."""
        self.nu.copy_((self.nu + self.dual_lr_nu * self._violation()).clamp(0, self.nu_max))

    def _violation(self) -> Tensor:
        raise NotImplementedError

    def _rate_stats(self) -> dict[str, float | int | list | bool | None]:
        return {
            "nu": float(self.nu.mean()),
            "nu_capped": bool((self.nu >= self.nu_max).any()),
            "rate_violation": float(self._violation().max()),
        }

    def extra_repr(self) -> str:
        return (
            f"n={self.n_samples}, positives={int(self._n_pos_list[0])}, {self._target_repr()}, "
            f"projection={self.projection!r}, nu_max={self.nu_max}"
        )

    def _target_repr(self) -> str:
        raise NotImplementedError


class _PointRateObjective(_RateObjective):
    """P@R and R@P: one target on the decisions ``u > t``, so besides the certificate of
    ``u > 0`` they learn a **decision threshold** of their own and can be calibrated on held-out
    scores (docs/rates.md).

    ``decision_threshold`` (buffer ``(1,)``): at every epoch end, the cut ``t`` whose decisions
    ``u > t`` on the remembered training scores meet the target with the best other rate
    (:meth:`_select_threshold`; ``0`` until the first epoch end). The hinge bounds count a positive
    fully only at ``u >= 1``, so the certified target at ``u > 0`` leaves the true rate there
    above it; the threshold makes the training decision tight.
    """

    def __init__(self, shape_labels: object, **options: Any) -> None:
        super().__init__(shape_labels, **options)
        self.register_buffer("decision_threshold", torch.zeros(1))
        self.register_buffer("threshold_met", torch.zeros((), dtype=torch.bool))

    def _end_epoch_body_(self) -> None:
        super()._end_epoch_body_()
        u_pos, u_neg = self._split_scores()
        if u_pos.numel():
            chosen = self._select_threshold(u_pos, u_neg)
            self.decision_threshold.fill_(chosen.threshold)
            self.threshold_met.fill_(chosen.met)

    def calibrate(self, scores: object, labels: object) -> R.RateThreshold:
        """The decision threshold chosen on held-out data (a validation split): the cut ``t``
        whose decisions ``u > t`` meet the target there with the best other rate -- for P@R the
        best precision with recall ``>= r``, for R@P the best recall with precision ``>= a``
        (none meets it: the most precise cut, ``met=False``). Returns ``RateThreshold(threshold,
        recall, precision, met)`` on those scores; the regularizer's state is not changed.

        Args:
            scores: the shape node's scores ``(M,)`` (or ``(M, 1)``), finite.
            labels: ``(M,)`` integer shape labels; ``positive_class`` is the positive.
        """
        if isinstance(scores, np.ndarray):
            scores = torch.from_numpy(scores)
        if not isinstance(scores, Tensor) or not scores.is_floating_point():
            raise ValueError(
                f"scores must be a floating tensor (M,), got {_checks.describe(scores)}"
            )
        u = scores.detach()
        if u.dim() == 2 and u.shape[1] == 1:
            u = u[:, 0]
        if u.dim() != 1 or u.numel() == 0:
            raise ValueError(
                f"scores must have shape (M,) or (M, 1) with M > 0, got {tuple(scores.shape)}"
            )
        y = _checks._int_vector("labels", labels, "class ids")
        if y.numel() != u.numel():
            raise ValueError(f"labels must have one entry per score ({u.numel()}), got {y.numel()}")
        if not bool(torch.isfinite(u).all()):
            raise ValueError(
                f"scores must be finite, got {int((~torch.isfinite(u)).sum())} non-finite"
            )
        pos = (y == self.positive_class).to(u.device)
        if not bool(pos.any()):
            raise ValueError(
                f"labels must contain positives (positive_class={self.positive_class}) to "
                f"calibrate on, got labels {sorted(set(y.tolist()))[:10]}"
            )
        return self._select_threshold(u[pos], u[~pos])

    def _threshold_stats(self) -> dict[str, float | bool | None]:
        """``decision_threshold`` and the recall / precision of ``u > decision_threshold`` on
        the remembered scores; ``threshold_met``: whether they meet the target."""
        u_pos, u_neg = self._split_scores()
        t = float(self.decision_threshold[0])
        recall, precision = R.recall_precision(u_pos - t, u_neg - t)
        return {
            "decision_threshold": t,
            "train_recall_at_threshold": recall,
            "train_precision_at_threshold": precision,
            "threshold_met": bool(self.threshold_met),
        }

    def _select_threshold(self, u_pos: Tensor, u_neg: Tensor) -> R.RateThreshold:
        raise NotImplementedError


class PrecisionAtRecall(_PointRateObjective):
    r"""Best precision at recall ``>= recall`` (8a of docs/method.md sec. 8); always feasible.

    .. math::
        \min\ \tfrac1n fp^+(u)\quad\text{s.t.}\quad \tau_i \le u_i,\ \mathrm{mean}_{S^+}\tau \ge r,
        \ \tau \le 1;\qquad
        L = \tfrac1n fp^+(u) + \tfrac1n \textstyle\sum \lambda_i(\tau_i - u_i) + \nu (r - \mathrm{mean}\,\tau)

    Minibatch: ``L_B = (N/(nB)) [sum_{B-} max(0, 1 + u_j) + sum_{B+} ((lambda_i - nu) tau_i -
    lambda_i min(u_i, 1))] + nu r`` (``E[L_B] = L``). Dual step: ``nu <- max(0, nu + eta (r - mean tau))``.

    Args:
        shape_labels: ``(N,)`` integer labels; ``positive_class`` is ``S+``, every other is ``S-``.
        recall: the target ``r`` in (0, 1).
        **options: the options every rate objective takes (``positive_class``, ``projection``,
            ``inline_strength``, ``dual_lr_lambda``, ``dual_lr_nu``, ``nu_max``, ``nu_init``,
            ``lambda_init``; see ``_RateObjective``). The stationary ``lambda_init`` is ``nu_init``.
    """

    def __init__(self, shape_labels: object, *, recall: float, **options: Any) -> None:
        recall = _checks.number("recall", recall, 0, strict=True, hi=1, strict_hi=True)
        super().__init__(shape_labels, **options)
        self.recall = recall
        self._init_rows(columns=0, stationary_lambda=self._nu_init)

    def _loss(self, u: Tensor, idx: Tensor, rows: Tensor) -> Tensor:
        self._step_duals_(u, rows)
        is_pos, t, lam, scale = self._gather(idx, rows)
        return R.precision_at_recall_minibatch(t, lam, self.nu[0], u, is_pos, scale, self.recall)

    def _batch_violation(self, z: Tensor, is_pos: Tensor) -> Tensor:
        """``r - (N / (n B)) sum_{B+} min(u_i, 1)``."""
        tp = torch.where(is_pos, R.capped(z), 0).sum()
        return (self.recall - self._scale_pos(z.shape[0]) * tp).reshape(1)

    def _stationary_lambda(self) -> Tensor:
        return self.nu

    def _select_threshold(self, u_pos: Tensor, u_neg: Tensor) -> R.RateThreshold:
        return R.threshold_at_recall(u_pos, u_neg, self.recall)

    def _lambda_targets(self) -> tuple[Tensor, Tensor]:
        return self.tau.detach().float(), R.capped(self.scores[self.pos_index, 0])

    def _violation(self) -> Tensor:
        return (self.recall - self.tau.detach().float().mean()).reshape(1)

    def _objective_stats(self) -> dict[str, float | int | list | bool | None]:
        """``certified_recall`` / ``certified_precision``: bounds on the recall and precision of
        ``u > 0`` over the scored samples (sound: docs/method.md sec. 8); ``train_recall`` /
        ``train_precision``: their true values; ``nu``, the violation ``r - mean tau``."""
        return _recall_precision_stats(self) | self._threshold_stats() | self._rate_stats()

    def _target_repr(self) -> str:
        return f"recall={self.recall}"


class RecallAtPrecision(_PointRateObjective):
    r"""Best recall at precision ``>= precision`` (8b of docs/method.md sec. 8).

    .. math::
        \max\ \mathrm{mean}_{S^+}\tau\quad\text{s.t.}\quad \tau_i \le u_i,\
        a\, fp^+(u) \le (1 - a) \textstyle\sum \tau,\ \tau \le 1;\qquad
        L = -\mathrm{mean}\,\tau + \tfrac1n \textstyle\sum \lambda_i(\tau_i - u_i)
            + \nu\,(a\, fp^+(u)/n - (1 - a)\,\mathrm{mean}\,\tau)

    Minibatch: ``L_B = (N/(nB)) [sum_{B+} ((lambda_i - 1 - nu (1 - a)) tau_i - lambda_i min(u_i, 1)) +
    nu a sum_{B-} max(0, 1 + u_j)]``. Dual step on the remembered scores.

    On overlapping data the target may be out of reach: no linear head meets the precision under
    the hinge bounds (the LP is infeasible: ``tau_i <= u_i`` forbids the trivial ``tau = 0`` unless
    the negatives' scores are ``<= -1`` while the positives' sum stays ``>= 0``), so the constraint
    stays violated while ``nu`` grows without limit. ``stats()["infeasible_suspected"]`` says so
    when for ``INFEASIBLE_PATIENCE`` epochs and ``INFEASIBLE_MIN_BATCHES`` steps no rescaling
    ``c u + d`` of the remembered scores has certified the target (a warning is issued once). A
    head still turning toward a feasible direction can be flagged too (on separable toys the
    scores certified the target after up to ~200 steps): the margin in ``stats()`` tells. Remedies:
    ``nu_max`` (caps ``nu``: the objective becomes a penalty) or a lower target. Same arguments as
    :class:`PrecisionAtRecall`, with ``precision`` the target ``a`` in (0, 1) (the stationary
    ``lambda_init`` is ``1 + nu_init (1 - a)``).
    """

    def __init__(self, shape_labels: object, *, precision: float, **options: Any) -> None:
        target = _checks.number("precision", precision, 0, strict=True, hi=1, strict_hi=True)
        super().__init__(shape_labels, **options)
        self.precision = target
        self._init_rows(columns=0, stationary_lambda=1 + self._nu_init * (1 - target))
        # (epochs, batches) when the checks started to fail (-1: the last check passed)
        self.register_buffer("uncertifiable_since", torch.full((2,), -1, dtype=torch.int64))
        # the last check's margin; -inf: not checked yet
        self.register_buffer("certifiable_margin", torch.full((), float("-inf")))

    def _loss(self, u: Tensor, idx: Tensor, rows: Tensor) -> Tensor:
        self._step_duals_(u, rows)
        is_pos, t, lam, scale = self._gather(idx, rows)
        return R.recall_at_precision_minibatch(t, lam, self.nu[0], u, is_pos, scale, self.precision)

    def _batch_violation(self, z: Tensor, is_pos: Tensor) -> Tensor:
        """``(N / (n B)) [a sum_{B-} max(0, 1 + u_j) - (1 - a) sum_{B+} min(u_i, 1)]``."""
        a = self.precision
        fp = torch.where(is_pos, 0, R.hinge_fp(z)).sum()
        tp = torch.where(is_pos, R.capped(z), 0).sum()
        return (self._scale_pos(z.shape[0]) * (a * fp - (1 - a) * tp)).reshape(1)

    def _stationary_lambda(self) -> Tensor:
        return 1 + self.nu * (1 - self.precision)

    def _select_threshold(self, u_pos: Tensor, u_neg: Tensor) -> R.RateThreshold:
        return R.threshold_at_precision(u_pos, u_neg, self.precision)

    def _lambda_targets(self) -> tuple[Tensor, Tensor]:
        return self.tau.detach().float(), R.capped(self.scores[self.pos_index, 0])

    def _violation(self) -> Tensor:
        """``a fp+/n - (1 - a) mean tau``, ``fp+`` from the scored negatives (scaled to all)."""
        _, u_neg = self._split_scores()
        fp = R.hinge_fp(u_neg).mean() * self.n_negatives if u_neg.numel() else torch.zeros(())
        a, n = self.precision, self._n_pos_list[0]
        return (a * fp / n - (1 - a) * self.tau.detach().float().mean()).reshape(1)

    def _dual_step_(self) -> None:
        """The ``nu`` step, then (after epoch 1, then every ``INFEASIBLE_CHECK_EVERY`` epochs) the
        infeasibility watch:
        can any rescaling ``c u + d`` of the remembered scores certify the precision
        (``rate_functional.best_rescaled_precision_margin >= 0``)? When not for
        ``INFEASIBLE_PATIENCE`` epochs and ``INFEASIBLE_MIN_BATCHES`` steps, say so (once)."""
        super()._dual_step_()
        done = int(self.epoch) + 1  # epochs completed, this one included
        if done > 1 and done % INFEASIBLE_CHECK_EVERY:
            return
        u_pos, u_neg = self._split_scores()
        margin = R.best_rescaled_precision_margin(
            u_pos,
            u_neg,
            self.precision,
            n_pos=int(self._n_pos_list[0]),
            n_neg=int(self.n_negatives),
        )
        self.certifiable_margin.fill_(float("-inf") if margin is None else margin)
        if margin is None or margin >= 0:
            self.uncertifiable_since.fill_(-1)
        elif int(self.uncertifiable_since[0]) < 0:
            self.uncertifiable_since.copy_(torch.stack([self.epoch, self.batches]))
        if self._suspected(done, int(self.batches)):
            self._warn_once(
                "infeasible",
                f"RecallAtPrecision: for {done - int(self.uncertifiable_since[0])} epochs no "
                f"rescaling of the head's scores certifies precision {self.precision} under the "
                f"hinge bounds (best margin {margin:.4g} < 0): the target may be out of reach for "
                f"this model, and nu then grows without limit. Lower the target or cap nu (nu_max; "
                f"docs/method.md sec. 8).",
            )

    def _suspected(self, epochs: int, batches: int) -> bool:
        since_epoch, since_batches = (int(v) for v in self.uncertifiable_since)
        return (
            since_epoch >= 0
            and (epochs - since_epoch >= INFEASIBLE_PATIENCE)
            and (batches - since_batches >= INFEASIBLE_MIN_BATCHES)
        )

    @property
    def infeasible_suspected(self) -> bool:
        """No rescaling of the scores has certified the target for ``INFEASIBLE_PATIENCE`` epochs
        and ``INFEASIBLE_MIN_BATCHES`` steps."""
        return self._suspected(int(self.epoch), int(self.batches))

    def _objective_stats(self) -> dict[str, float | int | list | bool | None]:
        """As :meth:`PrecisionAtRecall._objective_stats` (the violation is the precision one),
        plus ``certifiable_margin`` (the best rescaled margin, ``>= 0``: the direction of the
        scores can meet the target) and ``infeasible_suspected``."""
        margin = float(self.certifiable_margin)
        return (
            _recall_precision_stats(self)
            | self._threshold_stats()
            | self._rate_stats()
            | {
                "certifiable_margin": None if margin == float("-inf") else margin,
                "infeasible_suspected": self.infeasible_suspected,
            }
        )

    def _target_repr(self) -> str:
        return f"precision={self.precision}"


class ROCAUC(_RateObjective):
    r"""ROC-AUC on a grid of ``K`` false-positive rates ``t_k = (k - 1/2)/K`` (8c of
    docs/method.md sec. 8): ``AUC ~ (1/K) sum_k TPR at FPR <= t_k``.

    Point ``k`` thresholds the head's one score with its own offset ``b_k`` (``offsets``, an
    ``nn.Parameter`` owned here: the head keeps one output) and has its own ``tau_k`` (``tau``
    is ``(n, K)``), ``lambda_k`` and ``nu_k``:

    .. math::
        \max\ \tfrac1K \textstyle\sum_k \mathrm{mean}_i \tau_{ik}\quad\text{s.t.}\quad
        \tau_{ik} \le u_i + b_k,\ fp^+(u + b_k)/m \le t_k,\ \tau \le 1.

    Minibatch: ``L_B = (1/K) sum_k [(N/(nB)) sum_{B+} ((lambda_ik - 1) tau_ik - lambda_ik min(u_i +
    b_k, 1)) + nu_k (N/(mB)) sum_{B-} max(0, 1 + u_j + b_k) - nu_k t_k]``. ``stats()`` reports the
    exact AUC of the remembered scores (Mann-Whitney), a certified lower bound on it from the
    grid points, and the true TPR / FPR at the learned thresholds ``u + b_k > 0``.

    Args: as :class:`PrecisionAtRecall`, with ``grid`` = ``K >= 1`` instead of the target, and
    ``offset_init`` the initial ``b_k`` (the stationary ``lambda_init`` is 1).
    """

    def __init__(
        self, shape_labels: object, *, grid: int = 10, offset_init: float = 0.0, **options: Any
    ) -> None:
        if isinstance(grid, bool) or not isinstance(grid, int) or grid < 1:
            raise ValueError(f"grid must be an integer >= 1 (grid points K), got {grid!r}")
        offset_init = _checks.number("offset_init", offset_init)
        super().__init__(shape_labels, **options)
        self._init_rows(columns=grid, stationary_lambda=1.0)
        self.grid = grid
        self.offsets = nn.Parameter(torch.full((grid,), offset_init))
        self.register_buffer("fpr_targets", R.fpr_grid(grid).float())

    _default_dual_every = "epoch"

    def _loss(self, u: Tensor, idx: Tensor, rows: Tensor) -> Tensor:
        self._step_duals_(u[:, None] + self.offsets.detach()[None, :], rows)
        is_pos, t, lam, s_pos = self._gather(idx, rows)
        z = u[:, None] + self.offsets[None, :]  # (B, K): the score at every grid threshold
        s_neg = self.n_samples / (self.n_negatives * idx.numel())
        return R.roc_auc_minibatch(t, lam, self.nu, z, is_pos, s_pos, s_neg, self.fpr_targets)

    def _batch_violation(self, z: Tensor, is_pos: Tensor) -> Tensor:
        """``(N / (m B)) sum_{B-} max(0, 1 + u_j + b_k) - t_k`` per grid point."""
        fp = torch.where(is_pos[:, None], 0, R.hinge_fp(z)).sum(0)
        return self.n_samples / (self.n_negatives * z.shape[0]) * fp - self.fpr_targets

    def _stationary_lambda(self) -> Tensor:
        return torch.ones_like(self.nu)

    def _lambda_targets(self) -> tuple[Tensor, Tensor]:
        u_pos = self.scores[self.pos_index, 0]
        return self.tau.detach().float(), R.capped(
            u_pos[:, None] + self.offsets.detach().float()[None, :]
        )

    def _fpr_bounds(self) -> Tensor:
        """``fp+(u + b_k) / m`` per grid point, from the scored negatives."""
        _, u_neg = self._split_scores()
        if u_neg.numel() == 0:
            return torch.ones_like(self.fpr_targets)
        return R.hinge_fp(u_neg[:, None] + self.offsets.detach().float()[None, :]).mean(0)

    def _violation(self) -> Tensor:
        return self._fpr_bounds() - self.fpr_targets

    def _objective_stats(self) -> dict[str, float | int | list | bool | None]:
        """``train_auc``: the exact AUC of the scored samples' ``u``; ``certified_auc``: a lower
        bound on it from the grid points (``tpr >= mean min(1, u + b_k)``, ``fpr <= fp+(u + b_k)/m``);
        ``grid_tpr_mean``: the mean true TPR at the thresholds ``u + b_k > 0`` (the grid estimate
        of the AUC when their FPRs meet the targets); ``fpr_excess_max``: the largest true
        ``FPR_k - t_k``; ``offsets``, ``nu`` per grid point."""
        u_pos, u_neg = self._split_scores()
        b = self.offsets.detach().float()
        out: dict[str, float | int | list | bool | None] = {
            "train_auc": R.roc_auc(u_pos, u_neg),
            "certified_auc": None,
            "grid_tpr_mean": None,
            "fpr_excess_max": None,
        }
        if u_pos.numel() and u_neg.numel():
            z_pos, z_neg = u_pos[:, None] + b, u_neg[:, None] + b
            tpr_lower = torch.clamp(z_pos, max=1).mean(0).clamp_min(0)
            out["certified_auc"] = R.certified_auc(tpr_lower, self._fpr_bounds())
            out["grid_tpr_mean"] = float((z_pos > 0).float().mean())
            fpr = (z_neg > 0).float().mean(0)
            out["fpr_excess_max"] = float((fpr - self.fpr_targets).max())
        return out | self._rate_stats() | {"offsets": b.tolist(), "nu_per_point": self.nu.tolist()}

    def _target_repr(self) -> str:
        return f"grid={self.grid}"


def _recall_precision_stats(reg: _RateObjective) -> dict[str, float | None]:
    u_pos, u_neg = reg._split_scores()
    recall, precision = R.recall_precision(u_pos, u_neg)
    return {
        "certified_recall": R.certified_recall(u_pos),
        "certified_precision": R.certified_precision(u_pos, u_neg),
        "train_recall": recall,
        "train_precision": precision,
    }


__all__ = ["ROCAUC", "PrecisionAtRecall", "RecallAtPrecision"]
