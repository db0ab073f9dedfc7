"""``python -m benchmarks.compare rates``: the sweep (resumable) and its tables."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from benchmarks.sweep import run_pool
from train.files import write_text_atomic

from . import __doc__ as DOC
from .run import run
from .spec import (
    ARMS,
    COOPERS,
    DATASETS,
    EPOCHS,
    MODELS,
    NORMALIZED,
    OTHER_DIGITS,
    RARE,
    RULE_MLP_STUDY,
    RULE_MLP_TABLE,
    RULE_MNIST_STUDY,
    RULE_MNIST_TABLE,
    RULE_STUDY,
    RULE_TABLE,
    RUNS,
    SCHEDULE_STUDY,
    SCHEDULE_TABLE,
    SCHEDULES,
    SEEDS,
    STEP_STUDY,
    STEP_TABLE,
    STEPS,
    TABLE,
    TABULAR,
    TARGETS,
    Job,
    budget,
)
from .tables import rule_table, step_table, table, training_table


def jobs(args: argparse.Namespace) -> list[Job]:
    out = []
    for dataset in args.data:
        for model in args.models:
            for seed in args.seeds:
                for arm in args.arms:
                    epochs = budget(dataset)[0] or args.epochs
                    for target in [None] if arm == "ce" else args.targets:
                        slug = arm.replace(", ", "-").replace(" ", "-")
                        name = f"{dataset}-{model}-{slug}-{target or 'all'}-seed{seed}.json"
                        path = str(Path(args.runs) / name)
                        out.append(
                            Job(dataset, model, arm, target, seed, epochs, args.mnist_dir, path)
                        )
    return out


def load_record(job: Job) -> dict | None:
    try:
        record = json.loads(Path(job.path).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return (
        record
        if record.get("job", {}) | {"mnist_dir": None} == asdict(job) | {"mnist_dir": None}
        else None
    )


def _save(job: Job, record: dict) -> None:
    Path(job.path).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(json.dumps(record, indent=1), Path(job.path))
    sec = record["seconds_per_epoch"]
    print(
        f"done {Path(job.path).name}: " + (f"{sec:.2f} s/epoch" if sec else "diverged"), flush=True
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.compare rates",
        description=DOC,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--mnist-dir", default=None)
    p.add_argument(
        "--data",
        nargs="+",
        default=list(DATASETS),
        choices=[*DATASETS, *RARE, *OTHER_DIGITS, "digits", *TABULAR],
    )
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument(
        "--arms",
        nargs="+",
        default=list(ARMS),
        choices=[*ARMS, *SCHEDULES, *STEPS, *COOPERS, *NORMALIZED, "logistic"],
    )
    p.add_argument(
        "--study",
        choices=("main", "schedule", "step", "rule", "rule-mnist", "rule-mlp"),
        default="main",
        help="schedule: the dual schedules and nu step sizes (mnist9, P@R 0.95 / 0.99), "
        f"written to {SCHEDULE_TABLE}; step: the default nu step against a 9-point grid and "
        f"Cooper's hinge Lagrangian over its own (mnist9 at 10 %% and 1 %% positives, linear), "
        f"written to {STEP_TABLE}; rule: the additive and the normalized multiplier rules, "
        f"each at its default and over a 9-point grid of its step, Cooper over its own, BCE and "
        f"a tuned logistic regression (four real tabular sets, linear), written to {RULE_TABLE}; "
        f"rule-mnist: the same on the step study's data and digits 3 and 5, written to "
        f"{RULE_MNIST_TABLE}; "
        f"rule-mlp: the two rules for the MLP (digit 9, r = 0.99), written to {RULE_MLP_TABLE}",
    )
    p.add_argument("--targets", nargs="+", default=list(TARGETS), choices=TARGETS)
    p.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    p.add_argument("--epochs", type=int, default=EPOCHS)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--runs", default=str(RUNS))
    p.add_argument("--out", default=str(TABLE))
    p.add_argument("--table-only", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.study != "main":
        study, out = {
            "schedule": (SCHEDULE_STUDY, SCHEDULE_TABLE),
            "step": (STEP_STUDY, STEP_TABLE),
            "rule": (RULE_STUDY, RULE_TABLE),
            "rule-mnist": (RULE_MNIST_STUDY, RULE_MNIST_TABLE),
            "rule-mlp": (RULE_MLP_STUDY, RULE_MLP_TABLE),
        }[args.study]
        for key, value in study.items():  # unless given on the command line
            if getattr(args, key) == p.get_default(key):
                setattr(args, key, value)
        if args.out == str(TABLE):
            args.out = str(out)
    todo = jobs(args)
    if not args.table_only:
        pending = [j for j in todo if load_record(j) is None]
        print(f"{len(todo) - len(pending)} of {len(todo)} runs finished; {len(pending)} to run")
        run_pool(run, pending, args.jobs, _save)
    records = [r for j in todo if (r := load_record(j)) is not None]
    if args.study == "step":
        text = step_table(records)
    elif args.study.startswith("rule"):
        text = rule_table(records)
    else:
        text = table(records) + (training_table(records) if args.study == "schedule" else "")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(text, Path(args.out))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
