r"""``FBetaRegularizer``: the F-beta S-measure regularizer (method note sec. 2-3b) as an ``nn.Module``.

``eps`` (one per problem) is a parameter the user's optimizer steps; ``tau`` (one per positive
sample) is a parameter too, or rows that ``reg.sparse_tau`` steps; ``lambda``, ``mu``, the scores
remembered during the epoch and the counters are buffers, so ``.to()``, ``state_dict()`` and
checkpoints carry all of it. Per step ``loss = task_loss + alpha * reg(scores, idx)`` (after
``reg.attach(optimizer)`` the rows of a sparse ``tau`` step with the optimizer); per epoch ``reg.end_epoch_()``: the schedule's projection and the dual step
``lambda_i <- max(0, lambda_i + eta_lambda (tau_i - u_i))``,
``mu_j <- mu_j + eta_mu (mean_{S+_j} tau - 1)`` on the scores recorded during the epoch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from projections import project_onto_c, soft_project_onto_c

from . import _checks, fbeta_report
from . import functional as Fn
from .base import ReparamRegularizer
from .lagrangian import as_float, batch_lagrangian, greater
from .options import (
    DEFAULT_TAU_LR,
    PAPER,
    RULE_NAME,
    TAU_STORAGES,
    DenseTau,
    EpochEnd,
    Inline,
    SparseTau,
    Tracked,
    check_option,
)
from .sharding import Shard
from .sparse import SparseRows
from .tracked import TrackedThreshold


class FBetaRegularizer(ReparamRegularizer):
    """The F-beta S-measure regularizer, one-vs-rest per class.

    The scale-free form (3') of method note sec. 2. ``FBetaRegularizer(labels)`` is the
    library's defaults; docs/regularizer.md has every option with its evidence.

    Args:
        shape_labels: ``(N,)`` integer shape label ``s_i`` of every training sample (a tensor or
            numpy array of any integer dtype, or a sequence of ints).
        beta: the ``beta`` of F-beta (> 0).
        positive_classes: the shape classes with an F-beta term of their own (binary: ``(1,)``);
            the loss is the mean of their terms, each against all other samples.
        schedule: where ``Pi_C`` is applied (method note sec. 3b; ``reparam.options``):
            ``Tracked()`` (the loss sees the exact projection's threshold over an active set
            kept in O(B) per step; read ``reg.tau``), ``EpochEnd()`` (in place once per epoch,
            Algorithm 3) or ``Inline(strength)`` (the loss takes ``Pi_C(eps, tau)``,
            differentiated through; ``strength > 0``: the smooth projection, sec. 5).
        tau: who steps ``tau`` (method note sec. 11): ``SparseTau(lr)`` (the rows a batch touched,
            at the optimizer's step, by Adam, O(B); ``lr=None``: the lr of the group that steps
            ``eps`` after ``attach``, else 1e-2) or ``DenseTau()`` (your optimizer steps it, O(n)
            per step); ``Inline()`` needs ``DenseTau()``.
        dual_lr_lambda: ``lambda``'s constant dual step (a plain attribute: ``c / epoch`` decays).
        dual_lr_mu: ``mu``'s constant dual step.
        mu_init: initial ``mu``; default ``-beta^2`` (the optimal ``mu`` on separable data).
        lambda_init: initial ``lambda`` (0: the paper's; ``-mu_init``: every ``tau_i`` stationary).
        cap_scores: dualize ``tau_i <= min(u_i, eps)`` (``eps`` detached) instead of
            ``tau_i <= u_i``: the same constraint in C, whose term stops pulling a score up at
            ``eps`` (method note sec. 10).
        groups: ``(N,)`` integer group of every sample (``-1``: none), or ``None``. Given, the
            objective is the mean over the groups of each group's F-beta (per image of a
            segmentation set, the mean Dice; method note sec. 12): one problem per (class,
            group with a positive of it).
        shard: this process's block of a state spread over processes (``reparam.Shard``).
        process_group: the ``torch.distributed`` group of the processes that each hold the whole
            objective (replicated data parallelism; ``None``: the default group once initialized,
            if any). ``attach`` keeps their states equal at every step.

    The paper's Algorithm 3 as published is ``FBetaRegularizer.paper(shape_labels)``. After every
    ``end_epoch_`` ``reg.decision_threshold`` holds the F-beta-optimal threshold of the remembered
    scores per problem (``calibrate``: of fresh ones), ``stats()`` the F-beta of ``u > it``.

    Examples:
        >>> import torch
        >>> from reparam import FBetaRegularizer
        >>> reg = FBetaRegularizer(torch.tensor([0, 1, 1, 0, 1]))
        >>> scores = torch.tensor([0.2, 0.9], requires_grad=True)  # samples 0 and 2
        >>> opt = torch.optim.Adam([scores, *reg.parameters()], lr=0.1)
        >>> _ = reg.attach(opt)  # the rows of tau step with opt.step(), by Adam at its lr
        >>> reg(scores, torch.tensor([0, 2])).backward(); opt.step()
        >>> reg.end_epoch_()
        >>> int(reg.epoch), reg.n_problems, reg.options, int(reg.sparse_tau.step)
        (1, 1, (Tracked(), SparseTau(lr=None)), 1)
        >>> reg.calibrate(torch.tensor([2.0, 1.0, 0.5, -1.0]), torch.tensor([1, 0, 1, 0]))
        tensor([-0.2500])
        >>> reg.attach(torch.optim.SGD(reg.parameters(), lr=0.1))  # not the rows' rule
        Traceback (most recent call last):
        ...
        ValueError: tau=SparseTau(lr=None) steps the rows of tau by its own rule, ...
    """

    _constrained_names = ("eps_param", "tau_param")
    _version = 5  # 3: sparse_tau.*; 4: schedule.tau_active / active_sums; 5: the layout's

    def __init__(
        self,
        shape_labels: object,
        *,
        beta: float = 1.0,
        positive_classes: Sequence[int] = (1,),
        schedule: Tracked | EpochEnd | Inline = Tracked(),  # noqa: B008 (frozen values)
        tau: SparseTau | DenseTau = SparseTau(),  # noqa: B008
        dual_lr_lambda: float = 0.1,
        dual_lr_mu: float = 0.1,
        mu_init: float | None = None,
        lambda_init: float = 0.0,
        cap_scores: bool = True,
        groups: object = None,
        shard: Shard | None = None,
        process_group: object = None,
    ) -> None:
        tau = check_option("tau", tau, TAU_STORAGES)
        super().__init__(
            shape_labels,
            positive_classes=positive_classes,
            schedule=schedule,
            dual_lr_lambda=dual_lr_lambda,
            groups=groups,
            shard=shard,
            process_group=process_group,
        )
        _check_pair(schedule, tau, self.sharded)
        self.options = (schedule, tau)  # as given (reg.schedule, reg.sparse_tau: the modules)
        self.dual_lr_mu = _checks.number("dual_lr_mu", dual_lr_mu, 0)
        self.beta = _checks.number("beta", beta, 0, strict=True)
        mu_init = _checks.number("mu_init", -(self.beta**2) if mu_init is None else mu_init)
        p, n_pos = self.n_problems, self.layout.pos_index.numel()
        # (eps, tau) = (1, 1): a point of C with mean tau = 1, O(1) as (3') intends
        self.eps_param = nn.Parameter(torch.ones(p))
        if isinstance(tau, DenseTau):
            self.tau_param = nn.Parameter(torch.ones(n_pos))
        else:
            self.register_buffer("tau_param", torch.ones(n_pos))
            lr = DEFAULT_TAU_LR if tau.lr is None else tau.lr  # None: attach follows the optimizer
            self.sparse_tau = SparseRows(  # (the rows' gradient lives with eps's)
                n_pos, lr=lr, lr_given=tau.lr is not None, comm=self._comm, eps=self.eps_param
            )
        lambda_init = _checks.number("lambda_init", lambda_init, 0)
        self.register_buffer("lam", torch.full((n_pos,), lambda_init))
        self.register_buffer("mu", torch.full((p,), mu_init))
        if not isinstance(cap_scores, bool):
            raise ValueError(f"cap_scores must be a bool, got {cap_scores!r}")
        self.cap_scores = cap_scores
        self.register_buffer("decision_threshold", torch.zeros(p))
        self.inert: str | None = None  # why it may be doing nothing, after each end_epoch_()
        # (eps, mu, mean tau, rms tau, 1) at the last epoch end, for _check_inert (zeros: none yet)
        self.register_buffer("inert_ref", torch.zeros(2 * p + 3))
        if self.sharded:  # eps is replicated: its gradient is the mean over the processes
            self.eps_param.register_post_accumulate_grad_hook(self._average_grad_)

    @classmethod
    def paper(cls, shape_labels: object, **options: object) -> FBetaRegularizer:
        """The objective with the paper's Algorithm 3 as published.

        The projection once per epoch (``EpochEnd()``), a dense ``tau``, dual steps 1e-3
        (``lambda``) and 1e-5 (``mu``), scores not capped; ``options`` override any of them (the
        other options are the constructor's).

        Examples:
            >>> import torch
            >>> from reparam import FBetaRegularizer
            >>> reg = FBetaRegularizer.paper(torch.tensor([0, 1, 1, 0, 1]))
            >>> reg.projection, reg.tau_update, reg.dual_lr_mu, reg.cap_scores
            ('epoch', 'dense', 1e-05, False)
        """
        return cls(shape_labels, **(PAPER | options))

    @property
    def eps(self) -> Tensor:
        """``(P,)``: the ``eps`` the loss uses (in mode ``"inline"``, ``Pi_C`` of ``eps_param``)."""
        return self._effective(0)

    @property
    def tau(self) -> Tensor:
        """``(n,)``: the ``tau`` the loss uses (in mode ``"inline"``, ``Pi_C`` of ``tau_param``)."""
        return self._effective(1)

    # --- the loss -------------------------------------------------------------------------------

    def _loss(self, u: Tensor, idx: Tensor, rows: Tensor) -> Tensor:
        """``L_B`` (method note sec. 3), the mean over the problems (positive classes, or
        (class, group) pairs, sec. 12) in one autograd node with no batch split
        (``reparam.lagrangian.batch_lagrangian``; ``rows``: the batch's rows of ``tau``, ``-1``
        for a negative)."""
        tracked, sparse, lay = self._tracked, self.sparse_tau, self.layout
        eps, tau = self.constrained_parameters()  # inline: Pi_C of them, with autograd
        lam, share = self.lam, None
        u, problem, is_pos, touched, scale, eps_weight, at = lay.batch_entries(
            u, idx, rows, self._batch_of(idx)
        )  # (groups: the batch's problems only, in slots: at[slot] is the problem, O(B))
        mu = self.mu if at is None else self.mu.index_select(0, at)
        seen = None
        if tracked is not None:  # the loss sees e* (computed once: the rows' follow reads it)
            eps, share = tracked.threshold(self.eps_param, at)
            seen = (eps, share, at, problem)  # (the rows' share of it: _rows_threshold)
        if tracked is not None or sparse is not None:  # the batch's rows, O(B)
            tau, lam = _batch_rows(self, tau, rows, touched, tracked, sparse, seen)
            slots = None if problem is None else torch.arange(rows.numel(), device=rows.device)
        else:
            slots = rows.clamp_min(0)
        if problem is not None:  # a sample's row serves every column
            slots = slots.unsqueeze(1).expand(-1, len(self.classes)).reshape(-1)
        if tracked is not None:
            if problem is None:
                share = share.view(())
        elif at is not None:
            eps = eps.index_select(0, at)
        return batch_lagrangian(
            eps, tau, u, lam, mu, is_pos, slots, beta=self.beta, scale=scale,
            cap=self.cap_scores, share=share, problem=problem, eps_weight=eps_weight,
            columns=at is None,
        )  # fmt: skip

    @property
    def tau_update(self) -> str:
        """Who steps ``tau``: ``"dense"`` (your optimizer) or ``"sparse_adam_ahead"``."""
        return "dense" if self.sparse_tau is None else "sparse_adam_ahead"

    @property
    def _tracked(self) -> TrackedThreshold | None:
        """The schedule when it is ``"tracked"`` (its active set), else ``None``."""
        return self.schedule if isinstance(self.schedule, TrackedThreshold) else None

    def _end_epoch_body_(self) -> None:
        """Mode ``"tracked"``: ``A`` re-computed from the exact root first (O(n)); then the
        base's epoch end."""
        if self._tracked is not None:
            self._tracked.refresh_(self.tau_param, self.eps_param, self.layout.row_groups)
            self._forget_("constrained")
        super()._end_epoch_body_()

    def _after_step_body_(self) -> None:
        """After the optimizer's step: the sparse ``tau`` step (``reparam.sparse``) on the rows
        the backward passes since the last step touched, the tracked active set kept in step
        (``TrackedThreshold.step_``); a dense ``tau`` under ``"tracked"``, which the optimizer
        moved everywhere: ``A`` from the exact root (O(n))."""
        sparse, tau, tracked = self.sparse_tau, self.tau_param, self._tracked
        if sparse is None:
            if tracked is not None:
                tracked.refresh_(tau, self.eps_param, self.layout.row_groups)
                self._forget_("constrained")
            return
        # (zero_grad() since the backward, or no forward since the last step: nothing moves)
        if sparse.dropped_(by_hand=not self._monitor.hooks) or not sparse.stepping:
            return
        rows, touched = sparse.take_noted_()
        if tracked is None:
            return sparse.step_(tau, rows, touched)
        groups = self.layout.row_groups  # clipped rows follow eps; the change written once
        eps_grad = tracked.eps_grad_of_rows(self.eps_param, groups, rows)
        step = sparse.step_(tau, rows, touched, eps_grad, write=False)
        tracked.step_(tau, self.eps_param, groups, rows, step)

    @property
    def tau_lr(self) -> float | None:
        """The sparse ``tau`` step's size (``None`` with a dense ``tau``).

        After ``attach``: the lr of the group that steps ``eps``, unless ``SparseTau(lr)`` gave
        one."""
        return self.sparse_tau.lr if self.sparse_tau is not None else None

    def _project(self, eps: Tensor, tau: Tensor, strength: float = 0.0) -> tuple[Tensor, Tensor]:
        one = self.n_problems == 1  # the plain form is faster than one group of the grouped form
        if strength > 0:
            if one:
                e, t = soft_project_onto_c(eps[0], tau, strength=strength)
                return e.reshape(1), t
            return soft_project_onto_c(eps, tau, strength=strength, groups=self.layout.groups)
        if one:  # (over every process's rows: the communicator's)
            e, t = project_onto_c(eps[0], tau, comm=self._comm)
            return e.reshape(1), t
        lay = self.layout  # (sharded with groups: each problem at its owner, eps from there)
        e, t = project_onto_c(eps, tau, groups=lay.groups, comm=lay.problem_comm)
        return lay.replicate(e), t

    # --- the dual step --------------------------------------------------------------------------

    def _lambda_targets(self) -> tuple[Tensor, Tensor]:
        if len(self.classes) == 1:
            u = self.scores[:, 0].index_select(0, self.layout.pos_index)
        else:  # each row's class column
            u = self.scores[self.layout.pos_index, self.layout.problem_class[self.layout.groups]]
        if self.cap_scores:
            u = torch.minimum(u, self.layout.per_row(self.eps.detach().float()))
        return self.tau.detach().float(), u

    def _dual_step_(self) -> None:
        """``mu_j <- mu_j + dual_lr_mu (mean_{S+_j} tau - 1)`` (free multiplier of ``mean tau = 1``);
        then the F-beta-optimal threshold of the remembered scores (``decision_threshold``)."""
        self.mu.add_(self.dual_lr_mu * (self._class_mean(self.tau.detach()) - 1))
        lay = self.layout
        for k in lay.problems_here():
            u_pos, u_neg = self._split_scores(k)
            self.decision_threshold[k] = Fn.best_fbeta_threshold(
                u_pos, u_neg, self.beta, lay.problem_comm
            )[0]
        self.decision_threshold.copy_(lay.replicate(self.decision_threshold))
        self._check_inert()

    def _class_mean(self, tau: Tensor) -> Tensor:
        # (float64: a float32 sum of 1e5 rows is off by 1e-4, which mean - 1 makes 1e-3)
        sums = torch.zeros_like(self.mu, dtype=torch.float64)
        sums = self._comm.sum(sums.index_add_(0, self.layout.groups, tau.double()))
        return (sums / self.layout.n_pos).to(self.mu.dtype)

    # --- reporting: reparam/fbeta_report.py ---------------------------------------------------

    def _check_inert(self) -> None:
        self.inert = fbeta_report.inert_reasons(self)

    def _objective_stats(self) -> dict[str, float | int | list | bool | None]:
        return fbeta_report.figures(self)

    def calibrate(self, scores: object, labels: object) -> Tensor:
        """The F-beta-optimal threshold of each positive class on fresh scores, ``(P,)``.

        ``scores`` ``(M,)`` / ``(M, P)`` (held out, or the training set scored by the head as it
        ends: ``decision_threshold``'s scores lag it), ``labels`` ``(M,)``; no state changes."""
        return fbeta_report.calibrate(self, scores, labels)

    def extra_repr(self) -> str:
        lay = self.layout
        problems = f"groups={lay.n_groups}, problems={lay.n_problems}, " if self.grouped else ""
        positives = int(lay.n_pos.sum()) if self.grouped else lay.n_pos.long().tolist()
        schedule, tau = self.options
        lr = f" (rule {RULE_NAME}, lr {self.tau_lr:g})" if self.sparse_tau is not None else ""
        return (
            f"n={self.n_samples}, {problems}positives={positives}, "
            f"classes={self.classes}, beta={self.beta}, schedule={schedule}, tau={tau}{lr}, "
            f"cap_scores={self.cap_scores}"
        )


def _check_pair(schedule: object, tau: object, sharded: bool) -> None:
    """``ValueError`` for a pair of options the objective cannot run."""
    if sharded and isinstance(tau, DenseTau):
        raise ValueError(
            "tau=DenseTau() with a shard: a sharded F-beta needs tau=SparseTau() (a dense tau is "
            "O(n) per step on every process)"
        )
    if isinstance(schedule, Inline) and isinstance(tau, SparseTau):
        raise ValueError(
            f"schedule={schedule!r} couples every row of tau in each step's loss (O(n) per step), "
            f"so tau={tau!r}, which steps the batch's rows only, cannot follow it: pass "
            "tau=DenseTau(), or schedule=Tracked() (the exact projection's threshold, O(B)) or "
            "EpochEnd()"
        )


def _rows_threshold(
    reg: FBetaRegularizer,
    e_star: Tensor,
    share: Tensor,
    at: Tensor | None,
    problem: Tensor | None,
    rows: Tensor,
) -> tuple[Tensor, Tensor]:
    """``(e*, share)`` of each batch entry's row (detached, O(B)), from the loss's per-problem
    values (``at``: the batch's problems in slots, ``problem`` each entry's slot; else of every
    problem, or of one: a broadcast). With several classes per group (an entry per class and
    sample) they are computed for the rows' own problems."""
    groups = reg.layout.row_groups
    e_star, share = e_star.detach(), share.detach()
    if at is None and groups is None:
        return e_star, share
    if at is not None and problem.numel() == rows.numel():
        k = problem.clamp_min(0)
    elif at is None:
        k = groups.index_select(0, rows).long()
    else:
        at = groups.index_select(0, rows).long()
        return tuple(x.detach() for x in reg._tracked.threshold(reg.eps_param.detach(), at))
    return e_star.index_select(0, k), share.index_select(0, k)


def _batch_rows(
    reg: FBetaRegularizer, tau: Tensor, slots: Tensor, touched: Tensor, tracked, sparse, seen
) -> tuple:
    """``reg``'s batch view for ``lagrangian.batch_lagrangian`` in O(B): its rows' values (the
    ``tracked`` schedule: plus ``eps`` for a row of ``A``; a ``sparse`` tau: through the node
    that accumulates their gradient) and ``lambda``. ``touched``: the positives; ``seen``: the
    rows' ``(e*, share)`` under ``tracked`` (``_rows_threshold``)."""
    rows = slots.clamp_min(0)
    if tau.shape[0] == 0:  # a shard holding no positive: every entry is a negative
        tau, lam = tau.new_zeros(1), reg.lam.new_zeros(1)
        values = tau.expand(rows.shape[0])
        if sparse is not None:  # (its backward still notes the batch: every process steps)
            values = sparse.rows_(values, rows, touched)
        return values, lam.expand(rows.shape[0])
    values = tau.index_select(0, rows)
    follow = None
    if tracked is not None:
        groups = reg.layout.row_groups
        values = values + tracked.shift(rows, reg.eps_param, groups)
        if sparse is not None:  # a row above e* follows eps (sparse_step_): its weight
            e_star, share = _rows_threshold(reg, *seen, rows)
            follow = greater(values, e_star).mul_(as_float(touched, values.dtype)).mul_(share)
    if sparse is not None:  # the gradient to the rows' accumulator, the step at opt.step()
        values = sparse.rows_(values, rows, touched, follow)
    return values, reg.lam.index_select(0, rows)
