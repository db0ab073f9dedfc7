"""The first command's comparison (``python -m train.demo``) for every digit and two targets.

    python -m benchmarks.demo_digits --out docs/figures      # ~70 s, one thread

Each digit of scikit-learn's 8x8 digits against the rest, recall targets 0.95 and 0.99, seeds 0-4:
a linear head trained with cross-entropy and with ``PrecisionAtRecall`` alone, each scored on test
at its val threshold (``train.demo.run_arm``: same split, data order, optimizer and epochs). Writes
``demo_digits.md``: one row per digit, for each target the test precision of both arms (mean +- sd
over the seeds), the difference and in how many seeds the objective gains, and in its caption the
lowest test recall any val cut reached; and
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


def cells(r: dict[str, list[Outcome]]) -> tuple[list[str], float, float]:
    """One target's cells of a digit's row (cross-entropy, the objective, the mean difference with
    the seeds that gain), the difference and the lowest test recall either arm reached."""
    ce, pr = ([o.precision for o in r[a]] for a in ARMS)
    gains = [b - a for a, b in zip(ce, pr, strict=True)]
    gain = statistics.mean(gains)
    lowest = min(o.recall for a in ARMS for o in r[a])
    return (
        [mean_sd(ce), mean_sd(pr), f"{gain:+.3f} ({sum(g > 0 for g in gains)}/{len(gains)})"],
        gain,
        lowest,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.demo_digits", description=__doc__)
    p.add_argument("--out", default="docs/figures", help="writes demo_digits.md and .png here")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=Settings.epochs)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    rows, gains, lowest = [], {t: [] for t in TARGETS}, 1.0
    for digit in range(10):
        row = [str(digit)]
        for recall in TARGETS:
            text, gain, low = cells(measure(digit, recall, a.seeds, a.epochs))
            row += text
            gains[recall].append(gain)
            lowest = min(lowest, low)
        rows.append(row)
        print(" | ".join(row), flush=True)
    header = ["digit"] + [
        f"{name}, r = {recall}"
        for recall in TARGETS
        for name in ("cross-entropy", "P@R", "difference (seeds gaining)")
    ]
    command = "python -m benchmarks.demo_digits --out docs/figures"
    text = (
        f"`{command}` ({a.seeds} seeds, {a.epochs} epochs; test precision at each arm's val "
        f"threshold, mean ± sd; the lowest test recall of a val cut: {lowest:.3f})\n\n"
        + markdown_table(header, rows)
        + "\n"
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
