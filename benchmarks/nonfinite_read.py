"""What one host read of the non-finite flag per step costs, on the configs we ship, in one run.

    python -m benchmarks.nonfinite_read --out docs/figures       # needs data/smnist, data/camvid-sky-60x80

For each setting the trainer (``train.loop.run``, F-beta with the library's defaults,
``train.nonfinite=stop``) runs with ``train.nonfinite_check_every=1`` (the flag read after every
forward pass, as ``skip`` does) and ``=100`` (read every 100 steps and before checkpoints and the
epoch end: ``stop``'s default), alternately (``--repeats`` runs of each, so drift of the machine hits both alike). Reported:
the median epoch training time of each arm over the timed epochs (the first epoch of every run is
warm-up), their ratio, and the cost of a read per step. On a CPU a read is a function call (the
values are already on the host); on a GPU it also waits for the device to finish the step, which this
script measures where it runs on one (``train.device=auto``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from ._report import markdown_table, save_figure, subplots
from ._timing import alternating_runs, machine_line

SETTINGS = (  # name, config, overrides
    ("S-MNIST linear, batch 100", "configs/smnist_linear.yaml", ["data.path=data/smnist"]),
    ("S-MNIST mlp, batch 100", "configs/smnist_mlp.yaml", ["data.path=data/smnist"]),
    (
        "CamVid sky 60x80, DeepLabV3+/ResNet-18, batch 8",
        "configs/camvid_sky.yaml",
        ["data.path=data/camvid-sky-60x80", "train.log_images=0"],
    ),
)
ARMS = (("read every step", 1), ("read every 100 steps", 100))


def measure(config: str, overrides: list[str], epochs: int, repeats: int) -> dict[str, float]:
    """Median training seconds per epoch of the two arms (``ARMS``), alternating runs."""
    arms = {
        str(every): [
            *overrides,
            "regularizer.name=fbeta",
            "train.nonfinite=stop",
            f"train.nonfinite_check_every={every}",
        ]
        for _, every in ARMS
    }
    rows, steps = alternating_runs(config, arms, epochs, repeats)
    times = {int(every): [r["train_seconds"] for r in rows[every]] for every in arms}
    each, hundred = (statistics.median(times[every]) for _, every in ARMS)
    return {
        "every_s": each,
        "hundred_s": hundred,
        "ratio": each / hundred,
        "steps": steps,
        "per_read_us": (each - hundred) / steps * 1e6,
        "step_ms": hundred / steps * 1e3,
    }


def read_costs(number: int = 20000) -> dict[str, float]:
    """Microseconds per call of the two reads themselves, on the host: ``bool()`` of the step's
    flag (``skip``'s read) and the guard's read of its device state (``stop``'s, one ``tolist()``)."""
    import timeit

    import torch

    from train.nonfinite import NonFiniteGuard

    flag = torch.isfinite(torch.tensor(1.0)) & torch.isfinite(torch.randn(100)).all()
    guard = NonFiniteGuard("stop", processes=False, last_checkpoint="none")
    guard.begin_epoch(1, torch.zeros(4, dtype=torch.float64))
    return {
        "bool_us": timeit.timeit(lambda: bool(flag), number=number) / number * 1e6,
        "guard_us": timeit.timeit(lambda: guard.read(flag), number=number) / number * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2, help="timed epochs per run")
    p.add_argument("--repeats", type=int, default=2, help="alternating runs of each arm")
    p.add_argument("--only", default=None, help="substring: only the matching settings")
    p.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    args = p.parse_args(argv)
    rows = []
    for name, config, overrides in SETTINGS:
        if args.only and args.only not in name:
            continue
        m = measure(config, overrides, args.epochs, args.repeats)
        rows.append(
            [
                name,
                f"{m['step_ms']:.2f}",
                f"{m['hundred_s']:.2f}",
                f"{m['every_s']:.2f}",
                f"{m['ratio']:.3f}",
                f"{m['per_read_us']:+.0f}",
                f"{100 * (m['ratio'] - 1):+.1f} %",
            ]
        )
        print(rows[-1], flush=True)
    header = [
        "setting",
        "step (ms)",
        "epoch, read every 100 (s)",
        "epoch, read every step (s)",
        "ratio",
        "cost per read (us)",
        "share of a step",
    ]
    reads = read_costs()
    text = (
        f"{machine_line()}; F-beta defaults, train.nonfinite=stop, median of "
        f"{args.epochs} timed epochs x {args.repeats} alternating runs per arm\n\n"
        + markdown_table(header, rows)
        + f"\n\nThe reads alone (timeit, 20000 calls): bool() of the step's flag (skip) "
        f"{reads['bool_us']:.2f} us, the guard's tolist() read (stop) {reads['guard_us']:.1f} us.\n"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "nonfinite_read.md").write_text(text)
    fig, ax = subplots(figsize=(6, 2.6))
    ax.barh([r[0] for r in rows], [100 * (float(r[4]) - 1) for r in rows])
    ax.axvline(1.0, color="k", ls="--", lw=0.8)
    ax.set_xlabel("epoch time, read every step vs every 100 (% more)")
    save_figure(fig, args.out / "nonfinite_read.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
