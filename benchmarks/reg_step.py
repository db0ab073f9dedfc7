"""Step time of the F-beta regularizer alone vs the number of positives n, at a fixed batch size.

    python -m benchmarks.reg_step --out docs/figures            # ~1 min on 2 cores
    python -m benchmarks.reg_step --device cuda --out docs/figures
    python -m benchmarks.reg_step [--device cuda] --replot --out docs/figures   # figure from table

One step: ``reg(u, idx)`` (the minibatch ``L_B``), its backward, the optimizer step of the
regularizer's parameters and ``reg.after_step_()``, for random batches of ``B`` samples with ``n``
positives and ``n`` negatives; ``tau`` stepped densely by a fused Adam (the trainer's optimizer)
with the paper's settings (``FBetaRegularizer.paper``: ``EpochEnd()``, the epoch end timed apart)
and with ``schedule=Inline()``, and the library's defaults (``Tracked()``, ``tau`` stepped by
``SparseTau()``'s ``sparse_adam_ahead`` rule on the batch's rows only, reparam.sparse). What is
compared steps in turn (rotating order), so that drift of a shared machine hits all alike;
``--compile`` adds the defaults with ``reg.compile()``.
Prints the median step per ``n`` and the ratio to the first (target: <= 1.2). On the CPU also
one step at S-MNIST's size taken apart (median us and dispatched operations of each part, at a
steady step); ``--against REF`` adds the same for ``reparam`` at git revision ``REF`` (one with
the option types), interleaved in one process.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

import reparam
from benchmarks._report import markdown_table, read_markdown_table, save_figure, subplots
from benchmarks._timing import interleave, machine_line, package_at

# name -> (the regularizer of a ``reparam`` module and labels, whether its tau is dense): the
# paper's settings (the S-MNIST configs': EpochEnd(), DenseTau()) and the library's defaults
MODES: dict[str, tuple[Callable[[ModuleType, torch.Tensor], Any], bool]] = {
    "dense Adam (epoch)": (lambda lib, y: lib.FBetaRegularizer.paper(y), True),
    "dense Adam (inline)": (
        lambda lib, y: lib.FBetaRegularizer.paper(y, schedule=lib.Inline()),
        True,
    ),
    "defaults (tracked, sparse_adam_ahead)": (lambda lib, y: lib.FBetaRegularizer(y), False),
}
PARTS_MODES = ("dense Adam (epoch)",)
SEGMENTS = ("forward", "backward", "optimizer", "after_step_")
SMNIST = 55930  # S-MNIST's positives (and as many negatives here)
ROOT = Path(__file__).resolve().parents[1]


def _whole(reg, opt, u0, idx, sync=lambda: None):
    """The regularizer's step as one part."""
    u = u0.clone().requires_grad_()
    sync()
    yield
    loss = reg(u, idx)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    reg.after_step_()
    sync()
    yield


def _segments(reg, opt, u0, idx):
    """The regularizer's step part by part (``SEGMENTS``), each part a public call: the forward
    ``reg(u, idx)`` (the input checks, the score memory and ``L_B``), the backward, the
    optimizer's step and ``after_step_()``."""
    u = u0.clone().requires_grad_()
    yield
    loss = reg(u, idx)
    yield
    opt.zero_grad(set_to_none=True)
    loss.backward()
    yield
    opt.step()
    yield
    reg.after_step_()
    yield


def _batches(n: int, batch: int, device: str = "cpu"):
    """``batches(k)``: scores on ``device`` and the ``k``-th batch of dataset indices (on the CPU)
    of one random order of the ``n`` samples, drawn once, as a DataLoader's sampler draws one
    per epoch (a permutation drawn every step costs O(n) outside the timed parts and evicts from
    the caches the state that the timed step reads: at n = 2e6, 16 MB a step)."""
    gen = torch.Generator().manual_seed(0)
    order = torch.randperm(n, generator=gen)
    per_epoch = max(n // batch, 1)
    return lambda k: (
        torch.randn(batch, generator=gen).to(device),
        order[(k % per_epoch) * batch :][:batch],
    )


def _us(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1e6


def _labels(n_pos: int) -> torch.Tensor:
    labels = torch.zeros(2 * n_pos, dtype=torch.int64)
    labels[::2] = 1
    return labels


def step_times(
    n_pos: int, batch: int, modes: dict[str, tuple], device: str, steps: int
) -> dict[str, dict[str, float]]:
    """Median seconds of one regularizer step (forward, backward, optimizer, after_step_) and of
    one epoch end per mode (``MODES``' entries, ``compiled`` third), for ``n_pos`` positives and as
    many negatives, the modes in turn."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    arms, runs = {}, {}
    for name, (build, _, *compiled) in modes.items():
        reg = build(reparam, _labels(n_pos)).to(device)
        if compiled and compiled[0]:
            reg.compile()
        runs[name] = (reg, torch.optim.Adam(reg.parameters(), lr=1e-3, fused=True))
        arms[name] = lambda u, idx, run=runs[name]: _whole(*run, u, idx, sync)
    times, _ = interleave(arms, _batches(2 * n_pos, batch, device), ("step",), steps)
    out = {}
    for name, (reg, _) in runs.items():
        sync()
        t0 = time.perf_counter()
        reg.end_epoch_()
        sync()
        out[name] = {"step": _us(times[name]["step"]) / 1e6, "end": time.perf_counter() - t0}
    return out


def segment_table(
    libs: dict[str, ModuleType], batch: int, steps: int, modes: tuple[str, ...] = PARTS_MODES
) -> str:
    """Where a step's time goes at S-MNIST's size, for each mode in ``modes``: median us
    (dispatched operations) of each part per ``reparam`` module in ``libs`` (label -> module,
    ``"now"`` last), and the ratio now / before when there are two."""
    cols: dict[str, dict[str, str]] = {}
    for mode in modes:
        arms = {}
        for label, lib in libs.items():
            reg = MODES[mode][0](lib, _labels(SMNIST))
            run = (reg, torch.optim.Adam(reg.parameters(), lr=1e-3, fused=True))
            arms[label] = lambda u, idx, run=run: _segments(*run, u, idx)
        times, ops = interleave(arms, _batches(2 * SMNIST, batch), SEGMENTS, steps)
        split = {a: {s: (_us(times[a][s]), ops[a][s]) for s in SEGMENTS} for a in libs}
        for a, parts in split.items():
            parts["total"] = tuple(map(sum, zip(*parts.values(), strict=True)))
            cols[mode + ("" if a == "now" else f" at {a}")] = {
                s: f"{us:.0f} ({n})" for s, (us, n) in parts.items()
            }
        if len(libs) > 1:
            now, before = split["now"], split[next(iter(libs))]
            cols[f"{mode}: now / before"] = {s: f"{now[s][0] / before[s][0]:.2f}" for s in now}
    rows = [[part, *[col[part] for col in cols.values()]] for part in [*SEGMENTS, "total"]]
    return (
        f"One step at n = {SMNIST} positives (S-MNIST), B = {batch}: median us (dispatched tensor "
        f"operations, at a steady step)\n\n" + markdown_table(["part", *cols], rows)
    )


def reparam_at(ref: str) -> ModuleType:
    """The package ``reparam`` as it was at git revision ``ref``, imported as ``reparam_<ref>``
    from a temporary copy (its own imports are relative; ``projections`` is today's)."""
    return package_at("reparam", ref)


def step_table(results: dict[str, dict[int, dict[str, float]]], sizes: list[int]) -> str:
    """Per mode the step time at every ``n``, the ratio of the last to the first and the epoch end."""
    first, last = sizes[0], sizes[-1]
    header = ["mode", *[f"step at n = {n:.0e} (us)" for n in sizes]]
    header += [f"ratio {last:.0e} / {first:.0e} (target <= 1.2)", f"epoch end at {last:.0e} (ms)"]
    rows = [
        [mode, *[f"{r[n]['step'] * 1e6:.0f}" for n in sizes], *_ratio_end(r, first, last)]
        for mode, r in results.items()
    ]
    return markdown_table(header, rows)


def _ratio_end(r: dict, first: int, last: int) -> list[str]:
    return [f"**{r[last]['step'] / r[first]['step']:.2f}**", f"{r[last]['end'] * 1e3:.1f}"]


def main(argv: list[str] | None = None) -> int:
    """Time every mode at every size; write ``reg_step.md`` (``reg_step_<device>.md``) and the
    plot; ``--no-sizes``: only the CPU's tables (and ``--against``), to ``reg_step_parts.md``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--sizes", default="1e3,1e4,1e5,1e6", help="numbers of positives")
    p.add_argument("--steps", type=int, default=300, help="timed steps per size and mode")
    p.add_argument("--device", default="cpu")
    p.add_argument("--compile", action="store_true", help="also the defaults compiled")
    p.add_argument("--no-sizes", action="store_true", help="skip the step-vs-n sweep")
    p.add_argument("--against", metavar="REF", help="also reparam at git revision REF (0.4+)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--note", default="", help="how busy the machine was, for the header")
    p.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    p.add_argument("--replot", action="store_true", help="the figure from --out's table; no runs")
    a = p.parse_args(argv)
    if a.replot:
        stem = "reg_step" + ("" if a.device == "cpu" else f"_{a.device.split(':')[0]}")
        results, sizes = _from_table(a.out / f"{stem}.md")
        _plot(results, sizes, a.batch, a.out / f"{stem}.png")
        return 0
    torch.set_num_threads(a.threads or torch.get_num_threads())
    sizes, load, tables = [int(float(s)) for s in a.sizes.split(",")], _load(), []
    # the sparse modes compiled too (reg.compile())
    sparse = {f"{m} + compile": (b, d, True) for m, (b, d) in MODES.items() if not d}
    modes = MODES | (sparse if a.compile else {})
    results = {m: {} for m in modes}
    for n in [] if a.no_sizes else [sizes[0], *sizes]:  # the first: warm-up (and compilation)
        for mode, r in step_times(n, a.batch, modes, a.device, a.steps).items():
            results[mode][n] = r
        print(
            f"n = {n:.0e}: " + ", ".join(f"{m} {results[m][n]['step'] * 1e6:.0f} us" for m in modes)
        )
    tables += [] if a.no_sizes else [step_table(results, sizes)]
    if a.device == "cpu":
        libs = {a.against: reparam_at(a.against)} if a.against else {}
        parts = PARTS_MODES + (() if a.against else ("defaults (tracked, sparse_adam_ahead)",))
        tables.append(segment_table(libs | {"now": reparam}, a.batch, a.steps, parts))
    flags = [f"--{k} {v}" for k, v in (("against", a.against), ("threads", a.threads)) if v]
    flags += [f for f, on in (("--compile", a.compile), ("--no-sizes", a.no_sizes)) if on]
    cmd = " ".join(["python -m benchmarks.reg_step --batch", str(a.batch), "--steps", str(a.steps)])
    cmd += f" --device {a.device} " + " ".join(flags)
    stem = "reg_step" + ("" if a.device == "cpu" else f"_{a.device.split(':')[0]}")
    stem += "_parts" if a.no_sizes else ""
    busy = f"; {load} at the start, {_load()} at the end" + (f"; {a.note}" if a.note else "")
    table = "\n\n".join(tables)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{stem}.md").write_text(
        f"<!-- {cmd.strip()} -->\n{machine_line(a.device)}{busy}; B = {a.batch}, median of "
        f"{a.steps} steps per cell (forward + backward + optimizer + after_step_)\n\n{table}\n"
    )
    if not a.no_sizes:
        _plot(results, sizes, a.batch, a.out / f"{stem}.png")
    print(table)
    return 0


def _load() -> str:
    return f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"


def _from_table(path: Path) -> tuple[dict[str, dict[int, dict[str, float]]], list[int]]:
    """``(results, sizes)`` of the step-vs-n table ``step_table`` wrote (the step times only)."""
    rows = read_markdown_table(path)
    columns = {
        int(float(c.split("= ")[1].split()[0])): c for c in rows[0] if c.startswith("step at")
    }
    results = {
        row["mode"]: {n: {"step": float(row[c]) * 1e-6} for n, c in columns.items()} for row in rows
    }
    return results, list(columns)


def _plot(results, sizes, batch, path: Path) -> None:
    fig, ax = subplots(figsize=(6.5, 4))
    for mode, r in results.items():
        ax.loglog(sizes, [r[n]["step"] * 1e6 for n in sizes], marker="o", label=mode)
    ax.set_xlabel("positives n")
    ax.set_ylabel(f"regularizer step (us), B = {batch}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(main())
