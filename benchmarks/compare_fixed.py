"""Every F-beta and AUC method of the project on fixed features, against exact references
(docs/comparison.md, part 1).

    python -m benchmarks.compare fixed --jobs 2          # resumable (= python -m benchmarks.compare_fixed)
    python -m benchmarks.compare fixed --table-only      # the tables from finished runs

A linear head ``u = w.x + b`` on fixed Gaussian features is trained by each method alone (Adam lr
1e-2 on the head and the method's own parameters, batch 20, 200 epochs; 3 seeds = initialization
and batch order; the data of each problem are fixed). Every method gets the same tuning effort:
its main knob on a grid of three values (the dual step sizes, the temperature, the margin, the
infeasibility cost), and the tables show its default and its best grid value per problem (chosen on
the training metric, which is what is compared). References: the LP (3') optimum by HiGHS and its
head; the best linear head found (the best training F1 of any run's direction at its own
F1-optimal threshold, logistic regression's included). Measured per run: the training F1 of
``u > 0`` (and at the run's own F1-optimal threshold), the LP gap (the (3') objective at the best
feasible ``eps`` for the final scores, relative to the optimum), time per epoch, and the stability
over the last 20 epochs (sd of the training F1); for the AUC methods the exact training AUC.
Runs are JSON files under ``--runs`` (written atomically; finished ones are skipped).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ._timing import machine_line

EPOCHS, BATCH, LR, SEEDS = 200, 20, 1e-2, (0, 1, 2)

# name -> (positives, negatives, dimension, class mean, label noise)
PROBLEMS: dict[str, tuple[int, int, int, float, float]] = {
    "2-D, 40/60": (40, 60, 2, 1.0, 0.0),
    "20-D, 200/300": (200, 300, 20, 0.3, 0.0),
    "10-D, 50/950": (50, 950, 10, 0.5, 0.0),
    "50-D, 200/300": (200, 300, 50, 0.15, 0.0),
    "10-D, 20/980": (20, 980, 10, 0.5, 0.0),
    "20-D, 200/300, 10 % noise": (200, 300, 20, 0.3, 0.1),
}


def problem_data(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Positives ~ N(+mean, I), negatives ~ N(-mean, I) (data seed 0); with label noise, that
    fraction of the labels is flipped (the features stay): the training labels are the noisy ones."""
    from .fbeta_lp import gaussian_toy

    n_pos, n_neg, dim, mean, noise = PROBLEMS[name]
    a, s = gaussian_toy(n_pos, n_neg, dim, seed=0, mean=mean)
    if noise:
        rng = np.random.default_rng(1)
        flip = rng.random(len(s)) < noise
        s = np.where(flip, 1 - s, s)
    return a, s


# --- the methods ------------------------------------------------------------------------------------

GRIDS: dict[str, tuple[str, tuple[Any, ...], Any]] = {  # family -> (knob, grid, default)
    "reparam F-beta, inline": ("dual step", (0.01, 0.1, 1.0), 0.1),
    "reparam F-beta, inline, capped": ("dual step", (0.01, 0.1, 1.0), 0.1),
    "reparam F-beta, epoch": ("dual step", (0.01, 0.1, 1.0), 0.1),
    "reparam F-beta, paper preset": ("-", (None,), None),
    "LP layer (F-score LP, elastic)": ("M", (10.0, 100.0, 1000.0), 100.0),
    "soft-F1": ("T", (0.1, 0.3, 1.0), 1.0),
    "soft-F1 + Newton (Hessian)": ("T", (0.1, 0.3, 1.0), 1.0),
    "soft-F1 + Newton (Fisher)": ("T", (0.1, 0.3, 1.0), 1.0),
    "Cooper, same LP (3')": ("dual lr", (0.01, 0.1, 1.0), 0.1),
    "weighted logistic regression": ("-", (None,), None),
    # AUC methods
    "reparam ROC-AUC, inline": ("nu step", (0.1, 1.0, 10.0), 1.0),
    "LP layer (AUC LP)": ("margin", (0.01, 0.1, 1.0), 0.01),
    "pairwise squared hinge": ("margin", (0.1, 0.5, 1.0), 1.0),
    "LibAUC AUC-margin": ("alpha lr", (0.01, 0.1, 1.0), 0.1),
    "logistic regression": ("-", (None,), None),
}
AUC_FAMILIES = (
    "reparam ROC-AUC, inline",
    "LP layer (AUC LP)",
    "pairwise squared hinge",
    "LibAUC AUC-margin",
    "logistic regression",
)


def make_objective(family: str, value: Any, labels) -> Callable | Any:
    """The objective module of ``family`` at knob ``value`` (``None``: the family's only setting);
    the two logistic regressions are returned as a loss ``(u, idx) -> tensor``."""
    import torch

    from reparam import ROCAUC, FBetaRegularizer
    from reparam.baselines import LPAUC, CooperFBeta, LibAUCMargin, LPFBeta, PairwiseAUC, SoftFBeta

    if family.startswith("reparam F-beta"):
        if "paper" in family:
            return FBetaRegularizer(labels, preset="paper")
        mode = "epoch" if family.endswith("epoch") else "inline"
        return FBetaRegularizer(
            labels,
            projection=mode,
            dual_lr_lambda=value,
            dual_lr_mu=value,
            cap_scores=family.endswith("capped"),
        )
    if family.startswith("LP layer (F"):
        return LPFBeta(labels, infeasibility_cost=value)
    if family.startswith("soft-F1"):
        newton = "hessian" if "Hessian" in family else "fisher" if "Fisher" in family else "none"
        return SoftFBeta(labels, temperature=value, newton=newton, newton_tikhonov=1.0)
    if family.startswith("Cooper"):
        return CooperFBeta(labels, dual_lr=value)
    if family == "reparam ROC-AUC, inline":
        return ROCAUC(labels, grid=10, projection="inline", dual_lr_nu=value)
    if family == "LP layer (AUC LP)":
        return LPAUC(labels, margin=value)
    if family == "pairwise squared hinge":
        return PairwiseAUC(labels, margin=value)
    if family == "LibAUC AUC-margin":
        return LibAUCMargin(labels, alpha_lr=value)
    y = labels.float()
    weight = (1 - y).sum() / y.sum() if family.startswith("weighted") else torch.tensor(1.0)

    def logistic(u, idx):
        return torch.nn.functional.binary_cross_entropy_with_logits(u, y[idx], pos_weight=weight)

    return logistic


def run_one(args: tuple[str, str, Any, int, int]) -> dict[str, Any]:
    """Train one head; returns the record saved as JSON."""
    import torch

    from reparam import functional as Fn
    from reparam import rate_functional as R

    problem, family, value, seed, batch, epochs = args
    torch.set_num_threads(1)
    a, s = problem_data(problem)
    x, labels = torch.tensor(a, dtype=torch.float32), torch.as_tensor(s, dtype=torch.int64)
    torch.manual_seed(seed)
    head = torch.nn.Linear(x.shape[1], 1)
    objective = make_objective(family, value, labels)
    params = [*head.parameters(), *getattr(objective, "parameters", lambda: [])()]
    opt = torch.optim.Adam(params, lr=LR)
    gen = torch.Generator().manual_seed(seed)
    protocol = hasattr(objective, "end_epoch_")
    pos = labels == 1
    f1s, aucs, seconds, mus = [], [], [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # infeasibility notes etc.: in the record
        for _epoch in range(epochs):
            start = time.perf_counter()
            for idx in torch.randperm(len(x), generator=gen).split(batch):
                loss = objective(head(x[idx])[:, 0], idx)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if protocol:
                    objective.after_step_()
            if protocol:
                objective.end_epoch_()
            seconds.append(time.perf_counter() - start)
            with torch.no_grad():
                u = head(x)[:, 0].double()
            f1s.append(Fn.fbeta_of_decisions(u[pos], u[~pos], 1.0))
            aucs.append(R.roc_auc(u[pos], u[~pos]))
            if protocol and "mu" in (st := objective.stats()):
                mus.append(st["mu"])
    threshold, f1_tuned = Fn.best_fbeta_threshold(u[pos], u[~pos], 1.0)
    eps = Fn.best_feasible_eps(u[pos])
    lp_value = None if eps is None else float(Fn.lp_objective(eps, u[~pos], int(pos.sum()), 1.0))
    record = {
        "problem": problem,
        "family": family,
        "value": value,
        "seed": seed,
        "batch": batch,
        "f1": f1s[-1],
        "f1_tuned_threshold": f1_tuned,
        "threshold": threshold,
        "auc": aucs[-1],
        "f1_last20_sd": statistics.pstdev(f1s[-20:]),
        "auc_last20_sd": statistics.pstdev(aucs[-20:]),
        "lp_objective": lp_value,
        "seconds_per_epoch": statistics.median(seconds),
        "mu_range": [min(mus), max(mus)] if mus else None,
        "f1_curve": f1s[:: max(1, epochs // 50)],
        "epochs": epochs,
        "head": [*head.weight.detach()[0].tolist(), float(head.bias.detach())],
    }
    if hasattr(objective, "decision_threshold"):
        t = float(objective.decision_threshold[0])
        record["f1_learned_threshold"] = Fn.fbeta_of_decisions(u[pos] - t, u[~pos] - t, 1.0)
    return record


# --- references -------------------------------------------------------------------------------------


def references(problem: str) -> dict[str, float]:
    """The (3') optimum and its head's F1 (at 0 and at its F1-optimal threshold), and logistic
    regression's F1 at its F1-optimal threshold and AUC (scikit-learn, nearly unregularized)."""
    import torch
    from sklearn.linear_model import LogisticRegression

    from reparam import functional as Fn
    from reparam import rate_functional as R

    from .fbeta_lp import solve_fbeta_lp

    a, s = problem_data(problem)
    opt, w, b = solve_fbeta_lp(a, s)
    pos = torch.as_tensor(s) == 1
    u = torch.tensor(a @ w + b)
    lr = LogisticRegression(C=1e4, max_iter=10000).fit(a, s)
    v = torch.tensor(lr.decision_function(a))
    return {
        "lp_optimum": opt,
        "lp_head_f1": Fn.fbeta_of_decisions(u[pos], u[~pos], 1.0),
        "lp_head_f1_tuned": Fn.best_fbeta_threshold(u[pos], u[~pos], 1.0)[1],
        "lp_head_auc": R.roc_auc(u[pos], u[~pos]),
        "logistic_f1_tuned": Fn.best_fbeta_threshold(v[pos], v[~pos], 1.0)[1],
        "logistic_auc": R.roc_auc(v[pos], v[~pos]),
    }


# --- sweep and tables -------------------------------------------------------------------------------


def _key(problem: str, family: str, value: Any, seed: int, batch: int, epochs: int) -> str:
    safe = "".join(
        c if c.isalnum() else "_" for c in f"{problem}-{family}-{value}-b{batch}-e{epochs}"
    )
    return f"{safe}-s{seed}.json"


def jobs(
    problems: list[str], seeds: tuple[int, ...], batch_study: bool, epochs: int
) -> list[tuple]:
    out = [
        (p, f, v, seed, BATCH, epochs)
        for p in problems
        for f, (_, grid, _) in GRIDS.items()
        for v in grid
        for seed in seeds
    ]
    if batch_study and "10-D, 50/950" in problems:  # the "batch ~20 % of the data" advice
        for batch in (100, 200):
            out += [
                ("10-D, 50/950", f, GRIDS[f][2], seed, batch, epochs)
                for seed in seeds
                for f in ("reparam F-beta, inline", "reparam F-beta, inline, capped", "soft-F1")
            ]
    return out


def _ms(xs: list[float], fmt: str = ".3f") -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "n/a"
    return f"{statistics.mean(xs):{fmt}} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:{fmt}}"


def tables(records: list[dict], refs: dict[str, dict], problems: list[str]) -> str:
    """The markdown of docs/figures/compare_fixed.md."""
    by: dict[tuple, list[dict]] = {}
    for r in records:
        by.setdefault((r["problem"], r["family"], r["value"], r["batch"]), []).append(r)
    best_linear = {
        p: max(
            [r["f1_tuned_threshold"] for r in records if r["problem"] == p]
            + [refs[p]["logistic_f1_tuned"], refs[p]["lp_head_f1_tuned"]]
        )
        for p in problems
    }
    best_auc = {
        p: max(
            [r["auc"] for r in records if r["problem"] == p]
            + [refs[p]["logistic_auc"], refs[p]["lp_head_auc"]]
        )
        for p in problems
    }

    def pick(problem: str, family: str, metric: str, batch: int = BATCH) -> tuple[Any, list[dict]]:
        """(default value, its runs), (best grid value, its runs) on the mean of ``metric``."""
        _, grid, default = GRIDS[family]
        runs = {v: by.get((problem, family, v, batch), []) for v in grid}
        runs = {v: rs for v, rs in runs.items() if rs}
        best = max(runs, key=lambda v: statistics.mean(r.get(metric, -1.0) for r in runs[v]))
        return (default, runs.get(default, [])), (best, runs[best])

    epochs = records[0]["epochs"] if records else EPOCHS
    seeds = sorted({r["seed"] for r in records})
    lines = [
        f"{machine_line()}; 1 thread per run; {epochs} epochs, batch {BATCH}, Adam lr {LR}, "
        f"seeds {seeds}; mean ± sd (sample) over seeds",
        "",
    ]
    lines += [
        "### Training F1 of u > 0 (default setting / best of the three grid values)",
        "",
        "| method | " + " | ".join(problems) + " |",
        "|---|" + "---|" * len(problems),
    ]
    for family in GRIDS:
        if family in AUC_FAMILIES:
            continue
        cells = []
        for p in problems:
            (dv, dr), (bv, br) = pick(p, family, "f1")
            tuned = f" / {_ms([r['f1'] for r in br])} ({GRIDS[family][0]} {bv})" if bv != dv else ""
            cells.append(_ms([r["f1"] for r in dr]) + tuned)
        lines.append(f"| {family} | " + " | ".join(cells) + " |")
    lines.append(
        "| LP-optimal head (HiGHS) | "
        + " | ".join(f"{refs[p]['lp_head_f1']:.3f}" for p in problems)
        + " |"
    )
    lines.append(
        "| best linear head (any run or logistic regression, own F1-optimal threshold) | "
        + " | ".join(f"{best_linear[p]:.3f}" for p in problems)
        + " |"
    )

    lines += [
        "",
        "### Tightening: training F1 of the reparam F-beta heads at their learned threshold "
        "(`decision_threshold`, the exact F1-optimal cut of the remembered scores at the last epoch "
        "end; default setting / best grid value)",
        "",
        "| method | " + " | ".join(problems) + " |",
        "|---|" + "---|" * len(problems),
    ]
    for family in GRIDS:
        if not family.startswith("reparam F-beta"):
            continue
        cells = []
        for p in problems:
            (dv, dr), (bv, br) = pick(p, family, "f1_learned_threshold")
            tuned = (
                f" / {_ms([r['f1_learned_threshold'] for r in br])} ({GRIDS[family][0]} {bv})"
                if bv != dv
                else ""
            )
            cells.append(_ms([r["f1_learned_threshold"] for r in dr]) + tuned)
        lines.append(f"| {family}, learned threshold | " + " | ".join(cells) + " |")
    lines += [
        "",
        "### The best setting of each method: gap to the best linear head, LP gap, stability, time",
        "",
        "| problem | method (best grid value) | F1 - best linear | F1 at learned threshold - best linear "
        "| F1 at own optimal threshold - best linear "
        "| LP gap (3') | sd of F1, last 20 epochs | s / epoch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in problems:
        for family in GRIDS:
            if family in AUC_FAMILIES:
                continue
            _, (bv, br) = pick(p, family, "f1")
            gaps = [
                (r["lp_objective"] - refs[p]["lp_optimum"]) / refs[p]["lp_optimum"] * 100
                if r["lp_objective"] is not None
                else None
                for r in br
            ]
            lines.append(
                f"| {p} | {family} ({bv}) | {_ms([r['f1'] - best_linear[p] for r in br], '+.3f')} "
                f"| {_ms([r['f1_learned_threshold'] - best_linear[p] for r in br if 'f1_learned_threshold' in r], '+.3f')} "
                f"| {_ms([r['f1_tuned_threshold'] - best_linear[p] for r in br], '+.3f')} "
                f"| {_ms(gaps, '.1f')} % ({sum(g is None for g in gaps)} without feasible eps) "
                f"| {_ms([r['f1_last20_sd'] for r in br])} | {_ms([r['seconds_per_epoch'] for r in br], '.4f')} |"
            )
    lines += [
        "",
        "### Training ROC-AUC (default / best grid value)",
        "",
        "| method | " + " | ".join(problems) + " |",
        "|---|" + "---|" * len(problems),
    ]
    for family in AUC_FAMILIES:
        cells = []
        for p in problems:
            (dv, dr), (bv, br) = pick(p, family, "auc")
            tuned = (
                f" / {_ms([r['auc'] for r in br], '.4f')} ({GRIDS[family][0]} {bv})"
                if bv != dv
                else ""
            )
            cells.append(_ms([r["auc"] for r in dr], ".4f") + tuned)
        lines.append(f"| {family} | " + " | ".join(cells) + " |")
    lines.append(
        "| LP-optimal F-score head | "
        + " | ".join(f"{refs[p]['lp_head_auc']:.4f}" for p in problems)
        + " |"
    )
    lines.append(
        "| best linear AUC found | " + " | ".join(f"{best_auc[p]:.4f}" for p in problems) + " |"
    )
    study = [r for r in records if r["batch"] != BATCH]
    if study:
        lines += [
            "",
            "### Batch size on the imbalanced problem (10-D, 50/950; default settings)",
            "",
            "| method | B = 20 | B = 100 (10 %) | B = 200 (20 %) |",
            "|---|---|---|---|",
        ]
        for family in ("reparam F-beta, inline", "reparam F-beta, inline, capped", "soft-F1"):
            cells = [
                _ms([r["f1"] for r in by.get(("10-D, 50/950", family, GRIDS[family][2], b), [])])
                for b in (20, 100, 200)
            ]
            lines.append(f"| {family} | " + " | ".join(cells) + " |")
    mus = [(r["problem"], r["family"], r["mu_range"]) for r in records if r["mu_range"]]
    if mus:
        lines += [
            "",
            "### Range of the multiplier mu over the run (default settings, seed 0)",
            "",
            "| problem | reparam F-beta, inline | Cooper |",
            "|---|---|---|",
        ]
        for p in problems:
            row = []
            for family in ("reparam F-beta, inline", "Cooper, same LP (3')"):
                r = by.get((p, family, GRIDS[family][2], BATCH), [{}])[0]
                row.append(
                    "n/a"
                    if not r.get("mu_range")
                    else f"{r['mu_range'][0]:.2f} .. {r['mu_range'][1]:.2f}"
                )
            lines.append(f"| {p} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def plot(records: list[dict], refs: dict[str, dict], problems: list[str], path: Path) -> None:
    """Per problem, each F-beta method's training F1 at its best grid value (mean over seeds, of
    ``u > 0`` and, hatched above it, at the learned or own optimal threshold) against the best
    linear head (dashed) and the LP-optimal head (dotted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = [f for f in GRIDS if f not in AUC_FAMILIES]
    fig, axes = plt.subplots(1, len(problems), figsize=(4.2 * len(problems), 4.6), squeeze=False)
    for ax, p in zip(axes[0], problems, strict=True):
        best_linear = max(
            [r["f1_tuned_threshold"] for r in records if r["problem"] == p]
            + [refs[p]["logistic_f1_tuned"], refs[p]["lp_head_f1_tuned"]]
        )
        at_zero, at_threshold = [], []
        for family in families:
            runs = [
                r for r in records if (r["problem"], r["family"], r["batch"]) == (p, family, BATCH)
            ]
            by_value: dict[Any, list[dict]] = {}
            for r in runs:
                by_value.setdefault(r["value"], []).append(r)
            if not by_value:
                at_zero.append(0.0), at_threshold.append(0.0)
                continue
            best = max(by_value.values(), key=lambda rs: statistics.mean(r["f1"] for r in rs))
            at_zero.append(statistics.mean(r["f1"] for r in best))
            key = (
                "f1_learned_threshold"
                if "f1_learned_threshold" in best[0]
                else "f1_tuned_threshold"
            )
            at_threshold.append(statistics.mean(r[key] for r in best))
        y = range(len(families))
        ax.barh(y, at_threshold, color="white", edgecolor="gray", hatch="//", label="at threshold")
        ax.barh(y, at_zero, color="tab:blue", label="u > 0")
        ax.axvline(best_linear, ls="--", color="k", label="best linear head")
        ax.axvline(refs[p]["lp_head_f1"], ls=":", color="tab:red", label="LP-optimal head")
        ax.set_xlim(min([*at_zero, refs[p]["lp_head_f1"]]) - 0.05, best_linear + 0.02)
        ax.set_yticks(list(y), families if ax is axes[0][0] else [""] * len(families), fontsize=7)
        ax.set_title(p, fontsize=9)
        ax.set_xlabel("training F1")
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="lower center", ncol=4, fontsize=7)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from train.files import write_text_atomic

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    a.runs.mkdir(parents=True, exist_ok=True)
    todo = [
        j
        for j in jobs(a.problems, tuple(a.seeds), not a.no_batch_study, a.epochs)
        if not (a.runs / _key(*j)).is_file()
    ]
    print(f"{len(todo)} runs to do", flush=True)
    if todo and not a.table_only:
        with ProcessPoolExecutor(max_workers=a.jobs) as pool:
            for job, record in zip(todo, pool.map(run_one, todo), strict=True):
                write_text_atomic(json.dumps(record) + "\n", a.runs / _key(*job))
                print("done", _key(*job), f"F1 {record['f1']:.3f}", flush=True)
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
