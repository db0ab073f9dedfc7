r"""``SparseTau()``'s rows (``SparseRows``): the per-positive ``tau`` stepped on the rows a batch touched, on dense Adam's
trajectory, in O(B) per step whatever the number of positives (method note sec. 11, which derives
the rule and says why not ``torch.optim``).

A row stores its **rest point**, where dense Adam would carry it if no gradient came again:
``rho = tau - lr E(t) m / sqrt(v)``, ``E(t) = sum_{u > t} c_u r^(u - t)`` (``r = b1 / sqrt(b2)``,
``c_u`` the bias correction of step ``u``; a table). A touch after ``k`` idle steps decays the
moments by ``b^k``, takes Adam's step on them and moves the rest point by
``lr E(t) (r^k a - a' / r)``, ``a = m / (sqrt(v) + eps)`` before and ``a'`` after it.

**One step point.** The rows step when the optimizer steps, as a dense parameter does, on the
gradient summed over every forward and backward since the last step. A batch's rows enter the loss
through one autograd node (``RowGradient``) whose backward adds their gradient to a per-row
accumulator (``[sum of gradients, touches, follow weights]``, ``(n, 3)``): several calls per loss, several
backward passes per step (gradient accumulation, DDP's ``no_sync``) all sum there, exactly as
autograd sums a dense ``.grad``. Each forward that records a gradient notes its rows (a Python list,
O(B)); the optimizer's step (``reg.attach(opt)``'s hook) steps those rows once and clears the
accumulator on them. A step with no forward since the last one leaves every row as it is (dense
Adam skips a parameter with no gradient). A non-finite gradient skips the step.

Several processes each holding the whole objective (replicated data parallelism): before the
optimizer's step the processes' touched rows and their summed gradients are exchanged
(``all_gather``), so every process steps the same rows on the mean gradient and the state stays
equal on every process (``ReparamRegularizer`` runs it from ``attach``'s post-step hook, before the
rows step). ``zero_grad()`` clears the rows' gradient with ``eps``'s (``SparseRows.watch``); the
rule is Adam's (``RULE_NAME``): ``attach`` refuses an optimizer it is not (``check_rule``).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from projections.collective import LOCAL, LocalComm

from .compiling import compiled_form, eager_on_cpu
from .layout import SPARE, spare_places
from .memory import all_gather_rows
from .options import ADAM_BETAS, ADAM_EPS, check_rule

TAU_UPDATES = ("dense", "sparse_adam_ahead")
_ONE_MINUS_BETAS = tuple(1 - b for b in ADAM_BETAS)


def accumulate_(
    acc: Tensor, rows: Tensor, touched: Tensor, grad: Tensor, follow: Tensor | None = None
) -> None:
    """``acc[rows] += [grad, touched, follow]``: ``acc`` is ``(n, 3)``, per row the summed
    gradient, the number of contributions (``grad`` is 0 where not touched) and the summed
    ``follow`` weights (``None``: 0; the entries clipped at the tracked threshold, which take
    ``follow`` times ``eps``'s gradient at the step, ``sparse_step_``). An untouched entry
    adds zeros (``touched_only`` spreads their rows)."""
    if follow is None:  # (the first two columns: no operation for a column of zeros)
        add_rows_(acc.narrow(1, 0, 2), rows, torch.stack([grad, touched.to(grad.dtype)], 1))
    else:
        add_rows_(acc, rows, torch.stack([grad, touched.to(grad.dtype), follow.to(grad.dtype)], 1))


# entries of a scatter from which the ones that add nothing are spread over the rows (spread)
SPREAD_FROM = 4096


def spread(rows: Tensor, keep: Tensor, n: int) -> Tensor:
    """``rows`` where ``keep``, elsewhere the entry's position modulo ``n``: for a scatter in
    which the entries not kept add zeros (a batch's negatives stand at row 0). On an accelerator
    the atomic adds of a scatter into one row queue one behind another (2M of them took 3 ms on
    an H200); spread over the rows, they run at the memory's speed. Fixed shapes, O(B). Below
    ``SPREAD_FROM`` entries the rows are left as they are (the queue is short, and the three
    operations cost more: S-MNIST's B = 100)."""
    if n == 0 or rows.numel() < SPREAD_FROM:  # (a short queue: a few microseconds)
        return rows
    position = torch.arange(rows.numel(), device=rows.device, dtype=rows.dtype)
    return torch.where(keep, rows, position % n)


def add_rows_(state: Tensor, rows: Tensor, values: Tensor) -> None:
    """``state[rows] += values`` for row-paired ``(n, c)`` state, repeated rows summed in order.
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
    scratch: Tensor | None = None,
    eps_grad: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor] | None:
    """One ``"sparse_adam_ahead"`` step (module docstring) on the rows ``rows[touched]`` of ``tau``
    and of Adam's state (``moments`` ``(n, 2)`` = ``[m, v]``, the step count ``step``, ``last``
    the step of each row's last touch; ``ahead`` and ``coef``, the tables of ``_ahead_table``
    and ``_coefficients`` on the state's device, ``None``: made here), from the gradient
    summed in ``acc`` (``accumulate_``), which is zero again on ``rows`` afterwards. ``rows`` may repeat and may list rows that are not
    ``touched`` (their update is zero). In place; no host synchronization. Row-paired state
    (``[g, count]``, ``[m, v]``) halves the scattered reads and writes of a step.

    ``write=False``: ``tau`` is left alone and the step returns ``(change, elected, leader)``
    per entry: the row's whole update on the one entry elected to carry it, that entry's 1 (0
    elsewhere), and the position of the elected entry of the entry's row (its own where the row
    has none), for the caller to write once (mode ``"tracked"``: inductor copies all of ``tau``
    when it is read, written and written again in one graph).

    ``scratch``: an int32 ``(n + SPARE,)`` buffer of the caller's (any content) in which one
    entry per touched row is elected to carry the row's update (``_one_per_row``), whatever the
    number of entries the row has; ``None``: one made here (O(n)).

    ``eps_grad``: per entry, the gradient of ``eps`` (of the row's problem) at this step, which
    a row clipped at the tracked threshold follows: the row's gradient is its summed gradient
    plus its summed ``follow`` weights (``acc``'s third column) times it (method note sec. 4:
    ``d e* / d tau_i = share``), whatever the calls and processes the step's batch was split
    into."""
    rows = rows.long()  # one conversion for the scatters below (int64 rows pass through)
    g, count, follow = acc.index_select(0, rows).unbind(1)
    if eps_grad is not None:
        g = torch.addcmul(g, follow, eps_grad.to(g.dtype))
    # a non-finite gradient skips the whole step (on the device)
    # (several processes: skipped on all of them when one has one, so the step counts agree)
    ok = comm.all_of_flag(torch.isfinite(g).all())
    use = ok & touched & (count > 0)  # (count 0: a forward whose backward never ran)
    if scratch is None:  # (O(n): the caller's, kept between steps, saves it)
        scratch = torch.zeros(tau.shape[0] + SPARE, dtype=torch.int32, device=rows.device)
    chosen, leader = _one_per_row(rows, use, scratch)
    share = chosen.to(g.dtype)  # the row's update once, on one entry
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
    # (the entries that carry no update add zeros, spread over the rows)
    target = spread(rows, share > 0, moments.shape[0])
    add_rows_(moments, target, (new - old) * share.unsqueeze(1))
    change = move * share * lr  # (the row's update on its elected entry, 0 elsewhere)
    if write:
        tau.index_add_(0, target, change)
    # each touched row's last touch moved to this step, by its one elected entry (an int add)
    now = (step + 1).to(last.dtype)
    elected = (share > 0).to(last.dtype)
    last.index_add_(0, target, (now - last.index_select(0, rows)) * elected)
    step.add_(ok)
    zero_rows_(acc, spread(rows, touched, acc.shape[0]))  # (zero outside the noted rows already)
    return None if write else (change, share, leader)


# sparse_adam_ahead: r = b1 / sqrt(b2), the per-step decay of Adam's m / sqrt(v) without gradient;
# the momentum's future E(t) tabulated up to _AHEAD_STEPS steps (the bias correction is 1 to
# 1e-7 from there on: b2^16384 = 7.6e-8) and to _AHEAD_TERMS terms (r^512 = 4e-24)
_AHEAD_RATIO = ADAM_BETAS[0] / ADAM_BETAS[1] ** 0.5
_AHEAD_STEPS, _AHEAD_TERMS = 1 << 14, 512


@functools.lru_cache(maxsize=2)
def _coefficients(dtype: torch.dtype = torch.float32) -> Tensor:
    """``[[b1, b2], [1 - b1, 1 - b2]]`` in ``dtype`` (a buffer of ``SparseRows``, as the table)."""
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


def _one_per_row(rows: Tensor, use: Tensor, scratch: Tensor) -> tuple[Tensor, Tensor]:
    """``(chosen, leader)``: bool per entry, one entry of each row ``rows[use]`` (the one whose
    position the row's slot of ``scratch`` holds after every entry in use wrote its own there),
    and per entry the position of its row's chosen entry (its own where the row has none).
    ``scratch`` has ``SPARE`` slots past the rows, where the entries not in use write
    (``reparam.layout.spare_places``).
    Fixed shapes, O(B), no host read: whichever entry is chosen, the row's update is the same
    (every entry of a row computes it alike), and an entry that writes its row writes what the
    chosen one does (``leader``: no write of a row is lost to another)."""
    b = rows.numel()
    if b == 0:
        return use, rows
    n = scratch.shape[0] - SPARE
    position = torch.arange(b, device=rows.device, dtype=scratch.dtype)
    target = torch.where(use, rows, spare_places(position, n))
    scratch.index_copy_(0, target, position)
    mine = scratch.index_select(0, rows)  # (a row no entry in use wrote: a stale position)
    chosen = use & (mine == position)
    at = mine.long().clamp(0, b - 1)
    led = chosen.index_select(0, at) & (rows.index_select(0, at) == rows)
    return chosen, torch.where(led, at, position.long())


def zero_rows_(acc: Tensor, rows: Tensor) -> None:
    """``acc[rows] = 0`` for int32 or int64 ``rows`` (the regularizer's are int32; ``index_fill_``
    takes int64: the batch's ``B`` rows are converted, measured cheaper on the CPU than a
    ``scatter_`` or ``index_put_`` with int32 indices)."""
    acc.index_fill_(0, rows.long(), 0.0)


# entries of a batch from which the CPU keeps the touched ones only (touched_only): below it the
# three extra operations cost more than they save (S-MNIST's B = 100)
COMPACT_FROM = 4096


def touched_only(
    rows: Tensor, touched: Tensor, *more: Tensor, n: int, keep: Tensor | None = None
) -> tuple[Tensor, ...]:
    """A batch's ``(rows, touched, *more)`` with its untouched entries (a batch of pixels is
    mostly negatives, which stand at row 0 with no gradient) out of the way of the accumulation,
    the sparse step and the tracked set. Eager on the CPU, from ``COMPACT_FROM`` entries: only
    the touched entries are kept (``nonzero``: a size read from the data, which costs the CPU
    nothing and saves it nine tenths of the work). Elsewhere (an accelerator, where such a read
    would wait for the device at every step, or inside ``torch.compile``) the shapes stay and
    the untouched entries' rows are spread over the ``n`` rows (``spread``): they add zeros and
    write their rows' own values, so no write queues on one row (method note sec. 11). ``keep``:
    the positions of the touched entries, found already (``SparseRows.rows_``: one ``nonzero``
    serves the notes and the backward)."""
    if keep is None:
        if not compacts(rows):
            return (spread(rows, touched, n), touched, *more)
        keep = touched.nonzero().squeeze(1)
    return tuple(x.index_select(0, keep) for x in (rows, touched, *more))


def compacts(rows: Tensor) -> bool:
    """Whether ``touched_only`` keeps the touched entries of a batch of ``rows`` only (eager on
    the CPU, from ``COMPACT_FROM`` entries)."""
    return rows.numel() >= COMPACT_FROM and eager_on_cpu(rows, "sparse")


# noted entries, per row of tau, past which they are merged into one per row (SparseRows._compact_)
MAX_NOTED = 64


class SparseRows(nn.Module):
    """The per-positive rows of ``tau`` stepped in place by the ``"sparse_adam_ahead"`` rule (module
    docstring): a child module of ``FBetaRegularizer`` (``reg.sparse_tau``), optimizer-shaped as an
    indexed multiplier is. It owns the rule's state (``moments`` ``[m, v]`` per row, the ``step``
    count, each row's ``last`` touch; ``state_dict`` keys ``sparse_tau.*``) and the accumulator of
    the gradient since the last step; the rows themselves (``tau``) are its host's, passed in.

    Per forward, ``rows_`` routes the batch's rows through ``RowGradient`` and notes them; at the
    optimizer's step, ``step_`` steps the rows noted since the last one. ``lr`` follows the
    optimizer's group after ``attach`` (a tensor: an lr schedule changes it with no recompile).
    ``comm``: the processes over which the rows are spread (``projections.collective``;
    ``LOCAL``: one process)."""

    _row_state = ("moments", "last")  # one entry per row (reparam/resharding.py)

    def __init__(
        self, n_pos: int, *, lr: float, lr_given: bool, comm: LocalComm, eps: Tensor
    ) -> None:
        super().__init__()
        self.lr_given, self._comm = lr_given, comm
        # the step size as a tensor: a compiled step reads it (a float would be specialized, and
        # every change of it under an lr schedule would recompile)
        self.register_buffer("lr_value", torch.tensor(float(lr)), persistent=False)
        self._lr: float | None = float(lr)  # as given (lr_value holds it in the state's dtype)
        # Adam's [m, v] per row, its step count and the step of each row's last touch
        self.register_buffer("moments", torch.zeros(n_pos, 2))
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))
        self.register_buffer("last", torch.zeros(n_pos, dtype=torch.int32))
        # E(t) of the rest point (a table of _AHEAD_STEPS + 1 values, moved with the module)
        self.register_buffer("ahead", _ahead_table(), persistent=False)
        self.register_buffer("coef", _coefficients(), persistent=False)
        # [sum of gradients, touches, follow weights] per row since the last step (zero outside
        # the noted rows; follow: sparse_step_).
        # Not a buffer: DDP broadcasts buffers at every forward, which would overwrite the sums
        # another process accumulates under no_sync (moved by _apply)
        self.acc = torch.zeros(n_pos, 3)
        self.elect = torch.zeros(n_pos + SPARE, dtype=torch.int32)  # the step's (_one_per_row)
        # (rows, touched) of every forward since the last step that recorded a gradient, one
        # tensor each (a list would be guarded on its length by torch.compile: a graph per call)
        self._note_([])
        self._forwarded = False  # a forward recording a gradient since the last step (stepping)
        self._compacted = False  # one of them with entries, none of them noted (its negatives)
        # the gradient lives with eps's (watch): the sums of the backward passes before the
        # last one, held apart (rows, sums; one entry per row) until the next pass shows whether
        # zero_grad() cleared them since; `pending`: a pass accumulated since the last hold
        self._hold_([])
        self._pending = False
        self._seen_grad: Tensor | None = None  # eps.grad as the last backward pass left it
        self.watch(eps)

    def watch(self, eps: Tensor) -> None:
        """Tie the rows' gradient to ``eps``'s: a backward pass that finds ``eps.grad`` cleared
        since the last one (``zero_grad()``, ``set_to_none=True``) drops the earlier passes'
        sums, and a step with no ``eps.grad`` moves no row, so a skipped step leaves no trace.
        The rows enter the graph with ``eps`` as an input (``RowGradient``): their sums are in
        before ``eps``'s gradient is accumulated, and its hooks run."""
        self._eps = [eps]  # (a list: not a child parameter)
        eps.register_hook(self._before_pass)
        eps.register_post_accumulate_grad_hook(self._after_pass)

    def __setstate__(self, state: dict) -> None:
        # a copy (copy.deepcopy, pickle, torch.save of the module) has an eps without hooks
        super().__setstate__(state)
        self.watch(self._eps[0])

    def _before_pass(self, grad: Tensor) -> None:
        """``eps``'s gradient hook: with ``eps.grad`` cleared since the last pass, stale sums."""
        eps = self._eps[0]
        if eps.grad is not None and eps.grad is self._seen_grad:
            return
        if self._pending:  # this pass's sums and an earlier one's are in one accumulator
            raise RuntimeError(
                "the regularizer's rows got a backward pass after optimizer.zero_grad() while "
                "the sums of an earlier backward pass, with no forward call between the two, "
                "were not stepped: the two cannot be told apart. Call zero_grad() before the "
                "forward calls of a step, or step after each backward pass"
            )
        if self.held_rows.numel() > 0:
            self._hold_([])

    def _after_pass(self, eps: Tensor) -> None:  # (eps's post-accumulate hook)
        self._seen_grad = eps.grad
        self._pending = True

    def _hold_(self, parts: list[tuple[Tensor, Tensor]]) -> None:
        """The held sums: ``parts`` concatenated (``[]``: none)."""
        device = self.moments.device
        rows = [p[0] for p in parts] or [torch.zeros(0, dtype=torch.int64, device=device)]
        sums = [p[1] for p in parts] or [torch.zeros(0, 3, device=device)]
        self.held_rows, self.held_sums = torch.cat(rows), torch.cat(sums)

    @torch.no_grad()
    def _put_aside_(self) -> None:
        """Before a forward after a backward pass: the accumulator's sums move to the held ones
        (one entry per noted row carries its row's sums, the others zeros), the accumulator is
        zero again. O(entries noted)."""
        self._pending = False
        rows = self.noted_rows
        if rows.numel() == 0 or self.acc.shape[0] == 0:
            return
        chosen, _ = _one_per_row(rows, self.noted_touched, self.elect)
        sums = self.acc.index_select(0, rows) * chosen.unsqueeze(1).to(self.acc.dtype)
        zero_rows_(self.acc, rows)
        self._hold_([(self.held_rows, self.held_sums), (rows, sums)])

    @torch.no_grad()
    def _take_held_(self) -> None:
        """At the step: the held sums back into the accumulator."""
        if self.held_rows.numel() > 0:
            add_rows_(self.acc, self.held_rows, self.held_sums)
            self._hold_([])

    def cleared(self) -> bool:
        """Whether the watched ``eps`` has no gradient: the rows' sums are stale."""
        return self._eps[0].grad is None

    def dropped_(self, by_hand: bool) -> bool:
        """At the step: whether the rows' gradient was cleared, then dropped (``by_hand``, not
        from ``attach``'s hook: a ``ValueError``, as it comes after ``zero_grad()``)."""
        if not self.cleared():
            return False
        if by_hand:
            raise ValueError(
                "after_step_(): eps has no gradient, so the rows' gradient was cleared with it: "
                "call after_step_() right after optimizer.step(), before optimizer.zero_grad() "
                "(or reg.attach(optimizer) once, which does)"
            )
        self.drop_()
        return True

    @torch.no_grad()
    def drop_(self) -> None:
        """Forget every sum and note since the last step (their gradient was cleared)."""
        rows, _ = self.take_noted_()
        zero_rows_(self.acc, rows)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self.acc = self.acc.to(self.moments.device)
        self.held_rows = self.held_rows.to(self.moments.device)
        self.held_sums = self.held_sums.to(self.moments.device)
        self.elect = self.elect.to(self.moments.device)
        self.noted_rows = self.noted_rows.to(self.moments.device)
        self.noted_touched = self.noted_touched.to(self.moments.device)
        return self

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

    def rows_(
        self, values: Tensor, rows: Tensor, touched: Tensor, follow: Tensor | None = None
    ) -> Tensor:
        """The batch's rows of ``tau`` (``values``, at ``rows``; ``touched``: the entries that are
        positives) as the loss sees them: through ``RowGradient``, the rows noted for the next
        step; unchanged when no gradient is recorded. ``follow``: per entry, the weight with
        which the row follows ``eps`` at the step instead of the gradient its entry gets (the
        entries clipped at the tracked threshold: ``share``; else 0). O(B)."""
        if not torch.is_grad_enabled():
            return values
        if self._pending:  # a backward pass since the last forward: its sums held apart
            self._put_aside_()
        self._forwarded = True
        # the CPU's batch of many entries: its touched ones noted only, found once (touched_only)
        keep = touched.nonzero().squeeze(1) if compacts(rows) else None
        if self.acc.shape[0] > 0:  # (a shard may hold no row: nothing to step there)
            many = self.noted_rows.numel() > MAX_NOTED * self.acc.shape[0]
            if many and not compiled_form("notes"):
                self._compact_()  # (forwards with no step between them: kept O(n))
            self._compacted |= keep is not None
            noted, hit = (
                (rows, touched) if keep is None else touched_only(rows, touched, n=0, keep=keep)
            )
            self.noted_rows = torch.cat([self.noted_rows, noted.long()])
            self.noted_touched = torch.cat([self.noted_touched, hit])
        # (eps as an input: its gradient is accumulated after the rows', and its hooks run)
        return RowGradient.apply(self._eps[0], values, rows, touched, self, follow, keep)

    def _note_(self, parts: list[tuple[Tensor, Tensor]]) -> None:
        """The noted entries: ``parts`` concatenated (``[]``: none)."""
        device = self.moments.device
        rows = [p[0].long() for p in parts] or [torch.zeros(0, dtype=torch.int64, device=device)]
        touched = [p[1] for p in parts] or [torch.zeros(0, dtype=torch.bool, device=device)]
        self.noted_rows, self.noted_touched = torch.cat(rows), torch.cat(touched)

    @torch.no_grad()
    def _compact_(self) -> None:
        """The noted entries as one entry per touched row: the same step, in O(n) memory however
        many forwards run before it (eager)."""
        rows = torch.unique(self.noted_rows[self.noted_touched])
        self._note_([(rows, torch.ones_like(rows, dtype=torch.bool))])

    @property
    def stepping(self) -> bool:
        """Whether ``step_`` has rows to step. Several processes: whether a forward recording a
        gradient ran since the last step, on every process alike (every process calls every
        forward), though its shard may have noted no row: every process steps (the tracked sums
        are summed over them), or none (a step with no forward leaves the rows and the step
        count alone, as on one process). One process: whether a forward's batch had entries (a
        batch with no positive steps too: its rows' step count moves, as Adam's does), whether or
        not the CPU's compaction noted none of them."""
        if self._comm.world > 1:
            return self._forwarded
        return self.noted_rows.numel() > 0 or self._compacted

    def lr_source(self, optimizer: torch.optim.Optimizer, eps: Tensor) -> dict | None:
        """The param group of ``optimizer`` that steps ``eps`` when ``lr`` was not given (the
        step a dense ``tau`` would take), else ``None``."""
        if self.lr_given:
            return None
        group = next(g for g in optimizer.param_groups if any(p is eps for p in g["params"]))
        check_rule(optimizer, group)
        return group

    def take_noted_(self) -> tuple[Tensor, Tensor]:
        """``(rows, touched)`` noted since the last step, to step now (cleared here; the held
        sums back in the accumulator)."""
        self._take_held_()
        self._pending = False
        rows, touched = self.noted_rows, self.noted_touched
        self._note_([])
        self._forwarded = self._compacted = False
        return touched_only(rows, touched, n=self.acc.shape[0])

    @torch.no_grad()
    def exchange_(self, group: object, world: int) -> None:
        """Replicated data parallelism (module docstring): every process's noted rows and the
        gradient summed on them, gathered from ``world`` processes of ``group``
        (``torch.distributed``), become every process's, the gradient the mean over the
        processes. Each process sends each of its touched rows once, with all of the row's sums
        (its noted entries may be fewer than the row's touches: ``_compact_`` merges them), so the
        gathered entries of a row sum to the processes' sums. O(world B) per step."""
        noted, touched = self.take_noted_()
        rows = torch.unique(noted[touched])  # (a size read from the data: so is the gather's)
        if rows.numel() == 0 and noted.numel() > 0:  # forwards with no positive: a step, as on
            rows = noted[:1]  # one process (row 0 as a negative's placeholder, its sums zero)
        sums = self.acc.index_select(0, rows)
        # (float64 before the concatenation: a row index past 2^24 is exact there, not in float32)
        hit = (sums[:, 1:2] > 0).double()  # touched (the placeholder: not)
        mine = torch.cat([rows.double().unsqueeze(1), hit, sums.double()], 1)
        zero_rows_(self.acc, rows)
        every = all_gather_rows(mine, group, world)
        rows, touched = every[:, 0].long(), every[:, 1] > 0
        # the gradient: the mean over the processes; the touches and follow weights: their sums
        add_rows_(self.acc, rows, (every[:, 2:] * every.new_tensor([1 / world, 1, 1])).float())
        self._note_([(rows, touched)])

    def step_(
        self,
        tau: Tensor,
        rows: Tensor,
        touched: Tensor,
        eps_grad: Tensor | None = None,
        write: bool = True,
    ) -> tuple[Tensor, Tensor, Tensor] | None:
        """The sparse step (``sparse_step_``) on ``rows`` of ``tau`` (``take_noted_``'s);
        ``eps_grad``: the gradient of ``eps`` of each row's problem, which a row clipped at the
        tracked threshold follows (``sparse_step_``), or ``None``. ``write=False``: ``tau`` is
        left alone and the step's ``(change, elected, leader)`` returned, for the tracked set's
        owner to write (``TrackedThreshold.step_``)."""
        return sparse_step_(
            tau,
            self.acc,
            rows,
            touched,
            lr=self.lr_value,
            moments=self.moments,
            step=self.step,
            last=self.last,
            ahead=self.ahead,
            coef=self.coef,
            write=write,
            comm=self._comm,
            scratch=self.elect,
            eps_grad=eps_grad,
        )


class RowGradient(torch.autograd.Function):
    """The identity on a batch's rows of ``tau`` whose backward adds their gradient to the
    accumulator of ``sparse`` (``SparseRows.acc``: ``[gradient, 1 per positive entry, follow weight]`` per row,
    ``index_add_``, O(B)) and gives no gradient to its inputs, as autograd adds to a dense
    ``.grad``; the rows step at the optimizer's step. ``eps``: the watched parameter, so that
    the rows (a buffer's, which need no gradient) are part of the graph. Traced by
    ``torch.compile`` into the backward graph of the loss around it."""

    @staticmethod
    def forward(
        ctx, eps: Tensor, values: Tensor, rows: Tensor, touched: Tensor, sparse, follow, keep
    ):
        ctx.sparse, ctx.keep = sparse, keep  # (keep: the touched entries' positions, or None)
        if follow is None:
            ctx.save_for_backward(rows, touched)
        else:
            ctx.save_for_backward(rows, touched, follow)
        return values.clone()

    @staticmethod
    def backward(ctx, grad: Tensor):
        rows, touched, *follow = ctx.saved_tensors  # (follow: [] or [the entries' weights])
        sparse = ctx.sparse
        world = sparse._comm.world  # sharded: a row's share of the mean over the processes
        with torch.no_grad():
            g = grad if world == 1 else grad / world
            if follow:  # a clipped entry's row follows eps at the step (its gradient: the step's)
                g = g * torch.le(follow[0], 0, out=torch.empty_like(g))
            if sparse.acc.shape[0] > 0:  # (a shard may hold no row)
                accumulate_(
                    sparse.acc,
                    *touched_only(
                        rows,
                        touched,
                        g.to(sparse.acc.dtype),
                        *follow,
                        n=sparse.acc.shape[0],
                        keep=ctx.keep,
                    ),
                )
        return None, None, None, None, None, None, None
