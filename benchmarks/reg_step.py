"""Step time of the F-beta regularizer alone vs the number of positives n, at a fixed batch size.

    python -m benchmarks.reg_step --out docs/figures            # ~1 min on 2 cores
    python -m benchmarks.reg_step --device cuda --out docs/figures

One step is what the regularizer adds to a training step: ``reg(u, idx)`` (the minibatch ``L_B``),
its backward, the optimizer step of the regularizer's parameters and ``reg.after_step_()``, for
random batches of ``B`` samples of a binary problem with ``n`` positives and ``n`` negatives.
Compared: ``tau`` stepped densely by a fused Adam (the trainer's optimizer; every row every step),
and the sparse rules ``sparse_adam`` / ``sparse_sgd`` (reparam.sparse: the batch's rows only); all
with the paper's ``projection="epoch"`` (the epoch end is timed separately: once per epoch). Also
the library default ``projection="inline"`` with dense ``tau``, whose loss projects every ``tau``.
The modes step in turn (rotating order) so that drift of a shared machine hits all alike;
``--compile`` adds the sparse modes with ``reg.compile()`` (the ``L_B`` math compiled). Prints the median step time per ``n`` and
the ratio to ``n = 1e3`` (target: <= 1.2 at 1e6).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks._report import markdown_table, save_figure, subplots
from benchmarks._timing import machine_line
from reparam import FBetaRegularizer

MODES = {  # name -> FBetaRegularizer options
    "dense Adam (epoch)": dict(projection="epoch", tau_update="dense"),
    "sparse_adam (epoch)": dict(projection="epoch", tau_update="sparse_adam"),
    "sparse_sgd (epoch)": dict(projection="epoch", tau_update="sparse_sgd"),
    "dense Adam (inline)": dict(projection="inline", tau_update="dense"),
}


def step_times(
    n_pos: int, batch: int, modes: dict[str, dict], device: str, steps: int
) -> dict[str, dict[str, float]]:
    """Median seconds of one regularizer step (forward, backward, optimizer, after_step_) and of
    one epoch end per mode, for ``n_pos`` positives and as many negatives. The modes take their
    steps in turn (rotating order), so drift of a shared machine hits all of them alike."""
    labels = torch.zeros(2 * n_pos, dtype=torch.int64)
    labels[::2] = 1
    gen = torch.Generator().manual_seed(0)
    order = torch.randperm(2 * n_pos, generator=gen)
    u_all = torch.randn(2 * n_pos, generator=gen).to(device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    runs = {}
    for name, options in modes.items():
        options = dict(options)
        compiled = options.pop("compile", False)
        reg = FBetaRegularizer(labels, preset="paper", **options).to(device)
        if compiled:
            reg.compile()
        runs[name] = (reg, torch.optim.Adam(reg.parameters(), lr=1e-3, fused=True))
    times: dict[str, list[float]] = {name: [] for name in modes}
    names = list(modes)
    for k in range(steps + 10):  # 10 warm-up steps (and compilation)
        start = (k * batch) % (2 * n_pos - batch)
        idx = order[start : start + batch]  # on the CPU, as a DataLoader gives it
        u0 = u_all[idx.to(device)]
        for name in names[k % len(names) :] + names[: k % len(names)]:
            reg, opt = runs[name]
            u = u0.clone().requires_grad_()
            sync()
            t0 = time.perf_counter()
            loss = reg(u, idx)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            reg.after_step_()
            sync()
            if k >= 10:
                times[name].append(time.perf_counter() - t0)
    out = {}
    for name, (reg, _) in runs.items():
        sync()
        t0 = time.perf_counter()
        reg.end_epoch_()
        sync()
        out[name] = {"step": statistics.median(times[name]), "end": time.perf_counter() - t0}
    return out


SEGMENTS = (
    "input checks",
    "score memory",
    "L_B forward",
    "backward",
    "optimizer (eps)",
    "after_step_",
)


def segment_times(
    n_pos: int, batch: int, options: dict, steps: int
) -> dict[str, tuple[float, int]]:
    """Where one step's time goes (CPU): median microseconds and the number of dispatched tensor
    operations of each part of ``reg(u, idx)`` + backward + optimizer + ``after_step_()``, the
    forward taken apart as ``ShapeObjective.forward`` does it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from reparam import _checks

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            return func(*args, **(kwargs or {}))

    labels = torch.zeros(2 * n_pos, dtype=torch.int64)
    labels[::2] = 1
    reg = FBetaRegularizer(labels, preset="paper", **options)
    opt = torch.optim.Adam(reg.parameters(), lr=1e-3, fused=True)
    gen = torch.Generator().manual_seed(0)

    def parts(u, idx):
        yield
        u, idx = _checks.batch(u, idx, reg.classes, reg.n_samples, reg.shape_labels.device)
        rows = _checks.rows(reg.slot, idx)
        yield
        reg._remember_(u, idx)
        yield
        loss = reg._loss(u, idx, rows)
        yield
        opt.zero_grad(set_to_none=True)
        loss.backward()
        yield
        opt.step()
        yield
        reg.after_step_()
        yield

    times = {name: [] for name in SEGMENTS}
    ops = {}
    for k in range(steps + 10):
        idx = torch.randperm(2 * n_pos, generator=gen)[:batch]
        u = torch.randn(batch, generator=gen).requires_grad_()
        it = parts(u, idx)
        next(it)
        for name in SEGMENTS:
            if k == 0:
                with Count() as c:
                    next(it)
                ops[name] = c.ops
                continue
            t0 = time.perf_counter()
            next(it)
            if k >= 10:
                times[name].append(time.perf_counter() - t0)
    return {name: (statistics.median(times[name]) * 1e6, ops[name]) for name in SEGMENTS}


def step_table(results: dict[str, dict[int, dict[str, float]]], sizes: list[int]) -> str:
    """Per mode the step time at every ``n``, the ratio of the last to the first and the epoch end."""
    first, last = sizes[0], sizes[-1]
    header = [
        "mode",
        *[f"step at n = {n:.0e} (us)" for n in sizes],
        f"ratio {last:.0e} / {first:.0e} (target <= 1.2)",
        f"epoch end at {last:.0e} (ms)",
    ]
    rows = [
        [
            mode,
            *[f"{r[n]['step'] * 1e6:.0f}" for n in sizes],
            f"**{r[last]['step'] / r[first]['step']:.2f}**",
            f"{r[last]['end'] * 1e3:.1f}",
        ]
        for mode, r in results.items()
    ]
    return markdown_table(header, rows)


def segment_table(batch: int, steps: int) -> str:
    """Where a step's time goes at S-MNIST's size (55930 positives), for the three step rules."""
    split = {
        m: segment_times(55930, batch, MODES[m], steps)
        for m in ("dense Adam (epoch)", "sparse_adam (epoch)", "sparse_sgd (epoch)")
    }
    rows = [
        [name, *[f"{split[m][name][0]:.0f} ({split[m][name][1]})" for m in split]]
        for name in SEGMENTS
    ]
    total = [
        f"{sum(t for t, _ in split[m].values()):.0f} ({sum(o for _, o in split[m].values())})"
        for m in split
    ]
    return (
        f"One step at n = 55930 positives (S-MNIST), B = {batch}: median us (dispatched tensor "
        f"operations)\n\n" + markdown_table(["part", *split], [*rows, ["total", *total]])
    )


def main(argv: list[str] | None = None) -> int:
    """Time every mode at every size; write ``reg_step.md`` (``reg_step_<device>.md``) and the plot."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--sizes", default="1e3,1e4,1e5,1e6", help="numbers of positives")
    p.add_argument("--steps", type=int, default=300, help="timed steps per size and mode")
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--compile", action="store_true", help="also the sparse modes with reg.compile()"
    )
    p.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    a = p.parse_args(argv)
    sizes = [int(float(s)) for s in a.sizes.split(",")]
    modes = MODES | (
        {
            f"{m} + compile": {**o, "compile": True}
            for m, o in MODES.items()
            if o["tau_update"] != "dense"
        }
        if a.compile
        else {}
    )
    results = {m: {} for m in modes}
    step_times(sizes[0], a.batch, modes, a.device, 50)  # warm the machine and the compiler up
    for n in sizes:
        for mode, r in step_times(n, a.batch, modes, a.device, a.steps).items():
            results[mode][n] = r
        print(
            f"n = {n:.0e}: "
            + ", ".join(f"{m} {results[m][n]['step'] * 1e6:.0f} us" for m in modes),
            flush=True,
        )
    table = step_table(results, sizes)
    if a.device == "cpu":  # where a step's time goes, at S-MNIST's size (55930 positives)
        table += "\n\n" + segment_table(a.batch, a.steps)
    cmd = f"python -m benchmarks.reg_step --batch {a.batch} --steps {a.steps} --device {a.device}"
    cmd += " --compile" if a.compile else ""
    a.out.mkdir(parents=True, exist_ok=True)
    stem = "reg_step" + ("" if a.device == "cpu" else f"_{a.device.split(':')[0]}")
    text = (
        f"<!-- {cmd} -->\n{machine_line(a.device)}; B = {a.batch}, median of {a.steps} "
        f"steps per cell (forward + backward + optimizer + after_step_)\n\n{table}\n"
    )
    (a.out / f"{stem}.md").write_text(text)
    _plot(results, sizes, a.batch, a.out / f"{stem}.png")
    print(table)
    return 0


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
