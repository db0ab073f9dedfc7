r"""``FBetaRegularizer``: Algorithm 3 of the paper (docs/method.md sec. 3b) as an ``nn.Module``.

State (docs/method.md sec. 3): ``eps_param`` (one per positive shape class) and ``tau_param`` (one
per positive training sample, indexed by dataset index) are ``nn.Parameter``s stepped by the user's
optimizer; ``lambda`` (one per positive sample), ``mu`` (one per class), the scores remembered
during the epoch and the counters are buffers, so ``.to()``, ``state_dict()`` and checkpoints carry
all of it. ``reg.eps`` / ``reg.tau`` are the values the loss uses (the parameters themselves, or in
mode ``"inline"`` their projection, in mode ``"tracked"`` their clipping at the tracked threshold).

Per training step: ``loss = task_loss + alpha * reg(scores, idx)`` (the minibatch ``L_B``),
``loss.backward(); opt.step(); reg.after_step_()``. Per epoch: ``reg.end_epoch_()`` projects
``(eps, tau)`` onto C (mode ``"epoch"``) and takes the dual ascent step

.. math::
    \lambda_i \leftarrow \max(0, \lambda_i + \eta_\lambda (\tau_i - u_i)),\qquad
    \mu_j \leftarrow \mu_j + \eta_\mu (\mathrm{mean}_{S^+_j} \tau - 1),

with the scores ``u_i`` recorded during the epoch: no extra pass over the data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch
from torch import Tensor, nn

from projections import project_onto_c, soft_project_onto_c

from . import _checks
from . import functional as Fn
from .base import ReparamRegularizer
from .lagrangian import batch_lagrangian
from .options import DEFAULT_TAU_LR, resolve_options
from .schedules import Inline
from .sharding import Shard
from .sparse import SparseTau
from .tracked import TrackedThreshold


class FBetaRegularizer(ReparamRegularizer):
    """The F-beta S-measure regularizer, scale-free form (3') of docs/method.md sec. 2,
    one-vs-rest per class.

    Args:
        shape_labels: ``(N,)`` integer shape label ``s_i`` of every training sample (a tensor or
            numpy array of any integer dtype, or a sequence of ints).
        beta: the ``beta`` of F-beta (> 0).
        positive_classes: the shape classes ``j`` with an F-beta term of their own (binary:
            ``(1,)``); the regularizer is the mean of their terms. Each term's negatives are all
            samples of the other classes.
        projection: where ``Pi_C`` is applied: ``"inline"`` (inside the loss:
            ``L(Pi_C(eps, tau))``, exact or soft), ``"epoch"`` (once per epoch, Algorithm 3),
            ``"tracked"`` (the loss sees ``Pi_C``'s formula with
            the threshold ``e* = (eps + sum_A tau) / (1 + |A|)`` of an active set ``A`` tracked
            in O(B) per step: the touched rows re-tested after each step, all rows at the epoch
            end; the batch's positives see ``min(tau_k, e*)``, a clipped row's gradient is
            ``dL/de* / (1 + |A|)``, the exact projection's Jacobian; ``A`` moves with ``eps`` as a
            block, its rows stored in ``tau_param`` as offsets above ``eps``: read ``reg.tau``;
            also with a sparse ``tau``; the default with ``tau_update="auto"``).
            ``None``: the preset's (``"inline"``; paper: ``"epoch"``);
            with the library's preset and a sparse ``tau`` (also ``tau_update="auto"``),
            ``"tracked"``.
            The exact projection is ``projections.project_onto_c`` with its fastest method
            (``method="auto"``).
        inline_strength: with ``projection="inline"``, ``0`` uses the exact projection (autograd
            a.e.), ``> 0`` the smooth ``soft_project_onto_c`` with that strength (docs/method.md
            sec. 5).
        dual_lr_lambda, dual_lr_mu: constant dual step sizes; ``None``: the preset's (0.1, 0.1;
            paper: 1e-3, 1e-5). docs/comparison.md has the evidence and the guidance. Both are
            plain attributes: a decaying schedule is ``reg.dual_lr_lambda = c / epoch`` in your
            loop.
        mu_init: initial ``mu``; default ``-beta^2`` (docs/method.md sec. 3b: the optimal ``mu`` on
            separable data; ``0`` starts where the paper's code does, and is slower).
        lambda_init: initial ``lambda`` (0: the paper's; ``-mu_init`` makes every ``tau_i``
            stationary, ``dL/dtau_i = mu + lambda_i = 0``, so the positives are pulled up from the
            first step instead of after the first dual step).
        cap_scores: dualize ``tau_i <= min(u_i, eps)`` instead of ``tau_i <= u_i`` (the same
            constraint, since ``tau_i <= eps`` in C): the positives' term ``-lambda_i min(u_i, eps)``
            stops pulling a score up at ``eps`` (the cap is ``eps`` detached; docs/method.md
            sec. 10). ``None``: the preset's (``True``; paper: ``False``).
        preset: which values the four options above take when left at ``None``: the library's
            (``None``, ``FBETA_DEFAULTS``, chosen on the evidence of docs/comparison.md) or the
            paper's Algorithm 3 as published (``"paper"``, ``PAPER_PRESET``). An option passed
            explicitly overrides the preset (``preset="paper", projection="inline"``: the paper's
            steps with the projection inside the loss; the paper's full projections after every
            step are ``reparam.baselines.FullProjectionsFBeta``).
        tau_update: who steps ``tau`` (docs/method.md sec. 11). ``"dense"``: ``tau_param`` is an
            ``nn.Parameter`` in ``reg.parameters()``, stepped by your optimizer with the network
            (every row, every step: O(n)). ``"sparse_adam_ahead"``: the regularizer steps the rows
            the batch touched in :meth:`after_step_`, on dense Adam's trajectory in O(B) per step
            (each touched row stores where dense Adam's momentum carries it: docs/method.md sec.
            11); ``tau_param`` is then a buffer and ``reg.parameters()`` is ``eps`` alone. Needs
            ``after_step_()`` after every optimizer step (or :meth:`attach`) and a projection other
            than ``"inline"`` (which differentiates through the projection of every ``tau``: O(n)
            per step); with ``projection`` and ``preset`` left at ``None`` it takes
            ``"tracked"``. ``"auto"`` (default): with the library's defaults (``projection`` and ``preset``
            ``None``), ``"sparse_adam_ahead"`` and projection ``"tracked"`` at every size, else
            ``"dense"``. ``reg.tau_update`` and ``reg.projection`` are the resolved values.
        tau_lr: the sparse update's step size (``None``: 1e-2, the paper's primal step, and
            :meth:`attach` makes it follow the lr of the optimizer's group that steps ``eps``: the
            step a dense ``tau`` would take).
        groups: ``(N,)`` integer group of every training sample (``-1``: in no group), or
            ``None``. Given, the objective is the **grouped F-beta**, the mean over the groups of
            each group's F-beta (a macro F-beta over images, queries or users; per image of a
            segmentation set, the mean Dice): one problem (3') per (positive class, group with a
            positive of it), with its own ``eps``, ``mu`` and threshold, whose negatives are the
            group's other samples (docs/method.md sec. 12). A group with no positive of a class
            has no F-beta for it and is skipped, as a Dice loss skips an absent class. ``stats()``
            then reports the mean over the scored problems, ``certified_fbeta`` counting a
            problem without a certificate as 0 (still a lower bound on the mean F-beta).

    After every ``end_epoch_`` the regularizer also knows the exact F-beta-optimal threshold of its
    remembered scores (value buckets, expected O(n)): ``reg.decision_threshold`` (per class), with
    the F-beta of ``u > threshold`` in ``stats()`` (docs/method.md sec. 2: the certificate is for
    ``u > 0``; the threshold is a cheap post-hoc decision rule on the same scores).
    """

    _constrained_names = ("eps_param", "tau_param")
    # 3: the sparse tau's state in its own module (sparse_tau.moments, .step, .last); 4: the
    # tracked active set in the schedule's (schedule.tau_active, .active_sums); 5: the layout's
    _version = 5

    def __init__(
        self,
        shape_labels: object,
        *,
        beta: float = 1.0,
        positive_classes: Sequence[int] = (1,),
        projection: str | None = None,
        inline_strength: float = 0.0,
        dual_lr_lambda: float | None = None,
        dual_lr_mu: float | None = None,
        mu_init: float | None = None,
        lambda_init: float = 0.0,
        cap_scores: bool | None = None,
        preset: str | None = None,
        tau_update: str = "auto",
        tau_lr: float | None = None,
        groups: object = None,
        shard: Shard | None = None,
    ) -> None:
        resolved = resolve_options(
            preset,
            tau_update=tau_update,
            projection=projection,
            dual_lr_lambda=dual_lr_lambda,
            dual_lr_mu=dual_lr_mu,
            cap_scores=cap_scores,
        )
        projection, tau_update = resolved["projection"], resolved["tau_update"]
        dual_lr_lambda, dual_lr_mu = resolved["dual_lr_lambda"], resolved["dual_lr_mu"]
        cap_scores = resolved["cap_scores"]
        super().__init__(
            shape_labels,
            positive_classes=positive_classes,
            projection=projection,
            inline_strength=inline_strength,
            dual_lr_lambda=dual_lr_lambda,
            groups=groups,
            shard=shard,
        )
        self.dual_lr_mu = _checks.number("dual_lr_mu", dual_lr_mu, 0)
        self.preset = preset
        self.beta = _checks.number("beta", beta, 0, strict=True)
        mu_init = _checks.number("mu_init", -(self.beta**2) if mu_init is None else mu_init)
        p, n_pos = self.n_problems, self.layout.pos_index.numel()
        # (eps, tau) = (1, 1): a point of C with mean tau = 1, O(1) as (3') intends
        self.eps_param = nn.Parameter(torch.ones(p))
        dense = tau_update == "dense"
        if self.sharded and (dense or p != 1):
            raise ValueError(
                f"shard: a sharded F-beta needs one positive class and a sparse tau update, got "
                f"positive_classes={self.classes}, tau_update={tau_update!r} (tau_update='auto' "
                "is dense once projection or preset is given: pass "
                "tau_update='sparse_adam_ahead'; the trainer: regularizer.fbeta.tau_update)"
            )
        lr = _checks.number("tau_lr", DEFAULT_TAU_LR if tau_lr is None else tau_lr, 0, strict=True)
        self.sparse_tau: SparseTau | None = None  # the rows' own update (reparam.sparse)
        if dense:
            self._dense_tau_lr = lr  # (unused: the user's optimizer steps tau)
            self.tau_param = nn.Parameter(torch.ones(n_pos))
        else:
            if isinstance(self.schedule, Inline):
                raise ValueError(
                    f"tau_update={tau_update!r} steps only the rows a batch touches, but "
                    "projection='inline' couples every tau in each step's loss (O(n) per step): "
                    "use projection 'tracked' (O(B)) or 'epoch' (the paper's), or "
                    "tau_update='dense'"
                )
            self.register_buffer("tau_param", torch.ones(n_pos))
            # tau_lr not given: attach() follows the optimizer's lr
            self.sparse_tau = SparseTau(n_pos, lr=lr, lr_given=tau_lr is not None, comm=self._comm)
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
        """``L_B`` (docs/method.md sec. 3), the mean over the problems (positive classes, or
        (class, group) pairs, sec. 12) in one autograd node with no batch split
        (``reparam.lagrangian.batch_lagrangian``; ``rows``: the batch's rows of ``tau``, ``-1``
        for a negative)."""
        tracked = self._tracked
        eps, tau = self.constrained_parameters()  # inline: Pi_C of them, with autograd
        lam, share = self.lam, None
        problem = scale = eps_weight = None
        if self.layout.one_problem:  # the hot path: one problem, scalars
            is_pos = rows >= 0
            touched = is_pos
            scale = self.n_samples / (self.layout.n_pos_list[0] * self._batch_of(idx))
        else:  # one entry per (sample, class column), each in its problem
            problem, scale, eps_weight = self.layout.batch_problems(idx)
            columns = len(self.classes)
            row_problem = self.layout.tau_group.index_select(0, rows.clamp_min(0)).long()
            is_pos = (rows >= 0).unsqueeze(1) & (row_problem.unsqueeze(1) == problem)
            touched = is_pos.any(1)  # a sample is a positive of one problem at most
            u, problem, is_pos = u.reshape(-1), problem.reshape(-1), is_pos.reshape(-1)
        if tracked is not None and self.sparse_tau is None:  # the optimizer moved every row:
            tracked.retest_all_(self.tau_param, self.eps_param, self.layout.row_groups)  # O(n)
            self._forget_("constrained")
        slots = rows.clamp_min(0)
        if tracked is not None or self.sparse_tau is not None:  # the batch's rows, O(B)
            tau, lam = self._batch_rows(tau, rows, touched)
            slots = None if problem is None else torch.arange(rows.numel(), device=rows.device)
        if problem is not None:  # a sample's row serves every column
            slots = slots.unsqueeze(1).expand(-1, columns).reshape(-1)
        if tracked is not None:  # the loss sees e*
            eps, share = tracked.threshold(self.eps_param)
            if problem is None:
                share = share.view(())
        return batch_lagrangian(
            eps,
            tau,
            u,
            lam,
            self.mu,
            is_pos,
            slots,
            beta=self.beta,
            scale=scale,
            cap=self.cap_scores,
            share=share,
            problem=problem,
            eps_weight=eps_weight,
        )

    def _batch_rows(self, tau: Tensor, slots: Tensor, touched: Tensor) -> tuple[Tensor, ...]:
        """The batch's view for ``lagrangian.batch_lagrangian`` in O(B): its rows' values
        (``(B,)``; mode ``"tracked"``: the offset plus ``eps`` for a row of ``A``; a sparse
        ``tau``: plus the probe that collects their gradient, ``reparam.sparse``), their
        ``lambda``. ``touched``: the samples that are positives."""
        rows = slots.clamp_min(0)
        if tau.shape[0] == 0:  # a shard holding no positive: every entry is a negative
            tau, lam = tau.new_zeros(1), self.lam.new_zeros(1)
            probe = self.sparse_tau.probe(rows, touched)
            values = tau.expand(rows.shape[0]) + (0 if probe is None else probe)
            return values, lam.expand(rows.shape[0])
        values = tau.index_select(0, rows)
        if self._tracked is not None:
            values = values + self._tracked.shift(rows, self.eps_param, self.layout.row_groups)
        if self.sparse_tau is not None:
            probe = self.sparse_tau.probe(rows, touched)
            if probe is not None:
                values = values + probe
        return values, self.lam.index_select(0, rows)

    @property
    def tau_update(self) -> str:
        """Who steps ``tau``: ``"dense"`` (the user's optimizer) or ``"sparse_adam_ahead"``
        (``reg.sparse_tau``)."""
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

    @property
    def _needs_after_step(self) -> str | None:
        if self.sparse_tau is not None:
            return f"tau_update={self.tau_update!r} steps tau there, so tau does not move"
        return super()._needs_after_step

    def _after_step_body_(self) -> None:
        """The sparse ``tau`` step on the rows the backward passes since the last call touched
        (``reparam.sparse``), with the tracked active set kept in step in mode ``"tracked"``."""
        if self.sparse_tau is not None and self.sparse_tau.pending:
            tracked = self._tracked
            if tracked is not None:  # A kept in step with the rows' change
                tracked = partial(
                    tracked.step_, self.tau_param, self.eps_param, self.layout.row_groups
                )
            self.sparse_tau.step_(self.tau_param, tracked)

    # --- the sparse tau's conveniences ------------------------------------------------------------

    @property
    def tau_lr(self) -> float:
        """The sparse update's step size (``reg.sparse_tau.lr``)."""
        return self.sparse_tau.lr if self.sparse_tau is not None else self._dense_tau_lr

    @tau_lr.setter
    def tau_lr(self, value: float) -> None:
        if self.sparse_tau is None:
            raise AttributeError("tau_lr steps a sparse tau; tau_update='dense' has none")
        self.sparse_tau.lr = value

    def reserve_(self, entries: int) -> None:
        """Room for ``entries`` batch entries between two steps: call it before ``torch.compile``
        traces a step with batches of more than 4096 entries (eagerly the room grows)."""
        if self.sparse_tau is not None:
            self.sparse_tau.reserve_(entries)

    def attach(self, optimizer: torch.optim.Optimizer) -> torch.utils.hooks.RemovableHandle:
        """``ShapeObjective.attach``; with a sparse ``tau`` and ``tau_lr`` not given, the sparse
        step also takes the lr of the optimizer's group that steps ``eps``, at every step
        (schedules included): the step a dense ``tau`` in that group would take."""
        handle = super().attach(optimizer)
        group = self.tau_lr_source(optimizer)
        if group is None:
            return handle
        handle.remove()

        def hook(*_) -> None:
            self.tau_lr = float(group["lr"])
            self.after_step_()

        return optimizer.register_step_post_hook(hook)

    def tau_lr_source(self, optimizer: torch.optim.Optimizer) -> dict | None:
        """The param group of ``optimizer`` whose lr the sparse ``tau`` step takes: with a sparse
        ``tau`` and ``tau_lr`` not given, the group that steps ``eps`` (set ``self.tau_lr`` from
        its ``"lr"`` before each ``after_step_()``, as ``attach`` does); else ``None``."""
        if self.sparse_tau is None:
            return None
        return self.sparse_tau.lr_source(optimizer, self.eps_param)

    def share_sparse_grads_(
        self, all_gather: Callable[[Tensor], Tensor], processes: int, size: int
    ) -> None:
        """Data parallelism with a replicated sparse ``tau``: the pending gradient becomes the mean
        over the processes (``reparam.sparse.SparseTau.share_``). Call it after the backward pass
        and before ``after_step_()``, on every process."""
        if self.sparse_tau is None:
            raise RuntimeError(
                "share_sparse_grads_() is for a sparse tau (tau_update='dense' here)"
            )
        self.sparse_tau.share_(all_gather, processes, size)

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
        return project_onto_c(eps, tau, groups=self.layout.groups)

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
        for k in range(self.n_problems):
            u_pos, u_neg = self._split_scores(k)
            self.decision_threshold[k] = Fn.best_fbeta_threshold(
                u_pos, u_neg, self.beta, self._comm
            )[0]
        self._check_inert()

    def _check_inert(self) -> None:
        """After the epoch's dual step: why the regularizer may be doing nothing (``stats()["inert"]``,
        ``None`` when nothing looks wrong; docs/segmentation.md has the CamVid measurements).

        * the node decides one way for every scored training sample: the positives are not pulled
          above 0 (``lambda`` ~0: the paper's ``lambda_init=0`` with its dual step 1e-3 per epoch);
        * ``eps`` and ``tau`` moved by < 1e-3 in the epoch while ``tau_i <= u_i`` is violated: the
          optimizer barely steps them (their gradients carry ``alpha``: with SGD the step is
          ``lr * alpha``);
        * ``mean tau`` is off 1 by > 0.01 and ``mu`` moved by < 1e-4: ``dual_lr_mu`` is too small
          to enforce the equality (the paper's 1e-5);
        * no certified bound: the positives' mean capped score is below 1."""
        eps, tau = self.eps.detach().float(), self.tau.detach().float()
        p = self.n_problems
        one = torch.ones_like(eps[:1])
        moments = torch.cat([self._mean(tau).view(1), self._mean(tau.square()).sqrt().view(1), one])
        now = torch.cat([eps, self.mu.float(), moments.nan_to_num()])  # no positive: mean NaN
        prev = self.inert_ref.clone() if float(self.inert_ref[-1]) == 1 else None
        self.inert_ref.copy_(now)
        stats = self._objective_stats()
        reasons = []
        # per class; per group, all of a class's groups together (one line, not one per group)
        for j, cls in enumerate(self.classes):
            parts = [
                self._split_scores(k) for k in range(p) if self.layout.problem_class_list[k] == j
            ]
            u = torch.cat([x for pair in parts for x in pair])
            above, at_or_below = self._any(u > 0), self._any(u <= 0)
            if above != at_or_below:  # some scored sample, all on one side
                side = "above" if above else "at or below"
                reasons.append(
                    f"the scores of every scored training sample are {side} 0 (class "
                    f"{cls}: u in [{float(self._min(u)):.3g}, {float(self._max(u)):.3g}], lambda "
                    f"mean {float(self._mean(self.lam)):.3g}): the positives are not pulled above "
                    f"the margin. {self._inert_remedies()}"
                )
        if prev is not None:
            delta = (now - prev).abs()
            moved = max(float(delta[:p].max()), float(delta[2 * p :].max()))  # eps, tau moments
            target_tau, target_u = self._lambda_targets()
            seen = self._seen_positives()
            over = (target_tau - target_u).clamp_min(0)[seen]
            violated = float(self._mean(over)) if self._any(seen) else 0
            if moved < 1e-3 and violated > 1e-3:
                reasons.append(
                    f"eps and tau moved by < 1e-3 in the last epoch ({moved:.2g}) although tau_i <= "
                    f"u_i is violated by {violated:.3g} on average: their gradients are scaled by "
                    f"alpha, so with SGD their step is lr * alpha; train them with Adam (as the "
                    f"paper) or raise their lr (optim.regularizer_lr)"
                )
            off = float((self._class_mean(tau) - 1).abs().max())
            if off > 0.01 and float(delta[p : 2 * p].max()) < 1e-4:
                reasons.append(
                    f"mean tau is {off:.3g} away from 1 and mu moved by < 1e-4: dual_lr_mu="
                    f"{self.dual_lr_mu:g} is too small to enforce mean tau = 1 (the defaults: 0.1)"
                )
        if self._any(self.seen_ever) and stats["certified_fbeta"] is None:
            reasons.append(
                "no certified F-beta bound (the positives' mean score capped at eps is below 1): "
                "the positives are not above the margin yet"
            )
        self.inert = "; ".join(reasons) or None

    def _inert_remedies(self) -> str:
        """What to change when the scores sit on one side of 0: only the remedies not already in
        effect (a run on the library defaults is not told to use them)."""
        out = []
        if self.cap_scores and float(self._min(self.lam)) >= self.beta**2 - 1e-6:
            out.append("raise dual_lr_lambda (lambda grows by it per epoch)")
        else:
            out.append(
                f"start lambda at beta^2 with capped scores (lambda_init={self.beta**2:g}, "
                f"cap_scores=True) or raise dual_lr_lambda"
            )
        if self.preset is not None:
            out.append("use the library defaults (preset=None)")
        return "Remedies: " + "; ".join(out)

    def _class_mean(self, tau: Tensor) -> Tensor:
        sums = torch.zeros_like(self.mu).index_add_(0, self.layout.groups, tau.float())
        return self._comm.sum(sums) / self.layout.n_pos

    # --- reporting ------------------------------------------------------------------------------

    def _objective_stats(self) -> dict[str, float | int | list | bool | None]:
        """``eps``, ``mu``; ``certified_fbeta``: the bound of docs/method.md sec. 2 on the F-beta
        of ``u > 0`` over the scored samples (``None`` when ``mean u_pos < 1``: no certificate);
        ``train_fbeta``: their true F-beta; violations of C (``tau_i > eps``) and of
        ``|mean tau - 1|`` (dualized). Per-class lists when there are several classes."""
        eps, tau = self.eps.detach().float(), self.tau.detach().float()
        bounds, fbetas, at_threshold = [], [], []
        for k in range(self.n_problems):
            u_pos, u_neg = self._split_scores(k)
            scored = self._comm.total(u_pos.numel()) > 0
            comm = self._comm
            bounds.append(
                Fn.certified_fbeta_bound(u_pos, u_neg, self.beta, comm) if scored else None
            )
            fbetas.append(Fn.fbeta_of_decisions(u_pos, u_neg, self.beta, comm) if scored else None)
            t = float(self.decision_threshold[k])
            at_threshold.append(
                Fn.fbeta_of_decisions(u_pos - t, u_neg - t, self.beta, comm) if scored else None
            )
        out: dict[str, float | int | list | bool | None] = {
            "eps": float(eps.mean()),
            "mu": float(self.mu.mean()),
            "violation_tau_gt_eps_max": float(
                self._max((tau - self.layout.per_row(eps)).clamp_min(0))
            ),
            "violation_mean_tau_max": float((self._class_mean(tau) - 1).abs().max()),
            "certified_fbeta": _mean_or_none(bounds),
            "train_fbeta": _mean_or_none(fbetas),
            "decision_threshold": float(self.decision_threshold.mean()),
            "train_fbeta_at_threshold": _mean_or_none(at_threshold),
            "inert": getattr(self, "inert", None),
        }
        if self.grouped:  # the mean over the scored problems; one without a certificate counts 0
            scored = [k for k, f in enumerate(fbetas) if f is not None]
            out |= {
                "certified_fbeta": _mean_of([bounds[k] or 0.0 for k in scored]),
                "train_fbeta": _mean_of([fbetas[k] for k in scored]),
                "train_fbeta_at_threshold": _mean_of([at_threshold[k] for k in scored]),
                "certified_fraction": _mean_of([float(bounds[k] is not None) for k in scored]),
                "problems_scored": len(scored),
            }
        elif len(self.classes) > 1:
            out |= {
                "eps_per_class": eps.tolist(),
                "mu_per_class": self.mu.tolist(),
                "certified_fbeta_per_class": bounds,
                "train_fbeta_per_class": fbetas,
            }
        return out

    def extra_repr(self) -> str:
        return (
            f"n={self.n_samples}, "
            + (
                f"groups={self.n_groups}, problems={self.n_problems}, "
                f"positives={int(self.layout.n_pos.sum())}, "
                if self.grouped
                else f"positives={self.layout.n_pos.long().tolist()}, "
            )
            + f"classes={self.classes}, beta={self.beta}, projection={self.projection!r}, "
            f"cap_scores={self.cap_scores}"
            + (f", preset={self.preset!r}" if self.preset else "")
            + (
                f", tau_update={self.tau_update!r}, tau_lr={self.tau_lr:g}"
                if self.sparse_tau is not None
                else ""
            )
        )


def _mean_of(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _mean_or_none(xs: list) -> float | None:
    return None if any(x is None for x in xs) else sum(xs) / len(xs)
