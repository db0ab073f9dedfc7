r"""The problems of an objective and the rows of its per-positive variables (method note sec. 11,
12): ``ProblemLayout``, a child module ``reg.layout`` of every objective on the shape node's scores.

An objective solves one problem per (positive class, group with a positive of it); with no groups,
one per positive class. Each problem's positives own contiguous rows of the per-positive variables
(``tau``, ``lambda``), class by class, group by group. The layout maps a dataset index to its row
(``slot``; ``-1``: a negative) and back (``pos_index``), a row to its problem (``tau_group``), and
holds each problem's counts of positives and negatives (over every process's samples when the state
is sharded), in the smallest exact dtypes. It is fixed by the labels and groups: nothing in it moves
during training.

Sharded with groups, every group's samples are in one process's block (``reparam.Shard``'s
``unit``), so each problem's rows are on one process, its **owner**: the problems are numbered
over all processes (the same on each), the per-problem work of the epoch end runs at the owner
alone, and ``ProblemLayout.replicate`` makes its results equal on every process.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from projections.collective import LOCAL, LocalComm


def smallest_int(hi: int) -> torch.dtype:
    """The smallest signed integer dtype that holds ``-1 .. hi`` (labels, class numbers)."""
    for dtype in (torch.int8, torch.int16, torch.int32):
        if hi <= torch.iinfo(dtype).max:
            return dtype
    return torch.int64


def index_dtype(n: int) -> torch.dtype:
    """The dtype of indices into ``n`` rows: int32 (what torch's index ops take besides int64)
    when ``n <= 2**31``, else int64."""
    return torch.int32 if n - 1 <= torch.iinfo(torch.int32).max else torch.int64


class ProblemLayout(nn.Module):
    """The rows and problems of an objective (module docstring).

    Args:
        labels: ``(N,)`` int64 shape labels of this process's samples.
        classes: the positive classes.
        group_of: ``(N,)`` int64 group of every sample (``-1``: none), or ``None``.
        comm: the processes the samples are spread over (``projections.collective``).
        n_total: ``N`` over every process.
    """

    def __init__(
        self,
        labels: Tensor,
        classes: tuple[int, ...],
        group_of: Tensor | None,
        comm: LocalComm,
        n_total: int,
    ) -> None:
        super().__init__()
        n_here = labels.numel()
        index = index_dtype(n_here)  # rows of tau and dataset indices: int32 below 2**31
        slot = torch.full((n_here,), -1, dtype=index)
        rows, row_problem, counts, problem_class, problem_group = [], [], [], [], []
        # (sharded: over every process's samples, the same numbering on each)
        n_groups = 1 if group_of is None else int(comm.max(group_of.max().reshape(1))) + 1
        for j, c in enumerate(classes):
            pos = labels == c
            if group_of is None:
                idx, g = pos.nonzero()[:, 0], torch.zeros(int(pos.sum()), dtype=torch.int64)
                n_pos_c = comm.total(idx.numel())  # a shard: of all the processes
                if n_pos_c == 0 or n_pos_c == n_total:
                    raise ValueError(
                        f"shape_labels must contain positives and negatives for every positive "
                        f"class: class {c} has {n_pos_c} positive and {n_total - n_pos_c} "
                        f"negative samples (labels present: {sorted(set(labels.tolist()))})"
                    )
            else:  # the class's positives in a group, ordered by group (stable: by index within)
                idx = (pos & (group_of >= 0)).nonzero()[:, 0]
                if comm.total(idx.numel()) == 0:
                    raise ValueError(
                        f"shape_labels must contain a positive of every positive class in some "
                        f"group: class {c} has none (groups >= 0 hold labels "
                        f"{sorted(set(labels[group_of >= 0].tolist()))})"
                    )
                g, order = torch.sort(group_of[idx], stable=True)
                idx = idx[order]
            per_group = torch.bincount(g, minlength=n_groups)
            # groups with a positive of class c on any process (no groups: the class's one
            # problem, which a shard holding none of its positives has too)
            every = comm.sum(per_group) if group_of is not None else None
            present = every.nonzero()[:, 0] if group_of is not None else torch.zeros(1).long()
            problem = torch.full((n_groups,), -1, dtype=torch.int64)
            problem[present] = len(counts) + torch.arange(present.numel())
            slot[idx] = (sum(counts) + torch.arange(idx.numel())).to(index)
            rows.append(idx.to(index))
            row_problem.append(problem[g])
            counts += per_group[present].tolist()
            problem_class += [j] * present.numel()
            problem_group.append(present)
        k = len(counts)
        self.classes, self.n_total, self.n_groups, self._comm = classes, n_total, n_groups, comm
        # sharded with groups: the problems whose rows are here (module docstring)
        self.owned_here = group_of is not None and comm.world > 1
        owned = torch.tensor(counts, dtype=torch.int64) > 0
        self.register_buffer("problem_owned", owned, persistent=False)
        self.register_buffer("slot", slot)  # dataset index -> row of tau, or -1
        self.register_buffer("pos_index", torch.cat(rows))  # row of tau -> dataset index
        # row of tau -> its problem (one group: its class j; int8 while there are < 128)
        self.register_buffer("tau_group", torch.cat(row_problem).to(smallest_int(k - 1)))
        counts_all = comm.sum(torch.tensor(counts, dtype=torch.int64)).tolist()
        self.register_buffer("n_pos", torch.tensor(counts_all, dtype=torch.float32))
        self.n_pos_list = [float(c) for c in counts_all]  # fixed by the labels: no host sync
        self.problem_class_list = problem_class  # problem k -> its class's column j
        self.problem_group = torch.cat(problem_group).tolist()  # problem k -> its group g
        self.register_buffer(
            "problem_class", torch.tensor(problem_class, dtype=torch.int64), persistent=False
        )
        self.one_problem = group_of is None and k == 1  # the per-step hot path: scalars
        if group_of is None:
            self.n_neg_list = [float(n_total - c) for c in counts_all]
        else:
            self._init_groups(group_of, classes, problem_class)

    def _init_groups(self, g: Tensor, classes: tuple[int, ...], problem_class: list[int]) -> None:
        """The per-group layout: ``sample_group`` (``-1``: a sample of no group, never counted),
        the group sizes ``m_g``, each problem's negatives ``m_g - n_k``, the table
        ``problem_of[j, g + 1]`` (the problem of class ``j`` in group ``g``, ``-1`` if it has no
        positive; column 0: no group) and each group's samples as one range of ``group_order``
        (the epoch end's per-problem splits in O(N) in all)."""
        self.register_buffer("sample_group", g.to(smallest_int(self.n_groups - 1)))
        valid = g >= 0
        sizes = torch.bincount(g[valid], minlength=self.n_groups)  # this process's
        comm = self._comm
        if comm.world > 1:  # each group in one process's block
            split = (comm.sum((sizes > 0).long()) > 1).nonzero()[:, 0]
            if split.numel():
                raise ValueError(
                    f"groups must each lie in one process's block, got {split.numel()} split "
                    f"between processes (group {int(split[0])} first): make each group "
                    "consecutive samples and give reparam.Shard its size (unit=, an image's "
                    "pixels)"
                )
        every = comm.sum(sizes)  # m_g over the processes
        groups_of_problems = torch.tensor(self.problem_group, dtype=torch.int64)
        self.register_buffer(
            "problem_size", every[groups_of_problems].float(), persistent=False
        )  # m_k: its group's
        self.n_valid = comm.total(int(valid.sum()))
        table = torch.full((len(classes), self.n_groups + 1), -1, dtype=torch.int64)
        table[torch.tensor(problem_class, dtype=torch.int64), groups_of_problems + 1] = (
            torch.arange(len(problem_class))
        )
        # (in the index dtype of the problems: the batch's entries' problems and slots are int32)
        index = index_dtype(self.n_problems + SPARE)
        self.register_buffer("problem_of", table.to(index), persistent=False)
        self.n_neg_list = [
            float(every[gk]) - n for gk, n in zip(self.problem_group, self.n_pos_list, strict=True)
        ]
        # -1s first
        order = torch.sort(g, stable=True).indices[g.numel() - int(valid.sum()) :]
        self.register_buffer("group_order", order.to(index_dtype(g.numel())), persistent=False)
        self.group_start = [0, *torch.cumsum(sizes, 0).tolist()]
        # where a batch's entries elect their problem's slot (batch_slots; any content)
        scratch = torch.zeros(self.n_problems + SPARE, dtype=index_dtype(self.n_problems + SPARE))
        self.register_buffer("slot_scratch", scratch, persistent=False)

    @property
    def problem_comm(self) -> LocalComm:
        """The processes one problem's rows are spread over (sharded with groups: its owner's
        alone)."""
        return LOCAL if self.owned_here else self._comm

    def problems_here(self) -> list[int]:
        """The problems whose per-problem work runs in this process (sharded with groups: those
        it owns; otherwise all, each over every process's rows)."""
        if self.owned_here:
            return self.problem_owned.nonzero()[:, 0].tolist()
        return list(range(self.n_problems))

    def replicate(self, x: Tensor) -> Tensor:
        """A per-problem ``x`` (``(P, ...)``) computed by each problem's owner, equal on every
        process (sharded with groups: each problem's value from its owner, one all-reduce;
        otherwise ``x`` itself, which every process computed)."""
        if not self.owned_here:
            return x
        owned = self.problem_owned.view(-1, *([1] * (x.dim() - 1)))
        return self._comm.sum(torch.where(owned, x, torch.zeros_like(x)))

    @property
    def grouped(self) -> bool:
        """Whether there are groups: one problem per (class, group)."""
        return hasattr(self, "sample_group")

    @property
    def n_problems(self) -> int:
        """``K``: the problems, one per (positive class, group with a positive of it)."""
        return len(self.n_pos_list)

    @property
    def row_groups(self) -> Tensor | None:
        """Each row's problem (``tau_group``), ``None`` with one problem (what a schedule takes)."""
        return None if self.n_problems == 1 else self.tau_group

    @property
    def groups(self) -> Tensor:
        """``tau_group`` as int64 (an index; what the projections take): O(n)."""
        return self.tau_group.long()

    def per_row(self, x: Tensor) -> Tensor:
        """``x[tau_group]``: the per-problem ``x`` (P,) for every row; with one problem a
        broadcast view (no O(n) index)."""
        return x.expand(self.tau_group.shape[0]) if x.shape[0] == 1 else x[self.groups]

    def batch_problems(
        self, idx: Tensor, batch: int | None = None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        r"""``(problem (B, C), scale, eps_weight, at)`` of a batch, for the mean over the ``K``
        problems of each problem's Lagrangian (method note sec. 12):

        $$
        L_B = \frac{1}{K} \sum_k \Big[\beta^2 \epsilon_k \frac{N}{B}
              \frac{b_k}{m_k} + \frac{N}{B n_k} \sum_{e \in B_k} \ell_e\Big]
        $$

        with ``b_k`` of problem ``k``'s ``m_k`` samples (its group's; all ``N`` with no groups)
        in the batch, so ``E[b_k N / (B m_k)] = 1``: ``eps_k`` is pulled down only while its group
        is in the batch (with no groups, ``b_k = B``, ``m_k = N``: ``beta^2 eps_k`` at every step).
        ``problem``: the problem of each (sample, class column), ``-1`` where the sample's group
        has no positive of the class or the sample is in no group.

        No groups: ``scale`` and ``eps_weight`` per problem ``(K,)``, ``at`` ``None``. Groups: only
        the batch's problems, ``O(B)`` (no term is ``O(K)``, ``K`` being one per image): the batch's
        ``E = B C`` entries' problems in ``E`` slots (``batch_slots``), ``at`` the problem of
        each slot, ``scale`` and ``eps_weight`` per slot, ``problem`` the entries' slots; the
        problems of the batch get the same values as over all ``K``, the others weigh 0."""
        k, n_pos = self.n_problems, self.n_pos
        if not self.grouped:
            problem = torch.arange(k, device=idx.device).expand(idx.numel(), k)
            # (``batch``: the caller's ``B``; routed, not how many entries reached this process)
            f = self.n_total / ((idx.numel() if batch is None else batch) * k)
            return problem, n_pos.reciprocal() * f, torch.full_like(n_pos, 1 / k), None
        g = self.sample_group.index_select(0, idx).int() + 1
        problem = self.problem_of.index_select(1, g).t()
        if self._comm.world == 1:
            f = self.n_valid / ((g > 0).sum().clamp_min(1) * k)
        else:  # sharded: the mean over the processes of their losses is the global batch's
            total = self._comm.sum((g > 0).sum().reshape(1))[0]
            f = self.n_valid * self._comm.world / (total.clamp_min(1) * k)
        slot, at = batch_slots(problem.reshape(-1), self.slot_scratch)
        present = run_sums(slot >= 0, slot.clamp_min(0), slot.numel()).to(n_pos.dtype)
        scale = f / n_pos.index_select(0, at)
        return slot.view_as(problem), scale, f * present / self.problem_size.index_select(0, at), at

    def batch_entries(
        self, u: Tensor, idx: Tensor, rows: Tensor, batch: int
    ) -> tuple[Tensor, Tensor | None, Tensor, Tensor, Tensor | float, Tensor | None, Tensor | None]:
        """``(u, problem, is_pos, touched, scale, eps_weight, at)``: the batch's entries for
        ``lagrangian.batch_lagrangian``. One problem (the hot path): the samples themselves,
        scalars (``scale = N / (n B)``, ``problem``, ``eps_weight`` and ``at`` ``None``). Else one
        entry per (sample, class column), each in its problem (``batch_problems``; groups: its
        slot, ``at`` the slots' problems), flattened; ``touched``: the samples that are a
        positive (of one problem at most). ``rows``: the samples' rows (``-1``: a negative);
        ``batch``: ``B`` of the scale."""
        if self.one_problem:
            is_pos = rows >= 0
            scale = self.n_total / (self.n_pos_list[0] * batch)
            return u, None, is_pos, is_pos, scale, None, None
        problem, scale, eps_weight, at = self.batch_problems(idx, batch)
        if len(self.classes) == 1:  # (groups) a sample's row is in its group's one problem
            is_pos = (rows >= 0).unsqueeze(1)
            return (
                u.reshape(-1),
                problem.reshape(-1),
                is_pos.view(-1),
                is_pos[:, 0],
                scale,
                eps_weight,
                at,
            )
        tau_group = self.tau_group
        if tau_group.numel() == 0:  # a shard holding no positive: every entry is a negative
            tau_group = tau_group.new_full((1,), -1)
        row_problem = tau_group.index_select(0, rows.clamp_min(0)).long()
        entry_problem = problem  # (groups: the entries' slots, whose problems are at[slot])
        if at is not None:
            of_slot = at.index_select(0, problem.clamp_min(0).reshape(-1)).view_as(problem)
            entry_problem = torch.where(problem >= 0, of_slot, -1)
        is_pos = (rows >= 0).unsqueeze(1) & (row_problem.unsqueeze(1) == entry_problem)
        touched = is_pos.any(1)
        u, problem, is_pos = u.reshape(-1), problem.reshape(-1), is_pos.reshape(-1)
        return u, problem, is_pos, touched, scale, eps_weight, at

    def split(
        self, k: int, labels: Tensor, scores: Tensor, score_epoch: Tensor, seen: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """Remembered scores of problem ``k``'s scored positives and scored negatives (``seen``:
        ``score_epoch >= 0``, computed once by the caller when there are no groups)."""
        j = self.problem_class_list[k]
        if not self.grouped:
            pos = labels == self.classes[j]
            return scores[pos & seen, j], scores[~pos & seen, j]
        g = self.problem_group[k]
        members = self.group_order[self.group_start[g] : self.group_start[g + 1]]
        seen = score_epoch.index_select(0, members) >= 0
        pos = labels.index_select(0, members) == self.classes[j]
        u = scores[:, j].index_select(0, members)
        return u[pos & seen], u[~pos & seen]


# places of a scratch past its rows, where the entries that write nothing of use write
SPARE = 1 << 13


def spare_places(position: Tensor, size: int) -> Tensor:
    """A place past a scratch's ``size`` rows for each entry, its own modulo ``SPARE``
    (``size + position mod SPARE``, in ``position``'s dtype): where an entry that writes nothing
    of use writes, so that no row is written and no queue of writes forms on one address."""
    return (position & (SPARE - 1)).add_(size)


def batch_slots(problem: Tensor, scratch: Tensor) -> tuple[Tensor, Tensor]:
    """``(slot, at)`` (in ``scratch``'s dtype): the ``E`` entries' problems (``-1``: none) in
    slots, fixed shapes, no sort and no host read (compiled: one graph). The first entry of each run of equal problems writes
    its position in its problem's place of ``scratch`` (``K + SPARE`` places, any content; the
    other entries write to ``spare_places``), and every entry reads its problem's place back: its
    slot is the position of an entry of its problem (``-1`` kept). ``at`` is the problem of each
    of the ``E`` slots; a slot no entry uses reads a problem of its own, its position modulo the
    largest power of two not above ``K`` (weight 0 where it is read: its gradient, zero, is not
    added to one problem by every such slot). A batch of whole images writes one place per
    image."""
    e = problem.numel()
    k = scratch.shape[0] - SPARE
    position = torch.arange(e, device=problem.device, dtype=scratch.dtype)
    valid = problem >= 0
    head = torch.ones_like(valid)
    head[1:] = problem[1:] != problem[:-1]
    head &= valid
    place = torch.where(head, problem, spare_places(position, k)).long()  # (index_copy_: int64)
    scratch.index_copy_(0, place, position)
    mine = problem.clamp_min(0)
    slot = scratch.index_select(0, mine)
    used = (slot == position) & valid  # (the entry whose position is its slot)
    own = position & ((1 << (k.bit_length() - 1)) - 1)  # (a power of two: no division)
    return torch.where(valid, slot, -1), torch.where(used, mine, own)


def kept_keys(keep: Tensor, key: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """``(order, key)`` for ``run_sums`` when only the entries where ``keep`` count (the others'
    keys may break the kept ones' runs: a batch's negatives among its positives): the kept
    entries ahead of the others, each part in its order (``kept_first``), and their keys in that
    order, the others' at ``spare_places``. Computed once, it serves every sum over the same
    entries."""
    order = kept_first(keep)
    index = index_dtype(size + SPARE)
    spare = spare_places(torch.arange(key.numel(), device=key.device, dtype=index), size)
    return order, torch.where(
        keep.index_select(0, order), key.index_select(0, order).to(index), spare
    )


def run_sums(values: Tensor, key: Tensor, size: int, order: Tensor | None = None) -> Tensor:
    """``zeros(size, ...).index_add_(0, key, values)`` (``values`` ``(B,)`` or ``(B, c)``) with
    one add per run of equal consecutive keys instead of one per entry: the sum over a run is a
    difference of the running sum (``cumsum``) at its ends, in float64 (integer ``values``: in
    int32, exact below ``2**31``, the sums' dtype). Entries of a run's inside add nothing and go
    to ``spare_places``. On an accelerator, a scatter of many entries into few places queues
    its atomic adds one behind another; a batch of whole images is a few runs. Fixed shapes,
    O(B), no sort.

    ``order``: ``values`` are taken in this order, ``key`` being theirs in it (``kept_keys``:
    the entries that count first, so that their keys are runs)."""
    if order is not None:
        values = values.index_select(0, order)
    v = values.double() if values.is_floating_point() else values.int()
    total = v.cumsum(0, dtype=v.dtype)
    change = key[1:] != key[:-1]
    head = torch.ones_like(key, dtype=torch.bool)
    head[1:] = change
    end = torch.ones_like(key, dtype=torch.bool)
    end[:-1] = change
    # + the running sum at a run's end, - the running sum before its head
    shape = (-1, *([1] * (v.dim() - 1)))
    part = torch.where(end.view(shape), total, 0) - torch.where(head.view(shape), total - v, 0)
    index = index_dtype(size + SPARE)  # (int32: a third of int64's time in the select)
    position = torch.arange(key.numel(), device=key.device, dtype=index)
    target = torch.where(head | end, key.to(index), spare_places(position, size))
    out = torch.zeros(size + SPARE, *v.shape[1:], dtype=v.dtype, device=values.device)
    return out.index_add_(0, target, part)[:size]


def kept_first(keep: Tensor) -> Tensor:
    """The positions of the entries, those where ``keep`` first, each part in its order (a stable
    partition): from two running counts (``cumsum``: a scan without indices) and one scatter to
    distinct places. Fixed shapes, O(B), no sort."""
    k = keep.long()
    ahead = k.cumsum(0)  # kept entries up to and with each one
    behind = (1 - k).cumsum(0) + ahead[-1:]  # the others after every kept one
    place = torch.where(keep, ahead, behind) - 1
    position = torch.arange(keep.numel(), device=keep.device)
    return torch.empty_like(position).index_copy_(0, place, position)
