r"""``ReparamRegularizer``: what every reparameterized objective shares (method note sec. 3, 3b, 8).

An objective (F-beta, P@R, R@P, ROC-AUC) is a Lagrangian in per-positive variables ``tau``, their
multipliers ``lambda`` (buffer, dual ascent ``lambda <- max(0, lambda + dual_lr_lambda (tau - u))``)
and a few objective-level variables. On top of ``ShapeObjective`` this base owns the projection's
schedule (``reg.schedule``: ``tracked``, ``epoch`` or ``inline``; ``reparam.schedules``), a sparse
``tau``'s conveniences and ``compile()``. A subclass provides the raw parameters to project
(``_constrained_names``), the projection (``_project``), the minibatch Lagrangian (``_loss``),
``lambda``'s targets (``_lambda_targets``), its other dual step (``_dual_step_``) and its figures
(``_objective_stats``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from . import _checks
from ._monitor import Handles
from .compiling import compiled_steps
from .memory import gather_written_
from .objective import ShapeObjective, check_stepped
from .options import SCHEDULES, EpochEnd, Inline, Tracked, check_option
from .schedules import EpochEndSchedule, InlineSchedule, Schedule
from .sparse import SparseRows
from .tracked import TrackedThreshold


class ReparamRegularizer(ShapeObjective):
    """Base of the reparameterized objectives; see the module docstring. Not used directly.

    Args:
        shape_labels: ``(N,)`` integer shape labels of the training set.
        positive_classes: the shape classes with a problem of their own.
        schedule: where the projection onto ``C`` is applied: ``Tracked()``, ``EpochEnd()`` or
            ``Inline(strength)`` (``reparam.options``).
        dual_lr_lambda: ``lambda``'s dual step (``>= 0``).
        groups: ``(N,)`` integer group of every sample (``-1``: none), or ``None``.
        shard: this process's block of the samples (``reparam.Shard``), or ``None``.
        process_group: the ``torch.distributed`` group of processes that each hold the whole
            objective (replicated data parallelism; ``None``: the default group once
            initialized). ``attach`` keeps them equal. The objective's collectives run on it
            inside the backward pass, so a group given here must be one of the objective's own,
            not the group DDP reduces on (make it with ``torch.distributed.new_group(ranks)`` on
            every process); with ``None`` ``attach`` makes its own group of all the processes.

    Examples:
        >>> import torch
        >>> from reparam import ROCAUC, FBetaRegularizer, ReparamRegularizer
        >>> labels = torch.tensor([0, 1, 1, 0, 1])
        >>> from reparam import EpochEnd
        >>> regs = [FBetaRegularizer(labels, schedule=EpochEnd()), ROCAUC(labels, grid=2)]
        >>> [isinstance(r, ReparamRegularizer) for r in regs], [r.projection for r in regs]
        ([True, True], ['epoch', 'inline'])
        >>> reg = regs[0]
        >>> reg(torch.tensor([0.2, 0.9]), torch.tensor([0, 2])).backward(); reg.after_step_()
        >>> reg.end_epoch_()  # the schedule's projection onto C, then the dual step
        >>> int(reg.projections), tuple(reg.lam.shape)  # one lambda per positive
        (1, (3,))
    """

    _constrained_names: tuple[str, ...] = ()  # the raw parameters the projection acts on, in order
    _row_state = ("tau_param", "lam")  # one entry per positive (when stored)

    def __init__(
        self,
        shape_labels: object,
        *,
        positive_classes: Sequence[int],
        schedule: Tracked | EpochEnd | Inline,
        dual_lr_lambda: float,
        groups: object = None,
        shard: object = None,
        process_group: object = None,
    ) -> None:
        super().__init__(
            shape_labels, positive_classes=positive_classes, groups=groups, shard=shard
        )
        self.process_group = process_group  # replicated data parallelism (attach), or None
        self.schedule = self._schedule(schedule)
        self.sparse_tau: SparseRows | None = None  # rows stepped by the objective's own rule
        self.dual_lr_lambda = _checks.number("dual_lr_lambda", dual_lr_lambda, 0)
        self.register_load_state_dict_pre_hook(_fresh_sparse_moments)

    def _schedule(self, schedule: Tracked | EpochEnd | Inline) -> Schedule:
        """The schedule module of the option ``schedule`` (``reparam.options``)."""
        schedule = check_option("schedule", schedule, SCHEDULES)
        if isinstance(schedule, Tracked):
            lay = self.layout
            return TrackedThreshold(
                lay.pos_index.numel(), lay.n_problems, self._comm, lay.owned_here
            )
        if isinstance(schedule, Inline):
            return InlineSchedule(schedule.strength)
        return EpochEndSchedule()

    @property
    def projection(self) -> str:
        """The schedule's name (``reg.schedule``: the module)."""
        return self.schedule.name

    @property
    def inline_strength(self) -> float:
        return getattr(self.schedule, "strength", 0.0)

    def compile(self, **kwargs: object) -> None:
        """``torch.compile`` the whole per-step path, each part one graph.

        Each part compiles with ``fullgraph=True``, no graph break (method note sec. 11b): the
        forward (``L_B``, the score memory, the counters and the input masks; AOTAutograd compiles
        its backward with it) and ``after_step_`` (the sparse ``tau`` step, the tracked active
        set). The epoch end stays eager (O(n), once per epoch). ``kwargs`` go to ``torch.compile``
        (for example ``mode="reduce-overhead"`` for CUDA graphs; shapes must then be static: drop
        the last partial batch). Replaces ``nn.Module.compile``; the state, checkpoints and
        ``state_dict`` are unchanged. The first calls compile (seconds to a minute); results match
        eager to rounding (tests/reparam/test_compile.py). Inside a compiled region of your own
        (``torch.compile`` of your training step) the objective traces whole without this call. Mode
        ``"inline"`` runs the exact projection every step, whose root search reads values: it
        compiles with graph breaks (``fullgraph=False``)."""
        routed = self.shard is not None and self.shard.sampling == "global"  # (_routed: a break)
        options = {"fullgraph": self.schedule.traces_whole and not routed, **kwargs}
        self._compiled_forward, self._compiled_after_step = compiled_steps(type(self), **options)

    # --- the loss -------------------------------------------------------------------------------

    def constrained_parameters(self) -> tuple[Tensor, ...]:
        """The constrained variables the loss takes, in ``_constrained_names`` order.

        The parameters themselves, or in mode ``"inline"`` their (soft) projection, with autograd.
        """
        raw = tuple(getattr(self, name) for name in self._constrained_names)
        return self.schedule.view(raw, self._project)

    def _effective(self, position: int) -> Tensor:
        """The value the loss sees for constrained variable ``position`` (``Schedule.seen``): the
        parameter itself in mode ``"epoch"``, its projection in mode ``"inline"``, its clipping
        at the tracked threshold in mode ``"tracked"``, detached: write to the ``*_param``.
        Computed once while ``end_epoch_`` reads it (until a projection writes the parameters)."""
        raw = tuple(getattr(self, name) for name in self._constrained_names)
        seen = lambda: self.schedule.seen(raw, self._project, self.layout.row_groups)  # noqa: E731
        return self._memo(("constrained",), seen)[position]

    # --- the step point: the optimizer's step (attach) ------------------------------------------

    @property
    def _needs_after_step(self) -> str | None:
        if self.sparse_tau is not None:
            return "the sparse tau steps there, so tau does not move"
        if isinstance(self.schedule, TrackedThreshold):
            return "the tracked active set is re-tested there, so the loss sees a stale threshold"
        return super()._needs_after_step

    def attach(self, optimizer: torch.optim.Optimizer) -> Handles:
        """Step the objective's per-row state with ``optimizer``, at every ``optimizer.step()``.

        After every step the rows of a sparse ``tau`` noted since the last step take their step
        on the summed gradient (and the tracked active set is kept in step), so a read after
        ``step()`` returns holds the stepped values (``reg.tau``, ``stats()``,
        ``state_dict()``). Checks first that the optimizer steps this objective's parameters
        (``ValueError`` otherwise). With a sparse ``tau`` and its ``lr`` not given, its step
        takes the lr of the group that steps ``eps`` (lr schedules included).

        Several processes each holding the whole objective (the ``process_group`` given at
        construction, else the initialized default group; not with a ``shard``): each backward
        pass averages the objective's parameters' gradients over the processes (a hook per
        parameter, so a step that runs its backward inside ``optimizer.step(closure)`` is
        covered), and each step first exchanges the sparse rows' gradients and the scores
        written since the last step, so every process holds the same state (method note
        sec. 11). Returns the hooks' handle (``.remove()`` detaches them)."""
        check_stepped(self, optimizer)
        group = (
            None
            if self.sparse_tau is None
            else self.sparse_tau.lr_source(optimizer, self._eps_like)
        )

        def after(*_) -> None:
            if self.sparse_tau is not None and self.sparse_tau.cleared():
                self.sparse_tau.drop_()  # (zero_grad() since the backward: no row moves)
            replicas = self._replicas()
            if replicas is not None:
                self._share_(*replicas)
            if group is not None:
                self.sparse_tau.follow_lr_(group["lr"])
            self.after_step_()

        self._exchange_group = self._own_group()
        self._track_writes = self._replicas() is not None
        averaging = [
            p.register_post_accumulate_grad_hook(self._average_replicas_)
            for p in self.parameters()
            if self.shard is None  # (sharded: replicated parameters average themselves)
        ]
        handles = [optimizer.register_step_post_hook(after), *averaging]
        return self._monitor.hooked(*handles)

    @property
    def _eps_like(self) -> Tensor:
        """The objective's first parameter (``eps``), whose optimizer group sets the sparse lr."""
        return next(self.parameters())

    _exchange_group = None  # attach: the replicas' group of the objective's own collectives

    def _own_group(self) -> object:
        """The process group of the replicas' collectives (``attach``, on every replica): the
        ``process_group`` given, else a group of all the processes for the objective's
        collectives alone, since they run inside backward passes, which must not interleave with
        the collectives DDP runs there on the default group. ``None`` with no replicas."""
        if self.shard is not None or not (dist.is_available() and dist.is_initialized()):
            return None
        if dist.get_world_size(self.process_group) == 1:
            return None
        return self.process_group if self.process_group is not None else _replicas_group()

    def _replicas(self) -> tuple[object, int] | None:
        """``(process group, world size)`` of replicated data parallelism once attached (the
        ``process_group`` given, else ``torch.distributed``'s default group, with several
        processes), or ``None``; never for a sharded objective (its own collectives)."""
        group = self._exchange_group
        return None if group is None else (group, dist.get_world_size(group))

    @torch.no_grad()
    def _average_replicas_(self, p: Tensor) -> None:
        """After a backward pass's gradient reached ``p``: its mean over the replicas (the same
        value again when DDP averaged it already; with several backward passes per step the
        mean of the sum, as the first passes' part is the mean already)."""
        replicas = self._replicas()
        if replicas is not None and p.grad is not None:
            dist.all_reduce(p.grad, group=replicas[0])
            p.grad /= replicas[1]

    @torch.no_grad()
    def _share_(self, group: object, world: int) -> None:
        """A replicated step: the sparse rows' gradients exchanged (``SparseRows.exchange_``) and
        the scores written since the last step gathered in rank order (``memory.gather_written_``)
        before the rows step."""
        if self.sparse_tau is not None:
            self.sparse_tau.exchange_(group, world)
        written, self._written = self._written, []
        gather_written_(self.scores, self.score_epoch, written, group, world)

    # --- the schedule ---------------------------------------------------------------------------

    @torch.no_grad()
    def project_(self) -> None:
        """Project the constrained parameters in place (counted)."""
        raw = tuple(getattr(self, name).detach() for name in self._constrained_names)
        projected = self._project(*raw) if raw else ()  # (rates' saddle blocks: none stored)
        for name, value in zip(self._constrained_names, projected, strict=True):
            getattr(self, name).copy_(value)
        self._forget_("constrained")
        self.projections += 1
        self.projections_epoch += 1

    def _end_epoch_body_(self) -> None:
        r"""End of epoch ``e`` (method note sec. 3b): projection (mode ``"epoch"``), then dual
        ascent on the remembered scores:
        ``lambda_i <- max(0, lambda_i + eta_l (tau_i - u_i))`` for every positive whose score was
        ever recorded (``eta_l = dual_lr_lambda``), then the objective's own multipliers."""
        if self.schedule.projects_at_epoch_end:
            self.project_()
        if self._stores_lambda:
            eta_l = self.dual_lr_lambda
            tau, target = self._lambda_targets()
            have = self._seen_positives()
            have = have.view(-1, *([1] * (tau.dim() - 1)))
            self.lam.copy_(
                torch.where(have, (self.lam + eta_l * (tau - target)).clamp_min(0), self.lam)
            )
        self._dual_step_()

    # --- reporting ------------------------------------------------------------------------------

    @torch.no_grad()
    def stats(self) -> dict[str, float | int | list | bool | None]:
        """Numbers to log: ``ShapeObjective.stats``, ``lambda`` and the constraint violation.

        The violation is that of the dualized ``tau_i <= u_i``, over the positives with a remembered
        score."""
        with self._memos.window():
            return self._stats_now()

    def _stats_now(self) -> dict[str, float | int | list | bool | None]:
        tau, target = self._lambda_targets()
        over_u = (tau - target).clamp_min(0)[self._seen_positives()]
        any_over = self._comm.total(over_u.numel()) > 0
        return super().stats() | {
            "lambda_mean": float(self._mean(self._lambda_values())),
            "lambda_max": float(self._max(self._lambda_values())),
            "tau_mean": float(self._mean(tau)),
            "violation_tau_gt_u_mean": float(self._mean(over_u)) if any_over else 0.0,
            "violation_tau_gt_u_max": float(self._max(over_u)) if any_over else 0.0,
        }

    # --- for subclasses ---------------------------------------------------------------------------

    def _project(self, *raw: Tensor, strength: float = 0.0) -> tuple[Tensor, ...]:
        raise NotImplementedError

    def _loss(self, u: Tensor, idx: Tensor, rows: Tensor) -> Tensor:
        raise NotImplementedError

    def _lambda_targets(self) -> tuple[Tensor, Tensor]:
        """``(tau as the loss sees it, detached; the scores it must stay below)``, shaped like
        ``lam``, from the remembered scores."""
        raise NotImplementedError

    def _dual_step_(self) -> None:
        raise NotImplementedError

    _stores_lambda = True  # lambda is per-sample state (lam), stepped at the epoch end

    def _lambda_values(self) -> Tensor:
        """``lambda`` per positive (what ``stats()`` reports)."""
        return self.lam

    def _objective_stats(self) -> dict[str, float | int | list | bool | None]:
        raise NotImplementedError


def _fresh_sparse_moments(module, state_dict, prefix, *_args) -> None:
    """A dense-``tau`` state loads into a sparse-``tau`` regularizer with fresh (zero) moments
    (switching ``tau_update`` between runs is allowed; nothing else is filled in)."""
    sparse = getattr(module, "sparse_tau", None)
    if sparse is None or prefix + "sparse_tau.step" in state_dict:
        return
    for name, value in sparse.state_dict().items():
        state_dict.setdefault(prefix + "sparse_tau." + name, torch.zeros_like(value))


# the group of every process that attach made, per default group: (the default group, its group)
_REPLICA_GROUPS: dict[int, tuple[object, object]] = {}


def _replicas_group() -> object:
    """A group of every process for the objectives' own collectives, made once per default group
    (by every process, as ``attach`` runs on every replica) and shared by every objective
    attached afterwards: one attached again after a resume, or several in one program, issue
    their collectives in the same order on each replica, as they run the same program. (Not
    ``new_group(..., use_local_synchronization=True)``: torch 2.13 hangs when a group of the same
    ranks was made that way before, or a group that leaves out one of them the usual way.)"""
    world = dist.group.WORLD
    held = _REPLICA_GROUPS.get(id(world))
    if held is None or held[0] is not world:  # (a new default group: the old ones are gone)
        held = _REPLICA_GROUPS[id(world)] = (world, dist.new_group())
    return held[1]
