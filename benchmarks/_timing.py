"""Timing helpers shared by the benchmark scripts (median wall time, CUDA-synchronized)."""

from __future__ import annotations

import contextlib
import importlib
import io
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def median_seconds(
    fn: Callable[[], object],
    *,
    repeats: int = 5,
    warmup: int = 1,
    device: str = "cpu",
    budget_s: float = 30.0,
) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs after ``warmup`` runs.

    CUDA work is synchronized before each clock read. Stops early (at least one timed run) once
    ``budget_s`` seconds have been spent timing, so huge sizes do not take minutes.
    """
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times: list[float] = []
    spent = 0.0
    while len(times) < repeats and (not times or spent < budget_s):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
        spent += times[-1]
    return statistics.median(times)


def rotation_medians(
    calls: dict[str, Callable[[], object]],
    repeats: int,
    *,
    device: str = "cpu",
    warmup: bool = False,
    before: Callable[[], object] | None = None,
) -> dict[str, float]:
    """Median wall time of each of ``calls``, timed in turn for ``repeats`` rounds, so that a busy
    machine slows them alike and none always runs right after the same one. ``before`` runs untimed
    before each call (a pass that evicts the caches, say); CUDA work is synchronized around each
    timed call."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    if warmup:
        for fn in calls.values():
            fn()
    times: dict[str, list[float]] = {key: [] for key in calls}
    for _ in range(repeats):
        for key, fn in calls.items():
            if before is not None:
                before()
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times[key].append(time.perf_counter() - t0)
    return {key: statistics.median(v) for key, v in times.items()}


_ROOT = Path(__file__).resolve().parents[1]
_COPIES: list[tempfile.TemporaryDirectory] = []  # package_at's copies, for this process


def package_at(package: str, ref: str) -> ModuleType:
    """The top-level ``package`` as it was at git revision ``ref``, imported as ``<package>_<ref>``
    from a temporary copy removed at exit (its own imports must be relative), to time it against
    today's in one process."""
    name = f"{package}_" + "".join(c if c.isalnum() else "_" for c in ref)
    if name not in sys.modules:
        git = ["git", "archive", "--format=tar", ref, package]
        tar = subprocess.run(git, cwd=_ROOT, capture_output=True, check=True).stdout
        _COPIES.append(tempfile.TemporaryDirectory(prefix=f"{package}-at-"))
        root = Path(_COPIES[-1].name)
        with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
            archive.extractall(root, filter="data")
        (root / package).rename(root / name)
        sys.path.insert(0, str(root))
    return importlib.import_module(name)


def machine_line(device: str = "cpu") -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = f", {torch.cuda.get_device_name()}" if device.startswith("cuda") else ""
    return (
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {cpu}{gpu}, "
        f"python {platform.python_version()}"
    )


def keep_freed_memory() -> str:
    """Ask glibc's ``malloc`` to keep freed blocks of up to 32 MiB for reuse (``mallopt``: the
    ``mmap`` and trim thresholds), as ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` do,
    or as jemalloc and tcmalloc do by design. By default glibc maps each large temporary afresh
    and unmaps it when freed, so every step pays a page fault per 4 KiB of every temporary: on
    the CPU a large share of a step of many multi-MB temporaries. The words for the table;
    a ``RuntimeError`` where the C library is not glibc."""
    import ctypes
    import ctypes.util

    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        done = libc.mallopt(m_mmap_threshold, 32 << 20) and libc.mallopt(m_trim_threshold, 1 << 30)
    except (OSError, AttributeError) as e:
        raise RuntimeError(f"--keep-freed needs glibc's mallopt: {e}") from e
    if not done:
        raise RuntimeError("--keep-freed: glibc's mallopt refused the thresholds")
    return "glibc malloc keeps freed blocks up to 32 MiB (mallopt)"


def fmt_ms(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    ms = seconds * 1e3
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def alternating_runs(
    config: str, arms: dict[str, list[str]], epochs: int, repeats: int
) -> tuple[dict[str, list[dict]], int]:
    """Train ``config`` with each arm's overrides, ``repeats`` times, alternating (a, b, a, b, ...)
    so drift of the machine hits every arm alike; ``epochs + 1`` epochs a run, no checkpoints.
    Returns every arm's history rows without each run's first (warm-up) epoch, and the steps of
    an epoch."""
    import tempfile

    from train import config as config_mod
    from train.loop import run

    rows: dict[str, list[dict]] = {name: [] for name in arms}
    steps = 0
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            for a, (name, overrides) in enumerate(arms.items()):
                cfg = config_mod.load(
                    config,
                    [
                        *overrides,
                        f"train.epochs={epochs + 1}",
                        "train.checkpoint=false",
                        "train.progress=false",
                        f"train.out={tmp}/arm{a}-run{r}",
                    ],
                )
                history = run(cfg, log=lambda *_: None)["history"]
                steps = history[-1]["steps"]
                rows[name] += history[1:]
    return rows, steps


class Recordings:
    """Counts the CUDA graphs recorded while active (the nodes of inductor's CUDA graph trees,
    ``mode="reduce-overhead"``): after warm-up, a step that replays records none."""

    def __enter__(self) -> Recordings:
        from torch._inductor import cudagraph_trees

        self.count, node = 0, cudagraph_trees.CUDAGraphNode
        self._restore = node, node.__init__

        def counting(graph_node, *args, **kwargs) -> None:
            self.count += 1
            self._restore[1](graph_node, *args, **kwargs)

        node.__init__ = counting
        return self

    def __exit__(self, *exc) -> None:
        node, init = self._restore
        node.__init__ = init


# the step whose dispatched operations interleave counts: a steady one, not the first
COUNT_AT = 4


class OpCount(TorchDispatchMode):
    """Counts the tensor operations dispatched inside the ``with`` block (``ops``)."""

    ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def interleave(arms: dict, batches, names: tuple[str, ...], steps: int) -> tuple[dict, dict]:
    """Step every arm (label -> ``make(*batch)``, a generator that yields once before its step
    and once after each part in ``names``) on the same ``batches(k)``, in rotating order: 10
    warm-up steps, then ``steps`` timed. Returns the seconds of each part per arm and the
    dispatched operations of each part at step ``COUNT_AT`` (not timed)."""
    times = {a: {name: [] for name in names} for a in arms}
    ops: dict = {a: {} for a in arms}
    order = list(arms)
    for k in range(steps + 10):
        batch = batches(k)
        for a in order[k % len(order) :] + order[: k % len(order)]:
            step = arms[a](*batch)
            next(step)
            for name in names:
                t0 = time.perf_counter()
                count = k == COUNT_AT and "compile" not in a  # a dispatch mode breaks a graph
                with OpCount() if count else contextlib.nullcontext() as counter:
                    next(step)
                if counter is not None:
                    ops[a][name] = counter.ops
                elif k >= 10:
                    times[a][name].append(time.perf_counter() - t0)
    return times, ops
