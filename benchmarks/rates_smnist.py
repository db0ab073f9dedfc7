"""S-MNIST with each rate objective on the shape node (docs/rates.md): P@R, R@P at two targets,
ROC-AUC at two grid sizes, next to F-beta and the baseline; the MLP (its shared hidden layer lets
the shape term reach the classifier), 3 seeds.

    python -m benchmarks.rates_smnist --mnist-dir data/mnist --jobs 2     # ~25 min on 2 cores

Same machinery as ``benchmarks.smnist_results`` (one process per run, one thread each, finished
runs reused); writes ``docs/figures/rates_smnist.md``: the shape node's test precision / recall of
``u > 0``, the ROC-AUC of its scores, the precision / recall at the objective's learned
``decision_threshold`` (F-beta, P@R, R@P), the task accuracy overall and per
shape group, and the training time per epoch relative to F-beta's (mean +- sd over seeds).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from data_prep import smnist

from ._report import markdown_table, mean_sd, percent
from .smnist_results import TUNED
from .sweep import finished, metrics, run_pool, seconds_per_epoch, train_once

CONFIG = "configs/smnist_mlp.yaml"
COMMON = ["regularizer.alpha=1e-3", "regularizer.projection=inline"]


def grid(epochs: int) -> list[tuple[str, list[str]]]:
    """``(name, overrides)`` of every variant (all on ``configs/smnist_mlp.yaml``)."""
    e = [f"train.epochs={epochs}"]
    out = [
        ("baseline", ["regularizer.name=none", *e]),
        (
            "F-beta (inline, 0.1/0.1)",
            ["regularizer.name=fbeta", "regularizer.alpha=1e-3", *TUNED, *e],
        ),
    ]
    for r in ("0.9", "0.97"):
        out.append(
            (
                f"P@R r={r}",
                [
                    "regularizer.name=precision_at_recall",
                    *COMMON,
                    f"regularizer.precision_at_recall.recall={r}",
                    *e,
                ],
            )
        )
    for a in ("0.9", "0.97"):
        out.append(
            (
                f"R@P a={a}",
                [
                    "regularizer.name=recall_at_precision",
                    *COMMON,
                    f"regularizer.recall_at_precision.precision={a}",
                    *e,
                ],
            )
        )
    for k in ("10", "40"):
        out.append(
            (
                f"ROC-AUC K={k}",
                ["regularizer.name=roc_auc", *COMMON, f"regularizer.roc_auc.grid={k}", *e],
            )
        )
    return out


def _folder(runs: Path, name: str, seed: int) -> Path:
    safe = name.replace(" ", "_").replace("=", "").replace("@", "at").replace("/", "_")
    return runs / f"{safe.replace('(', '').replace(')', '').replace(',', '')}-seed{seed}"


HEADER = [
    "shape objective",
    "shape precision (test, u > 0)",
    "shape recall",
    "shape ROC-AUC",
    "precision / recall at its threshold",
    "task acc %",
    "small %",
    "big %",
    "gap (pp)",
    "time / epoch vs F-beta",
]
REFERENCE = "F-beta (inline, 0.1/0.1)"  # the time per epoch is relative to this variant's


def _row(name: str, ms: list[dict[str, Any]], ref_epoch: float | None) -> list[str]:
    f = [m["final"] for m in ms]
    rel = [seconds_per_epoch(m) / ref_epoch for m in ms] if ref_epoch else []
    return [
        name,
        mean_sd([x["test_shape_precision"] for x in f]),
        mean_sd([x["test_shape_recall"] for x in f]),
        mean_sd([x["test_shape_auc"] for x in f], ".4f"),
        _at_threshold(f),
        percent([x["test_accuracy"] for x in f]),
        percent([x["test_accuracy_small"] for x in f]),
        percent([x["test_accuracy_big"] for x in f]),
        percent([x["test_accuracy_gap"] for x in f]),
        mean_sd(rel, ".2f"),
    ]


def _at_threshold(finals: list[dict[str, Any]]) -> str:
    """The shape node's test precision / recall at the objective's learned ``decision_threshold``
    (F-beta's F1-optimal cut, the rate objectives' target cut); n/a for those that learn none."""
    if any(x.get("test_shape_precision_at_threshold") is None for x in finals):
        return "n/a"
    p = mean_sd([x["test_shape_precision_at_threshold"] for x in finals])
    return f"{p} / {mean_sd([x['test_shape_recall_at_threshold'] for x in finals])}"


def main(argv: list[str] | None = None) -> int:
    """Train the unfinished runs of the grid (unless ``--table-only``), then write the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mnist-dir", type=Path, default=Path("data/mnist"))
    p.add_argument("--data", type=Path, default=Path("data/smnist"))
    p.add_argument("--runs", type=Path, default=Path("runs/rates_smnist"))
    p.add_argument("--out", type=Path, default=Path("docs/figures"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--table-only", action="store_true", help="no training: tabulate finished runs")
    p.add_argument(
        "--variants",
        nargs="+",
        default=None,
        help="train only the variants whose names start with one of these (e.g. 'P@R' 'R@P'); "
        "the table has every variant with finished runs",
    )
    a = p.parse_args(argv)
    if not a.table_only:
        smnist.prepare(a.data, smnist.Options(), mnist_dir=a.mnist_dir)
    variants = grid(a.epochs)
    todo = [
        (CONFIG, [*overrides, f"train.seed={seed}", f"data.path={a.data}"], str(out))
        for name, overrides in variants
        for seed in a.seeds
        if metrics(out := _folder(a.runs, name, seed)) is None
        and not a.table_only
        and (a.variants is None or name.startswith(tuple(a.variants)))
    ]
    print(f"{len(todo)} runs to do ({len(variants) * len(a.seeds)} in the grid)", flush=True)
    run_pool(train_once, todo, a.jobs, lambda _, done: print("done", done, flush=True))
    finals = {name: finished([_folder(a.runs, name, s) for s in a.seeds]) for name, _ in variants}
    finals = {name: ms for name, ms in finals.items() if ms}
    ref = finals.get(REFERENCE)
    ref_epoch = statistics.mean(seconds_per_epoch(m) for m in ref) if ref else None
    table = markdown_table(HEADER, [_row(name, ms, ref_epoch) for name, ms in finals.items()])
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "rates_smnist.md").write_text(
        f"<!-- python -m benchmarks.rates_smnist --seeds {' '.join(map(str, a.seeds))} "
        f"--epochs {a.epochs} -->\n{table}\n"
    )
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
