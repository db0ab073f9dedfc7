"""Every F-beta and AUC method of the project on fixed features, against exact references
(docs/comparison.md, part 1).

    python -m benchmarks.compare fixed --jobs 2          # resumable (= python -m benchmarks.compare.fixed)
    python -m benchmarks.compare fixed --table-only      # the tables from finished runs
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

from benchmarks.sweep import run_pool
from train.files import write_text_atomic

from .run import record_name, run_one, save_record
from .spec import EPOCHS, PROBLEMS, SEEDS, jobs
from .tables import plot, references, tables


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.compare fixed", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--runs", type=Path, default=Path("runs/compare_fixed"))
    p.add_argument("--out", type=Path, default=Path("docs/figures"))
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=list(PROBLEMS))
    p.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    p.add_argument("--no-batch-study", action="store_true")
    p.add_argument("--epochs", type=int, default=EPOCHS)
    p.add_argument("--quick", action="store_true", help="the 2-D problem, seed 0, 5 epochs")
    p.add_argument("--table-only", action="store_true", help="no training: tabulate finished runs")
    a = p.parse_args(argv)
    if a.quick:
        a.problems, a.seeds, a.epochs, a.no_batch_study = ["2-D, 40/60"], [0], 5, True
    return a


def main(argv: list[str] | None = None) -> int:
    """Run the missing runs (unless ``--table-only``), then write the tables and the plot."""
    a = _arguments(argv)
    a.runs.mkdir(parents=True, exist_ok=True)
    todo = [
        j
        for j in jobs(a.problems, tuple(a.seeds), not a.no_batch_study, a.epochs)
        if not (a.runs / record_name(*j)).is_file()
    ]
    print(f"{len(todo)} runs to do", flush=True)
    if not a.table_only:
        run_pool(run_one, todo, a.jobs, partial(save_record, a.runs))
    records = [json.loads(f.read_text()) for f in sorted(a.runs.glob("*.json"))]
    records = [r for r in records if r["problem"] in a.problems and r["epochs"] == a.epochs]
    refs = {pr: references(pr) for pr in a.problems}
    text = tables(records, refs, a.problems)
    a.out.mkdir(parents=True, exist_ok=True)
    cmd = "python -m benchmarks.compare fixed --jobs 2" + (" --quick" if a.quick else "")
    if not a.quick and a.problems != list(PROBLEMS):
        cmd += " --problems " + " ".join(f'"{p}"' for p in a.problems)
    write_text_atomic(f"<!-- {cmd} -->\n{text}", a.out / "compare_fixed.md")
    if records:
        plot(records, refs, a.problems, a.out / "compare_fixed.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
