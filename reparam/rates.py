r"""Rate objectives by the same reparameterization (method note sec. 8): ``PrecisionAtRecall``
(8a), ``RecallAtPrecision`` (8b) and ``ROCAUC`` (8c, a grid of point metrics).

Recall and precision are rates, so unlike F-beta they need no Charnes-Cooper scaling (no ``eps``):
the true positives are bounded below by ``sum tau_i`` with ``tau_i <= min(u_i, 1)`` (dualized, one
``lambda_i`` per positive; with the box it is the same constraint as ``tau_i <= u_i``, but its
Lagrangian term stops pulling a score up at 1) and ``tau_i <= 1`` (the box ``C_box``, projected by
``min(tau, 1)``), the
false positives above by ``fp+(u) = sum_{S-} max(0, 1 + u_j)``. Each rate constraint has one
multiplier ``nu >= 0`` (per grid point for ROC-AUC). Every per-sample sum is estimated on the
minibatch with the factor ``N / B`` (unbiased, as for F-beta). With ``dual_every="step"`` (the
default of P@R and R@P) the multipliers move at every batch, before its loss: ``nu`` on the batch's
estimate of the violation, then each of the batch's positives takes the saddle point of its own
block, ``tau_i = min(u_i, 1)`` and ``lambda_i = c(nu)`` (``L`` is linear in ``tau_i`` with the
coefficient ``lambda_i - c(nu)``). Once per epoch, on the remembered scores (the paper's schedule, and
with ``"step"`` the correction):

$$
\lambda_i \leftarrow \max(0, \lambda_i + \eta_\lambda (\tau_i - \min(u_i, 1))),\qquad
\nu \leftarrow \min(\nu_{\max}, \max(0, \nu + \eta_\nu\, \mathrm{violation})).
$$

P@R and R@P also learn a decision threshold (the cut of the remembered scores that meets the target)
and calibrate one on held-out scores (docs/rates.md).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from . import _checks
from . import rate_functional as R
from .rate_base import (
    PointRateObjective,
    RateObjective,
    recall_precision_stats,
)

# RecallAtPrecision reports a target as out of reach when no rescaling of the remembered scores has
# certified it for INFEASIBLE_PATIENCE epochs and INFEASIBLE_MIN_BATCHES optimizer steps (feasible
# toys needed up to ~30 epochs / ~200 steps to get there), checking after epoch 1 and then every
# INFEASIBLE_CHECK_EVERY epochs (the check sorts the scores: ~10 ms per 1e5 samples)
INFEASIBLE_PATIENCE = 20
INFEASIBLE_MIN_BATCHES = 500
INFEASIBLE_CHECK_EVERY = 5


class PrecisionAtRecall(PointRateObjective):
    r"""Best precision at recall ``>= recall`` (8a of method note sec. 8); always feasible.

    $$
    \begin{aligned}
    &\min\ \tfrac1n fp^+(u)\quad\text{s.t.}\quad \tau_i \le u_i,\ \mathrm{mean}_{S^+}\tau \ge r,
    \ \tau \le 1;\\
    &L = \tfrac1n fp^+(u) + \tfrac1n \textstyle\sum \lambda_i(\tau_i - u_i) + \nu (r - \mathrm{mean}\,\tau)
    \end{aligned}
    $$

    Minibatch: ``L_B = (N/(nB)) [sum_{B-} max(0, 1 + u_j) + sum_{B+} ((lambda_i - nu) tau_i -
    lambda_i min(u_i, 1))] + nu r`` (``E[L_B] = L``). Dual step: ``nu <- max(0, nu + eta (r - mean tau))``.

    Args:
        shape_labels: ``(N,)`` integer labels; ``positive_class`` is ``S+``, every other is ``S-``.
        recall: the target ``r`` in (0, 1).
        **options: the options every rate objective takes (``positive_class``, ``schedule``,
            ``dual_lr_lambda``, ``dual_lr_nu``, ``nu_max``, ``nu_init``,
            ``lambda_init``; see ``RateObjective``). The stationary ``lambda_init`` is ``nu_init``.

    Examples:
        >>> import torch
        >>> from reparam import PrecisionAtRecall
        >>> reg = PrecisionAtRecall(torch.tensor([0, 1, 1, 0, 1]), recall=0.8)
        >>> scores = torch.tensor([0.2, 0.9], requires_grad=True)  # samples 0 and 2
        >>> opt = torch.optim.SGD([scores, *reg.parameters()], lr=0.1)
        >>> loss = reg(scores, torch.tensor([0, 2]))
        >>> loss.backward(); opt.step(); reg.after_step_()
        >>> reg.end_epoch_()
        >>> int(reg.epoch), reg.recall, tuple(reg.nu.shape)
        (1, 0.8, (1,))
    """

    _saddle_tau_vanishes = True  # (lambda_i - nu) tau_i = 0 at the saddle lambda_i = nu

    def __init__(self, shape_labels: object, *, recall: float, **options: Any) -> None:
        recall = _checks.number("recall", recall, 0, strict=True, hi=1, strict_hi=True)
        super().__init__(shape_labels, **options)
        self.recall = recall
        self._init_rows(columns=0, stationary_lambda=self._nu_init)

    def _loss(self, u: Tensor, idx: Tensor, rows: Tensor) -> Tensor:
        is_pos, t, lam, scale = self._batch_rows(u, idx, rows)
        return R.precision_at_recall_minibatch(
            t, lam, self._nu_now()[0], u, is_pos, scale, self.recall
        )

    def _batch_violation(self, z: Tensor, is_pos: Tensor) -> Tensor:
        """``r - (N / (n B)) sum_{B+} min(u_i, 1)``."""
        tp = torch.where(is_pos, R.capped(z), 0).sum()
        return self.recall - self._scale_pos(self._batch_of(z)) * tp  # (0-dim: broadcast)

    def _stationary_lambda(self) -> Tensor:
        return self.nu

    @property
    def multiplier_scale(self) -> float:
        """The multiplier's scale ``m / n`` (``RateObjective.multiplier_scale``).

        The objective ``fp+ / n`` is ``m / n`` times a false-positive rate, and the constraint a
        recall."""
        return self.n_negatives / self.layout.n_pos_list[0]

    def _select_threshold(self, u_pos: Tensor, u_neg: Tensor) -> R.RateThreshold:
        return R.threshold_at_recall(u_pos, u_neg, self.recall, self._comm)

    def _capped_targets(self) -> Tensor:
        return R.capped(self.scores[self.layout.pos_index, 0])

    def _violation(self) -> Tensor:
        return (self.recall - self._mean(self.tau.detach().float())).reshape(1)

    def _objective_stats(self) -> dict[str, float | int | list | bool | None]:
        """``certified_recall`` / ``certified_precision``: bounds on the recall and precision of
        ``u > 0`` over the scored samples (sound: method note sec. 8); ``train_recall`` /
        ``train_precision``: their true values; ``nu``, the violation ``r - mean tau``."""
        return recall_precision_stats(self) | self._threshold_stats() | self._rate_stats()

    def _target_repr(self) -> str:
        return f"recall={self.recall}"


class RecallAtPrecision(PointRateObjective):
    r"""Best recall at precision ``>= precision`` (8b of method note sec. 8).

    $$
    \begin{aligned}
    &\max\ \mathrm{mean}_{S^+}\tau\quad\text{s.t.}\quad \tau_i \le u_i,\
    a\, fp^+(u) \le (1 - a) \textstyle\sum \tau,\ \tau \le 1;\\
    &L = -\mathrm{mean}\,\tau + \tfrac1n \textstyle\sum \lambda_i(\tau_i - u_i)
        + \nu\,(a\, fp^+(u)/n - (1 - a)\,\mathrm{mean}\,\tau)
    \end{aligned}
    $$

    Minibatch: ``L_B = (N/(nB)) [sum_{B+} ((lambda_i - 1 - nu (1 - a)) tau_i - lambda_i min(u_i, 1)) +
    nu a sum_{B-} max(0, 1 + u_j)]``. Dual step on the remembered scores.

    On overlapping data the target may be out of reach: no linear head meets the precision under
    the hinge bounds (the LP is infeasible: ``tau_i <= u_i`` forbids the trivial ``tau = 0`` unless
    the negatives' scores are ``<= -1`` while the positives' sum stays ``>= 0``), so the constraint
    stays violated while ``nu`` grows without limit. ``stats()["certificate_out_of_reach"]`` says so
    when for ``INFEASIBLE_PATIENCE`` epochs and ``INFEASIBLE_MIN_BATCHES`` steps no rescaling
    ``c u + d`` of the remembered scores has certified the target. The target itself may still be
    met at the learned ``decision_threshold`` (the certificate counts a positive fully only at
    ``u >= 1``): only when it is not, ``stats()["infeasible_suspected"]`` is true and a warning
    naming both is issued once. A head still turning toward a feasible direction can be flagged
    too (on separable toys the scores certified the target after up to ~200 steps): the margin in
    ``stats()`` tells. Remedies: ``nu_max`` (caps ``nu``: the objective becomes a penalty) or a
    lower target. Same arguments as ``PrecisionAtRecall``, with ``precision`` the target ``a``
    in (0, 1) (the stationary ``lambda_init`` is ``1 + nu_init (1 - a)``).

    Args:
        shape_labels: ``(N,)`` integer labels; ``positive_class`` is ``S+``, every other is ``S-``.
        precision: the target ``a`` in (0, 1).
        **options: the options of every rate objective, as for ``PrecisionAtRecall``.

    Examples:
        >>> import torch
        >>> from reparam import RecallAtPrecision
        >>> reg = RecallAtPrecision(torch.tensor([0, 1, 1, 0, 1]), precision=0.8)
        >>> scores = torch.tensor([0.2, 0.9], requires_grad=True)  # samples 0 and 2
        >>> opt = torch.optim.SGD([scores, *reg.parameters()], lr=0.1)
        >>> loss = reg(scores, torch.tensor([0, 2]))
        >>> loss.backward(); opt.step(); reg.after_step_()
        >>> reg.end_epoch_()
        >>> int(reg.epoch), reg.precision, reg.infeasible_suspected
        (1, 0.8, False)
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
        is_pos, t, lam, scale = self._batch_rows(u, idx, rows)
        return R.recall_at_precision_minibatch(
            t, lam, self._nu_now()[0], u, is_pos, scale, self.precision
        )

    def _batch_violation(self, z: Tensor, is_pos: Tensor) -> Tensor:
        """``(N / (n B)) [a sum_{B-} max(0, 1 + u_j) - (1 - a) sum_{B+} min(u_i, 1)]``."""
        a = self.precision
        fp = torch.where(is_pos, 0, R.hinge_fp(z)).sum()
        tp = torch.where(is_pos, R.capped(z), 0).sum()
        return self._scale_pos(self._batch_of(z)) * (a * fp - (1 - a) * tp)  # (0-dim)

    def _stationary_lambda(self) -> Tensor:
        return 1 + self.nu * (1 - self.precision)

    def _select_threshold(self, u_pos: Tensor, u_neg: Tensor) -> R.RateThreshold:
        return R.threshold_at_precision(u_pos, u_neg, self.precision, self._comm)

    def _capped_targets(self) -> Tensor:
        return R.capped(self.scores[self.layout.pos_index, 0])

    def _violation(self) -> Tensor:
        """``a fp+/n - (1 - a) mean tau``, ``fp+`` from the scored negatives (scaled to all)."""
        _, u_neg = self._split_scores()
        scored = self._comm.total(u_neg.numel())  # (sharded: every process's)
        fp = self._mean(R.hinge_fp(u_neg)) * self.n_negatives if scored else torch.zeros(())
        a, n = self.precision, self.layout.n_pos_list[0]
        return (a * fp / n - (1 - a) * self._mean(self.tau.detach().float())).reshape(1)

    def _dual_step_(self) -> None:
        """The ``nu`` step, then (after epoch 1, then every ``INFEASIBLE_CHECK_EVERY`` epochs) the
        certificate's watch: can any rescaling ``c u + d`` of the remembered scores certify the
        precision (``rate_functional.best_rescaled_precision_margin >= 0``)? The warning waits
        for the epoch's decision threshold (``_end_epoch_body_``)."""
        super()._dual_step_()
        done = int(self.epoch) + 1  # epochs completed, this one included
        if done > 1 and done % INFEASIBLE_CHECK_EVERY:
            return
        u_pos, u_neg = self._split_scores()
        margin = R.best_rescaled_precision_margin(
            u_pos,
            u_neg,
            self.precision,
            n_pos=int(self.layout.n_pos_list[0]),
            n_neg=int(self.n_negatives),
            comm=self._comm,
        )
        self.certifiable_margin.fill_(float("-inf") if margin is None else margin)
        if margin is None or margin >= 0:
            self.uncertifiable_since.fill_(-1)
        elif int(self.uncertifiable_since[0]) < 0:
            self.uncertifiable_since.copy_(torch.stack([self.epoch, self.batches]))

    def _end_epoch_body_(self) -> None:
        """The base's epoch end (the ``nu`` step and the certificate's watch, then the decision
        threshold); then the alarm, once: the certificate out of reach and the target not met
        at the learned threshold either."""
        super()._end_epoch_body_()
        done = int(self.epoch) + 1  # epochs completed, this one included
        if bool(self.threshold_met) or not self._certificate_lost(done, int(self.batches)):
            return
        stats = self._threshold_stats()
        self._warn_once(
            "infeasible",
            f"RecallAtPrecision: no cut of the head's remembered training scores reaches "
            f"precision {self.precision} (the best: {stats['train_precision_at_threshold']:.4g} "
            f"at recall {stats['train_recall_at_threshold']:.4g}), and for "
            f"{done - int(self.uncertifiable_since[0])} epochs no rescaling of them "
            f"certifies it under the hinge bounds either (best margin "
            f"{float(self.certifiable_margin):.4g} < 0): the target may be out of reach for this "
            f"model, and nu then grows without limit. Lower the target or cap nu (nu_max; method "
            f"note sec. 8).",
        )

    def _certificate_lost(self, epochs: int, batches: int) -> bool:
        since_epoch, since_batches = (int(v) for v in self.uncertifiable_since)
        return (
            since_epoch >= 0
            and (epochs - since_epoch >= INFEASIBLE_PATIENCE)
            and (batches - since_batches >= INFEASIBLE_MIN_BATCHES)
        )

    @property
    def certificate_out_of_reach(self) -> bool:
        """Whether no rescaling of the scores has certified the target under the hinge bounds.

        For ``INFEASIBLE_PATIENCE`` epochs and ``INFEASIBLE_MIN_BATCHES`` steps: ``nu`` then
        grows without limit (cap it with ``nu_max``)."""
        return self._certificate_lost(int(self.epoch), int(self.batches))

    @property
    def infeasible_suspected(self) -> bool:
        """Whether the target looks out of reach, not only its certificate.

        ``certificate_out_of_reach``, and no cut of the remembered scores met the target at the
        last epoch end (``threshold_met`` false)."""
        return self.certificate_out_of_reach and not bool(self.threshold_met)

    def _objective_stats(self) -> dict[str, float | int | list | bool | None]:
        """As ``PrecisionAtRecall._objective_stats`` (the violation is the precision one),
        plus ``certifiable_margin`` (the best rescaled margin, ``>= 0``: the direction of the
        scores can meet the target), ``certificate_out_of_reach`` and ``infeasible_suspected``."""
        margin = float(self.certifiable_margin)
        return (
            recall_precision_stats(self)
            | self._threshold_stats()
            | self._rate_stats()
            | {
                "certifiable_margin": None if margin == float("-inf") else margin,
                "certificate_out_of_reach": self.certificate_out_of_reach,
                "infeasible_suspected": self.infeasible_suspected,
            }
        )

    def _target_repr(self) -> str:
        return f"precision={self.precision}"


class ROCAUC(RateObjective):
    r"""ROC-AUC on a grid of ``K`` false-positive rates ``t_k = (k - 1/2)/K``.

    The objective (8c) of method note sec. 8: ``AUC ~ (1/K) sum_k TPR at FPR <= t_k``.

    Point ``k`` thresholds the head's one score with its own offset ``b_k`` (``offsets``, an
    ``nn.Parameter`` owned here: the head keeps one output) and has its own ``tau_k`` (``tau``
    is ``(n, K)``), ``lambda_k`` and ``nu_k``:

    $$
    \max\ \tfrac1K \textstyle\sum_k \mathrm{mean}_i \tau_{ik}\quad\text{s.t.}\quad
    \tau_{ik} \le u_i + b_k,\ fp^+(u + b_k)/m \le t_k,\ \tau \le 1.
    $$

    Minibatch: ``L_B = (1/K) sum_k [(N/(nB)) sum_{B+} ((lambda_ik - 1) tau_ik - lambda_ik min(u_i +
    b_k, 1)) + nu_k (N/(mB)) sum_{B-} max(0, 1 + u_j + b_k) - nu_k t_k]``. ``stats()`` reports the
    exact AUC of the remembered scores (Mann-Whitney), a certified lower bound on it from the
    grid points, and the true TPR / FPR at the learned thresholds ``u + b_k > 0``.

    Args:
        shape_labels: ``(N,)`` integer labels; ``positive_class`` is ``S+``, every other is ``S-``.
        grid: ``K >= 1``, the grid points (in place of ``PrecisionAtRecall``'s target).
        offset_init: the initial ``b_k``.
        **options: the options of every rate objective, as for ``PrecisionAtRecall`` (the
            stationary ``lambda_init`` is 1).

    Examples:
        >>> import torch
        >>> from reparam import ROCAUC
        >>> reg = ROCAUC(torch.tensor([0, 1, 1, 0, 1]), grid=4)
        >>> scores = torch.tensor([0.2, 0.9], requires_grad=True)  # samples 0 and 2
        >>> opt = torch.optim.SGD([scores, *reg.parameters()], lr=0.1)
        >>> loss = reg(scores, torch.tensor([0, 2]))
        >>> loss.backward(); opt.step(); reg.after_step_()
        >>> reg.end_epoch_()
        >>> int(reg.epoch), tuple(reg.nu.shape), tuple(reg.offsets.shape)
        (1, (4,), (4,))
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
        if self.sharded:  # replicated: its gradient is the mean over the processes
            self.offsets.register_post_accumulate_grad_hook(self._average_grad_)
        self.register_buffer("fpr_targets", R.fpr_grid(grid).float())

    _default_dual_every = "epoch"

    def _loss(self, u: Tensor, idx: Tensor, rows: Tensor) -> Tensor:
        z_now = u[:, None] + self.offsets.detach()[None, :]  # the saddle's scores (no grad)
        is_pos, t, lam, s_pos = self._batch_rows(z_now, idx, rows)
        z = u[:, None] + self.offsets[None, :]  # (B, K): the score at every grid threshold
        s_neg = self.n_samples / (self.n_negatives * self._batch_of(idx))
        return R.roc_auc_minibatch(
            t, lam, self._nu_now(), z, is_pos, s_pos, s_neg, self.fpr_targets
        )

    def _batch_violation(self, z: Tensor, is_pos: Tensor) -> Tensor:
        """``(N / (m B)) sum_{B-} max(0, 1 + u_j + b_k) - t_k`` per grid point."""
        fp = torch.where(is_pos[:, None], 0, R.hinge_fp(z)).sum(0)
        return self.n_samples / (self.n_negatives * self._batch_of(z)) * fp - self.fpr_targets

    def _stationary_lambda(self) -> Tensor:
        return torch.ones_like(self.nu)

    def _capped_targets(self) -> Tensor:
        u_pos = self.scores[self.layout.pos_index, 0]
        return R.capped(u_pos[:, None] + self.offsets.detach().float()[None, :])

    def _fpr_bounds(self) -> Tensor:
        """``fp+(u + b_k) / m`` per grid point, from the scored negatives."""
        _, u_neg = self._split_scores()
        if self._comm.total(u_neg.numel()) == 0:
            return torch.ones_like(self.fpr_targets)
        return self._column_mean(
            R.hinge_fp(u_neg[:, None] + self.offsets.detach().float()[None, :])
        )

    def _column_mean(self, x: Tensor) -> Tensor:
        """``x.mean(0)`` over every process's rows (one process: ``x.mean(0)`` itself)."""
        if self._comm.world == 1:
            return x.mean(0)
        return (self._comm.sum(x.double().sum(0)) / self._comm.total(x.shape[0])).to(x.dtype)

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
            "train_auc": R.roc_auc(u_pos, u_neg, self._comm),
            "certified_auc": None,
            "grid_tpr_mean": None,
            "fpr_excess_max": None,
        }
        if self._comm.total(u_pos.numel()) and self._comm.total(u_neg.numel()):
            z_pos, z_neg = u_pos[:, None] + b, u_neg[:, None] + b
            tpr_lower = self._column_mean(torch.clamp(z_pos, max=1)).clamp_min(0)
            out["certified_auc"] = R.certified_auc(tpr_lower, self._fpr_bounds())
            out["grid_tpr_mean"] = float(self._mean((z_pos > 0).float()))
            fpr = self._column_mean((z_neg > 0).float())
            out["fpr_excess_max"] = float((fpr - self.fpr_targets).max())
        return out | self._rate_stats() | {"offsets": b.tolist(), "nu_per_point": self.nu.tolist()}

    def _target_repr(self) -> str:
        return f"grid={self.grid}"


__all__ = ["ROCAUC", "PrecisionAtRecall", "RecallAtPrecision"]
