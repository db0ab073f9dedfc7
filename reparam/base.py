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

import contextlib
from collections.abc import Callable, Sequence
from functools import partial

import torch
from torch import Tensor

from . import _checks
from .compiling import compiled_steps
from .objective import ShapeObjective
from .options import DEFAULT_TAU_LR
from .schedules import EpochEnd, Inline, Schedule
from .sparse import SparseTau
from .tracked import TrackedThreshold

PROJECTION_MODES = ("tracked", "epoch", "inline")  # the schedules' names (reparam.schedules)


class ReparamRegularizer(ShapeObjective):
    """Base of the reparameterized objectives; see the module docstring. Not used directly.

    Args:
        shape_labels: ``(N,)`` integer shape labels of the training set.
        positive_classes: the shape classes with a problem of their own.
        projection: the schedule's name, one of ``PROJECTION_MODES``.
        inline_strength: the inline schedule's smoothing (``> 0`` only with ``"inline"``).
        dual_lr_lambda: ``lambda``'s dual step (``>= 0``).
        groups: ``(N,)`` integer group of every sample (``-1``: none), or ``None``.
        shard: this process's block of the samples (``reparam.Shard``), or ``None``.

    Examples:
        >>> import torch
        >>> from reparam import ROCAUC, FBetaRegularizer, ReparamRegularizer
        >>> labels = torch.tensor([0, 1, 1, 0, 1])
        >>> regs = [FBetaRegularizer(labels, projection="epoch"), ROCAUC(labels, grid=2)]
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
        projection: str,
        inline_strength: float,
        dual_lr_lambda: float,
        groups: object = None,
        shard: object = None,
    ) -> None:
        super().__init__(
            shape_labels, positive_classes=positive_classes, groups=groups, shard=shard
        )
        self.schedule = self._schedule(projection, inline_strength)
        self.sparse_tau: SparseTau | None = None  # rows stepped by the objective's own rule
        self.dual_lr_lambda = _checks.number("dual_lr_lambda", dual_lr_lambda, 0)
        self.register_load_state_dict_pre_hook(_fresh_sparse_moments)

    def _schedule(self, projection: str, inline_strength: float) -> Schedule:
        """The schedule named ``projection`` (``inline_strength``: the inline one's smoothing)."""
        name = _checks.choice("projection", projection, PROJECTION_MODES)
        strength = _checks.number("inline_strength", inline_strength, 0)
        if strength > 0 and name != "inline":  # it would do nothing
            raise ValueError(
                f"inline_strength={inline_strength!r} smooths the inline projection, but "
                f"projection is {name!r}: pass projection='inline' with it"
            )
        if name == "tracked":
            lay = self.layout
            return TrackedThreshold(
                lay.pos_index.numel(), lay.n_problems, self._comm, lay.owned_here
            )
        return Inline(strength) if name == "inline" else EpochEnd()

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
        forward, self._compiled_after_step = compiled_steps(type(self), **options)
        self._compiled_forward = partial(_with_room, forward)

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

    # --- rows stepped by the objective (reg.sparse_tau, reparam/sparse.py) -----------------------

    _dense_tau_lr = DEFAULT_TAU_LR

    @property
    def tau_lr(self) -> float:
        """The sparse update's step size (``reg.sparse_tau.lr``)."""
        return self.sparse_tau.lr if self.sparse_tau is not None else self._dense_tau_lr

    @tau_lr.setter
    def tau_lr(self, value: float) -> None:
        if self.sparse_tau is None:
            raise AttributeError("tau_lr steps a sparse tau; tau_update='dense' has none")
        self.sparse_tau.lr = value

    @property
    def steps_tau_in_backward(self) -> bool:
        """Whether the backward passes step ``tau``, leaving ``after_step_()`` nothing to do.

        True for a sparse ``tau`` on one process, outside ``deferred_tau_step()``, with no
        deferred step pending."""
        sparse = self.sparse_tau
        return sparse is not None and sparse.fused and not sparse.pending

    @property
    def _needs_after_step(self) -> str | None:
        if self.sparse_tau is not None and not self.sparse_tau.fused:
            return f"tau_update={self.tau_update!r} steps tau there, so tau does not move"
        return super()._needs_after_step

    def deferred_tau_step(self) -> contextlib.AbstractContextManager:
        """Defer the sparse ``tau`` step of the block's backward passes to ``after_step_()``.

        For gradient accumulation: run the micro-batches' forward and backward inside it, then
        ``optimizer.step()`` and ``reg.after_step_()``: one step on the summed gradient, as a
        dense ``tau`` takes. Without a sparse ``tau``, a no-op.

        Examples:
            >>> import torch
            >>> from reparam import FBetaRegularizer
            >>> reg = FBetaRegularizer(torch.tensor([0, 1, 1, 0, 1]))
            >>> with reg.deferred_tau_step():
            ...     for idx in (torch.tensor([0, 1]), torch.tensor([2, 4])):
            ...         reg(torch.randn(2, requires_grad=True), idx).backward()
            >>> reg.after_step_()  # (after the optimizer's step)
            >>> int(reg.sparse_tau.step)
            1
        """
        return contextlib.nullcontext() if self.sparse_tau is None else self.sparse_tau.deferred()

    def reserve_(self, entries: int) -> None:
        """Make room for ``entries`` batch entries between two steps.

        Call it, with the batch's entries, before your ``torch.compile`` traces a step: the
        rows a step in the backward holds for their re-test have room for 256 entries, a
        deferred step's gradient for 4096, and a graph cannot make more. Eagerly, and under
        ``reg.compile()``, the room is made by itself."""
        sparse = self.sparse_tau
        if sparse is not None:
            sparse.reserve_(entries)
            if sparse.fused and isinstance(self.schedule, TrackedThreshold):  # the held rows
                self.schedule.make_room_(entries)

    def attach(self, optimizer: torch.optim.Optimizer) -> torch.utils.hooks.RemovableHandle:
        """Run ``after_step_`` after every ``optimizer.step()``, as ``ShapeObjective.attach``.

        With a sparse ``tau`` and ``tau_lr`` not given, the sparse step takes the lr of the group
        that steps the first parameter (``eps``), schedules included, read at every forward and
        optimizer step (a tensor lr with no host sync)."""
        handle = super().attach(optimizer)
        group = self.tau_lr_source(optimizer)
        if group is None:
            return handle
        handle.remove()

        def follow(*_) -> None:
            self.sparse_tau.follow_lr_(group["lr"])

        def hook(*_) -> None:
            follow()
            if not self.steps_tau_in_backward:  # (else nothing is left for it to do)
                self.after_step_()

        on_forward = self.register_forward_pre_hook(follow)
        on_step = optimizer.register_step_post_hook(hook)
        return _Handles(on_forward, on_step)

    def tau_lr_source(self, optimizer: torch.optim.Optimizer) -> dict | None:
        """The param group of ``optimizer`` whose lr the sparse ``tau`` step takes.

        With a sparse ``tau`` and ``tau_lr`` not given, the group that steps ``eps`` (set
        ``self.tau_lr`` from its ``"lr"`` before each ``after_step_()``, as ``attach`` does); else
        ``None``."""
        if self.sparse_tau is None:
            return None
        return self.sparse_tau.lr_source(optimizer, next(self.parameters()))

    def share_sparse_grads_(
        self, all_gather: Callable[[Tensor], Tensor], processes: int, size: int
    ) -> None:
        """Average the pending sparse ``tau`` gradient over data-parallel processes.

        For data parallelism with a replicated sparse ``tau``: the pending gradient becomes the mean
        over the processes (``reparam.sparse.SparseTau.share_``). Call it after the backward pass
        and before ``after_step_()``, on every process."""
        if self.sparse_tau is None:
            raise RuntimeError(
                "share_sparse_grads_() is for a sparse tau (tau_update='dense' here)"
            )
        self.sparse_tau.share_(all_gather, processes, size)

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


class _Handles:
    """The handles of several hooks, removed together (``ReparamRegularizer.attach``)."""

    def __init__(self, *handles: torch.utils.hooks.RemovableHandle) -> None:
        self.handles = handles

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _with_room(forward: Callable, reg: ReparamRegularizer, scores: Tensor, idx: Tensor) -> Tensor:
    """``reg.compile()``'s forward: the room for the batch's entries made eagerly first
    (``reserve_``; a compiled graph cannot make it), then the compiled ``forward``."""
    held = getattr(reg.schedule, "held_rows", None)
    if held is not None and held.numel() != idx.numel():  # (a size check: no host read)
        reg.reserve_(idx.numel())
    return forward(reg, scores, idx)
