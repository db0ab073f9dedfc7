"""Time cost of the F-beta regularizer in S-MNIST training, before and after the fast step, in one run.

    python -m benchmarks.overhead --out docs/figures                # needs data/smnist (README)
    python -m benchmarks.overhead --compile --out docs/figures      # adds the train.compile variant
    python -m benchmarks.overhead --replot --out docs/figures       # the figure from its table

For each setting and each variant, the trainer (``train.loop.run``) runs the baseline and the
regularized config (mode ``epoch``, the paper's dual steps) from the same seed, alternately (base,
reg, base, reg: ``--repeats`` runs of each) so drift of the machine hits both alike. A variant's
overrides apply to both arms (the baseline ignores the regularizer's): ``dense tau`` is the
published configuration (``tau`` stepped by the network's Adam, two GEMMs), ``sparse tau`` steps the
batch's rows of ``tau`` only (``regularizer.fbeta.tau_update=sparse_adam_ahead``, docs/method/cost.md
sec. 11), ``+ shared GEMM`` computes class outputs and shape node in one product
(``model.shared_gemm=true``), ``+ compile`` adds ``train.compile=true`` (the model and the
regularizer's per-step math). Reported, as medians over the timed epochs (the first epoch of every
run, which compiles, is warm-up): epoch wall time regularized / baseline (training pass + epoch
end), the regularizer's extra time per step, and the epoch-end work (projection + dual step) /
regularized epoch time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from ._report import markdown_table, read_markdown_table, save_figure, subplots
from ._timing import alternating_runs, machine_line

SETTINGS = (  # name, config, overrides
    ("linear, batch 100 (paper)", "configs/smnist_linear.yaml", []),
    ("linear, batch 1000", "configs/smnist_linear.yaml", ["data.batch_size=1000"]),
    ("mlp 256, batch 100", "configs/smnist_mlp.yaml", []),
)


VARIANTS = (  # name, overrides of both arms
    ("dense tau (published)", []),
    ("sparse tau", ["regularizer.fbeta.tau_update=sparse_adam_ahead"]),
    (
        "sparse tau + shared GEMM",
        ["regularizer.fbeta.tau_update=sparse_adam_ahead", "model.shared_gemm=true"],
    ),
)
COMPILED = (
    "sparse tau + shared GEMM + compile",
    [
        "regularizer.fbeta.tau_update=sparse_adam_ahead",
        "model.shared_gemm=true",
        "train.compile=true",
    ],
)


def measure(
    config_path: str, overrides: list[str], epochs: int, repeats: int = 2
) -> dict[str, float]:
    """Median epoch times of the trainer (``train.loop.run``), baseline vs regularized.

    ``repeats`` runs of each, alternating (base, reg, base, reg, ...) so drift of the machine hits
    both alike; per run the first epoch is warm-up. An epoch's time is its training pass plus the
    epoch end (projection + dual step); evaluation and checkpoints are not counted.
    """
    arms = {
        name: [*overrides, f"regularizer.name={reg}", "regularizer.projection=epoch"]
        for name, reg in (("base", "none"), ("reg", "fbeta"))
    }
    rows, steps = alternating_runs(config_path, arms, epochs, repeats)
    times = {
        name: [r["train_seconds"] + r["epoch_end_seconds"] for r in rows[name]] for name in arms
    }
    times["end"] = [r["epoch_end_seconds"] for r in rows["reg"]]
    base, reg, end = (statistics.median(times[k]) for k in ("base", "reg", "end"))
    return {
        "base_s": base,
        "reg_s": reg,
        "ratio": reg / base,
        "end_s": end,
        "end_fraction": end / reg,
        "steps": steps,
        "per_step_us": (reg - base) / steps * 1e6,
    }


RATIO = "ratio (target <= 1.03)"
HEADER = [
    "setting",
    "variant",
    "steps/epoch",
    "baseline epoch (s)",
    "regularized epoch (s)",
    RATIO,
    "extra per step (us)",
    "epoch end (ms)",
    "epoch end / epoch",
]


def _row(name: str, variant: str, r: dict[str, float]) -> list[str]:
    return [
        name,
        variant,
        str(r["steps"]),
        f"{r['base_s']:.3f}",
        f"{r['reg_s']:.3f}",
        f"**{r['ratio']:.3f}**",
        f"{r['per_step_us']:.0f}",
        f"{r['end_s'] * 1e3:.2f}",
        f"{100 * r['end_fraction']:.3f} %",
    ]


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="data/smnist", help="S-MNIST folder (data_prep.smnist)")
    p.add_argument("--epochs", type=int, default=5, help="timed epochs per setting (>= 5)")
    p.add_argument("--repeats", type=int, default=2, help="alternating runs of each (>= 1)")
    p.add_argument("--quick", action="store_true", help="first 10000 images, linear only")
    p.add_argument("--only", default=None, help="substring: only the matching settings")
    p.add_argument("--compile", action="store_true", help="add the train.compile=true variant")
    p.add_argument("--variants", default=None, help="substring: only the matching variants")
    p.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    p.add_argument(
        "--replot", action="store_true", help="draw overhead.png from --out's overhead.md; no runs"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Measure every (setting, variant); write ``overhead.md`` and ``overhead.png``."""
    a = _arguments(argv)
    if a.replot:
        rows = read_markdown_table(a.out / "overhead.md")
        results = [(r["setting"], r["variant"], {"ratio": float(r[RATIO])}) for r in rows]
        _plot(results, a.out / "overhead.png")
        return 0
    settings = SETTINGS[:1] if a.quick else SETTINGS
    settings = [s for s in settings if a.only is None or a.only in s[0]]
    variants = [*VARIANTS, *([COMPILED] if a.compile else [])]
    variants = [v for v in variants if a.variants is None or a.variants in v[0]]
    results = []
    for name, config_path, overrides in settings:
        for variant, changes in variants:
            extra = [f"data.path={a.data}", *overrides, *changes]
            if a.quick:
                extra.append("data.train_subset=10000")
            r = measure(config_path, extra, a.epochs, a.repeats)
            results.append((name, variant, r))
            print(
                f"{name} / {variant}: ratio {r['ratio']:.3f}, extra {r['per_step_us']:.0f} us/step",
                flush=True,
            )
    table = markdown_table(HEADER, [_row(*result) for result in results])
    a.out.mkdir(parents=True, exist_ok=True)
    cmd = "python -m benchmarks.overhead" + (" --quick" if a.quick else "")
    cmd += " --compile" if a.compile else ""
    cmd += f" --only '{a.only}'" if a.only else ""
    cmd += f" --variants '{a.variants}'" if a.variants else ""
    text = (
        f"<!-- {cmd} --epochs {a.epochs} --repeats {a.repeats} -->\n{machine_line()}; medians of "
        f"{a.epochs} epochs x {a.repeats} alternating runs\n\n{table}\n"
    )
    (a.out / "overhead.md").write_text(text)
    _plot(results, a.out / "overhead.png")
    print(table)
    return 0


def _plot(results: list[tuple[str, str, dict[str, float]]], path: Path) -> None:
    settings = list(dict.fromkeys(n for n, _, _ in results))
    variants = list(dict.fromkeys(v for _, v, _ in results))
    fig, ax = subplots(figsize=(8, 1.2 + 0.5 * len(settings) * len(variants)))
    height = 0.8 / len(variants)
    for j, variant in enumerate(variants):
        ratios = {n: r["ratio"] for n, v, r in results if v == variant}
        ys = [i + j * height for i, n in enumerate(settings) if n in ratios]
        ax.barh(ys, [ratios[n] for n in settings if n in ratios], height=height, label=variant)
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(settings))], settings)
    ax.axvline(1.03, color="tab:red", lw=1, label="target 1.03")
    ax.axvline(1.0, color="k", lw=0.5)
    ax.set_xlim(left=0.9)
    ax.set_xlabel("epoch time, regularized / baseline")
    ax.legend(fontsize=8, loc="upper right")
    save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(main())
