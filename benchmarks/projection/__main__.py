"""Projection benchmark: exact (sort, linear, tree) and soft Pi_C vs torch.sort, one elementwise
pass, a generic QP solver, qpth.

    python -m benchmarks.projection                  # full run (~3 min on 2 cores), writes the plot
    python -m benchmarks.projection --quick          # small sizes, seconds (smoke test)

Prints four tables measured in one run and writes ``projection.md`` and ``projection.png`` into
``--out``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks._timing import machine_line

from .run import time_batched, time_memory_limit, time_qp_solver, time_sizes
from .spec import FULL, QUICK
from .tables import plot, report


def main(argv: list[str] | None = None) -> str:
    """Measure, print and write ``projection.md`` and ``projection.png``; returns the markdown."""
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.projection", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    ap.add_argument("--sizes", type=str, default=None, help="comma list, e.g. 1e3,1e4")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    args = ap.parse_args(argv)
    budget = QUICK if args.quick else FULL
    sizes = [int(float(s)) for s in args.sizes.split(",")] if args.sizes else list(budget.sizes)
    repeats = args.repeats or budget.repeats
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)

    print(
        f"# Projection benchmark\n\n{machine_line(args.device)}; median of {repeats} runs.\n",
        flush=True,
    )
    rows = time_sizes(sizes, repeats, args.device)
    mem = time_memory_limit(list(budget.memory_sizes), budget.memory_repeats, args.device)
    qp = time_qp_solver(budget.qp_n, budget.qp_repeats)
    b = time_batched(*budget.batch, repeats=budget.batch_repeats)
    text = report(rows, mem, qp, b, args.device, repeats)
    print("\n" + text.split("\n\n", 2)[2])
    (args.out / "projection.md").write_text(text + "\n")
    plot(rows, args.out / "projection.png")
    print(f"\nwrote {args.out / 'projection.md'} and {args.out / 'projection.png'}")
    return text


if __name__ == "__main__":
    main()
