"""The references, the tables and the plot of part 1 of the comparison (``compare_fixed.md``: per
method its default setting and its best grid value, mean ± sd over seeds)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import torch

from benchmarks._report import markdown_table, mean_sd, save_figure, subplots
from benchmarks._timing import machine_line
from benchmarks.fbeta_lp import solve_fbeta_lp
from reparam import functional as Fn
from reparam import rate_functional as R

from .spec import (
    AUC_FAMILIES,
    BATCH,
    BATCH_STUDY,
    BATCH_STUDY_PROBLEM,
    EPOCHS,
    FAMILIES,
    FBETA_FAMILIES,
    LEARNED_THRESHOLD,
    LR,
    MU_FAMILIES,
    problem_data,
)

Runs = dict[tuple[str, str, Any, int], list[dict]]  # (problem, family, value, batch) -> records
BEST_SETTING = [
    "problem",
    "method (best grid value)",
    "F1 - best linear",
    "F1 at learned threshold - best linear",
    "F1 at own optimal threshold - best linear",
    "LP gap (3')",
    "sd of F1, last 20 epochs",
    "s / epoch",
]


def references(problem: str) -> dict[str, float]:
    """The (3') optimum and its head's F1 (at 0 and at its F1-optimal threshold), and logistic
    regression's F1 at its F1-optimal threshold and AUC (scikit-learn, nearly unregularized)."""
    from sklearn.linear_model import LogisticRegression

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


def _best(records: list[dict], refs: dict[str, float], problem: str, metric: str) -> float:
    """The best ``metric`` (``f1_tuned_threshold`` or ``auc``) of any linear head on ``problem``:
    every run's, logistic regression's and the LP-optimal head's."""
    ref = {"f1_tuned_threshold": "f1_tuned", "auc": "auc"}[metric]
    return max(
        [r[metric] for r in records if r["problem"] == problem]
        + [refs[f"logistic_{ref}"], refs[f"lp_head_{ref}"]]
    )


def _pick(
    by: Runs, problem: str, family: str, metric: str, batch: int = BATCH
) -> tuple[tuple[Any, list[dict]], tuple[Any, list[dict]]]:
    """(default value, its runs), (best grid value, its runs) on the mean of ``metric``."""
    runs = {v: by.get((problem, family, v, batch), []) for v in FAMILIES[family].grid}
    runs = {v: rs for v, rs in runs.items() if rs}
    best = max(runs, key=lambda v: statistics.mean(r.get(metric, -1.0) for r in runs[v]))
    default = FAMILIES[family].default
    return (default, runs.get(default, [])), (best, runs[best])


def _cell(by: Runs, problem: str, family: str, metric: str, fmt: str = ".3f") -> str:
    """``metric`` at the default setting, and ``/ at the best grid value (knob value)`` if that
    is another one."""
    (dv, dr), (bv, br) = _pick(by, problem, family, metric)
    cell = mean_sd([r[metric] for r in dr], fmt)
    if bv != dv:
        cell += f" / {mean_sd([r[metric] for r in br], fmt)} ({FAMILIES[family].knob} {bv})"
    return cell


def _best_setting_rows(by: Runs, refs: dict, best_linear: dict, problems: list[str]) -> list:
    """Per problem and F-beta method at its best grid value: the gaps to the best linear head,
    the LP gap, the stability and the time per epoch."""
    rows = []
    for p in problems:
        for family in FBETA_FAMILIES:
            _, (bv, br) = _pick(by, p, family, "f1")
            opt = refs[p]["lp_optimum"]
            gaps = [
                None if r["lp_objective"] is None else (r["lp_objective"] - opt) / opt * 100
                for r in br
            ]
            learned = [r for r in br if "f1_learned_threshold" in r]
            rows.append(
                [
                    p,
                    f"{family} ({bv})",
                    mean_sd([r["f1"] - best_linear[p] for r in br], "+.3f"),
                    mean_sd([r["f1_learned_threshold"] - best_linear[p] for r in learned], "+.3f"),
                    mean_sd([r["f1_tuned_threshold"] - best_linear[p] for r in br], "+.3f"),
                    f"{mean_sd(gaps, '.1f')} % ({sum(g is None for g in gaps)} without feasible eps)",
                    mean_sd([r["f1_last20_sd"] for r in br]),
                    mean_sd([r["seconds_per_epoch"] for r in br], ".4f"),
                ]
            )
    return rows


def _grid_tables(
    by: Runs, refs: dict[str, dict], problems: list[str], best: dict[str, dict[str, float]]
) -> dict[str, str]:
    """Every method at its default setting and its best grid value, with the references: the F1
    of ``u > 0``, the F1 at the learned threshold, the ROC-AUC (title -> table)."""

    def rows(families: tuple[str, ...], metric: str, fmt: str = ".3f", suffix: str = "") -> list:
        return [[f + suffix, *(_cell(by, p, f, metric, fmt) for p in problems)] for f in families]

    def reference(label: str, values: dict[str, float], fmt: str = ".3f") -> list[str]:
        return [label, *(f"{values[p]:{fmt}}" for p in problems)]

    lp_head = {k: {p: refs[p][k] for p in problems} for k in ("lp_head_f1", "lp_head_auc")}
    f1_refs = [
        reference("LP-optimal head (HiGHS)", lp_head["lp_head_f1"]),
        reference(
            "best linear head (any run or logistic regression, own F1-optimal threshold)",
            best["f1_tuned_threshold"],
        ),
    ]
    auc_refs = [
        reference("LP-optimal F-score head", lp_head["lp_head_auc"], ".4f"),
        reference("best linear AUC found", best["auc"], ".4f"),
    ]
    f1 = [*rows(FBETA_FAMILIES, "f1"), *f1_refs]
    learned = rows(LEARNED_THRESHOLD, "f1_learned_threshold", suffix=", learned threshold")
    auc = [*rows(AUC_FAMILIES, "auc", ".4f"), *auc_refs]
    head = ["method", *problems]
    return {
        "Training F1 of u > 0 (default setting / best of the three grid values)": (
            markdown_table(head, f1)
        ),
        "Tightening: training F1 of the reparam F-beta heads at their learned threshold "
        "(`decision_threshold`, the exact F1-optimal cut of the remembered scores at the last epoch "
        "end; default setting / best grid value)": markdown_table(head, learned),
        "The best setting of each method: gap to the best linear head, LP gap, stability, time": (
            markdown_table(
                BEST_SETTING, _best_setting_rows(by, refs, best["f1_tuned_threshold"], problems)
            )
        ),
        "Training ROC-AUC (default / best grid value)": markdown_table(head, auc),
    }


def _study_tables(by: Runs, records: list[dict], problems: list[str]) -> dict[str, str]:
    """The batch-size study and the range of ``mu``, where the records have them."""
    out = {}
    if any(r["batch"] != BATCH for r in records):
        rows = [
            [
                f,
                *(
                    mean_sd(r["f1"] for r in _defaults(by, BATCH_STUDY_PROBLEM, f, b))
                    for b in (20, 100, 200)
                ),
            ]
            for f in BATCH_STUDY
        ]
        out["Batch size on the imbalanced problem (10-D, 50/950; default settings)"] = (
            markdown_table(["method", "B = 20", "B = 100 (10 %)", "B = 200 (20 %)"], rows)
        )
    if any(r["mu_range"] for r in records):
        rows = [[p, *(_mu_range(by, p, f) for f in MU_FAMILIES)] for p in problems]
        out["Range of the multiplier mu over the run (default settings, seed 0)"] = markdown_table(
            ["problem", "reparam F-beta, inline", "Cooper"], rows
        )
    return out


def _defaults(by: Runs, problem: str, family: str, batch: int = BATCH) -> list[dict]:
    """The runs of ``family``'s default setting."""
    return by.get((problem, family, FAMILIES[family].default, batch), [])


def _mu_range(by: Runs, problem: str, family: str) -> str:
    mu = (_defaults(by, problem, family) or [{}])[0].get("mu_range")
    return "n/a" if not mu else f"{mu[0]:.2f} .. {mu[1]:.2f}"


def tables(records: list[dict], refs: dict[str, dict], problems: list[str]) -> str:
    """The markdown of docs/figures/compare_fixed.md."""
    by: Runs = {}
    for r in records:
        by.setdefault((r["problem"], r["family"], r["value"], r["batch"]), []).append(r)
    best = {
        metric: {p: _best(records, refs[p], p, metric) for p in problems}
        for metric in ("f1_tuned_threshold", "auc")
    }
    sections = _grid_tables(by, refs, problems, best) | _study_tables(by, records, problems)
    epochs = records[0]["epochs"] if records else EPOCHS
    seeds = sorted({r["seed"] for r in records})
    text = (
        f"{machine_line()}; 1 thread per run; {epochs} epochs, batch {BATCH}, Adam lr {LR}, "
        f"seeds {seeds}; mean ± sd (sample) over seeds"
    )
    return text + "".join(f"\n\n### {t}\n\n{table}" for t, table in sections.items()) + "\n"


def plot(records: list[dict], refs: dict[str, dict], problems: list[str], path: Path) -> None:
    """Per problem, each F-beta method's training F1 at its best grid value (mean over seeds, of
    ``u > 0`` and, hatched above it, at the learned or own optimal threshold) against the best
    linear head (dashed) and the LP-optimal head (dotted)."""
    families = FBETA_FAMILIES
    fig, axes = subplots(1, len(problems), figsize=(4.2 * len(problems), 4.6), squeeze=False)
    for ax, p in zip(axes[0], problems, strict=True):
        best_linear = _best(records, refs[p], p, "f1_tuned_threshold")
        at_zero, at_threshold = [], []
        for family in families:
            by_value: dict[Any, list[dict]] = {}
            for r in records:
                if (r["problem"], r["family"], r["batch"]) == (p, family, BATCH):
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
    save_figure(fig, path, rect=(0, 0.06, 1, 1))
