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

On the CPU it also takes one step at S-MNIST's size apart (median time and dispatched tensor
operations of each part, counted at a steady step). ``--against REF`` (a git revision) compares
with the library as it was at ``REF`` (``git archive`` of its ``reparam/``, imported under another
name), interleaved step by step in one process: the parts of a step (``reg(u, idx)``, backward,
optimizer, ``after_step_()``) and what the regularizer adds to a step of the paper's linear S-MNIST
model (784 -> 10 classes + the shape node in one layer, batch 100, one fused Adam with the
regularizer's parameter group, as the trainer builds it): issue 31's measure, target <= 0.25 ms.

    python -m benchmarks.reg_step --against 2a53c72 --no-sizes --out docs/figures
"""

from __future__ import annotations

import argparse
import importlib
import io
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch
from torch.utils._python_dispatch import TorchDispatchMode

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
    labels = _labels(n_pos)
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


COUNT_AT = 4  # the step whose dispatched operations are counted: a steady one


class OpCount(TorchDispatchMode):
    """Counts the tensor operations dispatched inside the ``with`` block (``ops``)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


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
    forward taken apart as ``ShapeObjective.forward`` does it (input checks: the scores' and,
    through the gather of the batch's rows, the indices'). Operations are counted at a steady
    step (the 5th: not the first, where the optimizer creates its state)."""
    from reparam import _checks

    reg = FBetaRegularizer(_labels(n_pos), preset="paper", **options)
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
        _run_parts(parts(u, idx), SEGMENTS, k, times, ops)
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


# --- against a revision: the parts of a step and the linear S-MNIST step, before / after -----------

ROOT = Path(__file__).resolve().parents[1]
API_PARTS = ("reg(u, idx)", "backward", "optimizer", "after_step_")
LINEAR_PARTS = ("forward", "backward", "optimizer", "after_step_")
AGAINST_MODES = ("dense Adam (epoch)", "sparse_adam (epoch)", "sparse_sgd (epoch)")
_COPIES: list[tempfile.TemporaryDirectory] = []  # the revisions' copies, for this process


def reparam_at(ref: str) -> ModuleType:
    """The package ``reparam`` as it was at git revision ``ref``, imported as ``reparam_<ref>``
    from a temporary copy (its own imports are relative; ``projections`` is today's)."""
    name = "reparam_" + "".join(c if c.isalnum() else "_" for c in ref)
    if name not in sys.modules:
        tar = subprocess.run(
            ["git", "archive", "--format=tar", ref, "reparam"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        _COPIES.append(tempfile.TemporaryDirectory(prefix="reg_step-"))  # removed at exit
        root = Path(_COPIES[-1].name)
        with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
            archive.extractall(root, filter="data")
        (root / "reparam").rename(root / name)
        sys.path.insert(0, str(root))
    return importlib.import_module(name)


def _labels(n_pos: int) -> torch.Tensor:
    labels = torch.zeros(2 * n_pos, dtype=torch.int64)
    labels[::2] = 1
    return labels


def _medians(times: dict, ops: dict) -> dict[str, tuple[float, int]]:
    return {part: (statistics.median(t) * 1e6, ops[part]) for part, t in times.items()}


def api_parts(libs: dict[str, ModuleType], options: dict, steps: int, n_pos: int, batch: int):
    """Per library (``libs``: label -> ``reparam`` module): median us and dispatched operations
    of ``reg(u, idx)``, the backward, the optimizer step (fused Adam on ``reg.parameters()``) and
    ``after_step_()``, the libraries stepping in turn (rotating order) on the same batches."""
    labels, gen = _labels(n_pos), torch.Generator().manual_seed(0)
    runs = {}
    for label, lib in libs.items():
        reg = lib.FBetaRegularizer(labels, preset="paper", **options)
        runs[label] = (reg, torch.optim.Adam(reg.parameters(), lr=1e-3, fused=True))
    times = {label: {part: [] for part in API_PARTS} for label in libs}
    ops = {label: {} for label in libs}
    order = list(libs)
    for k in range(steps + 10):
        idx = torch.randperm(2 * n_pos, generator=gen)[:batch]
        u0 = torch.randn(batch, generator=gen)
        for label in order[k % len(order) :] + order[: k % len(order)]:
            reg, opt = runs[label]
            step = _reg_step(reg, opt, u0.clone().requires_grad_(), idx)
            _run_parts(step, API_PARTS, k, times[label], ops[label])
    return {label: _medians(times[label], ops[label]) for label in libs}


def linear_step_extra(libs: dict[str, ModuleType], options: dict, steps: int, batch: int):
    """What the regularizer adds to a training step of the paper's linear S-MNIST model (one layer
    784 -> 11: 10 classes and the shape node; cross-entropy + 1e-3 L_B; one fused Adam whose
    second parameter group is ``reg.parameters()``, as ``train/build.py`` builds it), per library:
    median us and dispatched operations of the step's parts in the regularized arm minus the
    baseline arm (the same model without the regularizer); all arms step in turn on the same
    batches. N = 111860 (55930 positives, S-MNIST's)."""
    n_pos = 55930
    labels, gen = _labels(n_pos), torch.Generator().manual_seed(0)
    arms = {}
    for label, lib in {"baseline": None, **libs}.items():
        torch.manual_seed(0)
        model = torch.nn.Linear(784, 11)
        reg = None if lib is None else lib.FBetaRegularizer(labels, **options)
        groups = [{"params": list(model.parameters())}]
        if reg is not None:
            groups.append({"params": list(reg.parameters()), "weight_decay": 0.0})
        arms[label] = (model, reg, torch.optim.Adam(groups, lr=1e-2, fused=True))
    times = {label: {part: [] for part in LINEAR_PARTS} for label in arms}
    ops = {label: {} for label in arms}
    order = list(arms)
    for k in range(steps + 10):
        idx = torch.randperm(2 * n_pos, generator=gen)[:batch]
        x = torch.randn(batch, 784, generator=gen)
        y = torch.randint(0, 10, (batch,), generator=gen)
        for label in order[k % len(order) :] + order[: k % len(order)]:
            step = _linear_step(*arms[label], x, y, idx)
            _run_parts(step, LINEAR_PARTS, k, times[label], ops[label])
    base = _medians(times["baseline"], ops["baseline"])
    out = {"baseline": base}
    for label in libs:
        arm = _medians(times[label], ops[label])
        out[label] = {p: (arm[p][0] - base[p][0], arm[p][1] - base[p][1]) for p in LINEAR_PARTS}
    return out


def _reg_step(reg, opt, u, idx):
    """The regularizer's step alone, part by part (a generator: one ``next`` per part)."""
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


def _linear_step(model, reg, opt, x, y, idx):
    """A step of the linear model (``reg`` None: the baseline), part by part."""
    yield
    out = model(x)
    loss = torch.nn.functional.cross_entropy(out[:, :10], y)
    if reg is not None:
        loss = loss + 1e-3 * reg(out[:, 10], idx)
    yield
    opt.zero_grad(set_to_none=True)
    loss.backward()
    yield
    opt.step()
    yield
    if reg is not None:
        reg.after_step_()
    yield


def _run_parts(step, names, k: int, times: dict, ops: dict) -> None:
    """Run the generator ``step`` part by part: at step ``k == COUNT_AT`` count each part's
    dispatched operations into ``ops``, from ``k = 10`` on append each part's seconds to
    ``times``."""
    next(step)
    for name in names:
        if k == COUNT_AT:
            with OpCount() as c:
                next(step)
            ops[name] = c.ops
            continue
        t0 = time.perf_counter()
        next(step)
        if k >= 10:
            times[name].append(time.perf_counter() - t0)


def _cell(us: float, ops: int) -> str:
    return f"{us:.0f} ({ops})"


def against_tables(ref: str, steps: int, batch: int) -> str:
    """The before / after tables of ``--against``: the parts of a step for each step rule, and
    what the regularizer adds to the linear S-MNIST step (paper preset; sparse_sgd)."""
    libs = {ref: reparam_at(ref), "now": importlib.import_module("reparam")}
    out = []
    for mode in AGAINST_MODES:
        r = api_parts(libs, MODES[mode], steps, 55930, batch)
        rows = [
            [part, _cell(*r[ref][part]), _cell(*r["now"][part]), _ratio(r, ref, part)]
            for part in API_PARTS
        ]
        tot = {label: tuple(map(sum, zip(*r[label].values(), strict=True))) for label in libs}
        rows.append(
            ["total", _cell(*tot[ref]), _cell(*tot["now"]), f"{tot['now'][0] / tot[ref][0]:.2f}"]
        )
        out.append(
            f"{mode}, the regularizer alone, n = 55930 positives, B = {batch}: median us "
            f"(dispatched tensor operations)\n\n"
            + markdown_table(["part", f"at {ref}", "now", "now / before"], rows)
        )
    for name, options in (
        ("paper preset (dense tau, projection epoch)", dict(preset="paper")),
        ("sparse_sgd (epoch)", dict(preset="paper", tau_update="sparse_sgd")),
    ):
        r = linear_step_extra(libs, options, steps, batch)
        rows = [
            [
                part,
                _cell(*r["baseline"][part]),
                _cell(*r[ref][part]),
                _cell(*r["now"][part]),
                _ratio(r, ref, part),
            ]
            for part in LINEAR_PARTS
        ]
        tot = {label: tuple(map(sum, zip(*r[label].values(), strict=True))) for label in r}
        rows.append(
            [
                "step",
                _cell(*tot["baseline"]),
                _cell(*tot[ref]),
                _cell(*tot["now"]),
                f"**{tot['now'][0] / tot[ref][0]:.2f}**",
            ]
        )
        out.append(
            f"Linear S-MNIST step, {name}, B = {batch}: the baseline's median us (operations) and "
            f"what the regularizer adds to each part (target: the added step <= 250 us, "
            f"regularized / baseline <= 1.2)\n\n"
            + markdown_table(
                ["part", "baseline", f"added at {ref}", "added now", "now / before"], rows
            )
            + f"\n\nregularized / baseline: {(tot['baseline'][0] + tot[ref][0]) / tot['baseline'][0]:.2f} "
            f"at {ref}, {(tot['baseline'][0] + tot['now'][0]) / tot['baseline'][0]:.2f} now"
        )
    return "\n\n".join(out)


def _ratio(r: dict, ref: str, part: str) -> str:
    before = r[ref][part][0]
    return f"{r['now'][part][0] / before:.2f}" if before > 1 else "-"


def _load() -> str:
    """The 1-minute load average and the CPU count, for the header of a timing."""
    import os

    return f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"


def main(argv: list[str] | None = None) -> int:
    """Time every mode at every size; write ``reg_step.md`` (``reg_step_<device>.md``) and the
    plot. ``--no-sizes``: only the parts of a step (and ``--against``), to ``reg_step_parts.md``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--sizes", default="1e3,1e4,1e5,1e6", help="numbers of positives")
    p.add_argument("--steps", type=int, default=300, help="timed steps per size and mode")
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--compile", action="store_true", help="also the sparse modes with reg.compile()"
    )
    p.add_argument("--no-sizes", action="store_true", help="skip the step-vs-n sweep")
    p.add_argument("--against", metavar="REF", help="also compare with reparam at git revision REF")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--note", default="", help="how busy the machine was, for the header")
    p.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
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
    load = _load()
    parts = []
    if not a.no_sizes:
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
        parts.append(step_table(results, sizes))
    if a.device == "cpu":  # where a step's time goes, at S-MNIST's size (55930 positives)
        parts.append(segment_table(a.batch, a.steps))
        if a.against:
            parts.append(against_tables(a.against, a.steps, a.batch))
    table = "\n\n".join(parts)
    cmd = f"python -m benchmarks.reg_step --batch {a.batch} --steps {a.steps} --device {a.device}"
    cmd += " --compile" if a.compile else ""
    cmd += " --no-sizes" if a.no_sizes else ""
    cmd += f" --against {a.against}" if a.against else ""
    cmd += f" --threads {a.threads}" if a.threads else ""
    a.out.mkdir(parents=True, exist_ok=True)
    stem = "reg_step" + ("" if a.device == "cpu" else f"_{a.device.split(':')[0]}")
    stem += "_parts" if a.no_sizes else ""
    busy = f"; {load} at the start, {_load()} at the end" + (f"; {a.note}" if a.note else "")
    text = (
        f"<!-- {cmd} -->\n{machine_line(a.device)}{busy}; B = {a.batch}, median of {a.steps} "
        f"steps per cell (forward + backward + optimizer + after_step_)\n\n{table}\n"
    )
    (a.out / f"{stem}.md").write_text(text)
    if not a.no_sizes:
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
