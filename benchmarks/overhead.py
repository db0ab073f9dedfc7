"""Time cost of the F-beta regularizer in S-MNIST training, measured in one run.

    python -m benchmarks.overhead --out docs/figures          # needs data/smnist (README)

For each setting, the trainer (``train.loop.run``) runs the baseline and the regularized config (mode
``epoch``, the paper's dual steps) from the same seed, alternately (base, reg, base, reg: ``--repeats``
runs of each) so drift of the machine hits both alike. Reported, as medians over the timed epochs
(the first epoch of every run is warm-up):
epoch wall time regularized / baseline (training pass + epoch end), the epoch-end work (projection
+ dual step) / regularized epoch time, and the per-step cost in microseconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from ._timing import machine_line, markdown_table

SETTINGS = (  # name, config, overrides
    ("linear, batch 100 (paper)", "configs/smnist_linear.yaml", []),
    ("linear, batch 1000", "configs/smnist_linear.yaml", ["data.batch_size=1000"]),
    ("mlp 256, batch 100", "configs/smnist_mlp.yaml", []),
)


def measure(
    config_path: str, overrides: list[str], epochs: int, repeats: int = 2
) -> dict[str, float]:
    """Median epoch times of the trainer (``train.loop.run``), baseline vs regularized.

    ``repeats`` runs of each, alternating (base, reg, base, reg, ...) so drift of the machine hits
    both alike; per run the first epoch is warm-up. An epoch's time is its training pass plus the
    epoch end (projection + dual step); evaluation and checkpoints are not counted.
    """
    import tempfile

    from train import config as config_mod
    from train.loop import run

    times: dict[str, list[float]] = {"base": [], "reg": [], "end": []}
    steps = 0
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            for name in ("base", "reg"):
                cfg = config_mod.load(config_path, [
                    *overrides, f"regularizer.name={'none' if name == 'base' else 'fbeta'}",
                    "regularizer.projection=epoch", f"train.epochs={epochs + 1}",
                    "train.checkpoint=false", "train.progress=false", f"train.out={tmp}/{name}{r}",
                ])  # fmt: skip
                history = run(cfg, log=lambda *_: None)["history"]
                steps = history[-1]["steps"]
                for row in history[1:]:  # the first epoch is warm-up
                    times[name].append(row["train_seconds"] + row["epoch_end_seconds"])
                    if name == "reg":
                        times["end"].append(row["epoch_end_seconds"])
    base, reg, end = (statistics.median(times[k]) for k in ("base", "reg", "end"))
    return {"base_s": base, "reg_s": reg, "ratio": reg / base, "end_s": end,
            "end_fraction": end / reg, "steps": steps, "per_step_us": (reg - base) / steps * 1e6}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="data/smnist", help="S-MNIST folder (data_prep.smnist)")
    p.add_argument("--epochs", type=int, default=5, help="timed epochs per setting (>= 5)")
    p.add_argument("--repeats", type=int, default=2, help="alternating runs of each (>= 1)")
    p.add_argument("--quick", action="store_true", help="first 10000 images, linear only")
    p.add_argument("--only", default=None, help="substring: only the matching settings")
    p.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    a = p.parse_args(argv)
    settings = SETTINGS[:1] if a.quick else SETTINGS
    settings = [s for s in settings if a.only is None or a.only in s[0]]
    rows, results = [], []
    for name, config_path, overrides in settings:
        extra = [f"data.path={a.data}", *overrides]
        if a.quick:
            extra.append("data.train_subset=10000")
        r = measure(config_path, extra, a.epochs, a.repeats)
        results.append((name, r))
        rows.append([name, str(r["steps"]), f"{r['base_s']:.3f}", f"{r['reg_s']:.3f}",
                     f"**{r['ratio']:.3f}**", f"{r['per_step_us']:.0f}",
                     f"{r['end_s'] * 1e3:.2f}", f"**{100 * r['end_fraction']:.3f} %**"])  # fmt: skip
        print(
            f"{name}: ratio {r['ratio']:.3f}, epoch end {100 * r['end_fraction']:.3f} %", flush=True
        )
    header = ["setting", "steps/epoch", "baseline epoch (s)", "regularized epoch (s)",
              "ratio (target <= 1.03)", "extra per step (us)", "epoch end (ms)",
              "epoch end / epoch (target <= 0.5 %)"]  # fmt: skip
    table = markdown_table(header, rows)
    a.out.mkdir(parents=True, exist_ok=True)
    cmd = "python -m benchmarks.overhead" + (" --quick" if a.quick else "")
    cmd += f" --only '{a.only}'" if a.only else ""
    text = (f"<!-- {cmd} --epochs {a.epochs} --repeats {a.repeats} -->\n{machine_line()}; medians of "
            f"{a.epochs} epochs x {a.repeats} alternating runs\n\n{table}\n")  # fmt: skip
    (a.out / "overhead.md").write_text(text)
    _plot(results, a.out / "overhead.png")
    print(table)
    return 0


def _plot(results: list[tuple[str, dict[str, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = [n for n, _ in results]
    ax.barh(names, [r["ratio"] for _, r in results], color="tab:blue")
    ax.axvline(1.03, color="tab:red", lw=1, label="target 1.03")
    ax.axvline(1.0, color="k", lw=0.5)
    ax.set_xlabel("epoch time, regularized / baseline")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
