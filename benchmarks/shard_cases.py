"""The objectives a user shards, each at K = 2 gloo processes against one process: the state per
process as a fraction of one process's, or the constructor's refusal (docs/guide/sharded.md).

    python -m benchmarks.shard_cases --out docs/figures          # ~1 min on a 2-core CPU

Each case is built as the guide shows it: ``Shard.from_process_group(N)``, the objective on
``shard.local_labels(labels)`` with its defaults, ``N`` = 1e6 samples (``--n``) of which a third
are positive (a fifth of each of two classes in the two-class case; groups of 1000 consecutive
samples in the grouped case, ``Shard(..., unit=1000)``), one step of Adam on a batch of 256 per process so that the optimizer's state of the
objective's parameters counts too. The state is every parameter, buffer and Adam state tensor of
the objective, and the sparse ``tau``'s gradient accumulator (``SparseRows.acc``, not a buffer).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ._processes import measure_in_fresh_processes, run_child
from ._report import markdown_table
from ._timing import machine_line

CASES = {
    "PrecisionAtRecall(recall=0.9)": "par",
    "F-beta per group (groups=, what target: pixels builds)": "groups",
    "F-beta with 2 positive classes": "classes",
    "RecallAtPrecision(precision=0.9)": "rap",
    "ROCAUC(grid=10)": "roc",
}


def _measure(case: str, n: int) -> dict:
    """One process of the case (alone: the unsharded objective): its state bytes, or the error."""
    import torch
    import torch.distributed as dist

    from reparam import ROCAUC, FBetaRegularizer, PrecisionAtRecall, RecallAtPrecision, Shard

    torch.set_num_threads(1)
    sharded = dist.is_initialized()
    labels = (torch.arange(n) % 3 == 0).long()
    if case == "classes":
        labels = torch.where(
            torch.arange(n) % 5 == 0, 1, torch.where(torch.arange(n) % 5 == 1, 2, 0)
        )
    groups = torch.arange(n) // 1000
    unit = 1000 if case == "groups" else 1  # (groups: blocks of whole groups)
    shard = Shard.from_process_group(n, sampling="global", unit=unit) if sharded else None
    mine = labels if shard is None else shard.local_labels(labels)
    extra = {} if shard is None else {"shard": shard}
    make = {
        "par": lambda: PrecisionAtRecall(mine, recall=0.9, **extra),
        "groups": lambda: FBetaRegularizer(
            mine, groups=groups if shard is None else shard.local_labels(groups), **extra
        ),
        "classes": lambda: FBetaRegularizer(mine, positive_classes=(1, 2), **extra),
        "rap": lambda: RecallAtPrecision(mine, precision=0.9, **extra),
        "roc": lambda: ROCAUC(mine, grid=10, **extra),
    }[case]
    try:
        reg = make()
    except ValueError as e:
        return {"bytes": -1.0, "error": str(e)}
    opt = torch.optim.Adam(reg.parameters(), lr=1e-3) if list(reg.parameters()) else None
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, n, (256,), generator=gen)
    if shard is not None and shard.sampling == "owner":
        idx = idx % (shard.stop - shard.start) + shard.start
    columns = 3 if case == "classes" else 1
    u = torch.randn(256, columns, generator=gen).squeeze(1).requires_grad_()
    reg(u, idx).backward()
    if opt is not None:
        opt.step()
    reg.after_step_()
    state = [*reg.buffers(), *reg.parameters()]
    if getattr(reg, "sparse_tau", None) is not None:
        state.append(reg.sparse_tau.acc)
    if opt is not None:
        state += [v for s in opt.state.values() for v in s.values() if hasattr(v, "numel")]
    return {"bytes": float(sum(t.numel() * t.element_size() for t in state)), "error": ""}


def _child(spec: str) -> None:
    import json

    case, n, world, out = json.loads(spec)
    run_child(_measure, [case, n], world, out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=float, default=1e6)
    p.add_argument("--out", type=Path, default=None, help="folder for shard_cases.md")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        _child(a.child)
        return 0
    n, rows = int(a.n), []
    for title, case in CASES.items():
        alone = measure_in_fresh_processes("benchmarks.shard_cases", [case, n], 1)
        two = measure_in_fresh_processes("benchmarks.shard_cases", [case, n], 2)
        if two["error"]:
            rows.append([title, f"{alone['bytes'] / 2**20:.1f}", "refused", two["error"]])
        else:
            share = two["bytes"] / alone["bytes"]
            rows.append([title, f"{alone['bytes'] / 2**20:.1f}", f"{share:.3f}x", ""])
        print(rows[-1], flush=True)
    table = markdown_table(
        ["case", "one process (MiB)", "per process at K = 2", "the constructor's refusal"], rows
    )
    text = (
        f"<!-- python -m benchmarks.shard_cases --n {a.n:.0e} -->\n{machine_line()}; N = {n}, "
        "gloo, the larger process's state\n\n" + table + "\n"
    )
    print(text)
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "shard_cases.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
