"""Every GPU figure of the docs and the CUDA tests, in one command (about 8 minutes on one H200).

    PYTHONPATH=wheels/site python -m benchmarks.gpu --out docs/figures

Runs, each within its own time limit, and prints one line per part that cannot run (a missing
package, no CUDA device) instead of failing the rest:

1. the CUDA tests (``pytest -m cuda tests``);
2. the per-pixel regularizer alone, 8 whole 512x512 images (2,097,152 pixels) of 16, one problem
   and one problem per image, against one elementwise pass (``benchmarks.pixel_step``);
3. the DeepLabV3+ training step with and without the regularizer, eager, compiled and compiled
   ``reduce-overhead`` (CUDA graphs): ResNet-18 at 120x160 and ResNet-50 at 512x512 in bf16,
   batch 8 (``benchmarks.segmentation_step``; needs segmentation-models-pytorch);
4. the regularizer's own time in the S-MNIST loop, eager, ``reg.compile``, the user's compile and
   CUDA graphs, with the graphs recorded after warm-up (``benchmarks.reg_loop --cudagraphs``).

The figures go to ``--out`` (markdown and plots) and to standard output, headed by the device and
the torch version.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import torch

# the tests marked ``cuda`` (tests/conftest.py: every test on the ``device`` fixture's CUDA arm)
CUDA_TESTS = ["-m", "pytest", "-q", "-m", "cuda", "-p", "no:randomly", "tests"]


def run_part(name: str, argv: list[str], limit_s: int) -> bool:
    """Run ``python argv`` with a time limit, its output passed through; one line on failure."""
    t0 = time.time()
    try:
        done = subprocess.run([sys.executable, *argv], timeout=limit_s, check=False)
    except subprocess.TimeoutExpired:
        print(f"[gpu] {name}: stopped at its limit of {limit_s} s", flush=True)
        return False
    took = time.time() - t0
    status = "done" if done.returncode == 0 else f"failed (exit {done.returncode})"
    print(f"[gpu] {name}: {status} in {took:.0f} s", flush=True)
    return done.returncode == 0


def missing(packages: tuple[str, ...]) -> list[str]:
    """The importable names of ``packages`` that are not installed."""
    return [p for p in packages if importlib.util.find_spec(p) is None]


def parts(out: Path) -> list[tuple[str, list[str], int, tuple[str, ...]]]:
    """``(name, argv, limit_s, packages needed)`` of every part, in the order they run."""
    return [
        ("CUDA tests", CUDA_TESTS, 150, ()),
        (
            "per-pixel step, 2.1M pixels",
            ["-m", "benchmarks.pixel_step", "--device", "cuda", "--side", "512", "--out", str(out)],
            60,
            (),
        ),
        (
            "S-MNIST loop and DeepLabV3+ step",
            [
                "-m", "benchmarks.reg_loop", "--device", "cuda", "--cudagraphs", "--steps", "150",
                "--segmentation", "20", "--note", "benchmarks.gpu", "--out", str(out),
            ],
            270,
            (),  # (without segmentation-models-pytorch: one line, and the S-MNIST table alone)
        ),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("[gpu] skipped: no CUDA device (torch.cuda.is_available() is False)")
        return 0
    name = torch.cuda.get_device_name(0)
    print(f"[gpu] {name}, torch {torch.__version__}, CUDA {torch.version.cuda}", flush=True)
    ok = True
    for part, command, limit_s, needs in parts(args.out):
        absent = missing(needs)
        if absent:
            print(f"[gpu] {part}: skipped, {', '.join(absent)} not installed", flush=True)
            continue
        ok &= run_part(part, command, limit_s)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
