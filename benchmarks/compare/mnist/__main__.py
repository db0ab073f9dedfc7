"""The LP-layer paper's imbalanced binary MNIST protocol (Meng et al., NeurIPS 2021, Table 1) with
every AUC and F1 method of the project, each trained alone as the loss of one MLP's score.

    python -m benchmarks.compare mnist --mnist-dir data/mnist --jobs 2              # the full sweep
    python -m benchmarks.compare mnist --mnist-dir data/mnist --table-only          # tables only
    python -m benchmarks.compare mnist --mnist-dir data/mnist --quick --out /tmp/c  # smoke test
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

from benchmarks.sweep import run_pool

from .run import Job, finished, run_one, run_path, saved
from .spec import (
    ITERATIONS,
    METHODS,
    QUICK_ITERATIONS,
    QUICK_TEST,
    QUICK_TRAIN,
    RATIOS,
    SEEDS,
    official_mnist,
)
from .tables import plot, report


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.compare mnist", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--mnist-dir", type=Path, default=Path("data/mnist"))
    p.add_argument("--ratios", type=float, nargs="+", default=list(RATIOS))
    p.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    p.add_argument("--iterations", type=int, default=ITERATIONS)
    p.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    p.add_argument("--data-seed", type=int, default=0, help="the permutation of dropped samples")
    p.add_argument("--runs", type=Path, default=Path("runs/compare_mnist"))
    p.add_argument("--out", type=Path, default=Path("docs/figures"))
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"1 ratio, 1 seed, {QUICK_ITERATIONS} iterations, the first "
        f"{QUICK_TRAIN}/{QUICK_TEST} samples (a smoke test)",
    )
    p.add_argument("--table-only", action="store_true", help="no training: tabulate finished runs")
    a = p.parse_args(argv)
    if a.quick:
        a.ratios, a.seeds, a.iterations = a.ratios[:1], a.seeds[:1], QUICK_ITERATIONS
    return a


def main(argv: list[str] | None = None) -> int:
    """Run the missing runs of the grid (unless ``--table-only``) and write the tables and plot."""
    a = _arguments(argv)
    settings = (a.iterations, a.quick, a.data_seed)
    jobs = [
        Job(str(a.mnist_dir), r, m, s, *settings, str(run_path(a.runs, r, m, s)))
        for r in a.ratios
        for m in a.methods
        for s in a.seeds
    ]
    records, todo = saved(jobs)
    todo = [] if a.table_only else todo
    print(f"{len(todo)} runs to do ({len(jobs)} in the grid)", flush=True)
    if todo:
        a.runs.mkdir(parents=True, exist_ok=True)
    run_pool(run_one, todo, a.jobs, partial(finished, records))
    for recs in records.values():
        recs.sort(key=lambda r: r["settings"]["seed"])
    official = official_mnist(a.mnist_dir)
    command = (
        f"python -m benchmarks.compare mnist --mnist-dir "
        f"{'data/mnist' if official else a.mnist_dir} --jobs {a.jobs} --ratios "
        f"{' '.join(f'{r:g}' for r in a.ratios)} --seeds {' '.join(map(str, a.seeds))} "
        f"--iterations {a.iterations} --data-seed {a.data_seed}" + (" --quick" if a.quick else "")
    )
    text = report(records, a.ratios, a.seeds, command, official)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "compare_mnist.md").write_text(text)
    plot(records, a.ratios, a.out / "compare_mnist.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
