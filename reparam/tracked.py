r"""Schedule ``"tracked"`` (method note sec. 3b): the exact projection's threshold over an active
set kept up to date in ``O(B)`` per step.

The projection onto ``C`` has the threshold ``e* = max(0, r)``, ``r = (eps + sum_A tau_i) /
(|A| + 1)`` over its active set ``A = {i : tau_i > r}``. A row of ``A`` is stored as its offset
above ``eps`` (``o_i = tau_i - eps``: the block moves with ``eps`` at no cost), so ``r = eps +
sum_A o_i / (|A| + 1)`` from two running sums per problem. The loss sees ``e*`` and the batch's rows
clipped at it; each sparse step re-tests the touched rows, each epoch end recomputes ``A`` exactly.
"""

from __future__ import annotations

import torch
from torch import Tensor

from projections import projection_root
from projections.collective import LOCAL, LocalComm

from .compiling import compiled_form
from .lagrangian import as_float
from .layout import kept_keys, run_sums
from .schedules import Project, Schedule


class TrackedThreshold(Schedule):
    """Schedule ``"tracked"`` of ``FBetaRegularizer`` (``reg.schedule``): the active set ``A``
    (``tau_active``, bool per row) and its sums (``active_sums``, ``[sum of A's offsets, |A|]`` per
    problem, float64: O(B) increments between epoch ends), its ``state_dict`` keys
    ``schedule.tau_active`` / ``schedule.active_sums``. The rows ``tau`` and ``eps`` are the
    objective's, passed in; ``groups``: each row's problem (the objective's ``tau_group``, any
    integer dtype), ``None`` with one problem; ``comm``: the processes the rows are spread over;
    ``owned_here``: each problem's rows are on one process (sharded with groups,
    ``reparam.layout``), whose sums alone move between epoch ends (the others' copies are
    refreshed at the epoch end)."""

    name = "tracked"
    _row_state = ("tau_active",)  # one entry per row (reparam/resharding.py)
    _problem_state = ("active_sums",)  # one per problem, current at its owner (resharding)
    _float64_buffers = ("active_sums",)  # kept in float64 when the objective is cast

    def __init__(
        self, n_pos: int, problems: int, comm: LocalComm, owned_here: bool = False
    ) -> None:
        super().__init__()
        self._comm = comm
        self._row_comm = LOCAL if owned_here else comm  # a problem's rows: over these
        self.register_buffer("tau_active", torch.zeros(n_pos, dtype=torch.bool))
        self.register_buffer("active_sums", torch.zeros(problems, 2, dtype=torch.float64))

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ) -> None:
        """A state saved by 0.3 may hold rows whose re-test waited for the next forward
        (``schedule.held_*``): dropped when none waits, else a one-line error."""
        held = [key for key in list(state_dict) if key.startswith(prefix + "held_")]
        kept = state_dict.get(prefix + "held_kept")
        if kept is not None and bool(kept.any()):
            error_msgs.append(
                "the state was saved by fbeta-reparam 0.3 between a step and its re-test of the "
                "tracked rows (schedule.held_kept): load it with 0.3, run one forward, save again"
            )
            return
        for key in held:
            del state_dict[key]
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def threshold(self, eps: Tensor, at: Tensor | None = None) -> tuple[Tensor, Tensor]:
        r"""``(e*, share)`` per problem from the tracked active set ``A_j`` (O(P); ``at``: of the
        problems ``at`` only, O(len(at))):

        $$
        r_j = \frac{\epsilon_j + \sum_{A_j} \tau_i}{1 + |A_j|}
              = \epsilon_j + \frac{\sum_{A_j} o_i}{1 + |A_j|},\quad e^*_j = \max(0, r_j),
              \quad \mathrm{share}_j = \frac{\partial e^*_j}{\partial \epsilon_j}
              = \frac{\partial e^*_j}{\partial \tau_i} = \frac{1[r_j > 0]}{1 + |A_j|}
        $$

        (``o_i = tau_i - eps_j`` the stored offsets): the exact projection's threshold and
        Jacobian when ``A_j`` is its active set ``{i : tau_i > r_j}`` (method note sec. 4).
        Autograd carries ``share`` to ``eps``: the block's move with ``eps`` is in the offsets,
        not in this derivative (by design). With no more problems than ``at`` has entries, it
        is computed for every problem and gathered (two gathers, not one per operand)."""
        if at is not None and self.active_sums.shape[0] <= at.numel():
            e_star, share = self.threshold(eps)
            return e_star.index_select(0, at), share.index_select(0, at)
        sums = self.active_sums if at is None else self.active_sums.index_select(0, at)
        eps = eps if at is None else eps.index_select(0, at)
        sums = sums.to(eps.dtype)
        denom = 1 + sums[:, 1]
        share = 1 / denom
        r = eps * share + (eps * (1 - share) + sums[:, 0] / denom).detach()
        return r.clamp_min(0), (r.detach() > 0).to(r.dtype) * share

    @staticmethod
    def eps_grad_of_rows(eps: Tensor, groups: Tensor | None, rows: Tensor) -> Tensor:
        """The gradient of ``eps`` at this step, of each of ``rows``' problem, which the rows
        clipped at ``e*`` follow (the sparse step runs only when ``eps`` has a gradient:
        ``SparseRows.dropped_``)."""
        grad = eps.grad
        if groups is None:
            return grad.reshape(-1)[:1].expand(rows.shape[0])
        return grad.index_select(0, groups.index_select(0, rows.long()).long())

    def root(self, eps: Tensor, at: Tensor | None = None) -> Tensor:
        """The threshold ``r`` per problem, not clamped (``A = {tau_i > r}``), detached (``at``:
        of the problems ``at`` only)."""
        if at is not None and self.active_sums.shape[0] <= at.numel():  # (as threshold)
            return self.root(eps).index_select(0, at)
        sums = self.active_sums if at is None else self.active_sums.index_select(0, at)
        eps = eps.detach() if at is None else eps.detach().index_select(0, at)
        sums = sums.to(eps.dtype)
        return eps + sums[:, 0] / (1 + sums[:, 1])

    def seen(
        self, raw: tuple[Tensor, ...], project: Project, groups: Tensor | None = None
    ) -> tuple[Tensor, ...]:
        """``(e*, min(tau_i, e*))``: the exact projection's formula at the tracked threshold."""
        eps, tau = (x.detach() for x in raw)
        e = self.threshold(eps)[0]
        return e, self.values(tau, eps, groups).minimum(_per_row(e, groups, tau.shape[0]))

    def shift(self, rows: Tensor, eps: Tensor, groups: Tensor | None) -> Tensor:
        """``eps`` (detached) for the rows of ``A`` (stored as offsets above it), 0 elsewhere:
        what turns the stored rows into their values (O(B))."""
        eps_rows = _of_rows(eps.detach(), rows, groups)
        return as_float(self.tau_active.index_select(0, rows), eps_rows.dtype) * eps_rows

    def values(self, tau: Tensor, eps: Tensor, groups: Tensor | None) -> Tensor:
        """Every row's value: its offset + ``eps`` on ``A`` (O(n))."""
        tau, eps = tau.detach(), _per_row(eps.detach(), groups, tau.shape[0])
        return torch.where(self.tau_active, tau + eps, tau)

    @torch.no_grad()
    def set_active_(
        self, tau: Tensor, eps: Tensor, groups: Tensor | None, now: Tensor, values: Tensor
    ) -> None:
        """``A <- now`` (every row, O(n)): a row that joins stores its offset, one that leaves its
        value (``values``: every row's, ours to reuse); then ``A``'s sums."""
        was = self.tau_active
        eps = _per_row(eps.detach(), groups, tau.shape[0])
        tau.copy_(torch.where(now == was, tau, values.sub_(eps * now)))
        was.copy_(now)
        self.resum_(tau, groups)

    @torch.no_grad()
    def resum_(self, tau: Tensor, groups: Tensor | None) -> None:
        """``[sum of A's offsets, |A|]`` recomputed from ``A`` (O(n)), over every process's rows."""
        tau, active = tau.detach(), self.tau_active
        if groups is None:  # no O(n) float64 temporaries: sums accumulate in float64
            offsets = torch.where(active, tau, 0).sum(dtype=torch.float64)
            self.active_sums.copy_(
                torch.stack([offsets, active.sum(dtype=torch.float64)]).view(1, 2)
            )
        else:
            parts = torch.stack([torch.where(active, tau, 0).double(), active.double()], 1)
            self.active_sums.zero_().index_add_(0, groups.long(), parts)
        self.active_sums.copy_(self._comm.sum(self.active_sums))

    @torch.no_grad()
    def refresh_(self, tau: Tensor, eps: Tensor, groups: Tensor | None) -> None:
        """``A`` from the exact root of ``(eps, tau)`` (O(n)): at the epoch end, and after every
        step of a dense ``tau``, which the optimizer moves everywhere (one re-test of every row
        against the old root is not the exact set after a large step)."""
        eps, values = eps.detach(), self.values(tau, eps, groups)
        # compiled (a dense tau's step in the user's graph): the root by sort, no host read
        how = {"method": "sort", "_checked": True} if compiled_form("root") else {}
        if groups is None:  # (over every process's rows: the communicator's)
            r = projection_root(eps[0], values, comm=self._comm, **how).view(1)
        else:
            r = projection_root(eps, values, groups=groups.long(), comm=self._row_comm, **how)
        self.set_active_(tau, eps, groups, values > _per_row(r, groups, tau.shape[0]), values)

    @torch.no_grad()
    def step_(
        self,
        tau: Tensor,
        eps: Tensor,
        groups: Tensor | None,
        rows: Tensor,
        step: tuple[Tensor, Tensor, Tensor],
    ) -> None:
        """Write the sparse step of ``rows`` (int, may repeat), ``step = (change, one, leader)``
        (``SparseRows.step_(..., write=False)``: each row's change on the one entry of each
        touched row that it elected to carry it, that entry's 1, each entry's elected one), and
        keep ``A`` in step in O(B): ``A``'s offset sum moves by its rows' exact
        change; then every touched row is re-tested against the moved root ``r`` at the ``eps``
        the optimizer left. The batch's negatives stand at row 0 (``slots.clamp_min(0)``) and
        are never elected: only the touched rows are re-tested, so the rows a step re-tests do not
        depend on how the batch is split (between processes, or into accumulated micro-batches).
        No sort: the sums move by the elected entries' changes (the others add zeros), and every
        entry of a row copies the row's new value and membership from its elected entry
        (``leader``)."""
        rows = rows.long()
        before = tau.index_select(0, rows)  # (the step wrote no row)
        change, one, leader = step
        # one problem: no gather from the (n,) problem index (at 1e8 rows each is a DRAM miss)
        group = torch.zeros_like(rows) if groups is None else groups.index_select(0, rows).long()
        t = before + change
        was = self.tau_active.index_select(0, rows)
        was_f = as_float(was, torch.float64)
        moved = (t.double() - before.double()) * was_f * one
        # the elected entries first, in runs of their problems (one problem: a plain sum)
        runs = None if groups is None else kept_keys(one > 0, group, self.active_sums.shape[0])
        # A's sums are over every process's rows: their moves summed over the processes
        _add_per_problem(self.active_sums[:, 0], moved, runs, self._row_comm)
        self._retest_(tau, eps, groups, (rows, one, leader, group, t, was), runs)

    def _retest_(
        self, tau: Tensor, eps: Tensor, groups: Tensor | None, moved: tuple, runs: tuple | None
    ) -> None:
        """``step_``'s re-test of the moved rows (``(rows, one, leader, group, t, was)``: the
        entries, 1 on the elected entry of each touched row, the position of each entry's
        elected one, their problems, their stored values after the step and their membership):
        one that joins ``A`` stores its offset, one that leaves its value (``+/-(offset, 1)`` on
        the sums). Every entry writes its row as the row's elected entry leaves it (an entry of a
        row no step touched: as it was), so no write of a row is lost to another. ``runs``:
        ``_add_per_problem``'s."""
        rows, one, leader, group, t, was = moved
        eps_rows = _of_rows(eps.detach(), rows, groups)
        values = t + eps_rows * as_float(was, t.dtype)  # (a member's stored offset + eps)
        now = (values > self.root(eps, group)) & (one > 0) | was & (one == 0)
        offset = torch.where(was, t, values - eps_rows)  # the row's offset as a member of A
        sign = (now.double() - was.double()) * one  # +1 joins, -1 leaves
        delta = torch.stack([sign * offset.double(), sign], 1)
        _add_per_problem(self.active_sums, delta, runs, self._row_comm)
        stored = torch.where(now == was, t, torch.where(now, offset, values))
        tau.index_copy_(0, rows, stored.index_select(0, leader))
        self.tau_active.index_copy_(0, rows, now.index_select(0, leader))


def _per_row(x: Tensor, groups: Tensor | None, n: int) -> Tensor:
    """The per-problem ``x`` for every one of ``n`` rows (one problem: a broadcast view)."""
    return x.expand(n) if groups is None else x[groups.long()]


def _of_rows(x: Tensor, rows: Tensor, groups: Tensor | None) -> Tensor:
    """The per-problem ``x`` of each of ``rows`` (O(B); one problem: a broadcast)."""
    if groups is None:
        return x.expand(rows.shape[0])
    return x.index_select(0, groups.index_select(0, rows).long())


def _add_per_problem(sums: Tensor, values: Tensor, runs: tuple | None, comm) -> None:
    """``sums[group] += values`` for the entries' problems ``group`` (rows of ``values`` summed
    per problem over the runs ``runs = kept_keys(keep, group, P)``, ``keep`` the entries whose
    values count, the others adding zeros: ``reparam.layout.run_sums``; ``None``, one problem: a
    sum, as inductor's CPU code generator fails on a scatter-add of float64 into one row, torch
    2.13), summed over the processes by ``comm``."""
    if runs is None:
        sums.add_(comm.sum(values.sum(0, keepdim=True)))
    else:  # (the kept entries' problems are runs: an image's rows, in its pixels' order)
        change = run_sums(values, runs[1], sums.shape[0], runs[0]).to(sums.dtype)
        sums.add_(comm.sum(change) if comm.world > 1 else change)
