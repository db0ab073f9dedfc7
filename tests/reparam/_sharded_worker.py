"""Processes for tests/reparam/test_sharded.py: K gloo processes train a linear head with a sharded
objective; rank 0 replays the same batches in one process with the unsharded objective (the K
per-process batches as one accumulated step, each loss weighted 1/K, as data parallelism averages)."""

from __future__ import annotations

import copy
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch._dynamo.utils import counters

from reparam import (
    ROCAUC,
    DenseTau,
    EpochEnd,
    FBetaRegularizer,
    PrecisionAtRecall,
    RecallAtPrecision,
    Shard,
)

N, D, B = 240, 6, 16  # samples, features, per-process batch
STEPS = int(os.environ.get("SHARDED_TEST_STEPS", 7))  # steps per epoch
# per group (kinds fbeta_groups*): 20 groups of 12 consecutive samples (an image's pixels), every
# fifth sample in none (an unlabelled pixel); the blocks are whole groups (Shard unit)
UNIT = 12
GROUPS = (torch.arange(N) // UNIT).masked_fill(torch.arange(N) % 5 == 0, -1)


def unit(kind: str) -> int:
    return UNIT if kind.startswith("fbeta_groups") else 1


def data(
    seed: int = 0, ordered: bool = False, classes: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=g)
    y = (x[:, 0] + 0.5 * torch.randn(N, generator=g) > 0.6).long()
    if classes:  # three classes, 1 and 2 positive (about 20 % each)
        y = y + (x[:, 1] > 0.9).long() * (1 - y) * 2
    if ordered:  # the positives last: the first block holds none
        order = torch.argsort(y, stable=True)
        x, y = x[order], y[order]
    return x, y


def batches(k: int, epoch: int, sampling: str, unit: int = 1) -> list[list[torch.Tensor]]:
    """Per step, each process's batch of dataset indices."""
    g = torch.Generator().manual_seed(100 + epoch)
    out = []
    for _ in range(STEPS):
        if sampling == "global":
            perm = torch.randperm(N, generator=g)[: k * B]
            out.append(list(perm.view(k, B)))
        else:  # each from its own block
            shard = [Shard(N, r, k, unit=unit) for r in range(k)]
            out.append(
                [s.start + torch.randint(0, s.stop - s.start, (B,), generator=g) for s in shard]
            )
    return out


def make(kind: str, labels: torch.Tensor, shard: Shard | None):
    """The objective of ``kind``: sharded by ``shard``, or (``None``) the one-process reference,
    which holds the whole state in this process alone (a process group of its own: no replicas
    to keep equal)."""
    reg = _make(kind, labels, shard)
    if shard is None and dist.is_initialized():
        reg.process_group = dist.new_group([dist.get_rank()], use_local_synchronization=True)
    return reg


def _make(kind: str, labels: torch.Tensor, shard: Shard | None):
    if kind.startswith("fbeta_groups"):  # per group: each problem's rows on one process
        groups = GROUPS if shard is None else shard.local_labels(GROUPS)
        if kind == "fbeta_groups_epoch":
            return FBetaRegularizer(labels, groups=groups, shard=shard, schedule=EpochEnd())
        return FBetaRegularizer(labels, groups=groups, shard=shard)
    if kind in ("fbeta", "fbeta_ordered", "fbeta_compiled"):
        return FBetaRegularizer(labels, shard=shard)
    if kind == "fbeta_epoch":  # the projection at the epoch end, on the shards
        return FBetaRegularizer(labels, shard=shard, schedule=EpochEnd())
    if kind == "fbeta_classes":  # two positive classes: two problems over the processes
        return FBetaRegularizer(labels, positive_classes=(1, 2), shard=shard)
    if kind == "fbeta_classes_epoch":
        return FBetaRegularizer(labels, positive_classes=(1, 2), shard=shard, schedule=EpochEnd())
    if kind in ("roc", "roc_ordered"):  # the per-grid-point rows, the AUC by a sample sort
        return ROCAUC(labels, grid=4, shard=shard, schedule=EpochEnd())
    if kind == "rap":  # its infeasibility watch and threshold at a precision on the shards
        return RecallAtPrecision(labels, precision=0.7, shard=shard, schedule=EpochEnd())
    return PrecisionAtRecall(labels, recall=0.8, shard=shard, schedule=EpochEnd())


def train(kind: str, k: int, rank: int | None, sampling: str, epochs: int = 2, state=None):
    """``rank`` None: the one-process reference; else process ``rank`` of the sharded run."""
    torch.manual_seed(0)
    classes = kind.startswith("fbeta_classes")
    x, y = data(ordered=kind.endswith("_ordered"), classes=classes)
    head = torch.nn.Linear(D, 3 if classes else 1)

    def scores(idx: torch.Tensor) -> torch.Tensor:
        out = head(x[idx])
        return out if classes else out[:, 0]

    def task(u: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        if classes:
            return F.cross_entropy(u, y[idx])
        return F.binary_cross_entropy_with_logits(u, y[idx].float())

    # one step on the global batch in the reference (the sharded scale is the global batch's)
    whole = kind in ("pr", "rap") or kind.startswith("fbeta_groups")
    if rank is None:
        reg = make(kind, y, None)
        if sampling == "global" and not whole:  # the scale N / (n B) of each process's B
            reg._routed_batch = B
    else:
        shard = Shard.from_process_group(N, sampling=sampling, unit=unit(kind))
        reg = make(kind, shard.local_labels(y), shard)
        if kind.endswith("_compiled"):  # the forward and after_step_, each one graph
            reg.compile()
    opt = torch.optim.Adam([*head.parameters(), *reg.parameters()], lr=0.05)
    reg.attach(opt)
    if state is not None:
        head.load_state_dict(state["head"])
        reg.load_state_dict(state["reg"])
        opt.load_state_dict(state["opt"])
    first = int(reg.epoch) + 1
    for epoch in range(first, first + epochs):
        for step in batches(k, epoch, sampling, unit(kind))[:STEPS]:
            opt.zero_grad()
            if rank is None:  # one step on the micro-batches' summed gradient
                losses = []
                for idx in step:
                    losses.append(task(scores(idx), idx))
                if whole:  # (pr, rap: the per-step dual step once, on the global batch)
                    idx = torch.cat(micro_batches(step, k, sampling, unit(kind)))
                    losses.append(0.5 * k * reg(scores(idx), idx))
                else:
                    for idx in micro_batches(step, k, sampling, unit(kind)):
                        losses.append(0.5 * reg(scores(idx), idx))
                (sum(losses) / k).backward()
            else:
                idx = step[rank]
                u = scores(idx)
                (task(u, idx) + 0.5 * reg(u, idx)).backward()
                for p in head.parameters():  # what DDP does for the network
                    dist.all_reduce(p.grad)
                    p.grad /= k
            opt.step()
        if not os.environ.get("SHARDED_TEST_NO_END"):
            reg.end_epoch_()
    return head, reg, opt


def micro_batches(
    step: list[torch.Tensor], k: int, sampling: str, unit: int = 1
) -> list[torch.Tensor]:
    """The one-process reference's micro-batches: the entries each process's loss holds (its own
    batch; routed, the global batch's entries it owns, in the order they arrive)."""
    if sampling == "owner":
        return step
    shards = [Shard(N, r, k, unit=unit) for r in range(k)]
    return [torch.cat([idx[(idx >= s.start) & (idx < s.stop)] for idx in step]) for s in shards]


PER_ROW = ("tau_param", "lam", "sparse_tau.moments", "sparse_tau.last", "schedule.tau_active")
PER_SAMPLE = ("scores", "score_epoch", "layout.sample_group")


PER_PROBLEM = ("schedule.active_sums",)  # current at each problem's owner (per group)


def gathered(reg) -> dict[str, torch.Tensor]:
    """The sharded state of every process, concatenated in rank order, the rows in the unsharded
    layout's order (by problem, then dataset index); per group, each problem's state from its
    owner."""
    out, state = {}, reg.state_dict()
    start = 0 if reg.shard is None else reg.shard.start
    key = state["layout.tau_group"].long() * N + state["layout.pos_index"].long() + start
    held = torch.unique(state["layout.tau_group"].long())
    for name, value in [("row key", key), *state.items()]:
        if name in PER_ROW or name in PER_SAMPLE or name == "row key":
            parts = [None] * dist.get_world_size()
            dist.all_gather_object(parts, value)
            out[name] = torch.cat(parts)
        elif name in PER_PROBLEM and reg.grouped and reg.shard is not None:
            parts = [None] * dist.get_world_size()
            dist.all_gather_object(parts, (held, value))
            out[name] = value.clone()
            for problems, theirs in parts:
                out[name][problems] = theirs[problems]
        else:
            out[name] = value
    order = torch.argsort(out.pop("row key"))
    for name in PER_ROW:
        if name in out:
            out[name] = out[name][order]
    return out


def per_sample_bytes(reg) -> int:
    """Bytes of the state per sample or per row (not O(problems))."""
    layout = ("shape_labels", "layout.slot", "layout.pos_index", "layout.tau_group")
    return sum(
        t.numel() * t.element_size()
        for name, t in reg.state_dict().items()
        if name in PER_ROW or name in PER_SAMPLE or name in layout
    )


def _uneven(x: torch.Tensor, rank: int, k: int) -> torch.Tensor:
    weights = torch.tensor([(r + 1) ** 2 for r in range(k)], dtype=torch.float64)
    bounds = (weights.cumsum(0) / weights.sum() * x.numel()).long().tolist()
    return x[([0, *bounds])[rank] : bounds[rank]]


def statistics(rank: int, k: int, out: str) -> None:
    """The epoch end's selections on scores spread over the processes against one process's on
    all of them: the value-bucket paths (more than 2^14 scores; ties; a few huge values)."""
    from projections import projection_root
    from projections.collective import LOCAL, ProcessComm, root_over
    from reparam import functional as Fn
    from reparam import rate_functional as R

    comm, results = ProcessComm(), {}
    g = torch.Generator().manual_seed(7)
    cases = {
        "spread": (torch.randn(30000, generator=g) + 1.2, torch.randn(50000, generator=g) - 0.5),
        "ties": (
            (torch.randn(30000, generator=g) * 4).round() / 4 + 1,
            (torch.randn(50000, generator=g) * 4).round() / 4,
        ),
        "outliers": (
            torch.cat([torch.randn(30000, generator=g) + 1.5, torch.tensor([1e6])]),
            torch.cat([torch.randn(40000, generator=g), torch.tensor([-1e6, 3e5])]),
        ),
    }
    # three groups' rows spread unevenly: each group's root over the processes
    tau, groups = torch.randn(6000, generator=g), torch.randint(0, 3, (6000,), generator=g)
    eps = torch.tensor([0.1, -0.3, 2.0])
    results["grouped"] = {
        "root": (
            projection_root(
                eps, _uneven(tau, rank, k), groups=_uneven(groups, rank, k), comm=comm
            ).tolist(),
            projection_root(eps, tau, groups=groups).tolist(),
        )
    }
    for name, (u_pos, u_neg) in cases.items():
        # uneven shares (rank r holds a part growing with r^2): nothing may follow the local size
        mine = [_uneven(part, rank, k) for part in (u_pos, u_neg)]
        results[name] = {
            "threshold": (
                Fn.best_fbeta_threshold(*mine, 1.0, comm),
                Fn.best_fbeta_threshold(u_pos, u_neg, 1.0),
            ),
            "bound": (
                Fn.certified_fbeta_bound(*mine, 1.0, comm),
                Fn.certified_fbeta_bound(u_pos, u_neg, 1.0),
            ),
            "fbeta": (
                Fn.fbeta_of_decisions(*mine, 1.0, comm),
                Fn.fbeta_of_decisions(u_pos, u_neg, 1.0),
            ),
            "at_recall": (
                tuple(R.threshold_at_recall(*mine, 0.9, comm)),
                tuple(R.threshold_at_recall(u_pos, u_neg, 0.9)),
            ),
            "at_precision": (
                tuple(R.threshold_at_precision(*mine, 0.8, comm)),
                tuple(R.threshold_at_precision(u_pos, u_neg, 0.8)),
            ),
            "at_precision_unmet": (
                tuple(R.threshold_at_precision(*mine, 0.999, comm)),
                tuple(R.threshold_at_precision(u_pos, u_neg, 0.999)),
            ),
            "auc": (R.roc_auc(*mine, comm), R.roc_auc(u_pos, u_neg)),
            "root": (
                float(root_over(torch.tensor(0.3), mine[0], comm)),
                float(root_over(torch.tensor(0.3), u_pos, LOCAL)),
            ),
        }
    # R@P's infeasibility watch (about 1,400 all-reduces: one case)
    mine = [_uneven(part, rank, k) for part in cases["spread"]]
    results["spread"]["margin"] = (
        R.best_rescaled_precision_margin(*mine, 0.8, comm=comm),
        R.best_rescaled_precision_margin(*cases["spread"], 0.8),
    )
    if rank == 0:
        torch.save(results, out)


def errors(rank: int, k: int, out: str) -> None:
    """Bad input and a shard loaded into another layout: the messages each process gets."""

    _, y = data()
    shard = Shard.from_process_group(N)
    messages = {}

    def catch(name, fn):
        try:
            fn()
            messages[name] = None
        except (ValueError, RuntimeError) as e:
            messages[name] = str(e)

    catch("labels", lambda: FBetaRegularizer(y, shard=shard))
    reg = FBetaRegularizer(shard.local_labels(y), shard=shard)
    other = (shard.start + shard.stop) % N
    catch("owner_idx", lambda: reg(torch.zeros(2), torch.tensor([shard.start, other])))
    catch("dense", lambda: FBetaRegularizer(shard.local_labels(y), shard=shard, tau=DenseTau()))
    split = shard.local_labels(torch.arange(N) // 16)  # group 7 is [112, 128): in both blocks
    catch("split", lambda: FBetaRegularizer(shard.local_labels(y), groups=split, shard=shard))
    saved = [None] * k
    dist.all_gather_object(saved, reg.state_dict())
    catch("other_rank", lambda: reg.load_state_dict(saved[(rank + 1) % k]))
    catch("unsharded", lambda: reg.load_state_dict(FBetaRegularizer(y).state_dict()))
    catch("same", lambda: reg.load_state_dict(saved[rank]))
    if rank == 0:
        torch.save(messages, out)


def faults(rank: int, k: int, sampling: str, out: str) -> None:
    """A non-finite gradient on one rank's rows at step 3 (rank 1's probe): every rank skips that
    sparse step, so the step counts and the replicated state stay equal; the next steps go on."""
    torch.manual_seed(0)
    x, y = data()
    head = torch.nn.Linear(D, 1)
    shard = Shard.from_process_group(N, sampling=sampling)
    reg = FBetaRegularizer(shard.local_labels(y), shard=shard)
    opt = torch.optim.Adam([*head.parameters(), *reg.parameters()], lr=0.05)
    for s, step in enumerate(batches(k, 1, sampling)):
        idx = step[rank]
        u = head(x[idx])[:, 0]
        opt.zero_grad()
        (F.binary_cross_entropy_with_logits(u, y[idx].float()) + 0.5 * reg(u, idx)).backward()
        if s == 3 and rank == 1:  # a non-finite gradient on a row this rank touched
            rows, touched = reg.sparse_tau.noted_rows, reg.sparse_tau.noted_touched
            reg.sparse_tau.acc[rows[touched][:1], 0] = float("nan")
        for p in head.parameters():
            dist.all_reduce(p.grad)
            p.grad /= k
        opt.step()
        reg.after_step_()
    replicated = {
        name: value
        for name, value in reg.state_dict().items()
        if name not in PER_ROW
        and name not in PER_SAMPLE
        and not name.startswith("layout.")
        and name not in ("shape_labels", "shard_layout")
    }
    every = [None] * k
    dist.all_gather_object(
        every,
        {
            "replicated": replicated,
            "finite": bool(
                all(
                    torch.isfinite(v).all()
                    for v in reg.state_dict().values()
                    if v.is_floating_point()
                )
            ),
        },
    )
    if rank == 0:
        torch.save(every, out)


def reshard_save(rank: int, k: int, sampling: str, folder: str, kind: str = "fbeta") -> None:
    """One epoch on ``k`` processes (``k = 1``: the unsharded objective), each rank's state saved
    as a checkpoint would save it, and the state gathered in the unsharded layout."""
    head, reg, opt = train(kind, k, None if k == 1 else rank, sampling, epochs=1)
    saved = {"head": head.state_dict(), "reg": reg.state_dict(), "opt": opt.state_dict()}
    torch.save(saved, f"{folder}/from-rank{rank}.pt")
    before = gathered(reg)
    if rank == 0:
        torch.save(before, f"{folder}/before.pt")


def reshard_load(
    rank: int, k: int, k_from: int, sampling: str, folder: str, kind: str = "fbeta"
) -> None:
    """This rank's block of ``k`` assembled from the ``k_from`` saved blocks (only those it
    needs), gathered again; then one more epoch on ``k`` processes, and rank 0's one-process
    reference from the same state on the same batches."""
    from reparam.resharding import needed_blocks, reshard_state

    _, y = data()
    shard = None if k == 1 else Shard.from_process_group(N, sampling=sampling, unit=unit(kind))
    reg = make(kind, y if shard is None else shard.local_labels(y), shard)
    needed = needed_blocks(reg, k_from)
    files = {r: torch.load(f"{folder}/from-rank{r}.pt", weights_only=False) for r in needed}
    reg.load_state_dict(reshard_state(reg, {r: f["reg"] for r, f in files.items()}))
    after = gathered(reg)
    # deep copies: a loaded optimizer shares the state tensors it was given
    state = copy.deepcopy({"head": files[needed[0]]["head"], "opt": files[needed[0]]["opt"]})
    state["reg"] = reg.state_dict()
    head, reg, _ = train(kind, k, None if k == 1 else rank, sampling, epochs=1, state=state)
    result = {"after": after, "needed": needed, "state": gathered(reg), "head": head.state_dict()}
    every = [None] * k
    dist.all_gather_object(every, needed)
    if rank == 0:
        whole = make(kind, y, None)
        if sampling == "global" and not kind.startswith("fbeta_groups"):
            whole._routed_batch = B
        saved = {r: torch.load(f"{folder}/from-rank{r}.pt") for r in range(k_from)}
        state = {"head": saved[0]["head"], "opt": saved[0]["opt"]}
        state["reg"] = reshard_state(whole, {r: f["reg"] for r, f in saved.items()})
        ref_head, ref_reg, _ = train(kind, k, None, sampling, epochs=1, state=state)
        result.update(ref_state=ref_reg.state_dict(), ref_head=ref_head.state_dict())
        result["ref_stats"], result["stats"] = ref_reg.stats(), None
        result["every_needed"] = every
        torch.save(result, f"{folder}/result.pt")


def main(rank: int, k: int, port: int, kind: str, sampling: str, out: str) -> None:
    run_kind(rank, k, port, kind, sampling, out)
    # no interpreter teardown after the process group's: a gloo thread still winding down then
    # aborts the process now and then ("terminate called without an active exception")
    os._exit(0)


def run_kind(rank: int, k: int, port: int, kind: str, sampling: str, out: str) -> None:
    """Join the group of ``k`` gloo processes and run ``kind``; ``kind`` ``"pool"`` runs every
    case of ``sampling`` (``"kind:sampling,..."``) in this one group, each written to
    ``out/<kind>-<sampling>.pt`` (the default suite's cases: one start of the processes)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=k)
    torch.set_num_threads(1)
    cases = [(kind, sampling, out)]
    if kind == "pool":
        pairs = [case.partition(":")[::2] for case in sampling.split(",")]
        cases = [(one, how, f"{out}/{one}-{how}.pt") for one, how in pairs]
    for case in cases:
        counters.clear()  # (each case's graph breaks its own)
        run_case(rank, k, *case)
        dist.barrier()
    dist.destroy_process_group()


def run_case(rank: int, k: int, kind: str, sampling: str, out: str) -> None:
    """One case of the group's: its result written by rank 0 to ``out``."""
    if kind.startswith("reshard"):  # reshard_save[@objective], reshard_load:<k_from>[@objective]
        kind, _, objective = kind.partition("@")
        objective = objective or "fbeta"
        if kind == "reshard_save":
            reshard_save(rank, k, sampling, out, objective)
        else:
            reshard_load(rank, k, int(kind.split(":")[1]), sampling, out, objective)
        return
    if kind in ("statistics", "errors", "faults"):
        if kind == "faults":
            faults(rank, k, sampling, out)
        else:
            (statistics if kind == "statistics" else errors)(rank, k, out)
        return
    head, reg, opt = train(kind, k, rank, sampling)
    result = {"state": gathered(reg), "head": head.state_dict(), "stats": reg.stats()}
    # deep copies: a loaded optimizer shares the state tensors it was given
    local = copy.deepcopy(
        {"head": head.state_dict(), "reg": reg.state_dict(), "opt": opt.state_dict()}
    )
    # resume: the saved shard continued for one epoch equals the run continued in memory
    _, reg2, _ = train(kind, k, rank, sampling, epochs=1, state=local)
    _, reg3, _ = train(
        kind,
        k,
        rank,
        sampling,
        epochs=1,
        state=copy.deepcopy(
            {"head": head.state_dict(), "reg": reg.state_dict(), "opt": opt.state_dict()}
        ),
    )
    result["resume_equal"] = [
        name
        for (name, a), b in zip(reg2.state_dict().items(), reg3.state_dict().values(), strict=True)
        if not torch.equal(a, b)
    ]
    result["bytes"] = sum(t.numel() * t.element_size() for t in reg.state_dict().values())
    result["sample_bytes"] = per_sample_bytes(reg)
    if rank == 0:
        ref_head, ref_reg, _ = train(kind, k, None, sampling)
        result["ref_state"] = ref_reg.state_dict()
        result["ref_head"] = ref_head.state_dict()
        result["ref_stats"] = ref_reg.stats()
        result["ref_bytes"] = sum(
            t.numel() * t.element_size() for t in ref_reg.state_dict().values()
        )
        result["ref_sample_bytes"] = per_sample_bytes(ref_reg)
    breaks = dict(counters["graph_break"])  # compiled kinds: where the graphs broke, and how often
    results = [None] * k
    mine = {
        "bytes": result["bytes"],
        "sample_bytes": result["sample_bytes"],
        "resume": result["resume_equal"],
        "breaks": breaks,
    }
    dist.all_gather_object(results, mine)
    if rank == 0:
        result["all"] = results
        torch.save(result, out)


if __name__ == "__main__":
    k, port, kind, sampling, out = int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:6]
    torch.multiprocessing.spawn(main, args=(k, port, kind, sampling, out), nprocs=k)
