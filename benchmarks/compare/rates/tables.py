"""The tables of part 4 from the run records."""

from __future__ import annotations

from benchmarks._report import markdown_table, mean_and_sd, mean_sd

from .spec import (
    ARMS,
    COOPERS,
    DATASETS,
    MODELS,
    NORMALIZED,
    RARE,
    SCHEDULES,
    SHOWN,
    STEPS,
    TARGETS,
)

NORMALIZED_STEPS = [arm for arm in NORMALIZED if arm != "rate, normalized"]


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
        "Test precision (P@R) or recall (R@P), mean ± sd over seeds, then the constrained rate "
        "reached on test (P@R: recall, R@P: precision; mean over seeds) and [seeds that met the "
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
                        key, kept = (
                            ("precision", "recall")
                            if target.startswith("par")
                            else ("recall", "precision")
                        )
                        if not ds:
                            cells.append("")
                            continue
                        held = sum(d["held"] for d in ds)
                        reached = sum(d[kept] for d in ds) / len(ds)
                        cells.append(
                            f"{mean_sd([d[key] for d in ds])} at {reached:.3f} [{held}/{len(ds)}]"
                        )
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
        [f"{d} / {m}", arm, t, *(mean_sd([s.get(k) for s in stats]) for k in keys)]
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


def step_table(records: list[dict]) -> str:
    """The step study: per data set, the test precision at the val threshold (mean ± sd over
    seeds) and at the matched test recall, for the default ``nu`` step, each point of its grid and
    each point of Cooper's grid; then the default against the best point of each grid."""
    by: dict[tuple, list[dict]] = {}
    for rec in records:
        j = rec["job"]
        by.setdefault((j["dataset"], j["model"], j["arm"]), []).append(rec)
    lines = [
        "# The multiplier's step: the default against a grid, and Cooper's hinge Lagrangian",
        "",
    ]
    lines.append(
        "Test precision at the val threshold of P@R (mean ± sd over seeds), the test recall it "
        "reached (mean) [seeds whose test recall met r there], then the test precision at the "
        "test cut with recall >= r (the matched test recall, a diagnostic); `nu step` is the "
        "library's per-step multiplier step, `dual lr` Cooper's."
    )
    studied = {r["job"]["target"] for r in records}
    targets = [t for t in TARGETS if t.startswith("par") and t in studied]
    for dataset in (*DATASETS, *RARE, "digits"):
        for model in MODELS:
            rows, means = _step_rows(by, dataset, model, targets)
            if not rows:
                continue
            header = ["arm"]
            for t in targets:
                header += [f"r={t[3:]} at val", f"r={t[3:]} at matched test recall"]
            lines += ["", f"## {dataset}, {model}", "", markdown_table(header, rows), ""]
            lines += [_summary(means, t) for t in targets if ("rate", t) in means]
    return "\n".join(lines) + "\n"


def _step_rows(
    by: dict[tuple, list[dict]], dataset: str, model: str, targets: list[str]
) -> tuple[list[list[str]], dict[tuple[str, str], float]]:
    """The step table's rows of one data set and model, and each cell's mean at val."""
    rows, means = [], {}
    for arm in ("rate", *STEPS, *COOPERS):
        recs = by.get((dataset, model, arm), [])
        cells = []
        for t in targets:
            ds = [r for r in recs if r["job"]["target"] == t]
            if not ds:
                cells += ["", ""]
                continue
            val = [r["at_val"][t]["precision"] for r in ds]
            held = sum(r["at_val"][t]["held"] for r in ds)
            reached = sum(r["at_val"][t]["recall"] for r in ds) / len(ds)
            means[arm, t] = sum(val) / len(val)
            test = mean_sd([r["at_test"][t]["precision"] for r in ds])
            cells += [f"{mean_sd(val)} at {reached:.3f} [{held}/{len(ds)}]", test]
        if any(cells):
            name = f"**default** (nu step {recs[0]['nu_step']:.3g})" if arm == "rate" else arm
            rows.append([name, *cells])
    return rows, means


def _summary(means: dict[tuple[str, str], float], t: str) -> str:
    """``- r = ...: default ...; best of grid ...: default -0.003; best of Cooper ...``."""
    parts = [f"default {means['rate', t]:.3f}"]
    for name, group in (("grid", STEPS), ("Cooper", COOPERS)):
        points = [(means[a, t], a) for a in group if (a, t) in means]
        if points:
            v, a = max(points)
            parts.append(f"best of {name} {v:.3f} ({a}): default {means['rate', t] - v:+.3f}")
    return f"- r = {t[3:]}: " + "; ".join(parts)


RULES = {"additive": ("rate", STEPS), "normalized": ("rate, normalized", NORMALIZED_STEPS)}


def rule_table(records: list[dict]) -> str:
    """The rule study: per data set and target, the test precision (P@R) or recall (R@P) at the
    val threshold (mean ± sd over seeds, [seeds that met the target on test]) of BCE, the tuned
    logistic regression, each multiplier rule at its default and at the best point of its grid
    (chosen on these means: an oracle's choice), and Cooper at the best point of its; the
    default's seconds per epoch over BCE's; then each default against the best of its grid and
    against the better of BCE and the logistic model, over the cells."""
    by: dict[tuple, list[dict]] = {}
    for rec in records:
        j = rec["job"]
        targets = rec.get("at_val", {}) if j["arm"] == "ce" else [j["target"]]
        for t in targets:
            by.setdefault((_data_name(j), t, j["arm"]), []).append(rec)
    studied = {(d, t) for d, t, arm in by if arm != "ce"}
    cells = sorted(studied, key=lambda c: (c[0], TARGETS.index(c[1])))
    rows, gaps = [], {name: [] for name in RULES}
    for dataset, t in cells:
        rows.append(_rule_row(by, dataset, t, gaps))
    header = ["data", "target", "BCE", "logistic, tuned"]
    for name in RULES:
        header += [f"{name} default (cost / BCE)", f"{name} best of grid"]
    lines = [
        "# The multiplier's rule: additive and normalized, each against its grid",
        "",
        " ".join(rule_table.__doc__.split("\n\n")[0].split()),
        "",
        markdown_table([*header, "Cooper best of grid"], rows),
        "",
    ]
    for name, gap in gaps.items():
        if gap:
            lines.append(_rule_summary(name, gap))
    return "\n".join(lines) + "\n"


def _rule_row(by: dict[tuple, list[dict]], dataset: str, t: str, gaps: dict) -> list[str]:
    """One cell's row of the rule table; appends each default's gaps to ``gaps``."""
    key = "precision" if t.startswith("par") else "recall"

    def stat(arm: str) -> tuple[float, str, float | None] | None:
        recs = by.get((dataset, t, arm), [])
        if not recs:
            return None
        vals = [r["at_val"][t][key] for r in recs]
        held = sum(r["at_val"][t]["held"] for r in recs)
        secs = [r["seconds_per_epoch"] for r in recs if r["seconds_per_epoch"]]
        failed = sum("diverged" in r for r in recs)
        text = f"{mean_sd(vals)} [{held}/{len(recs)}]" + (f" ({failed} diverged)" if failed else "")
        return sum(vals) / len(vals), text, sum(secs) / len(secs) if secs else None

    def best(grid) -> tuple | None:
        return max(((s[0], arm, s) for arm in grid if (s := stat(arm)) is not None), default=None)

    ce, logistic = stat("ce"), stat("logistic")
    row = [dataset, t.replace("par", "P@R ").replace("rap", "R@P "), _cell(ce), _cell(logistic)]
    baseline = max((x[0] for x in (ce, logistic) if x is not None), default=None)
    for name, (default, grid) in RULES.items():
        d, top = stat(default), best(grid)
        cost = f", {d[2] / ce[2]:.1f}x" if d and ce and d[2] and ce[2] else ""
        row += [_cell(d) + cost, _cell(top and top[2]) + _point(top)]
        if d and top:
            gaps[name].append(
                (d[0] - top[0], None if baseline is None else d[0] - baseline, dataset, t)
            )
    top = best(COOPERS)
    return [*row, _cell(top and top[2]) + _point(top)]


def _data_name(job: dict) -> str:
    """A cell's data: the data set, and its model unless linear."""
    return job["dataset"] + ("" if job["model"] == "linear" else f", {job['model']}")


def _point(top: tuple | None) -> str:
    """`` (its step)`` of a grid's best point."""
    return f" ({top[1].rsplit(' ', 1)[-1]})" if top else ""


def _rule_summary(name: str, gap: list[tuple]) -> str:
    """How a default stands against its grid's best and the better of the two baselines."""
    within = sum(g[0] >= -0.01 for g in gap)
    vs = [g for g in gap if g[1] is not None]
    line = (
        f"- {name} default: within 0.01 of the best of its grid in {within} of {len(gap)} "
        f"cells (worst {min(g[0] for g in gap):+.3f})"
    )
    if vs:
        worst = min(vs, key=lambda g: g[1])
        line += (
            f"; against the better of BCE and the logistic model "
            f"{sum(g[1] for g in vs) / len(vs):+.3f} on average, worst {worst[1]:+.3f} "
            f"({worst[2]}, {worst[3]})"
        )
    return line


def _cell(stat: tuple | None) -> str:
    return "" if stat is None else stat[1]
