r"""Updates of the per-positive variables ``tau`` that touch only the rows a batch used
(docs/method.md sec. 11): the per-step work is O(B) whatever the number of positives ``n``.

A batch's ``L_B`` depends on ``tau_i`` only for its positives, so its gradient is sparse: at most
``B`` nonzero rows. A dense optimizer nevertheless reads and writes all ``n`` rows of ``tau`` (and
of its moment estimates) every step. The two sparse rules here do the same arithmetic on the
touched rows only:

* ``"sparse_sgd"``: ``tau_i <- tau_i - lr g_i`` for the touched rows -- the step of the paper's
  Algorithm 3, and exactly what dense SGD (no momentum, no weight decay) does, since the other rows'
  gradient is zero.
* ``"sparse_adam"``: lazy Adam, the semantics of ``torch.optim.SparseAdam``: the moment estimates
  of the touched rows only are updated,

  .. math::
      m_i \leftarrow \beta_1 m_i + (1-\beta_1) g_i,\quad
      v_i \leftarrow \beta_2 v_i + (1-\beta_2) g_i^2,\quad
      \tau_i \leftarrow \tau_i - \mathrm{lr}\,\frac{\sqrt{1-\beta_2^t}}{1-\beta_1^t}\,
      \frac{m_i}{\sqrt{v_i} + \epsilon},

  with ``t`` the number of steps taken (one count for all rows, as SparseAdam's). Rows a batch did
  not touch keep their moments (dense Adam would decay them and keep moving the row with its
  stale momentum).

Why not ``torch.optim.SparseAdam`` itself: its state lives in a separate optimizer, outside the
regularizer's ``state_dict`` (checkpoints, ``.to()``), and its coalescing of the sparse gradient
sorts the indices and sizes its output by the data, a host synchronization on accelerators per
step. The rule is the same (``tests/reparam/test_sparse.py`` checks it against SparseAdam), and
every operation here has a size fixed by the batch: no synchronization.

Bookkeeping: the backward pass adds the batch's gradient into a dense accumulator ``acc`` (zero
outside the touched rows) and a count of contributions per row, and remembers the rows; the step
reads the rows' summed gradient, updates them and zeroes the accumulator there again. Several
backward passes before one step (gradient accumulation) sum, as dense gradients do. A row listed
twice (a sample twice in one batch) receives one update: each occurrence applies ``1 / count`` of
it. A step whose gradient holds NaN/inf changes nothing (as a fused optimizer skips such a step).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._constants import constant

TAU_UPDATES = ("dense", "sparse_sgd", "sparse_adam")
ADAM_BETAS = (0.9, 0.999)  # torch.optim.Adam / SparseAdam defaults
ADAM_EPS = 1e-8
_ONE_MINUS_BETAS = tuple(1 - b for b in ADAM_BETAS)


def accumulate_(acc: Tensor, rows: Tensor, touched: Tensor, grad: Tensor) -> None:
    """``acc[rows] += [grad, touched]``: ``acc`` is ``(n, 2)``, the summed gradient and the number
    of contributions per row (``grad`` is 0 where not touched)."""
    add_rows_(acc, rows, torch.stack([grad, touched.to(grad.dtype)], 1))


def add_rows_(state: Tensor, rows: Tensor, values: Tensor) -> None:
    """``state[rows] += values`` for row-paired ``(n, 2)`` state, repeated rows summed in order.

    ``scatter_add_`` with the row index broadcast over the pair, not ``index_add_``: on the CPU
    (torch 2.13, one thread) ``index_add_`` of 2-column rows took 7.4 vs 4.3 us at 100 rows and
    6-8x longer at 1.5e5 (a batch of pixels), the same sums (``tests/reparam/test_sparse.py``)."""
    state.scatter_add_(0, rows.long().unsqueeze(1).expand(-1, state.shape[1]), values)


@torch.no_grad()
def sparse_step_(
    rule: str,
    tau: Tensor,
    acc: Tensor,
    rows: Tensor,
    touched: Tensor,
    *,
    lr: float,
    moments: Tensor | None = None,
    step: Tensor | None = None,
) -> None:
    """One ``rule`` step (``"sparse_sgd"`` / ``"sparse_adam"``, module docstring) on the rows
    ``rows[touched]`` of ``tau`` (and of the Adam state: ``moments`` ``(n, 2)`` = ``[m, v]``, the
    step count ``step``), from the gradient summed in ``acc`` (:func:`accumulate_`), which is zero
    again on ``rows`` afterwards. ``rows`` may repeat and may list rows that are not ``touched``
    (their update is zero). In place; no host synchronization. Row-paired state (``[g, count]``,
    ``[m, v]``) halves the scattered reads and writes of a step."""
    rows = rows.long()  # one conversion for the scatters below (int64 rows pass through)
    g, count = acc.index_select(0, rows).unbind(1)
    # a non-finite gradient skips the whole step (on the device): g . 0 is NaN iff one is
    ok = torch.dot(g, constant(0.0, g, g.shape)) == 0
    use, zero = ok & touched, constant(0.0, g)
    if rule == "sparse_sgd":  # 1/count of the row's step per occurrence: one update per row
        tau.index_add_(0, rows, torch.where(use, g / count, zero), alpha=-lr)
    elif rule == "sparse_adam":
        share = torch.where(use, count.reciprocal(), zero)  # 1/count per occurrence
        g = torch.where(ok, g, zero)
        step.add_(ok)
        old = moments.index_select(0, rows)
        betas, one_minus_betas = constant(ADAM_BETAS, old), constant(_ONE_MINUS_BETAS, old)
        delta = (torch.stack([g, g * g], 1) - old) * one_minus_betas
        m, v = (old + delta).unbind(1)
        # sqrt(1 - b2^t) / (1 - b1^t) = prod([1 - b1^t, 1 - b2^t] ** [-1, 1/2]); t = 0: skipped
        size = (1 - betas ** step.clamp_min(1)).pow(constant((-1.0, 0.5), old)).prod()
        add_rows_(moments, rows, delta * share.unsqueeze(1))
        tau.index_add_(0, rows, (m / (v.sqrt() + ADAM_EPS)).mul_(share * size), alpha=-lr)
    else:
        raise ValueError(f"rule must be one of {TAU_UPDATES[1:]}, got {rule!r}")
    zero_rows_(acc, rows)


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
    below ``COMPACT_FROM`` entries, unchanged: on an accelerator the size read from the data would
    synchronize every step (docs/method.md sec. 11)."""
    if rows.device.type != "cpu" or rows.numel() < COMPACT_FROM:
        return rows, touched, grad
    keep = touched.nonzero().squeeze(1)
    return rows.index_select(0, keep), touched.index_select(0, keep), grad.index_select(0, keep)


def one_row_per_sample(sink, columns: int, slots: Tensor, touched: Tensor, grad: Tensor) -> None:
    """A sparse gradient sink fed one entry per (sample, column), called once per sample: a
    sample's row of ``tau`` is touched by its one positive column at most, so the sparse step and
    the tracked set work on ``B`` rows, not ``B * columns`` (the 11-class per-image F-beta: 11x
    fewer)."""
    touched = touched.view(-1, columns)
    grad = torch.where(touched, grad.view(-1, columns), 0.0).sum(1)
    sink(slots.view(-1, columns)[:, 0], touched.any(1), grad)
