"""Part 4 of the comparison (docs/rates.md): rate targets against cross-entropy + a threshold chosen
on a validation split, the one-line alternative a user has.

    python -m benchmarks.compare rates --mnist-dir data/mnist --jobs 2   # resumable
    python -m benchmarks.compare rates --table-only                      # the table from the runs

Data (train / val / test): real MNIST digit 9 against the rest (50,000 / 10,000 / the 10,000 test
images); the imbalanced protocol of part 2 (digits 0-4 positive, 91 % and 50 % positives; a sixth of
its training subset, fixed, is the val split); ``--data digits`` is scikit-learn's bundled digits
(9 against the rest, 60 / 20 / 20 %), for a check without MNIST. Models: a linear head and the MLP
784-256-1 (64-256-1 on digits), Adam lr 1e-3, batch 128, ``EPOCHS`` epochs, seeds 0-2.

Targets: precision at recall ``r`` (P@R) for r in 0.9, 0.95, 0.99; recall at precision ``a`` (R@P)
for a in 0.9, 0.95. Arms, each a run:

* ``ce``: cross-entropy, evaluated at ``u > 0`` and at the val threshold of every target;
* ``rate``: the library's objective alone, at its own ``decision_threshold`` and at its
  ``calibrate``-d val threshold;
* ``rate+ce@alpha``: cross-entropy + alpha times the objective (alpha 1e-3, 1e-2, 1e-1), at the
  val threshold;
* ``rate, nu on val``: the two-dataset formulation of Cotter et al. (ICML 2019): the objective alone,
  its per-sample blocks on the training batches, but ``nu`` stepped only on the violation of a val
  batch drawn after every step (the same step size as the library's per-step ``nu`` step).

``--study schedule`` trains the objective alone under other dual schedules on mnist9 (P@R 0.95 and
0.99): the paper's once-per-epoch step (``dual_every="epoch"``) at its default ``lambda`` step and at
10, and the per-step ``nu`` step at 0.01 and 0.03 against the default 0.1.

A record per run (JSON, ``--runs``) holds the test recall and precision at each decision, whether
the target held on test, the certified value and the seconds per epoch; finished runs are skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from benchmarks._report import markdown_table, mean_and_sd, mean_sd
from benchmarks._timing import machine_line
from benchmarks.sweep import run_pool
from reparam import PrecisionAtRecall, RecallAtPrecision
from reparam import rate_functional as R
from reparam.rates import DEFAULT_NU_STEP
from train.files import write_text_atomic

EPOCHS, BATCH, LR, HIDDEN, SEEDS = 8, 128, 1e-3, 256, (0, 1, 2)
DATASETS = ("mnist9", "imb91", "imb50")
MODELS = ("linear", "mlp")
TARGETS = ("par0.9", "par0.95", "par0.99", "rap0.9", "rap0.95")  # objective + target
ALPHAS = (1e-3, 1e-2, 1e-1)
ARMS = ("ce", "rate", *(f"rate+ce@{a:g}" for a in ALPHAS), "rate, nu on val")
# --study schedule: the objective alone under other dual schedules (what picked the defaults)
SCHEDULES = {
    "rate, epoch schedule": {"dual_every": "epoch"},
    "rate, epoch schedule, lambda step 10": {"dual_every": "epoch", "dual_lr_lambda": 10.0},
    "rate, nu step 0.01": {"dual_lr_nu_step": 0.01},
    "rate, nu step 0.03": {"dual_lr_nu_step": 0.03},
}
ALONE = ("rate", "rate, nu on val", *SCHEDULES)
SCHEDULE_STUDY = {
    "data": ["mnist9"],
    "targets": ["par0.95", "par0.99"],
    "arms": ["rate", *SCHEDULES],
}
# the decisions each arm is reported at: u > 0, the val threshold, the objective's own
SHOWN = (
    {arm: ("at_val",) for arm in ARMS}
    | {
        "ce": ("at_zero", "at_val"),
        "rate": ("at_zero", "at_val", "at_own"),
        "rate, nu on val": ("at_val", "at_own"),
    }
    | {arm: ("at_zero", "at_val", "at_own") for arm in SCHEDULES}
)
RUNS = Path("benchmarks/compare/rates_runs")
TABLE = Path("docs/figures/compare_rates.md")
SCHEDULE_TABLE = Path("docs/figures/compare_rates_schedule.md")


# --- data ---------------------------------------------------------------------------------------


Split = tuple[Tensor, Tensor]


def load(dataset: str, mnist_dir: str | None) -> dict[str, Split]:
    """``{train, val, test: (x float32 (N, D), y int64 (N,), 1 = positive)}``."""
    if dataset == "digits":
        from sklearn.datasets import load_digits

        x, digits = load_digits(return_X_y=True)
        order = np.random.default_rng(0).permutation(len(digits))
        x = torch.from_numpy(x[order].astype(np.float32) / 16)
        y = torch.from_numpy((digits[order] == 9).astype(np.int64))
        a, b = int(0.6 * len(y)), int(0.8 * len(y))
        return {"train": (x[:a], y[:a]), "val": (x[a:b], y[a:b]), "test": (x[b:], y[b:])}
    if mnist_dir is None:
        raise ValueError(f"--mnist-dir is needed for data {dataset!r}")
    if dataset == "mnist9":
        from data_prep.smnist import load_mnist

        raw = load_mnist(Path(mnist_dir), verify=False)[0]
        out = {}
        for split, (images, digits) in raw.items():
            x = torch.from_numpy(images.reshape(len(digits), -1).astype(np.float32) / 255)
            out[split] = (x, torch.from_numpy((digits == 9).astype(np.int64)))
        (x, y) = out["train"]
        return {"train": (x[:50000], y[:50000]), "val": (x[50000:], y[50000:]), "test": out["test"]}
    from benchmarks.compare.mnist.spec import prepare

    ratio = {"imb91": 0.91, "imb50": 0.5}[dataset]
    parts = prepare(Path(mnist_dir), ratio, data_seed=0, quick=False)
    x, y = parts["train"]
    order = torch.from_numpy(np.random.default_rng(1).permutation(len(y)))
    n_val = len(y) // 6
    val, train = order[:n_val], order[n_val:]
    return {"train": (x[train], y[train]), "val": (x[val], y[val]), "test": parts["test"]}


# --- one run --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    dataset: str
    model: str
    arm: str
    target: str | None  # None for the cross-entropy run (it serves every target)
    seed: int
    epochs: int
    mnist_dir: str | None
    path: str


def objective(
    target: str, labels: Tensor, **options: float
) -> PrecisionAtRecall | RecallAtPrecision:
    """The library's objective for ``target`` (``par0.95``: P@R r = 0.95), its defaults."""
    value = float(target[3:])
    if target.startswith("par"):
        return PrecisionAtRecall(labels, recall=value, **options)
    return RecallAtPrecision(labels, precision=value, **options)


def val_violation(target: str, u: Tensor, positive: Tensor) -> Tensor:
    """The rate constraint's violation on a val batch (hinge bounds, normalized by its positives):
    P@R ``r - mean_+ min(u, 1)``; R@P ``(a fp+ - (1 - a) tp-) / n+``."""
    value, n_pos = float(target[3:]), positive.sum().clamp_min(1)
    tp = torch.where(positive, R.capped(u), 0).sum()
    if target.startswith("par"):
        return value - tp / n_pos
    fp = torch.where(positive, 0, R.hinge_fp(u)).sum()
    return (value * fp - (1 - value) * tp) / n_pos


def at_target(target: str, val: Split, test: Split, u_val: Tensor, u_test: Tensor) -> dict:
    """Test recall / precision at the threshold that meets ``target`` on val with the best other
    rate, and whether the target holds on test there."""
    pos = val[1] == 1
    chooser = R.threshold_at_recall if target.startswith("par") else R.threshold_at_precision
    t = chooser(u_val[pos], u_val[~pos], float(target[3:])).threshold
    return decision(target, test, u_test, t)


def decision(target: str, test: Split, u_test: Tensor, t: float) -> dict:
    pos = test[1] == 1
    recall, precision = R.recall_precision(u_test[pos] - t, u_test[~pos] - t)
    recall, precision = recall or 0.0, precision or 0.0
    held = (
        recall >= float(target[3:]) if target.startswith("par") else precision >= float(target[3:])
    )
    return {"threshold": t, "recall": recall, "precision": precision, "held": held}


def run(job: Job) -> dict[str, Any]:
    torch.set_num_threads(1)
    data = load(job.dataset, job.mnist_dir)
    (x, y), dim = data["train"], data["train"][0].shape[1]
    torch.manual_seed(job.seed)
    if job.model == "linear":
        model = torch.nn.Linear(dim, 1)
    else:
        model = torch.nn.Sequential(
            torch.nn.Linear(dim, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1)
        )
    on_val = job.arm == "rate, nu on val"
    # nu on val: the training batches step no nu (per step nor at the epoch end)
    options = {"dual_lr_nu_step": 0.0, "dual_lr_nu": 0.0} if on_val else SCHEDULES.get(job.arm, {})
    reg = None if job.arm == "ce" else objective(job.target, y, **options)
    alone = job.arm in ALONE
    ce_weight = 0.0 if alone else 1.0
    alpha = 1.0 if alone else float(job.arm.partition("@")[2] or 0)
    x_val, y_val = data["val"]
    params = [*model.parameters(), *(reg.parameters() if reg is not None else [])]
    opt = torch.optim.Adam(params, lr=LR)
    if reg is not None:
        reg.attach(opt)
    g = torch.Generator().manual_seed(job.seed)
    start = time.perf_counter()
    for _ in range(job.epochs):
        perm = torch.randperm(len(y), generator=g)
        for i in range(0, len(y), BATCH):
            idx = perm[i : i + BATCH]
            u = model(x[idx]).squeeze(1)
            loss = ce_weight * torch.nn.functional.binary_cross_entropy_with_logits(
                u, y[idx].float()
            )
            if reg is not None:
                loss = loss + alpha * reg(u, idx)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if on_val:  # Cotter et al.: the multiplier sees the constraint on the second data set
                pick = torch.randint(len(y_val), (BATCH,), generator=g)
                with torch.no_grad():
                    u_val = model(x_val[pick]).squeeze(1)
                    step = DEFAULT_NU_STEP * val_violation(job.target, u_val, y_val[pick] == 1)
                    reg.nu.copy_((reg.nu + step).clamp_min(0))
        if reg is not None:
            reg.end_epoch_()
    seconds = (time.perf_counter() - start) / job.epochs
    with torch.no_grad():
        u_val, u_test = (model(data[s][0]).squeeze(1) for s in ("val", "test"))
    record: dict[str, Any] = {"job": asdict(job), "seconds_per_epoch": seconds}
    record["machine"] = machine_line()
    targets = TARGETS if job.target is None else (job.target,)
    record["at_zero"] = {t: decision(t, data["test"], u_test, 0.0) for t in targets}
    record["at_val"] = {t: at_target(t, data["val"], data["test"], u_val, u_test) for t in targets}
    if reg is not None:
        s = reg.stats()
        own = float(reg.decision_threshold[0])
        record["at_own"] = {job.target: decision(job.target, data["test"], u_test, own)}
        record["stats"] = {
            k: s[k]
            for k in (
                "certified_recall",
                "certified_precision",
                "train_recall",
                "train_precision",
                "train_recall_at_threshold",
                "train_precision_at_threshold",
                "nu",
            )
        }
    return record


# --- the sweep and its table ----------------------------------------------------------------------


def jobs(args: argparse.Namespace) -> list[Job]:
    out = []
    for dataset in args.data:
        for model in args.models:
            for seed in args.seeds:
                for arm in args.arms:
                    for target in [None] if arm == "ce" else args.targets:
                        slug = arm.replace(", ", "-").replace(" ", "-")
                        name = f"{dataset}-{model}-{slug}-{target or 'all'}-seed{seed}.json"
                        path = str(Path(args.runs) / name)
                        out.append(
                            Job(
                                dataset, model, arm, target, seed, args.epochs, args.mnist_dir, path
                            )
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
    print(f"done {Path(job.path).name}: {record['seconds_per_epoch']:.2f} s/epoch", flush=True)


def table(records: list[dict]) -> str:
    """Per data set and model: each arm's test precision (P@R) or recall (R@P) at the val
    threshold, mean ± sd over seeds, with how many seeds met the target on test; the rate
    objective also at its own training threshold."""
    by: dict[tuple, list[dict]] = {}
    for rec in records:
        j = rec["job"]
        for point in ("at_val", "at_own", "at_zero"):
            for target, d in rec.get(point, {}).items():
                by.setdefault((j["dataset"], j["model"], j["arm"], point, target), []).append(
                    d | {"sec": rec["seconds_per_epoch"]}
                )
    lines = ["# Rate targets against cross-entropy + a val threshold", ""]
    lines.append(
        "Test precision (P@R) or recall (R@P), mean ± sd over seeds, [seeds that met the "
        "target on test / seeds]; `val`: the threshold chosen on the val split, `own`: the "
        "objective's training `decision_threshold`, `0`: `u > 0`."
    )
    for dataset in (*DATASETS, "digits"):
        for model in MODELS:
            rows = []
            for arm in (*ARMS, *SCHEDULES):
                for point in SHOWN[arm]:
                    cells, secs = [], []
                    for target in TARGETS:
                        ds = by.get((dataset, model, arm, point, target), [])
                        key = "precision" if target.startswith("par") else "recall"
                        if not ds:
                            cells.append("")
                            continue
                        held = sum(d["held"] for d in ds)
                        cells.append(f"{mean_sd([d[key] for d in ds])} [{held}/{len(ds)}]")
                        secs += [d["sec"] for d in ds]
                    if any(cells):
                        name = (
                            f"{arm} ({ {'at_zero': '0', 'at_val': 'val', 'at_own': 'own'}[point] })"
                        )
                        ms = mean_and_sd(secs)
                        rows.append([name, *cells, f"{ms[0]:.2f}" if ms else ""])
            if rows:
                lines += ["", f"## {dataset}, {model}", ""]
                header = [
                    "arm (decision)",
                    *(t.replace("par", "P@R r=").replace("rap", "R@P a=") for t in TARGETS),
                    "s / epoch",
                ]
                lines.append(markdown_table(header, rows))
    return "\n".join(lines) + "\n"


def training_table(records: list[dict]) -> str:
    """The objective's own figures at the end of training, per arm and target (mean ± sd over
    seeds): the training recall and precision of ``u > 0``, the certified recall and ``nu`` (from
    the remembered scores), the recall at its own threshold."""
    by: dict[tuple, list[dict]] = {}
    for rec in records:
        j = rec["job"]
        if "stats" in rec:
            by.setdefault((j["dataset"], j["model"], j["arm"], j["target"]), []).append(
                rec["stats"]
            )
    keys = (
        "train_recall",
        "train_precision",
        "certified_recall",
        "train_recall_at_threshold",
        "nu",
    )
    rows = [
        [f"{d} / {m}", arm, t, *(mean_sd([s[k] for s in stats]) for k in keys)]
        for (d, m, arm, t), stats in sorted(by.items())
    ]
    header = [
        "data / model",
        "arm",
        "target",
        "recall u > 0",
        "precision u > 0",
        "certified recall",
        "recall at own t",
        "nu",
    ]
    return (
        "\n## Training side (remembered scores, last epoch)\n\n"
        + markdown_table(header, rows)
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.compare rates",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--mnist-dir", default=None)
    p.add_argument("--data", nargs="+", default=list(DATASETS), choices=[*DATASETS, "digits"])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=[*ARMS, *SCHEDULES])
    p.add_argument(
        "--study",
        choices=("main", "schedule"),
        default="main",
        help="schedule: the dual schedules and nu step sizes (mnist9, P@R 0.95 / 0.99), "
        f"written to {SCHEDULE_TABLE}",
    )
    p.add_argument("--targets", nargs="+", default=list(TARGETS), choices=TARGETS)
    p.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    p.add_argument("--epochs", type=int, default=EPOCHS)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--runs", default=str(RUNS))
    p.add_argument("--out", default=str(TABLE))
    p.add_argument("--table-only", action="store_true")
    args = p.parse_args(argv)
    if args.study == "schedule":
        for key, value in SCHEDULE_STUDY.items():  # unless given on the command line
            if getattr(args, key) == p.get_default(key):
                setattr(args, key, value)
        if args.out == str(TABLE):
            args.out = str(SCHEDULE_TABLE)
    todo = jobs(args)
    if not args.table_only:
        pending = [j for j in todo if load_record(j) is None]
        print(f"{len(todo) - len(pending)} of {len(todo)} runs finished; {len(pending)} to run")
        run_pool(run, pending, args.jobs, _save)
    records = [r for j in todo if (r := load_record(j)) is not None]
    text = table(records) + (training_table(records) if args.study == "schedule" else "")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(text, Path(args.out))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
