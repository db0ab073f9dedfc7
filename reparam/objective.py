r"""``ShapeObjective``: what every objective on the shape node's scores shares.

The reparameterized objectives (F-beta, P@R, R@P, ROC-AUC) and the minibatch alternatives of
``reparam.baselines`` all take ``loss = reg(scores, idx)`` per step, ``reg.attach(optimizer)``
once (its hook runs the objective's step after every ``optimizer.step()``) and
``reg.end_epoch_()`` per epoch; a forward in ``eval()`` mode or under ``torch.no_grad()``
records nothing. This base owns the training set's labels and problems (``reg.layout``), the
**score memory** (each sample's last score and its epoch, which the dual steps and ``stats()``
read: no extra pass over the data), the epoch counters, ``_merge_scores_``, float32 state, the
misuse monitor (``reg._monitor``) and the conveniences ``attach`` and ``epochs``. A subclass
provides ``_loss``, ``_end_epoch_body_``, ``_after_step_body_`` and ``_objective_stats``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from . import _checks
from ._monitor import Handles, MisuseMonitor
from .compiling import tracing
from .layout import ProblemLayout, smallest_int
from .memory import Memo, merge_, remember_
from .sharding import Shard, ShardedRows


class ShapeObjective(ShardedRows, nn.Module):
    """Base of every objective on the shape node's scores; see the module docstring."""

    _needs_end_epoch = True  # warn when end_epoch_() is forgotten (False: it only counts epochs)
    _sample_state = ("shape_labels", "scores", "score_epoch")  # per sample, per row: resharding
    _row_state: tuple[str, ...] = ()
    # The state_dict's layout (torch's idiom: in its metadata, checked on load, another refused
    # with a message). 3: the problems' layout in reg.layout
    _version = 3

    def __init__(
        self,
        shape_labels: object,
        *,
        positive_classes: Sequence[int],
        groups: object = None,
        shard: Shard | None = None,
    ) -> None:
        super().__init__()
        labels = _checks.shape_labels(shape_labels)  # validated as int64, then stored compactly
        classes = _checks.positive_classes(positive_classes)
        n_total = labels.numel()
        self._init_shard(shard, n_total)
        group_of = None if groups is None else _checks.groups(groups, n_total)
        self.classes = classes
        # the problems and the rows of the per-positive variables (reparam/layout.py)
        self.layout = ProblemLayout(labels, classes, group_of, self._comm, self._n_total)
        # State per training sample (method note sec. 11): the smallest exact dtypes
        self.register_buffer("shape_labels", labels.to(smallest_int(int(labels.max())), copy=True))
        self.register_buffer("scores", torch.zeros(n_total, len(classes)))  # u, one column/class
        # epoch (value of ``epoch`` then) in which each score was recorded; -1: never (seen_ever)
        self.register_buffer("score_epoch", torch.full((n_total,), -1, dtype=torch.int32))
        self.register_buffer("epoch", torch.zeros((), dtype=torch.int32))  # epochs completed
        self.register_buffer("batches", torch.zeros((), dtype=torch.int64))  # forward calls
        self.register_buffer("projections", torch.zeros((), dtype=torch.int64))
        self.register_buffer("projections_epoch", torch.zeros((), dtype=torch.int64))
        self.register_buffer("projections_last_epoch", torch.zeros((), dtype=torch.int64))
        self._monitor = MisuseMonitor(type(self).__name__)  # reparam/_monitor.py
        self._memos = Memo()  # what the epoch end computes once (reparam/memory.py)
        # (indices, scores) written since the last step (_track_writes)
        self._written: list[tuple[Tensor, Tensor]] = []

    @property
    def grouped(self) -> bool:
        """Whether the objective is per group (``groups`` given): one problem per (class, group)."""
        return self.layout.grouped

    @property
    def n_problems(self) -> int:
        """``K``: the problems, one per (positive class, group with a positive of it)."""
        return self.layout.n_problems

    n_groups = property(lambda self: self.layout.n_groups)

    # --- the loss -------------------------------------------------------------------------------

    # ReparamRegularizer.compile() sets them: the forward and after_step_ then call these
    _compiled_forward = _compiled_after_step = None

    def forward(self, scores: Tensor, idx: Tensor) -> Tensor:
        """The objective's loss on the batch (for the reparameterized objectives the minibatch
        Lagrangian ``L_B``, method note sec. 3 and 8); remembers the batch's scores.

        In ``eval()`` mode or under ``torch.no_grad()`` it returns the loss and changes no state
        (no score remembered, nothing counted, no multiplier step): a validation loss.

        Args:
            scores: shape-head outputs, ``(B,)`` (one positive class) or ``(B, K)``: column ``c``
                is the score of shape class ``c`` (``K = 1`` also for one class).
            idx: int64 ``(B,)`` dataset indices of the batch's samples.
        """
        return self._dispatch(self._compiled_forward, self._forward, scores, idx)

    def _dispatch(self, compiled: Callable | None, eager: Callable, *args: Tensor) -> Tensor | None:
        """``reg.compile()``'s form of a step, or the eager one (also inside a caller's
        ``torch.compile``, which traces it into its own graph)."""
        if compiled is not None and not tracing():
            return compiled(self, *args)
        return eager(*args)

    def _forward(self, scores: Tensor, idx: Tensor) -> Tensor:
        scores, idx = self._to_owner(scores, idx)  # sharded: the entries this process owns
        u, idx, ok = _checks.batch(
            scores, idx, self.classes, self.shape_labels.numel(), self.shape_labels.device
        )
        batch = idx.numel()
        # a training forward records; in eval() or under no_grad the loss is all it returns
        records = self._records = self.training and torch.is_grad_enabled()
        if records:
            self._monitor.count_forward(batch, self._samples_per_epoch, self._duties)
        if batch == 0 and self._comm.world == 1:  # (with several processes, every one steps)
            # nothing to estimate; keep a graph so backward() still works
            return sum((p * 0.0).sum() for p in self.parameters()) + (u * 0.0).sum()
        if ok is None:  # eager on the CPU: idx checked by the gather's own bounds check
            rows = _checks.rows(self.layout.slot, idx)
        else:
            rows = self.layout.slot.index_select(0, idx)
            u, rows = self._monitor.mask_faults_(u, rows, *ok, self.batches, records)
        if records:
            self._remember_(u, idx, ok)
        return self._loss(u, idx, rows)

    def _duties(self) -> tuple[bool, str | None, str]:
        """For the misuse warnings (``MisuseMonitor.on_forward``): whether ``end_epoch_()`` is
        needed, what is lost without ``after_step_()``, and what the epoch end does."""
        schedule = getattr(self, "schedule", None)
        projects = schedule is not None and schedule.projects_at_epoch_end
        work = "dual step" + (" and no projection" if projects else "")
        return self._needs_end_epoch, self._needs_after_step, work

    _records = True  # whether the forward running records its batch (training, with gradients)
    _track_writes = False  # replicated processes (ReparamRegularizer.attach): note written indices

    def _remember_(self, u: Tensor, idx: Tensor, ok: tuple[Tensor, Tensor] | None) -> None:
        """Record the batch's scores and their epoch (``reparam.memory.remember_``), count it;
        with replicated processes, note the indices for the exchange at the next step."""
        remember_(self.scores, self.score_epoch, self.epoch, u, idx, ok)
        self.batches.add_(1)
        if self._track_writes:  # (the values as written: DDP may broadcast the buffer over them)
            self._written.append((idx, self.scores.index_select(0, idx)))

    @property
    def seen_ever(self) -> Tensor:
        """bool ``(N,)``: which samples have a remembered score (``score_epoch >= 0``). Derived, not
        stored: a new tensor at every read (to change it, write ``score_epoch``)."""
        return self.score_epoch >= 0

    def _seen_positives(self) -> Tensor:
        """bool ``(n,)``: ``seen_ever`` of the rows of ``tau`` (O(n), not O(N))."""
        return self.score_epoch.index_select(0, self.layout.pos_index) >= 0

    @property
    def n_samples(self) -> int:
        """``N``, the number of training samples (the length of ``shape_labels``; sharded: of
        all the processes' together)."""
        return self._n_total

    # --- the schedule ---------------------------------------------------------------------------

    def after_step_(self) -> None:
        """Call after every optimizer step (a sparse ``tau`` is stepped here)."""
        with torch.no_grad():
            self._dispatch(self._compiled_after_step, self._after_step)

    @torch.no_grad()
    def _after_step(self) -> None:
        self._monitor.count_after_step()
        self._after_step_body_()

    @torch.no_grad()
    def end_epoch_(self) -> None:
        """Call once per epoch: the objective's epoch end (projection and dual ascent for the
        reparameterized objectives, method note sec. 3b), then the epoch counters.

        Raises ``ValueError`` first if a forward call inside ``torch.compile`` or on an
        accelerator got a non-finite score or an index out of range since the last epoch end
        (those entries were masked: ``MisuseMonitor.mask_faults_``)."""
        self._monitor.check_device_(self.shape_labels.numel(), self._duties)
        self._monitor.before_epoch_end(self.named_parameters)
        with self._memos.window():
            self._end_epoch_body_()
        self.epoch += 1
        self.projections_last_epoch.copy_(self.projections_epoch)
        self.projections_epoch.zero_()
        self._monitor.after_epoch_end(self.parameters())

    def _after_step_body_(self) -> None:
        pass

    def _end_epoch_body_(self) -> None:
        pass

    @property
    def _needs_after_step(self) -> str | None:
        """What ``after_step_()`` does that is lost without it (``None``: nothing; no warning)."""
        return None

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ) -> None:
        version = local_metadata.get("version")
        if version is not None and version != self._version:
            error_msgs.append(
                f"{type(self).__name__}: the state has layout version {version}, this library "
                f"reads version {self._version} (saved by another version of fbeta-reparam): "
                f"load it with the version that wrote it, or start from a fresh objective"
            )
            return
        if not self._check_layout(state_dict, prefix, error_msgs):
            return
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    # --- conveniences ---------------------------------------------------------------------------

    def attach(self, optimizer: torch.optim.Optimizer) -> Handles:
        """Run ``after_step_`` after every ``optimizer.step()`` (a step post-hook).

        Checks first that the optimizer steps this regularizer's parameters (``ValueError``
        otherwise). Returns the hook's handle (``.remove()`` detaches it).
        """
        check_stepped(self, optimizer)
        return self._monitor.hooked(
            optimizer.register_step_post_hook(lambda *_: self.after_step_())
        )

    def epochs(self, last: int) -> Iterator[int]:
        """``for epoch in reg.epochs(E): <the epoch's steps>``: yields the epoch numbers from the
        next one (``epoch + 1``, so a restored regularizer continues where it stopped) to ``last``
        and calls ``end_epoch_`` after each epoch's body (not when the body breaks or raises).
        The explicit call remains the alternative."""
        for e in range(int(self.epoch) + 1, int(last) + 1):
            yield e
            self.end_epoch_()

    # --- data-parallel training -----------------------------------------------------------------

    @torch.no_grad()
    def _merge_scores_(self, written: Tensor, all_reduce: Callable[[Tensor], object]) -> None:
        """Make the remembered scores equal across data-parallel processes, before ``end_epoch_``
        (``reparam.memory.merge_``): ``written``, bool ``(N,)``, the samples this process scored
        since the last merge; ``all_reduce``, an in-place sum over the processes. A sample takes
        the mean of the scores written for it; ``seen_ever`` becomes the OR over the processes."""
        merge_(self.scores, self.score_epoch, written, all_reduce)

    # --- reporting ------------------------------------------------------------------------------

    @torch.no_grad()
    def stats(self) -> dict[str, float | int | list | bool | None]:
        """Numbers to log: the objective's figures (see the subclass), the projection counts and how
        fresh the remembered scores are.

        Figures computed from remembered scores use every sample scored so far (``scored_fraction``
        of the training set); ``score_age_epochs_mean`` / ``_max`` say how many epoch ends ago they
        were recorded (0: in the current epoch; right after ``end_epoch_()`` the epoch just finished
        has age 1). ``None`` means: not defined yet (no score, or no certificate).
        """
        # a compiled forward counts on the device: a forgotten end_epoch_ is reported here
        self._monitor.report_device_counts(self.shape_labels.numel(), self._duties)
        seen = self.seen_ever
        age = (self.epoch - self.score_epoch)[seen].float()
        aged = self._comm.total(age.numel()) > 0  # sharded: over every process's samples
        out: dict[str, float | int | list | bool | None] = {
            "epoch": int(self.epoch),
            **self._objective_stats(),
            "projections": int(self.projections),
            "projections_last_epoch": int(self.projections_last_epoch),
            "scored_fraction": float(self._mean(seen.float())),
            "score_age_epochs_mean": float(self._mean(age)) if aged else None,
            "score_age_epochs_max": int(self._max(age)) if aged else None,
        }
        return out

    def _memo(self, key: tuple, compute):
        """``compute()``, computed once per ``key`` while the epoch end or ``stats()`` runs."""
        return self._memos.get(key, compute)

    def _forget_(self, kind: str) -> None:
        """Drop the memoized values of ``kind`` (their inputs were written)."""
        self._memos.forget(kind)

    def _split_scores(self, k: int = 0) -> tuple[Tensor, Tensor]:
        """Remembered scores of problem ``k``'s scored positives and scored negatives (one group:
        problem ``k`` is class ``k``; computed once per problem during ``end_epoch_`` and
        ``stats()``, which write no score)."""
        return self._memo(("split", k), lambda: self._split_now(k))

    def _split_now(self, k: int) -> tuple[Tensor, Tensor]:
        seen = None if self.grouped else self._memo(("seen",), lambda: self.seen_ever)
        return self.layout.split(k, self.shape_labels, self.scores, self.score_epoch, seen)

    _float64_buffers: tuple[str, ...] = ()  # accumulators kept in float64 (moved, never cast)

    def _apply(self, fn, recurse=True):  # keep the objective's floating state in float32
        modules = list(self.modules()) if recurse else [self]  # with its schedule, sparse tau
        return _in_float32(self, modules, lambda: super(ShapeObjective, self)._apply(fn, recurse))

    def _warn_once(self, kind: str, message: str) -> None:
        self._monitor.warn_once(kind, message)

    # --- for subclasses ---------------------------------------------------------------------------

    def _loss(self, u: Tensor, idx: Tensor, rows: Tensor) -> Tensor:
        """The loss of a batch: scores ``u`` (``(B,)`` for one positive class, else ``(B, P)``),
        dataset indices ``idx``, the rows of ``tau`` ``rows = slot[idx]`` (``-1``: a negative)."""
        raise NotImplementedError

    def _objective_stats(self) -> dict[str, float | int | list | bool | None]:
        raise NotImplementedError


def _in_float32(objective: nn.Module, modules: list[nn.Module], apply: Callable) -> nn.Module:
    """``apply()`` (``nn.Module._apply``) with the floating state of ``modules`` kept in float32:
    parameters and buffers cast back, the ``_float64_buffers`` moved to the device only (a cast
    would lose their bits)."""
    kept = {
        (module, name): module._buffers[name]
        for module in modules
        for name in getattr(module, "_float64_buffers", ())
    }
    apply()
    for (module, name), b in kept.items():
        module._buffers[name] = b.to(module._buffers[name].device)
    for module in modules:
        for p in module._parameters.values():
            if p is not None and p.is_floating_point() and p.dtype != torch.float32:
                p.data = p.data.float()
        for name, b in module._buffers.items():
            if (module, name) in kept or b is None:
                continue
            if b.is_floating_point() and b.dtype != torch.float32:
                module._buffers[name] = b.float()
    return objective


def check_stepped(objective: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """``ValueError`` unless ``optimizer`` steps every parameter of ``objective`` (``attach``)."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer)!r}")
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    missing = [name for name, p in objective.named_parameters() if id(p) not in stepped]
    if missing:
        raise ValueError(
            f"optimizer must step the regularizer's parameters {missing}: build it with "
            f"[*model.parameters(), *reg.parameters()] (or add a param group)"
        )
