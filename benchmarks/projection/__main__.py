"""Projection benchmark: exact (sort, linear, tree) and soft Pi_C vs torch.sort, one elementwise
pass, a generic QP solver, qpth.

    python -m benchmarks.projection                  # full run (~3 min on 2 cores), writes the plot
    python -m benchmarks.projection --quick          # small sizes, seconds (smoke test)
    python -m benchmarks.projection --memory-only --against REF --threads 1
                                  # only "Near the memory limit", with the tree at git revision REF
    python -m benchmarks.projection --clipped --against REF
                                  # the tree by the number of clipped coordinates, 1e6 and 1e7

Prints four tables measured in one run and writes ``projection.md`` and ``projection.png`` into
``--out``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from benchmarks._timing import machine_line, package_at

from .run import time_batched, time_clipped, time_memory_limit, time_qp_solver, time_sizes
from .spec import CLIPPED, FULL, QUICK
from .tables import clipped_table, memory_table, plot, report


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
    ap.add_argument(
        "--memory-only",
        action="store_true",
        help='only the table "Near the memory limit", to projection_memory.md',
    )
    ap.add_argument(
        "--clipped",
        action="store_true",
        help="only the tree by the number of clipped coordinates, to projection_clipped.md",
    )
    ap.add_argument("--against", metavar="REF", help="also the tree at git revision REF")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    against = package_at("projections", args.against) if args.against else None
    budget = QUICK if args.quick else FULL
    sizes = [int(float(s)) for s in args.sizes.split(",")] if args.sizes else list(budget.sizes)
    repeats = args.repeats or budget.repeats
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)

    print(
        f"# Projection benchmark\n\n{machine_line(args.device)}; median of {repeats} runs.\n",
        flush=True,
    )
    if args.clipped:
        rows = time_clipped(list(budget.memory_sizes), list(CLIPPED), repeats, against)
        return _one_table(args, repeats, clipped_table(rows, args.against), "projection_clipped")
    if args.memory_only:
        mem = time_memory_limit(list(budget.memory_sizes), repeats, args.device, against)
        return _one_table(args, repeats, memory_table(mem, args.against), "projection_memory")
    rows = time_sizes(sizes, repeats, args.device)
    mem = time_memory_limit(list(budget.memory_sizes), budget.memory_repeats, args.device, against)
    qp = time_qp_solver(budget.qp_n, budget.qp_repeats)
    b = time_batched(*budget.batch, repeats=budget.batch_repeats)
    text = report(rows, mem, qp, b, args.device, repeats, args.against)
    print("\n" + text.split("\n\n", 2)[2])
    (args.out / "projection.md").write_text(text + "\n")
    plot(rows, args.out / "projection.png")
    print(f"\nwrote {args.out / 'projection.md'} and {args.out / 'projection.png'}")
    return text


def _one_table(args: argparse.Namespace, repeats: int, table: str, name: str) -> str:
    """One table of the run, under the machine line and the load, printed and written to
    ``<out>/<name>.md``."""
    text = (
        f"{machine_line(args.device)}; load average {os.getloadavg()[0]:.2f}; median of "
        f"{repeats} rounds\n\n{table}"
    )
    print("\n" + text)
    (args.out / f"{name}.md").write_text(text + "\n")
    return text


if __name__ == "__main__":
    main()
