r"""The base of the rate objectives (method note sec. 8): ``RateObjective`` holds what P@R,
R@P and ROC-AUC share (``tau`` in the box ``tau <= 1``, the multipliers ``nu``, the batch's rows,
the per-step dual step of ``dual_every="step"``), ``PointRateObjective`` what the two point targets
add (the learned ``decision_threshold``, ``calibrate``). The objectives are in ``reparam.rates``.

With ``dual_every="step"`` every batch, before its loss, steps ``nu`` on its unbiased estimate of
the violation and puts each of its positives' blocks at their saddle point given the fresh score
``z_i``:

$$
\nu \leftarrow \mathrm{clip}(\nu + \eta_{\nu,\mathrm{step}}\, \mathrm{violation}_B),\qquad
\tau_i = \min(z_i, 1),\qquad \lambda_i = c(\nu)
$$

(``L`` is linear in ``tau_i`` with the coefficient ``lambda_i - c(nu)``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from . import _checks
from . import rate_functional as R
from .base import ReparamRegularizer
from .options import EpochEnd, Inline, Tracked

# dual_every: "step" (the per-sample block at its saddle at every touch, nu stepped on every batch,
# the exact epoch-end step as the correction) or "epoch" (the paper's Algorithm 3 schedule)
DUAL_EVERY = ("step", "epoch")
# the per-step nu step at a multiplier scale of 1 (method note sec. 8, "The multiplier's step"):
# each objective multiplies it by the square root of its multiplier's scale (P@R: sqrt(m / n);
# R@P, ROC-AUC: 1), between the drift the optimal nu needs (the scale) and the noise of the batch's
# estimate of the violation (its square root); docs/rates.md: against a 9-point grid on real MNIST
# at 10 % and 1 % positives, and Cooper's hinge Lagrangian over its own grid
DEFAULT_NU_STEP = 0.1
# nu_rule: "additive" (nu += step * violation, the epoch end's step as the correction) or
# "normalized" (log nu += step * violation / its running RMS: the one rule that moves nu)
NU_RULES = ("additive", "normalized")
# the normalized rule: its default relative step, the decay of the violation's running mean square
# (the RMS of about the last 100 batches) and the floor that keeps nu > 0 (a product cannot
# leave 0)
NORMALIZED_NU_STEP = 0.005
NU_RMS_DECAY = 0.99
NU_FLOOR = 1e-6
# and the ceiling under any nu_max: at an unreachable target the product grows without limit, and
# by 1e6 times the multiplier's scale the constraint's term outweighs the objective's so far that a
# larger nu changes no decision (an overflow to inf would make the loss NaN)
NU_CEILING = 1e6


class RateObjective(ReparamRegularizer):
    """Shared by the rate objectives: ``tau`` in the box ``tau <= 1``, multipliers ``nu >= 0``
    with an optional cap, the per-batch gathers. Its keyword arguments are the options every rate
    objective takes (each subclass adds its target and passes the rest through ``**options``).

    Args:
        shape_labels: ``(N,)`` integer labels; ``positive_class`` is ``S+``, every other is ``S-``.
        schedule: ``Inline(strength)`` or ``EpochEnd()`` (``reparam.options``; the projection is
            onto ``tau <= 1``: ``min(tau, 1)``, or with ``strength = s > 0`` the smooth
            ``tau - s softplus((tau - 1)/s)``).
        dual_lr_lambda, dual_lr_nu: constant dual step sizes of the once-per-epoch step
            (defaults: what converges on the fixed-feature problems of docs/rates.md with
            ``Inline()``); plain attributes, so a schedule is set from the user's loop.
        nu_max: cap on ``nu`` (``None``: no cap; with a cap the constraint becomes a penalty of
            bounded weight, the remedy for an unreachable target); nu_init: the initial ``nu``.
        lambda_init: initial ``lambda``; ``None``: the value that makes every ``tau_i`` stationary
            inside the box (``dL/dtau_i = 0``; method note sec. 8). With 0, the head gets no
            pull toward the positives until the dual steps have grown ``lambda``.
        dual_every: when the multipliers move (method note sec. 8). ``"step"``: at every
            batch, first the per-sample block, then ``nu``: each of the batch's positives gets the
            saddle point of its own ``(tau_i, lambda_i)`` given its fresh score and ``nu``
            (``tau_i = min(u_i, 1)``, ``lambda_i`` = the stationary value), then
            ``nu <- clip(nu + dual_lr_nu_step * violation_B)`` on the batch's unbiased estimate;
            the once-per-epoch step on the remembered scores stays as the correction.
            ``"epoch"``: only the once-per-epoch step (the paper's Algorithm 3). ``None``: the
            objective's default (``"step"``; ``"epoch"`` for ROC-AUC).
        dual_lr_nu_step: the per-step ``nu`` step size of ``dual_every="step"``; ``None``:
            ``DEFAULT_NU_STEP`` times the square root of the multiplier's scale
            (``multiplier_scale``; method note sec. 8), so that it follows the class ratio;
            with ``nu_rule="normalized"``, ``NORMALIZED_NU_STEP``.
        nu_rule: how ``dual_every="step"`` moves ``nu`` (method note sec. 8, "The multiplier's
            rule"). ``"additive"``: ``nu <- clip(nu + dual_lr_nu_step * violation_B)``, and the
            epoch end's step at ``dual_lr_nu`` on the remembered scores. ``"normalized"``:
            ``log nu <- log nu + dual_lr_nu_step * violation_B / RMS(violation)`` (the running
            RMS of the batches' violations), a relative step whatever the scale of ``nu`` or of
            the violation, and the only step of ``nu`` (the epoch end leaves it alone).
    """

    _constrained_names = ("tau_param",)
    _default_dual_every = "step"
    _version = 4  # 4: no per-sample tau or lambda with dual_every="step", the layout's module

    def __init__(
        self,
        shape_labels: object,
        *,
        positive_class: int = 1,
        schedule: Inline | EpochEnd = Inline(),  # noqa: B008 (a frozen value)
        dual_lr_lambda: float = 0.1,
        dual_lr_nu: float = 1.0,
        nu_max: float | None = None,
        nu_init: float = 1.0,
        lambda_init: float | None = None,
        dual_every: str | None = None,
        dual_lr_nu_step: float | None = None,
        nu_rule: str = "additive",
        shard: object = None,
        process_group: object = None,
    ) -> None:
        if isinstance(positive_class, bool) or not isinstance(positive_class, int):
            raise ValueError(f"positive_class must be an int class id, got {positive_class!r}")
        if isinstance(schedule, Tracked):
            raise ValueError(
                "schedule=Tracked() tracks F-beta's shared threshold eps; a rate objective's box "
                "tau <= 1 has none (its projection is separable): use Inline(), which is then "
                "the exact projection of the batch's rows, O(B) per step, or EpochEnd()"
            )
        super().__init__(
            shape_labels,
            positive_classes=(positive_class,),
            schedule=schedule,
            dual_lr_lambda=dual_lr_lambda,
            shard=shard,
            process_group=process_group,
        )
        self._schedule_option = schedule
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
        self.nu_rule = _checks.choice("nu_rule", nu_rule, NU_RULES)
        if self.nu_rule == "normalized" and self.dual_every != "step":
            raise ValueError(
                f"nu_rule='normalized' moves nu at every batch, which dual_every="
                f"{self.dual_every!r} does not: pass dual_every='step' with it"
            )
        default_step = (
            NORMALIZED_NU_STEP
            if self.nu_rule == "normalized"
            else DEFAULT_NU_STEP * math.sqrt(self.multiplier_scale)
        )
        self.dual_lr_nu_step = (
            default_step
            if dual_lr_nu_step is None
            else _checks.number("dual_lr_nu_step", dual_lr_nu_step, 0)
        )

    @property
    def multiplier_scale(self) -> float:
        r"""The scale of ``nu`` against a multiplier of two rates (1 here).

        With the objective and the constraint of the Lagrangian ``f + nu g`` on their natural
        scales ``s_f`` and ``s_g`` (rates of their own class), the optimal ``nu`` is
        ``s_f / s_g`` times that of ``f / s_f + nu' g / s_g`` (method note sec. 8). R@P's
        objective is a recall and its constraint the precision's violation times
        ``(tp + fp) / n``, ROC-AUC's a TPR and an FPR: 1. The default per-step ``nu`` step is
        ``DEFAULT_NU_STEP`` times its square root."""
        return 1.0

    def _init_rows(self, columns: int, stationary_lambda: float) -> None:
        """``nu`` per constraint; with ``dual_every="epoch"`` also ``tau`` (parameter, 1) and
        ``lambda`` (``lambda_init``, else ``stationary_lambda``) per positive, ``(n,)`` or
        ``(n, columns)``. With ``"step"`` a positive's block is at its saddle whenever the loss
        reads it, so there is no per-sample state (``_saddle_rows``). Called by the subclass."""
        self.register_buffer("nu", torch.full((max(columns, 1),), self._nu_init))
        if self.nu_rule == "normalized":  # the violation's running mean square, its weight
            self.register_buffer("nu_sq", torch.zeros_like(self.nu))
            self.register_buffer("nu_sq_weight", torch.zeros(()))
            self.nu.clamp_(NU_FLOOR, self.nu_max)
        if self._saddle:
            if self._lambda_init is not None:
                raise ValueError(
                    f"lambda_init={self._lambda_init!r} is the start of per-sample multipliers, "
                    "which dual_every='step' does not keep (each positive takes lambda_i = c(nu) "
                    "when touched): pass dual_every='epoch' with it"
                )
            self._constrained_names = ()
            return
        n_pos = self.layout.pos_index.numel()
        shape = (n_pos,) if columns == 0 else (n_pos, columns)
        lam = stationary_lambda if self._lambda_init is None else self._lambda_init
        self.tau_param = nn.Parameter(torch.ones(shape))
        if self.sharded:  # this process's rows: a share 1/K of the mean over the processes
            self.tau_param.register_hook(lambda g: g / self._comm.world)
        self.register_buffer("lam", torch.full(shape, lam))

    @property
    def _saddle(self) -> bool:
        """Whether the per-sample blocks are at their saddle (``dual_every="step"``: no state)."""
        return self.dual_every == "step"

    @property
    def tau(self) -> Tensor:
        """The ``tau`` the loss uses.

        In mode ``"inline"``, ``min(tau_param, 1)``; with ``dual_every="step"``, each positive's
        saddle ``min(z_i, 1)`` at its remembered score (1 before its first touch)."""
        if not self._saddle:
            return self._effective(0)
        target = self._capped_targets()
        seen = self._seen_positives().view(-1, *([1] * (target.dim() - 1)))
        return torch.where(seen, target, 1.0)

    def _lambda_targets(self) -> tuple[Tensor, Tensor]:
        return self.tau.detach().float(), self._capped_targets()

    @property
    def _stores_lambda(self) -> bool:
        return not self._saddle

    def _lambda_values(self) -> Tensor:
        """``dual_every="step"``: ``c(nu)``, the ``lambda`` every positive takes when touched."""
        return self._stationary_lambda() if self._saddle else self.lam

    def _capped_targets(self) -> Tensor:
        """``min(z_i, 1)`` of every positive's remembered score ``z_i``, shaped like ``tau``."""
        raise NotImplementedError

    @property
    def n_negatives(self) -> float:
        return self.layout.n_neg_list[0]

    def _project(self, tau: Tensor, strength: float = 0.0) -> tuple[Tensor]:
        """``min(tau, 1)``; with ``strength s > 0`` the smooth ``tau - s softplus((tau - 1)/s)``
        (also ``<= min(tau, 1)``, so always feasible, and exact as ``s -> 0``)."""
        if strength > 0:
            return (tau - strength * torch.nn.functional.softplus((tau - 1) / strength),)
        return (torch.clamp(tau, max=1),)

    def _batch_rows(self, z: Tensor, idx: Tensor, slots: Tensor) -> tuple[Tensor, ...]:
        """``(is_pos (B,), tau rows, lambda rows, scale N / (n B))`` for the batch with scores
        ``z`` (``u``, or ``u + b_k``; ``slots``: its rows of ``tau``, ``-1`` for a negative).

        ``dual_every="step"`` (``_saddle_rows``): ``nu`` steps, and each positive's rows are
        its block's saddle. ``"epoch"``: the stored rows; the box's projection is separable, so
        mode ``"inline"`` projects the batch's rows only (O(B); the same values and gradients as
        projecting all of ``tau``)."""
        is_pos = slots >= 0
        scale = self._scale_pos(self._batch_of(idx))
        if self._saddle:
            lam = self._saddle_rows(z, is_pos)
            # (tau_i = min(z_i, 1), unless its coefficient lambda_i - c(nu) is exactly 0)
            tau = None if self._saddle_tau_vanishes else R.capped(z.detach())
            return is_pos, tau, lam, scale
        slots = slots.clamp_min(0)
        tau, lam = self.tau_param, self.lam
        if tau.shape[0] == 0:  # a shard holding no positive: every entry is a negative
            tau, lam = tau.new_zeros(1, *tau.shape[1:]), lam.new_zeros(1, *lam.shape[1:])
        (rows,) = self.schedule.view((tau.index_select(0, slots),), self._project)
        return is_pos, rows, lam.index_select(0, slots), scale

    # P@R: lambda_i = nu at the saddle, so the loss's (lambda_i - nu) tau_i is exactly 0 and the
    # batch's tau is not computed (R@P's 1 + nu (1 - a) - 1 - nu (1 - a) rounds, so it keeps tau)
    _saddle_tau_vanishes = False

    @torch.no_grad()
    def _saddle_rows(self, z: Tensor, is_pos: Tensor) -> Tensor:
        r"""``dual_every="step"``, before the batch's loss: ``nu`` steps on the batch's estimate
        of the violation; then each positive's block takes its saddle point given its fresh
        score ``z_i`` (``u_i``, or ``u_i + b_k``) and the new ``nu``. ``L`` is linear in
        ``tau_i`` with the coefficient ``lambda_i - c(nu)`` (``c = nu`` for P@R,
        ``1 + nu (1 - a)`` for R@P, 1 for ROC-AUC), so the saddle is ``lambda_i = c(nu)``,
        ``tau_i = min(z_i, 1)`` (method note sec. 8): the slack sits on its score and the
        score is pulled up with weight ``c(nu)``. Returns the batch's ``lambda``, ``(1,)`` or
        ``(K,)`` (broadcast over the batch's rows; ``_batch_rows`` adds their ``tau``, detached:
        ``L`` is flat in ``tau`` there, so no gradient flows to it), O(B)."""
        z = z.float()  # (no_grad: no graph to cut)
        # the estimate of the global batch: the mean over the processes
        violation = self._comm.mean(self._batch_violation(z, is_pos))
        replicas = self._replicas()
        if replicas is not None:  # replicated (attach): each holds a part of the global batch
            violation = violation.clone()
            dist.all_reduce(violation, group=replicas[0])
            violation /= replicas[1]
        # in place: the loss reads nu through a copy (_nu_now), so an earlier batch's graph
        # keeps the nu it saw (gradient accumulation)
        if self._records and self.nu_rule == "normalized":  # (a validation forward: no step)
            self._normalized_nu_step_(violation)
        elif self._records:
            self.nu.copy_((self.nu + self.dual_lr_nu_step * violation).clamp(0, self.nu_max))
        # lambda a copy: the next batch's in-place nu step leaves this batch's graph alone
        return self._stationary_lambda().clone()

    def _normalized_nu_step_(self, violation: Tensor) -> None:
        """``nu_rule="normalized"``'s step (``normalized_nu_step_``), capped at ``nu_max`` and
        at ``NU_CEILING`` times the multiplier's scale."""
        ceiling = min(self.nu_max, NU_CEILING * max(self.multiplier_scale, 1.0))
        normalized_nu_step_(
            self.nu, self.nu_sq, self.nu_sq_weight, violation, self.dual_lr_nu_step, ceiling
        )

    def _nu_now(self) -> Tensor:
        """``nu`` as the loss reads it: a copy, which the per-step dual step's in-place write of
        the next batch leaves alone (the backward may come after it: gradient accumulation)."""
        return self.nu.clone()

    def _batch_violation(self, z: Tensor, is_pos: Tensor) -> Tensor:
        """The batch's unbiased estimate of ``_violation`` (shaped like ``nu``)."""
        raise NotImplementedError

    def _stationary_lambda(self) -> Tensor:
        """``c(nu)``: the ``lambda`` that makes ``L`` flat in ``tau`` (shaped like ``nu``)."""
        raise NotImplementedError

    def _scale_pos(self, batch: int) -> float:
        return self.n_samples / (self.layout.n_pos_list[0] * batch)

    def _dual_step_(self) -> None:
        """``nu <- min(nu_max, max(0, nu + dual_lr_nu violation))`` (``nu_rule="normalized"``:
        no step, its per-batch rule is the only one)."""
        if self.nu_rule == "normalized":
            return
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
            f"n={self.n_samples}, positives={int(self.layout.n_pos_list[0])}, {self._target_repr()}, "
            f"schedule={self._schedule_option}, nu_max={self.nu_max}"
            + (", nu_rule='normalized'" if self.nu_rule == "normalized" else "")
        )

    def _target_repr(self) -> str:
        raise NotImplementedError


class PointRateObjective(RateObjective):
    """P@R and R@P: one target on the decisions ``u > t``, so besides the certificate of
    ``u > 0`` they learn a **decision threshold** of their own and can be calibrated on held-out
    scores (docs/rates.md).

    ``decision_threshold`` (buffer ``(1,)``): at every epoch end, the cut ``t`` whose decisions
    ``u > t`` on the remembered training scores meet the target with the best other rate
    (``_select_threshold``; ``0`` until the first epoch end). The hinge bounds count a positive
    fully only at ``u >= 1``, so the certified target at ``u > 0`` leaves the true rate there
    above it; the threshold makes the training decision tight.
    """

    # 3: the learned decision threshold (buffers decision_threshold, threshold_met); 4: no
    # per-sample tau or lambda with dual_every="step", the layout in its own module
    _version = 4

    def __init__(self, shape_labels: object, **options: Any) -> None:
        super().__init__(shape_labels, **options)
        self.register_buffer("decision_threshold", torch.zeros(1))
        self.register_buffer("threshold_met", torch.zeros((), dtype=torch.bool))

    def _end_epoch_body_(self) -> None:
        super()._end_epoch_body_()
        u_pos, u_neg = self._split_scores()
        if self._comm.total(u_pos.numel()):
            chosen = self._select_threshold(u_pos, u_neg)
            self.decision_threshold.fill_(chosen.threshold)
            self.threshold_met.fill_(chosen.met)

    def calibrate(self, scores: object, labels: object) -> R.RateThreshold:
        """The decision threshold chosen on held-out data (a validation split).

        The cut ``t`` whose decisions ``u > t`` meet the target there with the best other rate --
        for P@R the best precision with recall ``>= r``, for R@P the best recall with precision
        ``>= a`` (none meets it: the most precise cut, ``met=False``). Returns
        ``RateThreshold(threshold, recall, precision, met)`` on those scores; the regularizer's state is not changed.

        Args:
            scores: the shape node's scores ``(M,)`` (or ``(M, 1)``), finite.
            labels: ``(M,)`` integer shape labels; ``positive_class`` is the positive.
        """
        u, y = _checks.held_out(scores, labels, 1, (self.positive_class,))
        u, pos = u[:, 0], y == self.positive_class
        return self._select_threshold(u[pos], u[~pos])

    def _threshold_stats(self) -> dict[str, float | bool | None]:
        """``decision_threshold`` and the recall / precision of ``u > decision_threshold`` on
        the remembered scores; ``threshold_met``: whether they meet the target."""
        u_pos, u_neg = self._split_scores()
        t = float(self.decision_threshold[0])
        recall, precision = R.recall_precision(u_pos - t, u_neg - t, self._comm)
        return {
            "decision_threshold": t,
            "train_recall_at_threshold": recall,
            "train_precision_at_threshold": precision,
            "threshold_met": bool(self.threshold_met),
        }

    def _select_threshold(self, u_pos: Tensor, u_neg: Tensor) -> R.RateThreshold:
        raise NotImplementedError


def recall_precision_stats(reg: RateObjective) -> dict[str, float | None]:
    u_pos, u_neg = reg._split_scores()
    recall, precision = R.recall_precision(u_pos, u_neg, reg._comm)
    return {
        "certified_recall": R.certified_recall(u_pos, reg._comm),
        "certified_precision": R.certified_precision(u_pos, u_neg, reg._comm),
        "train_recall": recall,
        "train_precision": precision,
    }


@torch.no_grad()
def normalized_nu_step_(
    nu: Tensor, sq: Tensor, weight: Tensor, violation: Tensor, eta: float, ceiling: float
) -> None:
    r"""``nu_rule="normalized"`` (method note sec. 8, "The multiplier's rule"): ``nu`` moves by a
    relative step of the violation ``v`` over its running RMS (``sq``, ``weight``: its running
    mean square and that mean's weight, updated in place),

    $$
    s_t = \rho s_{t-1} + (1 - \rho) v_t^2,\quad
    \nu_{t+1} = \mathrm{clip}\Big(\nu_t \exp\Big(\eta \frac{v_t}{\sqrt{s_t / (1 -
    \rho^t)}}\Big), \nu_{\min}, \mathrm{ceiling}\Big)
    $$

    (``rho = NU_RMS_DECAY``, ``nu_min = NU_FLOOR``): scale-free in ``nu`` (its optimum is ``m / n``
    times larger at ``m / n`` negatives per positive) and in the violation (a recall's, a
    precision's); it rests where the batches' mean violation is 0."""
    sq.mul_(NU_RMS_DECAY).add_(violation.square(), alpha=1 - NU_RMS_DECAY)
    weight.mul_(NU_RMS_DECAY).add_(1 - NU_RMS_DECAY)
    step = (eta * violation / (sq / weight).sqrt()).nan_to_num(0.0, 0.0, 0.0)
    nu.copy_((nu * step.exp()).clamp(NU_FLOOR, ceiling))
