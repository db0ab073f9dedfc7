"""S-MNIST results table on the real MNIST: baseline vs the F-beta regularizer, 3 seeds each.

    python -m benchmarks.smnist_results --mnist-dir data/mnist --jobs 2

Builds ``data/smnist`` if needed, trains every (variant, seed) of the grid below with
``python -m train``'s loop (each in its own process, one thread each, ``--jobs`` at a time; a run
whose ``metrics.json`` is complete is reused, so an interrupted sweep resumes), then writes
``docs/results.md`` (mean +- sd over seeds) and ``docs/figures/smnist_results.png`` (the paper's
Fig. 3: test accuracy per epoch, projections per epoch: Algorithm 3's ``epoch`` against the full
projections after every step, ``reparam.baselines.FullProjectionsFBeta``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

from data_prep import smnist

from ._report import markdown_table, mean_sd, percent, save_figure, subplots
from .sweep import finished, metrics, run_pool, train_once

PAPER = ["regularizer.fbeta.dual_lr_lambda=1e-3", "regularizer.fbeta.dual_lr_mu=1e-5"]
# the paper's full projections (a dense tau projected after every optimizer step) with the same
# settings: the configs' preset (paper) and dual steps, in that regularizer's own section
FULL_PROJECTIONS = [
    "regularizer.name=fbeta_full_projections",
    "regularizer.fbeta_full_projections.preset=paper",
    *(o.replace("regularizer.fbeta.", "regularizer.fbeta_full_projections.") for o in PAPER),
]
TUNED = [
    "regularizer.projection=inline",
    "regularizer.fbeta.dual_lr_lambda=0.1",
    "regularizer.fbeta.dual_lr_mu=0.1",
]  # docs/regularizer.md


def grid(mlp_epochs: int) -> list[tuple[str, str, list[str]]]:
    """``(name, config, overrides)`` of every variant."""
    out = [("linear baseline", "configs/smnist_linear.yaml", ["regularizer.name=none"])]
    for alpha in ("1e-2", "1e-3", "1e-4"):
        epoch = ["regularizer.name=fbeta", "regularizer.projection=epoch", *PAPER]
        for mode, overrides in (("epoch", epoch), ("full projections", FULL_PROJECTIONS)):
            out.append(
                (
                    f"linear a={alpha} {mode}",
                    "configs/smnist_linear.yaml",
                    [f"regularizer.alpha={alpha}", *overrides],
                )
            )
    out.append(
        (
            "linear a=1e-3 tuned",
            "configs/smnist_linear.yaml",
            ["regularizer.name=fbeta", "regularizer.alpha=1e-3", *TUNED],
        )
    )
    mlp = ["train.epochs=" + str(mlp_epochs)]
    out.append(("mlp baseline", "configs/smnist_mlp.yaml", ["regularizer.name=none", *mlp]))
    for name, extra in (
        ("epoch", ["regularizer.name=fbeta", "regularizer.projection=epoch", *PAPER]),
        ("full projections", FULL_PROJECTIONS),
        ("tuned", ["regularizer.name=fbeta", *TUNED]),
    ):
        out.append(
            (
                f"mlp a=1e-3 {name}",
                "configs/smnist_mlp.yaml",
                ["regularizer.alpha=1e-3", *extra, *mlp],
            )
        )
    return out


def _folder(runs: Path, name: str, seed: int) -> Path:
    return runs / f"{name.replace(' ', '_').replace('=', '')}-seed{seed}"


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mnist-dir", type=Path, default=Path("data/mnist"))
    p.add_argument("--data", type=Path, default=Path("data/smnist"))
    p.add_argument("--runs", type=Path, default=Path("runs/smnist_results"))
    p.add_argument("--out", type=Path, default=Path("docs"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--mlp-epochs", type=int, default=10)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--only", default=None, help="substring: run only matching variants")
    p.add_argument("--table-only", action="store_true", help="no training: tabulate finished runs")
    return p.parse_args(argv)


def _row(name: str, regularized: bool, ms: list[dict[str, Any]], n_seeds: int) -> list[str]:
    f = [m["final"] for m in ms]
    seeds = "" if len(ms) == n_seeds else f" ({len(ms)} seed{'s' if len(ms) > 1 else ''})"
    shape = mean_sd([x["test_shape_fbeta"] for x in f]) if regularized else "n/a"
    return [
        f"{name}{seeds}",
        percent([x["test_accuracy"] for x in f]),
        percent([x["test_accuracy_small"] for x in f]),
        percent([x["test_accuracy_big"] for x in f]),
        percent([x["test_accuracy_gap"] for x in f]),
        shape,
        mean_sd([x.get("reg_certified_fbeta") for x in f]),
        mean_sd([x.get("reg_projections") for x in f], ".0f"),
        mean_sd([x["train_seconds_total"] for x in f], ".0f"),
    ]


HEADER = [
    "variant",
    "test acc %",
    "small %",
    "big %",
    "gap (pp)",
    "shape-head F1 (test)",
    "certified F1 bound (train)",
    "projections",
    "train time (s)",
]


def main(argv: list[str] | None = None) -> int:
    """Train the unfinished runs of the grid (unless ``--table-only``); the table and the figure."""
    a = _arguments(argv)
    smnist.prepare(a.data, smnist.Options(), mnist_dir=a.mnist_dir)
    variants = [v for v in grid(a.mlp_epochs) if a.only is None or a.only in v[0]]
    todo = []
    for name, config_path, overrides in variants:
        for seed in a.seeds:
            out = _folder(a.runs, name, seed)
            if metrics(out) is None and not a.table_only:
                if out.exists():
                    shutil.rmtree(out)
                todo.append(
                    (
                        config_path,
                        [*overrides, f"train.seed={seed}", f"data.path={a.data}"],
                        str(out),
                    )
                )
    print(f"{len(todo)} runs to do ({len(variants) * len(a.seeds)} in the grid)", flush=True)
    run_pool(train_once, todo, a.jobs, lambda _, done: print("done", done, flush=True))
    rows, curves = [], {}
    for name, _, overrides in variants:
        ms = finished([_folder(a.runs, name, seed) for seed in a.seeds])
        if ms:
            curves[name] = ms
            rows.append(_row(name, "regularizer.name=none" not in overrides, ms, len(a.seeds)))
    table = markdown_table(HEADER, rows)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "figures").mkdir(exist_ok=True)
    (a.out / "figures" / "smnist_results.md").write_text(
        f"<!-- python -m benchmarks.smnist_results --seeds {' '.join(map(str, a.seeds))} "
        f"--mlp-epochs {a.mlp_epochs} -->\n{table}\n"
    )
    _plot(curves, a.out / "figures" / "smnist_results.png")
    print(table)
    return 0


def _plot(curves: dict[str, list[dict]], path: Path) -> None:
    fig, axes = subplots(1, 3, figsize=(16, 4.5))
    for ax, model in zip(axes[:2], ("linear", "mlp"), strict=True):
        for name, ms in curves.items():
            if not name.startswith(model) or "a=1e-2" in name or "a=1e-4" in name:
                continue
            if len({len(m["history"]) for m in ms}) != 1:
                continue
            acc = [[h["test_accuracy"] * 100 for h in m["history"]] for m in ms]
            mean = [statistics.mean(col) for col in zip(*acc, strict=True)]
            ax.plot(range(1, len(mean) + 1), mean, label=name)
        ax.set(title=f"{model}: test accuracy (mean of seeds)", xlabel="epoch", ylabel="%")
        ax.legend(fontsize=8)
    ax = axes[2]
    for name, ms in curves.items():
        if name.startswith("linear a=1e-3") and ("epoch" in name or "full projections" in name):
            proj = [h["reg_projections"] for h in ms[0]["history"]]
            ax.plot(range(1, len(proj) + 1), proj, label=name)
    ax.set(title="projections (cumulative)", xlabel="epoch", yscale="log")
    ax.legend(fontsize=8)
    save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(main())
