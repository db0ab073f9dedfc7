"""The tables of part 4 from the run records."""

from __future__ import annotations

from benchmarks._report import markdown_table, mean_and_sd, mean_sd

from .spec import ARMS, DATASETS, MODELS, SCHEDULES, SHOWN, TARGETS


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
