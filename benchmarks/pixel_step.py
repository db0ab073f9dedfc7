"""The per-pixel F-beta regularizer's step against one elementwise pass over the same batch.

    python -m benchmarks.pixel_step --threads 1 --out docs/figures          # ~1 min on 2 cores
    python -m benchmarks.pixel_step --threads 1 --keep-freed --out docs/figures
    python -m benchmarks.pixel_step --threads 1 --compile --out docs/figures   # + compiled steps
    python -m benchmarks.pixel_step --device cuda --side 512 --out docs/figures

A segmentation batch of ``--images`` whole images of ``--side`` x ``--side`` pixels (8 of 16 by
default; 10 % of the pixels positive, drawn once) with every pixel a sample, in the two layouts a
user builds: one problem over the pixels (``FBetaRegularizer(labels)``) and one problem per image
(``groups`` = the image: what ``regularizer.target: pixels`` builds for a per-image F-beta). One
step is the regularizer's forward, ``backward`` and ``opt.step()`` (Adam, ``reg.attach(opt)``: the
sparse rows step there) with the library's defaults; the elementwise pass is the forward and
backward of ``(u * 2).sum()`` on the same batch. The arms are timed in turn (``--rounds`` rounds;
a busy machine slows them alike); the table gives the median and the fastest of each and the ratio
of the medians. The scores and the images of each step are drawn before the clock starts.
``--keep-freed`` (glibc): freed temporaries are kept for reuse, not returned to the system and
faulted in again at the next step (``benchmarks._timing.keep_freed_memory``); the table's first
line says which. ``--compile``: a third arm, the same step with the user's ``torch.compile`` of the
loss (``fullgraph=True``) and of ``opt.step``, on a regularizer of its own, and its ratio to the
eager step.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch

from benchmarks._report import markdown_table, save_figure, subplots
from benchmarks._timing import keep_freed_memory, machine_line

LAYOUTS = ("one problem", "per image")


def pixel_batches(side: int, images: int, of: int, steps: int, device: str) -> tuple:
    """``(labels, groups, batches)``: the pixels' labels (``of`` images, 10 % positive), each
    pixel's image, and ``steps`` batches ``(u, idx)`` of ``images`` whole images."""
    hw = side * side
    gen = torch.Generator().manual_seed(0)
    labels = (torch.rand(of * hw, generator=gen) < 0.1).long()
    groups = torch.arange(of * hw) // hw
    batches = []
    for _ in range(steps):
        pick = torch.randperm(of, generator=gen)[:images]
        idx = (pick[:, None] * hw + torch.arange(hw)).reshape(-1)
        u = torch.randn(images * hw, generator=gen)
        batches.append((u.to(device), idx.to(device)))
    return labels, groups, batches


def arms(
    layout: str, side: int, images: int, device: str, steps: int, compiled: bool = False
) -> dict:
    """The arms of one layout: ``{"step": fn, "elementwise": fn}`` (and ``"compiled step"``:
    the user's ``torch.compile`` of the loss, ``fullgraph=True``, and of ``opt.step``, on a
    regularizer of its own), each taking the next batch on every call."""
    from reparam import FBetaRegularizer

    labels, groups, batches = pixel_batches(side, images, 2 * images, steps, device)
    turn = {"step": 0, "elementwise": 0, "compiled step": 0}

    def take(arm: str) -> tuple:
        turn[arm] += 1
        u, idx = batches[turn[arm] % len(batches)]
        return u.clone().requires_grad_(), idx

    def stepper(arm: str, compile_: bool):
        reg = FBetaRegularizer(labels, groups=groups if layout == "per image" else None)
        reg = reg.to(device)
        opt = torch.optim.Adam(reg.parameters(), lr=1e-3)
        reg.attach(opt)
        loss = torch.compile(reg, fullgraph=True) if compile_ else reg
        opt_step = torch.compile(opt.step) if compile_ else opt.step

        def step() -> None:
            u, idx = take(arm)
            loss(u, idx).backward()
            opt_step()
            opt.zero_grad()

        step.reg = reg  # (the arm's regularizer: a test compares the arms' states)
        return step

    def elementwise() -> None:
        u, _ = take("elementwise")
        (u * 2).sum().backward()

    out = {"step": stepper("step", False), "elementwise": elementwise}
    if compiled:
        out["compiled step"] = stepper("compiled step", True)
    return out


def measure(layout: str, args: argparse.Namespace) -> dict:
    """Median and fastest seconds of each arm of ``layout``, timed in turn."""
    import statistics
    import time

    calls = arms(layout, args.side, args.images, args.device, 4, args.compile)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for fn in calls.values():  # warm-up: the first steps allocate (and compile)
        fn(), fn(), fn()
    for _ in range(args.rounds):
        for name, fn in calls.items():
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - t0)
    return {name: (statistics.median(t), min(t)) for name, t in times.items()}


def table(results: dict, args: argparse.Namespace) -> str:
    """The markdown table of ``results`` (``layout -> arm -> (median, fastest)``)."""
    rows = []
    for layout, arm in results.items():
        (step, step_min), (pass_, pass_min) = arm["step"], arm["elementwise"]
        row = [
            layout,
            f"{step * 1e3:.2f} ({step_min * 1e3:.2f})",
            f"{pass_ * 1e3:.2f} ({pass_min * 1e3:.2f})",
            f"{step / pass_:.1f}",
        ]
        if "compiled step" in arm:
            compiled, compiled_min = arm["compiled step"]
            row += [f"{compiled * 1e3:.2f} ({compiled_min * 1e3:.2f})", f"{compiled / step:.2f}"]
        rows.append(row)
    pixels = args.images * args.side**2
    header = [
        f"layout ({pixels:,} pixels, {args.device})",
        "step ms, median (fastest)",
        "elementwise pass ms",
        "step / pass",
    ]
    if args.compile:
        header += ["compiled step ms, median (fastest)", "compiled / eager step"]
    return markdown_table(header, rows)


def plot(results: dict, path: Path) -> None:
    """Bars: the step's median over the elementwise pass's, per layout."""
    fig, ax = subplots(figsize=(4.5, 3))
    ratios = [arm["step"][0] / arm["elementwise"][0] for arm in results.values()]
    ax.bar(list(results), ratios, color=["tab:blue", "tab:orange"])
    ax.axhline(8, color="gray", linestyle="--", linewidth=1, label="8x")
    ax.set_ylabel("step / elementwise pass")
    ax.legend()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--side", type=int, default=256, help="image side in pixels")
    parser.add_argument("--images", type=int, default=8, help="whole images per batch")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument(
        "--keep-freed",
        action="store_true",
        help="glibc malloc keeps freed temporaries for reuse (no page faults on each step's)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also a compiled step: the loss (fullgraph) and opt.step under torch.compile",
    )
    parser.add_argument("--out", type=Path, default=None, help="folder for the table and plot")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    memory = keep_freed_memory() if args.keep_freed else "glibc malloc's defaults"
    with warnings.catch_warnings():  # (steps past an epoch with no end_epoch_: timing only)
        warnings.simplefilter("ignore", RuntimeWarning)
        results = {layout: measure(layout, args) for layout in LAYOUTS}
    command = "python -m benchmarks.pixel_step " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    machine = f"{machine_line(args.device)}; {memory}"
    text = f"<!-- {command.strip()} -->\n{machine}\n\n{table(results, args)}\n"
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        suffix = ("" if args.device == "cpu" else "_cuda") + ("_kept" if args.keep_freed else "")
        suffix += "_compiled" if args.compile else ""
        (args.out / f"pixel_step{suffix}.md").write_text(text)
        plot(results, args.out / f"pixel_step{suffix}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
