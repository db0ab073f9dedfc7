"""The first command's comparison (``python -m train.demo``) for every digit and two targets.

    python -m benchmarks.demo_digits --out docs/figures      # ~5 min on 2 cores

Each digit of scikit-learn's 8x8 digits against the rest, recall targets 0.95 and 0.99, seeds 0-4:
a linear head trained with cross-entropy and with ``PrecisionAtRecall`` alone, each scored on test
at its val threshold (``train.demo.run_arm``: same split, data order, optimizer and epochs). Writes
``demo_digits.md``: test precision (mean +- sd over the seeds), the difference, in how many seeds
the objective gains, and the lowest test recall either arm reached at its val cut; and
``demo_digits.png``: the difference per digit.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from train.demo import ARMS, Outcome, Settings, load_digits, run_arm

from ._report import markdown_table, mean_sd, save_figure, subplots

TARGETS = (0.95, 0.99)


def measure(digit: int, recall: float, seeds: int, epochs: int) -> dict[str, list[Outcome]]:
    """Both arms of ``train.demo`` on one digit and target, seeds ``0 .. seeds - 1``."""
    s = Settings(digit=digit, recall=recall, seeds=tuple(range(seeds)), epochs=epochs)
    x, labels = load_digits()
    y = (labels == digit).long()
    return {arm: [run_arm(arm, x, y, seed, s) for seed in s.seeds] for arm in ARMS}


def row(digit: int, recall: float, r: dict[str, list[Outcome]]) -> list[str]:
    ce, pr = ([o.precision for o in r[a]] for a in ARMS)
    gains = [b - a for a, b in zip(ce, pr, strict=True)]
    lowest = min(o.recall for a in ARMS for o in r[a])
    return [
        str(digit),
        str(recall),
        mean_sd(ce),
        mean_sd(pr),
        f"{statistics.mean(gains):+.3f}",
        f"{sum(g > 0 for g in gains)}/{len(gains)}",
        f"{lowest:.3f}",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.demo_digits", description=__doc__)
    p.add_argument("--out", default="docs/figures", help="writes demo_digits.md and .png here")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=Settings.epochs)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    rows, gains = [], {t: [] for t in TARGETS}
    for recall in TARGETS:
        for digit in range(10):
            r = measure(digit, recall, a.seeds, a.epochs)
            rows.append(row(digit, recall, r))
            gains[recall].append(float(rows[-1][4]))
            print(" | ".join(rows[-1]), flush=True)
    header = [
        "digit",
        "r",
        "cross-entropy",
        "precision at recall",
        "difference",
        "seeds gaining",
        "lowest test recall",
    ]
    command = "python -m benchmarks.demo_digits --out docs/figures"
    text = (
        f"`{command}` ({a.seeds} seeds, {a.epochs} epochs; test precision at each arm's val "
        "threshold, mean ± sd)\n\n" + markdown_table(header, rows) + "\n"
    )
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo_digits.md").write_text(text)
    fig, ax = subplots(figsize=(6, 3))
    for k, recall in enumerate(TARGETS):
        ax.bar([d + 0.4 * k - 0.2 for d in range(10)], gains[recall], 0.4, label=f"r = {recall}")
    ax.axhline(0, color="black", lw=0.8)
    ax.set(xticks=range(10), xlabel="positive digit", ylabel="test precision gained")
    ax.legend()
    save_figure(fig, out / "demo_digits.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
