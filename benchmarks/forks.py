"""What each eager/compiled fork of the regularizer costs: the eager step with one module's compiled
forms forced, against the eager forms (docs/method/cost.md sec. 11b).

    python -m benchmarks.forks --threads 1 --out docs/figures          # ~3 min on 2 cores

The loop is ``benchmarks.reg_loop``'s (S-MNIST's paper model in a user's loop, the F-beta
defaults, Adam), eager, at ``B`` = 100 (S-MNIST's batch) and 8192 entries (a batch of pixels, past
the CPU's compaction of large batches at 4096). The library's eager and compiled forms differ at
named forks (``reparam.compiling.FORKS``); an arm makes some of them take their compiled form
eagerly (``reparam.compiling.compiled_forms``), and nothing else changes:

* ``_monitor``: the misuse counters on the device instead of in Python;
* ``_checks``: the scores' check masked on the device instead of one host read;
* ``sparse``: no compaction of large batches to their touched entries (a size read from the
  data).

The objectives' entry points ask once more whether they are traced
(``reparam.compiling.tracing``): not a second form of the step, but whether to call
``reg.compile()``'s compiled one.

Each arm's step is timed in rotating order with the others (drift hits all alike); the table gives
the median step, the regularizer's own time (the step minus the step without it) and what the
compiled forms add to it, with the operations one regularized step dispatches.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks._report import markdown_table
from benchmarks._timing import OpCount, machine_line
from benchmarks.reg_loop import Loop, _batches
from reparam.compiling import compiled_forms

# arm -> the library's forks (reparam.compiling.FORKS) whose compiled forms run eagerly in it
FORKS = {
    "eager forms": (),
    "_monitor": ("monitor",),
    "_checks": ("checks",),
    "sparse": ("sparse",),
}
FORKS["all compiled forms"] = tuple(f for fs in FORKS.values() for f in fs)


def time_forks(batch: int, steps: int) -> list[dict]:
    """Median step seconds of every arm with the regularizer and of the loop without it."""
    arms = {name: Loop("cpu", True, "eager") for name in FORKS}
    arms["without reg"] = Loop("cpu", False, "eager")
    batches = _batches("cpu", batch, 16)
    times: dict = {a: [] for a in arms}
    order = list(arms)
    for k in range(steps + 10):
        for a in order[k % len(order) :] + order[: k % len(order)]:
            with compiled_forms(*FORKS.get(a, ())):
                t0 = time.perf_counter()
                arms[a].step(*batches[k % len(batches)])
                if k >= 10:
                    times[a].append(time.perf_counter() - t0)
    ops = {}
    for a in FORKS:
        with compiled_forms(*FORKS[a]), OpCount() as count:
            arms[a].step(*batches[0])
        ops[a] = count.ops
    with OpCount() as count:
        arms["without reg"].step(*batches[0])
    plain = statistics.median(times["without reg"])
    base = statistics.median(times["eager forms"]) - plain
    rows = []
    for a in FORKS:
        own = statistics.median(times[a]) - plain
        rows.append(
            {
                "batch": batch,
                "arm": a,
                "step_ms": statistics.median(times[a]) * 1e3,
                "own_ms": own * 1e3,
                "added_us": (own - base) * 1e6,
                "added_pct": 100 * (own - base) / base,
                "ops": ops[a] - count.ops,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.forks", description=__doc__)
    parser.add_argument("--batches", type=int, nargs="+", default=[100, 8192])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="folder for forks.md / forks.png")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = [r for b in args.batches for r in time_forks(b, args.steps)]
    table = markdown_table(
        ["B", "forms", "step (ms)", "reg's own (ms)", "added by the compiled forms", "ops"],
        [
            [
                str(r["batch"]),
                r["arm"],
                f"{r['step_ms']:.2f}",
                f"{r['own_ms']:.3f}",
                ""
                if r["arm"] == "eager forms"
                else f"{r['added_us']:+.0f} us ({r['added_pct']:+.0f} %)",
                str(r["ops"]),
            ]
            for r in rows
        ],
    )
    cmd = "python -m benchmarks.forks " + " ".join(argv if argv is not None else sys.argv[1:])
    text = f"<!-- {cmd} -->\n{machine_line()}; median of {args.steps} steps\n\n{table}\n"
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "forks.md").write_text(text)
        _plot(rows, args.out / "forks.png")
    return 0


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({r["batch"] for r in rows})
    arms = [a for a in FORKS if a != "eager forms"]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    width = 0.8 / len(batches)
    for i, b in enumerate(batches):
        values = [
            next(r["added_us"] for r in rows if r["batch"] == b and r["arm"] == a) for a in arms
        ]
        ax.bar([k + i * width for k in range(len(arms))], values, width, label=f"B = {b}")
    ax.set_xticks([k + width * (len(batches) - 1) / 2 for k in range(len(arms))], arms)
    ax.axhline(0, color="black", linewidth=0.5)
    ax.set_ylabel("us added per step, eagerly")
    ax.set_title("The compiled forms run eagerly, by module")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
