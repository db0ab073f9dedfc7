"""The tables and the plot of part 2 of the comparison (mean ± sd over seeds per ratio and
method; seconds per iteration against cross-entropy; AUC and F1 against the ratio)."""

from __future__ import annotations

from pathlib import Path

from benchmarks._report import markdown_table, mean_and_sd, mean_sd, save_figure, subplots

from .spec import BATCH, LR, METHODS, PAPER_SECONDS, PESG, Records


def _cell(xs: list[float | None], n_seeds: int, scale: float = 100.0, fmt: str = ".2f") -> str:
    """``mean ± sd`` of the finite values (``n/a`` without any); ``(k/n)`` when seeds are missing."""
    n = sum(x is not None for x in xs)
    return mean_sd(xs, fmt, scale) + (f" ({n}/{n_seeds})" if 0 < n < n_seeds else "")


def metric_rows(
    records: Records, ratios: list[float], n_seeds: int, metrics: list[str]
) -> list[list[str]]:
    """One row per method (for the threshold-dependent metrics two for the F-beta regularizer:
    ``u > 0`` and its learned threshold), per ratio one cell per metric of ``metrics`` (keys of a
    record's ``test``)."""
    rows = []
    for key, (label, target) in METHODS.items():
        variants = [("test", label)]
        if key == "reparam_fbeta" and metrics != ["auc"]:  # AUC does not depend on a threshold
            variants = [("test", f"{label}, u > 0"), ("test_at_threshold", f"{label}, u > t")]
        for field, name in variants:
            row = [name, target]
            for ratio in ratios:
                recs = records.get((ratio, key), [])
                row += [_cell([r.get(field, {}).get(m) for r in recs], n_seeds) for m in metrics]
            rows.append(row)
    return rows


def timing_rows(records: Records, ratios: list[float], n_seeds: int) -> list[list[str]]:
    """Per method and ratio: median ms per iteration (mean ± sd over seeds) and the ratio to
    cross-entropy's of the same seed."""
    rows = []
    for key, (label, _) in METHODS.items():
        row = [label]
        for ratio in ratios:
            ce = {
                r["settings"]["seed"]: r["seconds_per_iteration"]
                for r in records.get((ratio, "ce"), [])
            }
            recs = records.get((ratio, key), [])
            rel = [
                r["seconds_per_iteration"] / ce[r["settings"]["seed"]]
                for r in recs
                if r["settings"]["seed"] in ce
            ]
            row.append(_cell([r["seconds_per_iteration"] for r in recs], n_seeds, 1e3, ".3g"))
            row.append(_cell(rel, n_seeds, 1.0, ".2f"))
        rows.append(row)
    return rows


def _sizes(records: Records, ratios: list[float]) -> str:
    """Per ratio the sizes of the splits and the number of full epochs (of its first record)."""
    sizes = []
    for r in ratios:
        rec = next((rs[0] for (rr, _), rs in records.items() if rr == r and rs), None)
        if rec is not None:
            sizes.append(
                f"{r:.0%}: {rec['n_train']} train ({rec['n_train_pos']} pos), "
                f"{rec['n_test']} test ({rec['n_test_pos']} pos), "
                f"{rec['epochs_completed']} full epochs"
            )
    return "; ".join(sizes) or "n/a"


def _tables(records: Records, ratios: list[float], n: int) -> dict[str, str]:
    """The AUC, F1 / accuracy, share predicted positive and timing tables."""
    pct = [f"{r:.0%}" for r in ratios]
    return {
        "auc": markdown_table(
            ["method", "trained for", *pct], metric_rows(records, ratios, n, ["auc"])
        ),
        "f1": markdown_table(
            ["method", "trained for", *[f"{p} {m}" for p in pct for m in ("F1", "acc")]],
            metric_rows(records, ratios, n, ["f1", "accuracy"]),
        ),
        "share": markdown_table(
            ["method", "trained for", *pct], metric_rows(records, ratios, n, ["predicted_positive"])
        ),
        "timing": markdown_table(
            ["method", *[f"{p} {m}" for p in pct for m in ("ms / iter", "x CE")]],
            timing_rows(records, ratios, n),
        ),
    }


def _protocol(
    records: Records, ratios: list[float], seeds: list[int], official: bool, first: dict | None
) -> list[str]:
    """The report's paragraphs on the data and on the training."""
    return [
        f"Digits 0-4 positive, 5-9 negative; samples dropped (a fixed permutation) so that positives "
        f"/ all is the column's ratio, in the training and the test split alike: ROC-AUC is "
        f"prior-free, F1 and accuracy are not, so they are measured at the training prior. "
        f"{'Official MNIST files (md5 checked).' if official else 'NOT the official MNIST files.'} "
        f"Sizes: {_sizes(records, ratios)}.",
        "",
        f"Every method alone trains an MLP 784-256-1 (its score `u`): Adam lr {LR:g}, batch {BATCH}, "
        f"{first['settings']['iterations'] if first else 'n/a'} iterations, seeds "
        f"{', '.join(map(str, seeds))} (initialization and batch order); mean ± sd over seeds. "
        f"Exception: LibAUC's AUC-margin loss with its own optimizer PESG (lr {PESG['lr']}, "
        f"epoch_decay {PESG['epoch_decay']:g}, weight_decay {PESG['weight_decay']:g}, "
        f"`update_regularizer(decay_factor=10)` at the first epoch ends past 50 % and 75 % of the "
        f"run, as LibAUC's examples do at epochs 50 and 75 of 100; its loss sees `sigmoid(u)`). "
        f"The per-sample multipliers of the reparameterized objectives take one dual step per "
        f"epoch (`end_epoch_()`), so the number of full epochs matters.",
    ]


def report(
    records: Records, ratios: list[float], seeds: list[int], command: str, official: bool
) -> str:
    """The markdown of ``compare_mnist.md``."""
    tables = _tables(records, ratios, len(seeds))
    first = next((rs[0] for rs in records.values() if rs), None)
    paper = ", ".join(
        f"{k} {v} s ({v / PAPER_SECONDS['CE']:.1f}x)" for k, v in PAPER_SECONDS.items()
    )
    diverged = sorted(
        {
            f"{METHODS[k][0]} at {r:.0%}"
            for (r, k), rs in records.items()
            for x in rs
            if x["diverged"]
        }
    )
    return "\n".join(
        [
            f"<!-- {command} -->",
            "# Imbalanced binary MNIST (Meng et al., NeurIPS 2021, Table 1 protocol)",
            "",
            *_protocol(records, ratios, seeds, official, first),
            "",
            "## Test ROC-AUC (%) of `u`",
            "",
            tables["auc"],
            "",
            "## Test F1 (%) and accuracy (%) of `u > 0`",
            "",
            "`u > t`: the F-beta regularizer's learned F1-optimal threshold `reg.decision_threshold`.",
            "",
            tables["f1"],
            "",
            "## Share of the test set predicted positive (%); the true share is the column's ratio",
            "",
            tables["share"],
            "",
            "## Seconds per iteration",
            "",
            "Median over each run of forward + loss + backward + step (+ `after_step_()`), one thread "
            "per run, two runs at a time (`--jobs 2`); `x CE`: per seed, relative to cross-entropy's "
            f"run in the same sweep. Meng et al. (GPU): {paper}. "
            f"Machine: {first['machine'] if first else 'n/a'}.",
            "",
            tables["timing"],
            "",
            f"Diverged (non-finite loss): {', '.join(diverged) if diverged else 'none'}.",
            "",
        ]
    )


def plot(records: Records, ratios: list[float], path: Path) -> None:
    """Test AUC and F1 (mean ± sd over seeds) against the positive ratio, one line per method."""
    fig, axes = subplots(1, 2, figsize=(13, 5.8))
    xs = sorted(ratios)
    for ax, metric, title in ((axes[0], "auc", "test ROC-AUC (%)"), (axes[1], "f1", "test F1 (%)")):
        for i, (key, (label, _)) in enumerate(METHODS.items()):
            fields = [("test", label)]
            if key == "reparam_fbeta" and metric == "f1":
                fields.append(("test_at_threshold", f"{label}, u > t"))
            for field, name in fields:
                pts = []
                for r in xs:
                    stats = mean_and_sd(
                        (rec.get(field, {}).get(metric) for rec in records.get((r, key), [])), 100
                    )
                    if stats is not None:
                        pts.append((r * 100, *stats))
                if pts:
                    px, py, pe = zip(*pts, strict=True)
                    ax.errorbar(
                        px,
                        py,
                        yerr=pe,
                        marker="o",
                        capsize=3,
                        label=name,
                        color=f"C{i}",
                        linestyle="--" if field == "test_at_threshold" else "-",
                    )
        ax.set(title=title, xlabel="positive ratio (%)", ylabel="%")
        ax.grid(alpha=0.3)
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8)
    save_figure(fig, path, rect=(0, 0.16, 1, 1))
