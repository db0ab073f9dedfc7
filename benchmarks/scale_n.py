"""The regularizer alone at n = 1e4 ... 1e8 training samples: step time, epoch end, memory, in one run.

    python -m benchmarks.scale_n --out docs/figures                       # n up to 1e8 (~15 min)
    python -m benchmarks.scale_n --max-n 1e6 --out /tmp/scale_n           # quick
    python -m benchmarks.scale_n --replot --out docs/figures              # the figure from its table

``FBetaRegularizer`` driven with synthetic scores (no network): half of the ``n`` samples positive,
batches of ``--batch`` random indices, a random score per sample with a gradient, Adam (lr 1e-2) on
the regularizer's parameters, ``reg.attach(opt)`` (the sparse ``tau`` steps at ``opt.step()``);
every measurement in a fresh process (so its peak memory is its own), ``--processes`` 1 and 2
(gloo, one thread each; each process holds the whole objective, and ``attach``'s hook before the
step exchanges what the mode needs: the dense ``tau`` gradient, or the touched rows of a sparse
one). Modes: ``MODES`` below (the library's defaults, ``Tracked()`` with ``SparseTau()``, O(B) per
step, eager and compiled; the exact inline projection with a dense ``tau``, ``Inline()`` with
``DenseTau()``, O(n) per step), all or ``--modes``. Reported per mode, n
and processes: the median step time (after
warm-up) and its ratio to the smallest n, the epoch end (projection, dual step and the statistics
over all n, every sample scored with a Gaussian score), the exact projection of ``(eps, tau)`` alone against one elementwise
pass over ``tau`` (``clamp``: the memory floor of any pass), the process's peak resident memory, and
the regularizer's state in bytes per training sample: parameters, every buffer (the non-persistent
sparse gradient accumulator too; not the buffers of fixed size, ``PER_BATCH``) and the optimizer's
state (Adam's two moments of a dense ``tau``).

State per mode (docs/method/cost.md sec. 11), per sample + per positive, and at half positives:

* per sample, every mode: 13 B (labels int8, ``slot`` int32, one float32 score per positive class,
  ``score_epoch`` int32);
* dense ``tau`` stepped by Adam: + 21 B per positive (``pos_index`` int32, ``tau_group``
  int8, ``tau``, ``lambda``, Adam's two moments): 23.5 B per sample;
* ``SparseTau()`` (``sparse_adam_ahead``) with ``Tracked()`` (the default): + 38 B per positive
  (``pos_index``, ``tau_group``, ``tau``, ``lambda``, the Adam moments 8 B, the gradient accumulator
  12 B (the summed gradient, the touches, the follow weight of a clipped row), the active set 1 B
  (bool), the step of each row's last touch 4 B (int32)): 32 B per sample.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from reparam import DenseTau, Inline, layout

from ._processes import measure_in_fresh_processes, run_child
from ._report import markdown_table, read_markdown_table, save_figure, subplots
from ._timing import machine_line


@dataclass(frozen=True)
class ModeSpec:
    name: str
    options: dict  # FBetaRegularizer keyword arguments


# buffers whose size is fixed, not set by n: the E(t) table of sparse_adam_ahead
PER_BATCH = ("sparse_tau.ahead",)

MODES = (
    # the defaults: Tracked() + SparseTau() at every n
    ModeSpec("default (tracked + sparse_adam_ahead tau)", {}),
    # the exact inline projection with a dense tau: every row every step
    ModeSpec("inline projection, dense tau", {"schedule": Inline(), "tau": DenseTau()}),
    ModeSpec("default compiled (reg.compile())", {"compile": True}),
)


def _measure(mode: int, n: int, batch: int, steps: int) -> dict[str, float]:
    """In this process (one rank when torch.distributed is initialized): build, step, end the epoch."""
    import torch
    import torch.distributed as dist

    from projections import project_onto_c
    from reparam import FBetaRegularizer

    torch.set_num_threads(1)
    world = dist.get_world_size() if dist.is_initialized() else 1
    gen = torch.Generator().manual_seed(dist.get_rank() if dist.is_initialized() else 0)
    labels = torch.zeros(n, dtype=torch.int8)
    labels[::2] = 1
    options = dict(MODES[mode].options)
    compiled = options.pop("compile", False)
    reg = FBetaRegularizer(labels, **options)
    if compiled:  # the first (warm-up) steps compile
        reg.compile()
    opt = torch.optim.Adam(reg.parameters(), lr=1e-2)
    reg.attach(opt)  # the sparse step at opt.step(); 2 processes: the exchange before it
    state_bytes = sum(t.numel() * t.element_size() for t in state_tensors(reg))
    local = batch // world
    times = []
    for k in range(steps + 3):
        idx = torch.randint(n, (local,), generator=gen)
        u = torch.randn(local, generator=gen).requires_grad_()
        start = time.perf_counter()
        loss = reg(u, idx)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if k >= 3:
            times.append(time.perf_counter() - start)
    state_bytes += sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values())
    # every sample scored (seen_ever), with a score of its own: the dual step's full work on
    # distinct scores (zeros where no step wrote one would be one tie, not what training leaves)
    reg.score_epoch.fill_(0)
    reg.scores.normal_(generator=gen)
    start = time.perf_counter()
    reg.end_epoch_()
    end = time.perf_counter() - start
    tau, eps = reg.tau_param.detach(), reg.eps_param.detach()[0]
    elementwise = _seconds(lambda: tau.clamp(max=1.0))
    projection = _seconds(lambda: project_onto_c(eps, tau))
    return {
        "step_s": statistics.median(times),
        "epoch_end_s": end,
        "projection_s": projection,
        "elementwise_s": elementwise,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "state_bytes_per_sample": state_bytes / n,
    }


def state_tensors(reg) -> list:
    """The regularizer's state that grows with n: its parameters, its buffers but ``PER_BATCH``
    (and the fixed ``SPARE`` places of the layout's scratch of a batch's slots),
    and the sparse ``tau``'s gradient accumulator (not a buffer: ``SparseRows.acc``)."""
    buffers = [b for name, b in reg.named_buffers() if name not in PER_BATCH]
    scratch = getattr(reg.layout, "slot_scratch", None)  # (its SPARE places: fixed, not per n)
    buffers = [b[: -layout.SPARE] if b is scratch else b for b in buffers]
    acc = [reg.sparse_tau.acc] if reg.sparse_tau is not None else []
    return [*reg.parameters(), *buffers, *acc]


def _seconds(fn, repeats: int = 3) -> float:
    """The median wall time of ``fn()`` after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(mode: int, n: int, batch: int, steps: int, processes: int) -> dict[str, float]:
    """One measurement in fresh processes; with 2 processes, the slower rank's times and the
    larger rank's memory."""
    return measure_in_fresh_processes("benchmarks.scale_n", [mode, n, batch, steps], processes)


def _child(spec: str) -> None:
    mode, n, batch, steps, processes, out = json.loads(spec)
    run_child(_measure, [mode, n, batch, steps], processes, out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-n", type=float, default=1e8)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=100, help="timed steps per measurement")
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    p.add_argument(
        "--modes", type=int, nargs="+", default=None, help="indices into MODES (default: all)"
    )
    p.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument(
        "--replot", action="store_true", help="draw scale_n.png from --out's scale_n.md; no runs"
    )
    a = p.parse_args(argv)
    if a.child:
        _child(a.child)
        return 0
    if a.replot:
        _plot(_from_table(a.out / "scale_n.md"), a.out / "scale_n.png")
        return 0
    sizes = [10**k for k in range(4, 9) if 10**k <= a.max_n]
    results = []
    for m, spec in enumerate(MODES):
        if a.modes is not None and m not in a.modes:
            continue
        for processes in a.processes:
            for n in sizes:
                r = measure(m, n, a.batch, a.steps, processes)
                results.append((spec.name, processes, n, r))
                print(spec.name, processes, n, {k: f"{v:.4g}" for k, v in r.items()}, flush=True)
    text = _report(results, a)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "scale_n.md").write_text(text)
    _plot(results, a.out / "scale_n.png")
    print(text)
    return 0


def _report(results: list, a: argparse.Namespace) -> str:
    rows = []
    for name, processes, n, r in results:
        first = next(x for x in results if x[0] == name and x[1] == processes)[3]
        rows.append(
            [
                name,
                str(processes),
                f"{n:.0e}",
                f"{r['step_s'] * 1e3:.3g}",
                f"{r['step_s'] / first['step_s']:.2f}",
                f"{r['epoch_end_s']:.3g}",
                f"{r['projection_s'] * 1e3:.3g}",
                f"{r['projection_s'] / r['elementwise_s']:.1f}",
                f"{r['peak_rss_bytes'] / 2**20:.0f}",
                f"{r['state_bytes_per_sample']:.1f}",
            ]
        )
    header = [
        "mode",
        "processes",
        "n",
        "step (ms)",
        "step / step at 1e4",
        "epoch end (s)",
        "projection (ms)",
        "projection / one elementwise pass",
        "peak memory per process (MiB)",
        "state (bytes / sample)",
    ]
    return (
        f"<!-- python -m benchmarks.scale_n --max-n {a.max_n:.0e} --batch {a.batch}"
        + (f" --steps {a.steps}" if a.steps != 100 else "")
        + (f" --modes {' '.join(map(str, a.modes))}" if a.modes is not None else "")
        + (f" --processes {' '.join(map(str, a.processes))}" if a.processes != [1, 2] else "")
        + " -->\n"
        f"{machine_line()}; one thread per process, batch {a.batch}, median of {a.steps} steps\n\n"
        + markdown_table(header, rows)
        + "\n"
    )


def _from_table(path: Path) -> list:
    """The results as ``main`` collects them, read back from the table ``_report`` wrote (the
    step and the epoch end, which ``_plot`` draws)."""
    return [
        (
            row["mode"],
            int(row["processes"]),
            int(float(row["n"])),
            {"step_s": float(row["step (ms)"]) / 1e3, "epoch_end_s": float(row["epoch end (s)"])},
        )
        for row in read_markdown_table(path)
    ]


def _plot(results: list, path: Path) -> None:
    fig, axes = subplots(1, 2, figsize=(11, 4))
    for name in dict.fromkeys(r[0] for r in results):
        for processes in sorted({r[1] for r in results}):
            rs = [r for r in results if r[0] == name and r[1] == processes]
            label = f"{name}, {processes} process{'es' * (processes > 1)}"
            axes[0].loglog([r[2] for r in rs], [r[3]["step_s"] for r in rs], "o-", label=label)
            axes[1].loglog([r[2] for r in rs], [r[3]["epoch_end_s"] for r in rs], "o-", label=label)
    axes[0].set(xlabel="n (training samples)", ylabel="step (s)", title="per step")
    axes[1].set(xlabel="n (training samples)", ylabel="epoch end (s)", title="per epoch end")
    axes[0].legend(fontsize=7)
    save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(main())
