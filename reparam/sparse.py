r"""``tau_update="sparse_adam_ahead"``: the per-positive ``tau`` stepped on the rows a batch touched,
on dense Adam's trajectory, in O(B) per step whatever the number of positives (method note
sec. 11, which derives the rule and says why not ``torch.optim``).

A row stores its **rest point**, where dense Adam would carry it if no gradient came again:
``rho = tau - lr E(t) m / sqrt(v)``, ``E(t) = sum_{u > t} c_u r^(u - t)`` (``r = b1 / sqrt(b2)``,
``c_u`` the bias correction of step ``u``; a table). A touch after ``k`` idle steps decays the
moments by ``b^k``, takes Adam's step on them and moves the rest point by
``lr E(t) (r^k a - a' / r)``, ``a = m / (sqrt(v) + eps)`` before and ``a'`` after it.

By default the step is part of the backward pass, as a fused optimizer of an embedding table
applies its update in the table's backward: the batch's rows enter the loss through one autograd
node (``StepInBackward``) whose backward sums their gradient per row (repeated rows: one update,
``1 / count`` per occurrence) and steps them, in place. A step costs no call of its own, and under
``torch.compile`` of a user's loss the update is part of the compiled backward.

Deferred (several processes, or inside ``reg.deferred_tau_step()`` for gradient accumulation): the
loss sees ``tau[rows] + probe[a:b]``, ``probe`` a zero leaf that no optimizer steps, and
``after_step_()`` sums ``probe.grad`` per row over the backward passes since the last step, steps
the rows and clears the sums. Both paths take the same step on the same summed gradient. A
non-finite gradient skips the step (on every process when the rows are spread over several).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from functools import partial

import torch
from torch import Tensor, nn

from projections.collective import LOCAL, LocalComm

TAU_UPDATES = ("dense", "sparse_adam_ahead")
ADAM_BETAS = (0.9, 0.999)  # torch.optim.Adam / SparseAdam defaults
ADAM_EPS = 1e-8
_ONE_MINUS_BETAS = tuple(1 - b for b in ADAM_BETAS)


def accumulate_(acc: Tensor, rows: Tensor, touched: Tensor, grad: Tensor) -> None:
    """``acc[rows] += [grad, touched]``: ``acc`` is ``(n, 2)``, the summed gradient and the number
    of contributions per row (``grad`` is 0 where not touched)."""
    add_rows_(acc, rows, torch.stack([grad, touched.to(grad.dtype)], 1))


def add_rows_(state: Tensor, rows: Tensor, values: Tensor) -> None:
    """``state[rows] += values`` for row-paired ``(n, 2)`` state, repeated rows summed in order.
    An ``index_add_``: inductor updates it in place (a ``scatter_add_`` through a broadcast index
    copied all of ``state``: 2 ms at 1e6 rows, torch 2.13)."""
    state.index_add_(0, rows.long(), values)


@torch.no_grad()
def sparse_step_(
    tau: Tensor,
    acc: Tensor,
    rows: Tensor,
    touched: Tensor,
    *,
    lr: Tensor | float,
    moments: Tensor,
    step: Tensor,
    last: Tensor,
    ahead: Tensor | None = None,
    coef: Tensor | None = None,
    write: bool = True,
    comm: LocalComm = LOCAL,
) -> Tensor | None:
    """One ``"sparse_adam_ahead"`` step (module docstring) on the rows ``rows[touched]`` of ``tau``
    and of Adam's state (``moments`` ``(n, 2)`` = ``[m, v]``, the step count ``step``, ``last``
    the step of each row's last touch; ``ahead`` and ``coef``, the tables of ``_ahead_table``
    and ``_coefficients`` on the state's device, ``None``: made here), from the gradient
    summed in ``acc`` (``accumulate_``), which is zero again on ``rows`` afterwards. ``rows`` may repeat and may list rows that are not
    ``touched`` (their update is zero). In place; no host synchronization. Row-paired state
    (``[g, count]``, ``[m, v]``) halves the scattered reads and writes of a step.

    ``write=False``: ``tau`` is left alone and the step returns each entry's row change (the
    row's whole update, 0 where not touched) for the caller to write once (mode ``"tracked"``:
    inductor copies all of ``tau`` when it is read, written and written again in one graph)."""
    rows = rows.long()  # one conversion for the scatters below (int64 rows pass through)
    g, count = acc.index_select(0, rows).unbind(1)
    # a non-finite gradient skips the whole step (on the device)
    # (several processes: skipped on all of them when one has one, so the step counts agree)
    ok = comm.all_of_flag(torch.isfinite(g).all())
    use = ok & touched
    share = torch.where(use, count.reciprocal(), 0.0)  # 1/count per occurrence: one update a row
    g = torch.where(ok, g, 0.0)
    old = moments.index_select(0, rows)
    coef = _coefficients(old.dtype).to(old.device) if coef is None else coef
    betas, one_minus_betas = coef.unbind(0)
    # the k steps since the row's last touch decay its moments
    k = (step - last.index_select(0, rows)).to(old.dtype)
    decayed = old * betas.pow(k.unsqueeze(1))  # dense Adam's moments at the last step
    new = decayed * betas + torch.stack([g, g * g], 1) * one_minus_betas
    a_old = old[:, 0] / (old[:, 1].sqrt() + ADAM_EPS)
    a_new = new[:, 0] / (new[:, 1].sqrt() + ADAM_EPS)
    ahead = _ahead_table(old.dtype).to(old.device) if ahead is None else ahead
    future = ahead.index_select(0, step.clamp_max(_AHEAD_STEPS).view(1))
    move = (a_old * torch.pow(_AHEAD_RATIO, k) - a_new / _AHEAD_RATIO) * future
    add_rows_(moments, rows, (new - old) * share.unsqueeze(1))
    change = None
    if write:
        tau.index_add_(0, rows, move * share * lr)
    else:
        change = torch.where(use, move, 0.0) * lr
    _write_touched_(last, rows, use, (step + 1).to(last.dtype))
    step.add_(ok)
    zero_rows_(acc, rows)
    return change


# sparse_adam_ahead: r = b1 / sqrt(b2), the per-step decay of Adam's m / sqrt(v) without gradient;
# the momentum's future E(t) tabulated up to _AHEAD_STEPS steps (the bias correction is 1 to
# 1e-7 from there on: b2^16384 = 7.6e-8) and to _AHEAD_TERMS terms (r^512 = 4e-24)
_AHEAD_RATIO = ADAM_BETAS[0] / ADAM_BETAS[1] ** 0.5
_AHEAD_STEPS, _AHEAD_TERMS = 1 << 14, 512


@functools.lru_cache(maxsize=2)
def _coefficients(dtype: torch.dtype = torch.float32) -> Tensor:
    """``[[b1, b2], [1 - b1, 1 - b2]]`` in ``dtype`` (a buffer of ``SparseTau``, as the table)."""
    return torch.tensor([ADAM_BETAS, _ONE_MINUS_BETAS], dtype=dtype)


@functools.lru_cache(maxsize=2)
def _ahead_table(dtype: torch.dtype = torch.float32) -> Tensor:
    """``E(t) = sum_{u > t} c_u r^(u - t)``, ``c_u = sqrt(1 - b2^u) / (1 - b1^u)``, for
    ``t = 0 .. _AHEAD_STEPS`` (module docstring), in ``dtype``; computed in float64 (a backward
    recursion ``E(t) = r (c_{t+1} + E(t+1))``), once per regularizer (a buffer: it moves with
    the module, and a compiled step reads it as any other state; shared read-only)."""
    b1, b2, r = ADAM_BETAS[0], ADAM_BETAS[1], _AHEAD_RATIO
    u = torch.arange(1, _AHEAD_STEPS + _AHEAD_TERMS + 1, dtype=torch.float64)
    c = (1 - b2**u).sqrt() / (1 - b1**u)
    e = [r / (1 - r)]  # E at the last step tabulated: c_u = 1 from there on
    for c_next in reversed(c.tolist()):  # ~17k Python float operations (~5 ms)
        e.append(r * (c_next + e[-1]))
    return torch.tensor(e[::-1], dtype=torch.float64)[: _AHEAD_STEPS + 1].to(dtype)


def _write_touched_(state: Tensor, rows: Tensor, use: Tensor, value: Tensor) -> None:
    """``state[rows[use]] = value`` with fixed shapes and one value per row: an entry not in use
    writes the row of the first one in use with the same value (none in use: the first row its
    own value). An ``index_copy_``, which inductor updates in place (a ``scatter_reduce_`` copied
    all of ``state``: 0.84 ms at 1e6 rows, torch 2.13)."""
    if rows.numel() == 0:  # (a shard with no row touched since the last step)
        return
    first = use.to(torch.uint8).argmax().view(1)
    target = torch.where(use, rows, rows.index_select(0, first))
    kept = torch.where(use.index_select(0, first), value, state.index_select(0, target[:1]))
    state.index_copy_(0, target, torch.where(use, value, kept))


def zero_rows_(acc: Tensor, rows: Tensor) -> None:
    """``acc[rows] = 0`` for int32 or int64 ``rows`` (the regularizer's are int32; ``index_fill_``
    takes int64: the batch's ``B`` rows are converted, measured cheaper on the CPU than a
    ``scatter_`` or ``index_put_`` with int32 indices)."""
    acc.index_fill_(0, rows.long(), 0.0)


# entries of a batch from which the CPU keeps the touched ones only (touched_only): below it the
# three extra operations cost more than they save (S-MNIST's B = 100)
COMPACT_FROM = 4096


def touched_only(rows: Tensor, touched: Tensor, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """A large batch's ``(rows, touched, grad)`` on the CPU reduced to its touched entries (a
    batch of pixels is mostly negatives, which stand at row 0 with no gradient): the
    accumulation, the sparse step and the tracked set then work on the positives. Elsewhere, or
    below ``COMPACT_FROM`` entries, or inside ``torch.compile``, unchanged: on an accelerator the
    size read from the data would synchronize every step (method note sec. 11)."""
    if rows.device.type != "cpu" or rows.numel() < COMPACT_FROM or torch.compiler.is_compiling():
        return rows, touched, grad  # (compiled: a size read from the data breaks the graph)
    keep = touched.nonzero().squeeze(1)
    return rows.index_select(0, keep), touched.index_select(0, keep), grad.index_select(0, keep)


# the probe's room (batch entries between two steps) before the first batch asks for more; growing
# it inside torch.compile is refused (reserve_ first), so the default covers usual batches
PROBE_ENTRIES = 4096


class SparseTau(nn.Module):
    """The per-positive rows of ``tau`` stepped in place by the ``"sparse_adam_ahead"`` rule (module
    docstring): a child module of ``FBetaRegularizer`` (``reg.sparse_tau``) in the manner of an
    indexed multiplier. It owns the rule's state (``moments`` ``[m, v]`` per row, the ``step``
    count, each row's ``last`` touch; ``state_dict`` keys ``sparse_tau.*``) and the probe that
    collects a batch's gradient; the rows themselves (``tau``) are its host's, passed in.

    Per forward, ``probe`` gives the zeros to add to the batch's rows; after the optimizer's
    step, ``step_`` steps the rows the backward passes since the last step touched. ``lr`` is
    a plain attribute (``attach`` makes it follow the optimizer's group). ``comm``: the processes
    over which the rows are spread (``projections.collective``; ``LOCAL``: one process)."""

    _row_state = ("moments", "last")  # one entry per row (reparam/resharding.py)

    def __init__(self, n_pos: int, *, lr: float, lr_given: bool, comm: LocalComm) -> None:
        super().__init__()
        self.lr_given, self._comm = lr_given, comm
        # the step size as a tensor: a compiled step reads it (a float would be specialized, and
        # every change of it under an lr schedule would recompile)
        self.register_buffer("lr_value", torch.tensor(float(lr)), persistent=False)
        self._lr: float | None = float(lr)  # as given (lr_value holds it in the state's dtype)
        # the leaf that makes a batch's rows differentiable in the fused path (StepInBackward)
        self.register_buffer("anchor", torch.zeros((), requires_grad=True), persistent=False)
        self._deferring = 0  # nested deferred_tau_step() blocks
        # Adam's [m, v] per row, its step count and the step of each row's last touch
        self.register_buffer("moments", torch.zeros(n_pos, 2))
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))
        self.register_buffer("last", torch.zeros(n_pos, dtype=torch.int32))
        # E(t) of the rest point (a table of _AHEAD_STEPS + 1 values, moved with the module)
        self.register_buffer("ahead", _ahead_table(), persistent=False)
        self.register_buffer("coef", _coefficients(), persistent=False)
        # the gradient summed since the last step and its count (zero outside touched rows)
        self.register_buffer("grad", torch.zeros(n_pos, 2), persistent=False)
        # the batch's rows of tau are tau[rows] + probe[a:b]: their gradient lands in probe.grad;
        # the rows and which are positives are recorded beside it, in buffers (what a compiled
        # forward writes there outlives its graph's outputs: CUDA graphs reuse those)
        self._probe_buffers_(PROBE_ENTRIES, None)
        # per forward since the last step: (probe, a, rows, touched); then in acc: (rows, touched)
        self._pending: list[tuple[Tensor, int, Tensor, Tensor]] = []
        self._accumulated: list[tuple[Tensor, Tensor]] = []
        self._probe_used = 0

    def _probe_buffers_(self, entries: int, like: Tensor | None) -> None:
        device = None if like is None else like.device
        probe = torch.zeros(entries, device=device, requires_grad=True)
        self.register_buffer("probe_values", probe, persistent=False)
        rows = torch.zeros(entries, dtype=torch.int64, device=device)
        self.register_buffer("probe_rows", rows, persistent=False)
        touched = torch.zeros(entries, dtype=torch.bool, device=device)
        self.register_buffer("probe_touched", touched, persistent=False)

    @property
    def lr(self) -> float:
        """The sparse step size (as given; one taken from a tensor: ``lr_value``, read)."""
        return float(self.lr_value) if self._lr is None else self._lr

    @lr.setter
    def lr(self, value: float) -> None:
        self._lr = float(value)
        self.lr_value.fill_(self._lr)

    def follow_lr_(self, lr: float | Tensor) -> None:
        """Take ``lr`` as the step size: an optimizer group's lr, a float or a tensor (copied on
        the device, no host read)."""
        if isinstance(lr, Tensor):
            self._lr = None
            self.lr_value.copy_(lr)
        else:
            self.lr = lr

    @property
    def fused(self) -> bool:
        """Whether a backward pass steps its batch's rows (``StepInBackward``), else
        ``after_step_()`` does (several processes, or inside ``deferred_tau_step()``)."""
        return self._deferring == 0 and self._comm.world == 1

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """A block whose forwards take the deferred path (``reg.deferred_tau_step()``)."""
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1

    def rows_(self, values: Tensor, rows: Tensor, touched: Tensor, owner: nn.Module) -> Tensor:
        """The batch's rows of ``tau`` (``values``, at ``rows``; ``touched``: the entries that are
        positives) as the loss sees them: through ``StepInBackward`` (``fused``; ``owner``'s
        ``_after_step_body_`` takes the step), or plus the probe (deferred); unchanged when no
        gradient is recorded. O(B)."""
        if not torch.is_grad_enabled():
            return values
        if self.fused:
            return StepInBackward.apply(self.anchor, values, rows, touched, owner)
        return values + self.probe(rows, touched)

    def reserve_(self, entries: int) -> None:
        """Make room for ``entries`` batch entries between two steps (eagerly the room grows by
        itself)."""
        if entries > self.probe_values.numel():
            self._probe_buffers_(entries, self.probe_values)

    def probe(self, rows: Tensor, touched: Tensor) -> Tensor | None:
        """``(B,)`` zeros to add to the batch's rows of ``tau`` (``rows``, with ``touched``: the
        entries that are positives), whose gradient is the rows' gradient; ``None`` when no
        gradient is recorded (``torch.no_grad``). O(B): a slice, and the rows recorded."""
        if not torch.is_grad_enabled():
            return None
        start, end = self._probe_used, self._probe_used + rows.numel()
        if end > self.probe_values.numel():
            if torch.compiler.is_compiling():
                raise ValueError(
                    f"a compiled step needs room for {end} batch entries of tau's gradient, the "
                    f"regularizer has {self.probe_values.numel()}: call reg.reserve_({end}) "
                    "before compiling"
                )
            # new buffers: the pending entries keep the old ones
            self._probe_buffers_(max(end, 2 * self.probe_values.numel()), self.probe_values)
        # kept in buffers: a compiled forward's outputs are reused by CUDA graphs
        rows = self.probe_rows[start:end].copy_(rows)
        touched = self.probe_touched[start:end].copy_(touched)
        self._pending.append((self.probe_values, start, rows, touched))
        self._probe_used = end
        return self.probe_values[start:end]

    def _collect_(self) -> tuple[Tensor, Tensor, Tensor] | None:
        """The pending forwards' ``(rows, touched, grad)`` (a large batch on the CPU: its
        touched entries, ``touched_only``), their probes' gradients cleared; ``None``
        when none is pending."""
        if len(self._pending) == 0:  # len(): torch 2.11's dynamo does not trace a list's truth
            return None
        parts = []
        for probe, start, rows, touched in self._pending:
            grad = probe.grad
            if grad is None:  # a forward with no backward: no gradient on its rows
                grad = torch.zeros_like(probe)
            g = grad[start : start + rows.numel()].to(self.grad.dtype, copy=True)
            if self._comm.world > 1:  # a row's share of the mean over the processes' gradients
                g = g / self._comm.world
            parts.append(touched_only(rows, touched, g))
        for probe, *_ in self._pending:
            probe.grad = None
        self._pending.clear()
        self._probe_used = 0
        if len(parts) == 1:
            return parts[0]
        return tuple(torch.cat([part[k] for part in parts]) for k in range(3))

    def accumulate_pending_(self) -> None:
        """The pending gradients into the accumulator (``accumulate_``)."""
        collected = self._collect_()
        if collected is not None and self.grad.shape[0] > 0:  # (a shard may hold no row)
            rows, touched, grad = collected
            accumulate_(self.grad, rows, touched, grad)
            self._accumulated.append((rows, touched))

    @property
    def pending(self) -> bool:
        """Whether ``step_`` has rows to step (several processes: always, every process
        steps at every step: the tracked sums are summed over them)."""
        return len(self._pending) > 0 or len(self._accumulated) > 0 or self._comm.world > 1

    def lr_source(self, optimizer: torch.optim.Optimizer, eps: Tensor) -> dict | None:
        """The param group of ``optimizer`` that steps ``eps`` when ``lr`` was not given (the
        step a dense ``tau`` would take), else ``None``."""
        if self.lr_given:
            return None
        return next(g for g in optimizer.param_groups if any(p is eps for p in g["params"]))

    @torch.no_grad()
    def share_(self, all_gather: Callable[[Tensor], Tensor], processes: int, size: int) -> None:
        """Data parallelism with a replicated sparse ``tau`` (method note sec. 11): make the
        pending gradient the mean over ``processes`` of every process's, so that every process
        takes the same step (its state stays replicated), as a dense ``tau`` whose gradient is
        all-reduced would. Exchanges only the touched rows: this process's entries ``(row,
        touched, grad)`` since the last step, padded to ``size`` (at least their number: the
        per-process batch), go through ``all_gather`` (a ``(size, 3)`` float64 tensor ->
        ``(processes * size, 3)``, rank order), O(``processes * size``) per step, no host read."""
        if self.fused and len(self._pending) == 0:
            raise RuntimeError(
                "share_sparse_grads_(): the backward pass already stepped tau's rows with this "
                "process's gradient alone; run the forward and backward inside "
                "`with reg.deferred_tau_step():` so that the step waits for the exchange"
            )
        acc = self.grad
        packed = acc.new_zeros(size, 3, dtype=torch.float64)
        collected = self._collect_()
        if collected is not None:
            rows, touched, grad = collected
            if len(rows) > size:
                raise ValueError(f"size must be >= the pending entries ({len(rows)}), got {size}")
            packed[: len(rows)] = torch.stack([rows.double(), touched.double(), grad.double()], 1)
        every = all_gather(packed)
        rows, touched = every[:, 0].long(), every[:, 1] > 0
        grad = (every[:, 2] / processes).to(acc.dtype)
        accumulate_(acc, rows, touched, grad)
        self._accumulated.append((rows, touched))

    def step_(
        self,
        tau: Tensor,
        tracked: Callable[..., None] | None = None,
        batch: tuple[Tensor, Tensor, Tensor] | None = None,
    ) -> None:
        """The sparse step (``sparse_step_``) on the rows of ``tau`` the backward passes since
        the last call touched, or (``batch``: ``(rows, touched, grad)``, the fused path's
        backward) on a batch's; ``tracked(rows, touched, step)`` runs it instead when the host
        keeps a tracked active set in step with it (``reparam.tracked``)."""
        if batch is not None:
            rows, touched, grad = touched_only(*batch)
            accumulate_(self.grad, rows, touched, grad.to(self.grad.dtype))
        else:
            rows, touched = self._accumulated_rows(tau.device)
        step = partial(
            sparse_step_,
            tau,
            self.grad,
            rows,
            touched,
            lr=self.lr_value,
            moments=self.moments,
            step=self.step,
            last=self.last,
            ahead=self.ahead,
            coef=self.coef,
            comm=self._comm,
        )
        if tracked is not None:
            tracked(rows, touched, step)
        else:
            step()

    def _accumulated_rows(self, device: torch.device) -> tuple[Tensor, Tensor]:
        """``(rows, touched)`` of the pending and accumulated backward passes (deferred)."""
        self.accumulate_pending_()
        parts = self._accumulated  # (rows, touched) of each pass
        if len(parts) == 0:  # sharded, no row here since the last step
            empty = torch.zeros(0, dtype=torch.int64, device=device)
            parts = [(empty, empty >= 0)]
        if len(parts) == 1:
            rows, touched = parts[0]
        else:
            rows, touched = (torch.cat([part[k] for part in parts]) for k in range(2))
        self._accumulated.clear()
        return rows, touched


class StepInBackward(torch.autograd.Function):
    """The identity on a batch's rows of ``tau`` whose backward steps them: it calls
    ``owner._after_step_body_((rows, touched, grad))`` (the sparse step, and the tracked set's
    bookkeeping, in place) and gives no gradient to its inputs; eagerly, a step with no optimizer
    step since the last one is reported (``owner._monitor.on_step_in_backward``). ``anchor``: a zero leaf that
    requires a gradient, so that the rows (a buffer's, which do not) are part of the graph.
    Traced by ``torch.compile`` into the backward graph of the loss around it."""

    @staticmethod
    def forward(ctx, anchor: Tensor, values: Tensor, rows: Tensor, touched: Tensor, owner):
        ctx.owner = owner
        ctx.save_for_backward(rows, touched)
        return values.clone()

    @staticmethod
    def backward(ctx, grad: Tensor):
        rows, touched = ctx.saved_tensors
        owner = ctx.owner
        if not torch.compiler.is_compiling():  # (gradient accumulation: deferred_tau_step())
            owner._monitor.on_step_in_backward(next(owner.parameters()))
        with torch.no_grad():
            owner._after_step_body_((rows, touched, grad))
        return None, None, None, None, None
