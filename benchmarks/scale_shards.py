"""The per-sample state sharded over K processes: memory, step and epoch end per process, in one run.

    python -m benchmarks.scale_shards --out docs/figures                  # K = 1, 2, 4; n to 1e8
    python -m benchmarks.scale_shards --max-n 1e6 --out /tmp/shards       # quick
    python -m benchmarks.scale_shards --compile --max-n 1e4 --out docs/figures   # reg.compile()
    python -m benchmarks.scale_shards --groups 2500 --out docs/figures    # per image (groups)

``FBetaRegularizer`` with the library's defaults (``Tracked()`` projection, ``SparseTau()``)
driven with synthetic scores (no network), half of the samples positive, as
``benchmarks.scale_n``. ``K = 1``: one process, the unsharded state. ``K > 1``: gloo processes, one
thread each, each holding its block (``reparam.Shard``) and building only its block's labels;
``owner``: each draws its batch of ``--batch`` from its own block, ``global``: from all samples,
routed to the owners. Each measurement runs in fresh processes (its peak memory is its own).
Reported per (K, sampling, n), the largest over the processes: the median step (forward, backward,
Adam on ``eps`` and, at its step, the sparse ``tau``'s: ``reg.attach(opt)``) and its ratio to the
step at 1e4; the epoch end (every sample scored with a Gaussian score: the distributed root, dual
step and statistics); the process's peak resident memory; the regularizer's state (parameters,
buffers and the sparse gradient accumulator growing with n, Adam's state) per process and as a
fraction of one process's. ``--compile``: the regularizer's ``compile()``
(owner sampling one graph per part; global sampling breaks at the routing), 30 warm-up steps,
written as ``scale_shards_compiled.md``. ``--groups M``: the per-group layout (what ``target:
pixels`` builds): groups of ``M`` consecutive samples (an image's pixels; ``n`` rounded down to a
multiple of ``M``, and at least 4 groups), the blocks whole groups (``Shard(..., unit=M)``), one problem per group;
written as ``scale_shards_groups<M>.md``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

from ._processes import measure_in_fresh_processes, run_child
from ._report import markdown_table, save_figure, subplots
from ._timing import machine_line
from .scale_n import state_tensors  # the state that grows with n

SETUPS = ((1, "none"), (2, "owner"), (2, "global"), (4, "owner"), (4, "global"))


def _measure(
    n: int, sampling: str, batch: int, steps: int, compiled: bool = False, group: int = 0
) -> dict:
    """In this process (one rank of the group, or alone): build, step, end the epoch."""
    import torch
    import torch.distributed as dist

    from reparam import FBetaRegularizer, Shard

    torch.set_num_threads(1)
    unit = max(group, 1)
    shard = (
        Shard.from_process_group(n, sampling=sampling, unit=unit) if sampling != "none" else None
    )
    start, stop = shard.bounds() if shard is not None else (0, n)
    gen = torch.Generator().manual_seed(start)
    labels = torch.zeros(stop - start, dtype=torch.int8)
    labels[(start % 2) :: 2] = 1  # the even samples are the positives
    groups = torch.arange(start, stop) // group if group else None
    reg = FBetaRegularizer(labels, shard=shard, groups=groups)
    del groups
    if compiled:
        reg.compile()
    warm = 30 if compiled else 3  # (compiled: the first calls compile, and recompile once)
    del labels
    opt = torch.optim.Adam(reg.parameters(), lr=1e-2)
    reg.attach(opt)
    times = []
    for k in range(steps + warm):
        low, high = (start, stop) if sampling == "owner" else (0, n)
        idx = torch.randint(low, high, (batch,), generator=gen)
        u = torch.randn(batch, generator=gen).requires_grad_()
        begin = time.perf_counter()
        loss = reg(u, idx)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if k >= warm:
            times.append(time.perf_counter() - begin)
    state = [*state_tensors(reg), *(v for s in opt.state.values() for v in s.values())]
    reg.score_epoch.fill_(0)  # every sample scored, with a score of its own
    reg.scores.normal_(generator=gen)
    if dist.is_initialized():
        dist.barrier()
    begin = time.perf_counter()
    reg.end_epoch_()
    end = time.perf_counter() - begin
    return {
        "step_s": statistics.median(times),
        "epoch_end_s": end,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "state_bytes": sum(t.numel() * t.element_size() for t in state),
    }


def measure(
    n: int,
    sampling: str,
    batch: int,
    steps: int,
    world: int,
    compiled: bool = False,
    group: int = 0,
) -> dict[str, float]:
    """One measurement in fresh processes; the largest value over the processes."""
    args = [n, sampling, batch, steps, compiled, group]
    return measure_in_fresh_processes("benchmarks.scale_shards", args, world)


def _child(spec: str) -> None:
    n, sampling, batch, steps, compiled, group, world, out = json.loads(spec)
    run_child(_measure, [n, sampling, batch, steps, compiled, group], world, out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-n", type=float, default=1e8)
    p.add_argument("--batch", type=int, default=256, help="samples per process and step")
    p.add_argument("--steps", type=int, default=100, help="timed steps per measurement")
    p.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    p.add_argument("--compile", action="store_true", help="the regularizer's compile()")
    p.add_argument("--groups", type=int, default=0, help="samples per group (0: no groups)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        _child(a.child)
        return 0
    unit = max(a.groups, 1)
    # (groups: whole groups, at least 4 of them, so that 4 processes each own one)
    sizes = [max(n // unit, 4) * unit for n in (10**4, 10**7, 10**8) if n <= a.max_n]
    results = []
    for world, sampling in SETUPS:
        for n in sizes:
            r = measure(n, sampling, a.batch, a.steps, world, a.compile, a.groups)
            results.append((world, sampling, n, r))
            print(world, sampling, n, {k: f"{v:.4g}" for k, v in r.items()}, flush=True)
    text = _report(results, a)
    a.out.mkdir(parents=True, exist_ok=True)
    name = (
        "scale_shards"
        + ("_compiled" if a.compile else "")
        + (f"_groups{a.groups}" if a.groups else "")
    )
    (a.out / f"{name}.md").write_text(text)
    _plot(results, a.out / f"{name}.png")
    print(text)
    return 0


def _report(results: list, a: argparse.Namespace) -> str:
    rows = []
    for world, sampling, n, r in results:
        first = next(x for x in results if x[:2] == (world, sampling))[3]
        alone = next(x for x in results if x[0] == 1 and x[2] == n)[3]
        rows.append(
            [
                str(world),
                sampling,
                f"{n:.0e}",
                f"{r['step_s'] * 1e3:.3g}",
                f"{r['step_s'] / first['step_s']:.2f}",
                f"{r['epoch_end_s']:.3g}",
                f"{r['peak_rss_bytes'] / 2**20:.0f}",
                f"{r['state_bytes'] / 2**20:.1f}",
                f"{r['state_bytes'] / n:.2f}",
                f"{r['state_bytes'] / alone['state_bytes']:.3f}",
            ]
        )
    header = [
        "processes K",
        "sampling",
        "n",
        "step (ms)",
        "step / step at the smallest n",
        "epoch end (s)",
        "peak memory per process (MiB)",
        "state per process (MiB)",
        "state per process / n (bytes)",
        "state / one process's",
    ]
    return (
        f"<!-- python -m benchmarks.scale_shards {'--compile ' if a.compile else ''}"
        + (f"--groups {a.groups} " if a.groups else "")
        + f"--max-n {a.max_n:.0e} --batch {a.batch}"
        + (f" --steps {a.steps}" if a.steps != 100 else "")
        + " -->\n"
        f"{machine_line()}; one thread per process, batch {a.batch} per process, median of "
        f"{a.steps} steps; the largest value over the processes"
        + (f"; groups of {a.groups} samples, one problem each" if a.groups else "")
        + "\n\n"
        + markdown_table(header, rows)
        + "\n"
    )


def _plot(results: list, path: Path) -> None:
    fig, axes = subplots(1, 2, figsize=(11, 4))
    for world, sampling in SETUPS:
        rs = [r for r in results if r[:2] == (world, sampling)]
        if not rs:
            continue
        label = f"K = {world}" + (f", {sampling}" if world > 1 else "")
        ns = [r[2] for r in rs]
        axes[0].loglog(ns, [r[3]["peak_rss_bytes"] / 2**20 for r in rs], "o-", label=label)
        axes[1].loglog(ns, [r[3]["step_s"] * 1e3 for r in rs], "o-", label=label)
    axes[0].set(xlabel="n (training samples)", ylabel="MiB", title="peak memory per process")
    axes[1].set(xlabel="n (training samples)", ylabel="ms", title="step per process")
    axes[0].legend(fontsize=7)
    save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(main())
