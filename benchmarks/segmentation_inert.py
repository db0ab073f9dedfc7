"""Why the paper's F-beta preset does nothing in CamVid segmentation, and what repairs it.

    python -m benchmarks.segmentation_inert --camvid <CamVid dir> --jobs 2

Trains each variant of ``VARIANTS`` (``configs/camvid_sky.yaml``: DeepLabV3+ / ResNet-18 from
scratch, Adam 1e-3, alpha 1e-3) on the sky task at 60x80 for ``--epochs`` epochs, one seed, through
``benchmarks.sweep`` (resumable), and writes ``docs/figures/segmentation_inert.md``: the shape
node's test F1 per epoch, the multipliers at the end, the test mIoU, and the trainer's inertness
warning (``stats()["inert"]``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ._report import markdown_table
from .sweep import Job, metrics, run_jobs

CONFIG, CACHE = "configs/camvid_sky.yaml", "data/camvid-sky-60x80"  # the study's cache
PAPER = ("regularizer.name=fbeta", "regularizer.fbeta.preset=paper")
VARIANTS = {
    "paper preset, SGD 0.01 (the earlier configs)": (
        *PAPER,
        "optim.name=sgd",
        "optim.lr=0.01",
        "optim.regularizer_lr=0.01",
    ),
    "paper preset (Adam)": PAPER,
    "paper + dual_lr_lambda 0.1": (*PAPER, "regularizer.fbeta.dual_lr_lambda=0.1"),
    "paper + lambda_init 1": (*PAPER, "regularizer.fbeta.lambda_init=1.0"),
    "paper + lambda_init 1 + cap_scores": (
        *PAPER,
        "regularizer.fbeta.lambda_init=1.0",
        "regularizer.fbeta.cap_scores=true",
    ),
    "library defaults": ("regularizer.name=fbeta", "regularizer.fbeta.preset=null"),
    # the task alone at the configs' network step and at the paper's primal step 1e-2
    "no regularizer, Adam 1e-3": (),
    "no regularizer, Adam 1e-2 (the paper's step)": ("optim.lr=1e-2",),
}


def jobs(epochs: int, seed: int) -> list[tuple[str, Job]]:
    """``(variant, job)`` for every variant."""
    out = []
    for name, overrides in VARIANTS.items():
        key = "inert-" + "".join(c if c.isalnum() else "_" for c in name) + f"-seed{seed}"
        settings = (
            *overrides,
            f"data.path={CACHE}",
            f"train.epochs={epochs}",
            f"train.seed={seed}",
        )
        out.append((name, Job(key, CONFIG, settings)))
    return out


HEADER = [
    "variant",
    "shape-node test F1, epoch 1..E",
    "lambda mean (end)",
    "eps (end)",
    "mu (end)",
    "test mIoU (end; min over epochs)",
    "the trainer's warning at the end",
]


def _row(name: str, history: list[dict]) -> list[str]:
    last = history[-1]
    miou = f"{last['test_miou']:.3f}; {min(r['test_miou'] for r in history):.3f}"
    if "reg_eps" not in last:  # no regularizer: the task's figures only
        return [name, "n/a", "n/a", "n/a", "n/a", miou, "n/a"]
    reasons = (last.get("reg_inert") or "").split("; ")
    return [
        name,
        " ".join(f"{r['test_shape_fbeta']:.2f}" for r in history),
        f"{last['reg_lambda_mean']:.3f}",
        f"{last['reg_eps']:.3f}",
        f"{last['reg_mu']:.3f}",
        miou,
        ", ".join(r.split(" (")[0].split(":")[0] for r in reasons if r) or "none",
    ]


def table(root: Path, grid: list[tuple[str, Job]]) -> str:
    """One row per finished run of ``grid``."""
    runs = [(name, metrics(root / job.key, job)) for name, job in grid]
    return markdown_table(HEADER, [_row(n, m["history"]) for n, m in runs if m is not None]) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--camvid", type=Path, required=True, help="the CamVid folder (SegNet layout)")
    p.add_argument("--runs", type=Path, default=Path("runs/segmentation_inert"))
    p.add_argument("--out", type=Path, default=Path("docs/figures"))
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2)
    a = p.parse_args(argv)
    from data_prep import camvid

    camvid.prepare(camvid.Options(root=a.camvid, out=CACHE, task="sky", size=(60, 80)))
    grid = jobs(a.epochs, a.seed)
    run_jobs([job for _, job in grid], a.runs, a.jobs)
    text = table(a.runs, grid)
    a.out.mkdir(parents=True, exist_ok=True)
    command = f"python -m benchmarks.segmentation_inert --epochs {a.epochs} --seed {a.seed}"
    (a.out / "segmentation_inert.md").write_text(f"<!-- {command} -->\n{text}")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
