"""The paper's use, with every shape method: S-MNIST task accuracy overall and per shape group,
the shape node's metric and the time per epoch, for the reparameterized objectives and the
alternatives as the shape term (docs/comparison.md, part 3).

    python -m benchmarks.compare smnist --mnist-dir data/mnist --jobs 2     # ~1 h on 2 cores

Three settings, 3 seeds each, every method through ``python -m train``'s loop (one process per
run, one thread each; finished runs reused):

* ``mlp``: the MLP of ``configs/smnist_mlp.yaml`` (a hidden layer shared by the classifier and the
  shape node), 10 epochs, S-MNIST as built by default (every digit also rescaled);
* ``mlp, few big``: the same with only 10 % of the digits rescaled (``--fraction 0.1``), so the
  big digits are a minority of the training set and the baseline has a real subgroup gap;
* ``linear, logits``: the paper's linear model with the shape node reading the class logits
  (``model.shape_input=logits``), so the shape term *can* move the classifier (with the pixels as
  its input it cannot: docs/results.md), 10 epochs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from benchmarks._report import markdown_table, mean_sd, percent
from benchmarks._timing import machine_line
from benchmarks.sweep import finished, metrics, run_pool, seconds_per_epoch, train_once
from data_prep import smnist
from train.files import write_text_atomic

ALPHA = "regularizer.alpha=1e-3"
REFERENCE = "reparam F-beta, defaults (inline, 0.1/0.1, capped)"  # time per epoch relative to it
METHODS: dict[str, list[str]] = {  # name -> overrides (documented settings of each)
    "baseline (no shape term)": ["regularizer.name=none"],
    "reparam F-beta, paper preset": ["regularizer.name=fbeta"],  # the configs pin the paper's
    "reparam F-beta (inline, 0.1/0.1, uncapped)": [
        "regularizer.name=fbeta",
        "regularizer.projection=inline",
        "regularizer.fbeta.dual_lr_lambda=0.1",
        "regularizer.fbeta.dual_lr_mu=0.1",
        "regularizer.fbeta.cap_scores=false",
    ],
    REFERENCE: [  # the library's defaults with a dense tau (the exact inline projection)
        "regularizer.name=fbeta",
        "regularizer.fbeta.preset=null",
        "regularizer.fbeta.tau_update=dense",
    ],
    "reparam F-beta, defaults (tracked, sparse_adam_ahead tau)": [  # the defaults
        "regularizer.name=fbeta",
        "regularizer.fbeta.preset=null",
    ],
    "reparam F-beta, defaults but tracked": [
        "regularizer.name=fbeta",
        "regularizer.fbeta.preset=null",
        "regularizer.projection=tracked",
    ],
    "reparam P@R r=0.9": [
        "regularizer.name=precision_at_recall",
        "regularizer.projection=inline",
        "regularizer.precision_at_recall.recall=0.9",
    ],
    "reparam R@P a=0.9": [
        "regularizer.name=recall_at_precision",
        "regularizer.projection=inline",
        "regularizer.recall_at_precision.precision=0.9",
    ],
    "reparam ROC-AUC K=10": ["regularizer.name=roc_auc", "regularizer.projection=inline"],
    "LP layer F-score (M=100)": [
        "regularizer.name=lp_fbeta",
        "regularizer.lp_fbeta.infeasibility_cost=100",
    ],
    "soft-F1 (T=1)": ["regularizer.name=soft_fbeta"],
    "Cooper F-beta (dual lr 0.1)": ["regularizer.name=cooper_fbeta"],
}
SETTINGS: dict[str, tuple[str, list[str], str]] = {  # name -> (config, overrides, data folder key)
    "mlp": ("configs/smnist_mlp.yaml", ["train.epochs=10"], "full"),
    "mlp, few big": ("configs/smnist_mlp.yaml", ["train.epochs=10"], "few-big"),
    "linear, logits": (
        "configs/smnist_linear.yaml",
        ["train.epochs=10", "model.shape_input=logits"],
        "full",
    ),
}


def _folder(runs: Path, setting: str, method: str, seed: int) -> Path:
    safe = "".join(c if c.isalnum() else "_" for c in f"{setting}-{method}")
    return runs / f"{safe}-seed{seed}"


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.compare smnist", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--mnist-dir", type=Path, default=Path("data/mnist"))
    p.add_argument("--data", type=Path, default=Path("data/smnist"))
    p.add_argument("--data-few-big", type=Path, default=Path("data/smnist-f0.1"))
    p.add_argument("--runs", type=Path, default=Path("runs/compare_smnist"))
    p.add_argument("--out", type=Path, default=Path("docs/figures"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument(
        "--methods",
        nargs="+",
        default=list(METHODS),
        choices=list(METHODS),
        help="the shape terms to run and tabulate (default: all)",
    )
    p.add_argument("--table-only", action="store_true")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: 'linear, logits', seed 0, 1 epoch, on the prepared --data",
    )
    return p.parse_args(argv)


def _todo(a: argparse.Namespace, epochs: list[str]) -> list[tuple[str, list[str], str]]:
    """``(config, overrides, run folder)`` of every unfinished run of the chosen grid."""
    data = {"full": a.data, "few-big": a.data_few_big}
    todo = []
    for setting in a.settings:
        config, extra, key = SETTINGS[setting]
        for method in [m for m in METHODS if m in a.methods]:
            for seed in a.seeds:
                out = _folder(a.runs, setting, method, seed)
                if metrics(out) is None:
                    run = [f"train.seed={seed}", f"data.path={data[key]}"]
                    todo.append(
                        (config, [*extra, *epochs, ALPHA, *METHODS[method], *run], str(out))
                    )
    return todo


HEADER = [
    "shape term",
    "task acc %",
    "small %",
    "big %",
    "gap (pp)",
    "shape F1 (test)",
    "shape F1 at learned threshold (test)",
    "shape AUC (test)",
    "certified F1 bound (train)",
    "time / epoch vs reparam F-beta defaults",
]


def _table(runs: Path, setting: str, seeds: list[int]) -> str:
    """One setting's table: every method with finished runs (in ``METHODS``' order)."""
    found = {m: finished([_folder(runs, setting, m, s) for s in seeds]) for m in METHODS}
    found = {m: ms for m, ms in found.items() if ms}
    ref = (
        statistics.mean(seconds_per_epoch(m) for m in found[REFERENCE])
        if REFERENCE in found
        else None
    )
    rows = []
    for method, ms in found.items():
        f = [m["final"] for m in ms]
        rel = [seconds_per_epoch(m) / ref for m in ms] if ref else []
        rows.append(
            [
                method,
                percent([x["test_accuracy"] for x in f]),
                percent([x["test_accuracy_small"] for x in f]),
                percent([x["test_accuracy_big"] for x in f]),
                percent([x["test_accuracy_gap"] for x in f]),
                mean_sd([x["test_shape_fbeta"] for x in f]),
                mean_sd([x.get("test_shape_fbeta_at_threshold") for x in f]),
                mean_sd([x["test_shape_auc"] for x in f], ".4f"),
                _bound(f),
                mean_sd(rel, ".2f"),
            ]
        )
    return f"### {setting}\n\n{markdown_table(HEADER, rows)}\n"


def _bound(finals: list[dict]) -> str:
    """The certified training F1 bound of the last epoch end (docs/method/lp.md sec. 2): ``n/a`` for
    a shape term without one, else mean ± sd over the seeds that have one, with how many do."""
    if any("reg_certified_fbeta" not in x for x in finals):
        return "n/a"
    have = [x["reg_certified_fbeta"] for x in finals if x["reg_certified_fbeta"] is not None]
    return f"{mean_sd(have) if have else 'none'} ({len(have)}/{len(finals)} certified)"


def main(argv: list[str] | None = None) -> int:
    """Train the unfinished runs (unless ``--table-only``), then write the tables."""
    a = _arguments(argv)
    epochs = []
    if a.quick:
        a.settings, a.seeds, epochs = ["linear, logits"], [0], ["train.epochs=1"]
    elif not a.table_only:
        smnist.prepare(a.data, smnist.Options(), mnist_dir=a.mnist_dir)
        if "mlp, few big" in a.settings:
            smnist.prepare(a.data_few_big, smnist.Options(fraction=0.1), mnist_dir=a.mnist_dir)
    todo = [] if a.table_only else _todo(a, epochs)
    print(f"{len(todo)} runs to do", flush=True)
    run_pool(train_once, todo, a.jobs, lambda _, done: print("done", done, flush=True))
    text = "\n".join(_table(a.runs, setting, a.seeds) for setting in a.settings)
    a.out.mkdir(parents=True, exist_ok=True)
    settings = " ".join(f'"{x}"' for x in a.settings)
    if a.methods != list(METHODS):
        settings += " --methods " + " ".join(f'"{x}"' for x in a.methods)
    write_text_atomic(
        f"<!-- python -m benchmarks.compare smnist --mnist-dir data/mnist --jobs {a.jobs} "
        f"--settings {settings} --seeds {' '.join(map(str, a.seeds))} -->\n"
        f"{machine_line()}; mean ± sd over seeds; 1 thread per run, {a.jobs} runs at a time\n\n{text}",
        a.out / "compare_smnist.md",
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
