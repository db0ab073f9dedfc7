"""Why F-beta offers each projection mode: the defaults with the projection moved, on fixed features.

    python -m benchmarks.projection_modes --jobs 2 --out docs/figures     # resumable
    python -m benchmarks.projection_modes --out docs/figures --name tau_update_quality \
        --arms "inline, exact (dense tau)" "projection tracked" \
        "projection tracked, sparse tau ahead"          # the tau update rules (~10 min)
    python -m benchmarks.projection_modes --replot --out docs/figures [--name NAME]  # from NAME.md

The runs of ``benchmarks.compare.fixed`` (a linear head alone, Adam 1e-2, batch 20, 200 epochs,
seeds 0-2) for the library's defaults with a dense ``tau`` (``schedule=Inline()``, exact, with
``tau=DenseTau()``; dual steps 0.1; capped) and for the same settings with the projection once per
epoch (``EpochEnd()``, Algorithm 3's place), the inline projection's threshold over a tracked
active set (``Tracked()``: with a dense ``tau``, and with ``SparseTau(lr=1e-2)``, stepped by
``sparse_adam_ahead``: the library's default) and inline but smooth (``Inline(strength=0.05)``,
``Inline(strength=0.2)``: ``soft_project_onto_c``). Reported per problem, mean ± sd over seeds:
the training F1 of ``u > 0``, the certified F1 bound and the LP gap of the final scores (the (3')
objective at their best feasible ``eps``, relative to HiGHS's optimum; runs without a feasible
``eps`` are counted), the sd of the F1 over the last 20 epochs and the seconds per epoch. Runs are shared with ``compare.fixed``
(``--runs``). ``--arms`` (their labels) keeps some arms, written to ``--name``.md/.png.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

from ._report import markdown_table, mean_sd, read_markdown_table, save_figure, subplots
from .compare.fixed.run import record_name, run_one, save_record
from .compare.fixed.spec import BATCH, EPOCHS, MODE_FAMILIES, SEEDS
from .compare.fixed.tables import references
from .sweep import run_pool

# compare.fixed's family at its default step: the library's defaults with a dense tau (the exact
# inline projection)
DEFAULTS = ("reparam F-beta, inline, capped", 0.1)
PROBLEMS = ("2-D, 40/60", "20-D, 200/300", "10-D, 50/950")
ARMS = [DEFAULTS, *((family, None) for family in MODE_FAMILIES)]


def _label(family: str) -> str:
    return "inline, exact (dense tau)" if family == DEFAULTS[0] else family.split(" but ")[1]


def table(records: list[dict], optima: dict[str, float], arms: list = ARMS) -> str:
    """One row per arm and problem: F1, the certified F1 bound and the LP gap (feasible runs),
    last-20 sd, seconds per epoch."""
    rows = []
    for problem in PROBLEMS:
        for family, _ in arms:
            rs = [r for r in records if (r["problem"], r["family"]) == (problem, family)]
            gaps = [
                (r["lp_objective"] - optima[problem]) / optima[problem] * 100
                for r in rs
                if r["lp_objective"] is not None
            ]
            # the certificate of docs/method/lp.md sec. 2 at the best feasible eps (> 0 whenever one
            # exists): F1 >= 2 / (1 + v), v the (3') objective there (beta = 1)
            bounds = [2 / (1 + r["lp_objective"]) for r in rs if r["lp_objective"] is not None]
            rows.append(
                [
                    problem,
                    _label(family),
                    mean_sd([r["f1"] for r in rs]),
                    mean_sd(bounds) if bounds else "none",
                    f"{mean_sd(gaps, '.1f') + ' %' if gaps else 'n/a'} ({len(gaps)}/{len(rs)} feasible)",
                    mean_sd([r["f1_last20_sd"] for r in rs]),
                    mean_sd([r["seconds_per_epoch"] for r in rs], ".4f"),
                ]
            )
    header = [
        "problem",
        "projection",
        "F1 (u > 0)",
        "certified F1 bound",
        "LP gap",
        "F1 sd, last 20 epochs",
        "s / epoch",
    ]
    return markdown_table(header, rows)


def plot(records: list[dict], path: Path, arms: list = ARMS) -> None:
    fig, axes = subplots(1, len(PROBLEMS), figsize=(4 * len(PROBLEMS), 3), sharey=True)
    for ax, problem in zip(axes, PROBLEMS, strict=True):
        for family, _ in arms:
            f1s = [r["f1"] for r in records if (r["problem"], r["family"]) == (problem, family)]
            ax.scatter([_label(family)] * len(f1s), f1s, s=12)
        ax.set_title(problem, fontsize=9)
        ax.tick_params(axis="x", labelrotation=60, labelsize=7)
    axes[0].set_ylabel("training F1 (u > 0)")
    save_figure(fig, path)


def plot_table(path: Path, out: Path) -> None:
    """The figure of ``plot`` from the table ``main`` wrote (``--replot``): per arm and problem the
    mean training F1 and its sd over the seeds (the table keeps no single run)."""
    rows = read_markdown_table(path)
    fig, axes = subplots(1, len(PROBLEMS), figsize=(4 * len(PROBLEMS), 3.6), sharey=True)
    for ax, problem in zip(axes, PROBLEMS, strict=True):
        for row in (r for r in rows if r["problem"] == problem):
            mean, sd = (float(x) for x in row["F1 (u > 0)"].split(" ± "))
            ax.errorbar([row["projection"]], [mean], yerr=[sd], fmt="o", ms=4, capsize=3)
        ax.set_title(problem, fontsize=9)
        ax.tick_params(axis="x", labelrotation=60, labelsize=7)
    axes[0].set_ylabel("training F1, mean ± sd")
    save_figure(fig, out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=Path, default=Path("runs/compare_fixed"))
    p.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    p.add_argument("--jobs", type=int, default=2)
    labels = [_label(family) for family, _ in ARMS]
    p.add_argument("--arms", nargs="+", choices=labels, default=labels, metavar="ARM")
    p.add_argument("--name", default="projection_modes", help="output file stem")
    p.add_argument(
        "--replot", action="store_true", help="draw NAME.png from --out's NAME.md; no runs"
    )
    a = p.parse_args(argv)
    if a.replot:
        plot_table(a.out / f"{a.name}.md", a.out / f"{a.name}.png")
        return 0
    arms = [arm for arm in ARMS if _label(arm[0]) in a.arms]
    a.runs.mkdir(parents=True, exist_ok=True)
    jobs = [(pr, f, v, s, BATCH, EPOCHS) for pr in PROBLEMS for f, v in arms for s in SEEDS]
    todo = [j for j in jobs if not (a.runs / record_name(*j)).is_file()]
    print(f"{len(todo)} runs to do", flush=True)
    run_pool(run_one, todo, a.jobs, partial(save_record, a.runs))
    records = [json.loads((a.runs / record_name(*j)).read_text()) for j in jobs]
    optima = {problem: references(problem)["lp_optimum"] for problem in PROBLEMS}
    subset = (
        "" if arms == ARMS else f" --name {a.name} --arms " + " ".join(f'"{x}"' for x in a.arms)
    )
    text = (
        f"<!-- python -m benchmarks.projection_modes --jobs 2{subset} -->\n"
        "F-beta's defaults with the projection moved (benchmarks/projection_modes.py), "
        f"{EPOCHS} epochs, seeds {list(SEEDS)}, mean ± sd\n\n" + table(records, optima, arms) + "\n"
    )
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{a.name}.md").write_text(text)
    plot(records, a.out / f"{a.name}.png", arms)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
