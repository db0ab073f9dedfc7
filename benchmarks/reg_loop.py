"""The regularizer's own time in a user's training loop, eager and compiled (CPU or CUDA).

    python -m benchmarks.reg_loop --threads 1 --out docs/figures          # ~3 min on 2 cores
    python -m benchmarks.reg_loop --device cuda --cudagraphs --out docs/figures

The loop a user writes around S-MNIST's paper model: ``Linear(3136, 11)`` (10 digit logits and
the shape node), Adam 1e-3, B = 100 from 111860 samples of which 55930 are positives of the shape
(S-MNIST's), cross-entropy on the digits plus ``alpha * reg(shape_score, idx)`` with the F-beta
regularizer's defaults; one step is the forward, ``backward``, ``opt.step()`` and
``opt.zero_grad()`` (``reg.attach(opt)``: the defaults' sparse ``tau`` steps inside ``opt.step()``).
Every arm is timed with and without ``reg``, the arms in rotating order (drift of a shared machine
hits all alike); the regularizer's own time is the median step with it minus the median step
without it.

* ``eager``: as written;
* ``reg.compile``: eager model and loss, ``reg.compile()`` (the regularizer's forward with its
  backward, and ``after_step_``, the sparse step, one compiled graph each);
* ``compiled``: the user's ``torch.compile`` of the loss (model, cross-entropy and ``reg``) as one
  graph (``fullgraph=True``; AOTAutograd compiles its backward, the accumulation of the rows'
  gradient inside it) and ``torch.compile(opt.step)`` (with ``attach``'s hook, the sparse step;
  torch's optimizers break the graph around their step by design, so it is its own graph);
* ``cudagraphs`` (CUDA, ``--cudagraphs``): the same with ``mode="reduce-overhead"`` (static
  shapes: every batch has B samples); the re-recordings after warm-up are counted
  (``cudagraph_recordings``).

Also per arm: the first steps' time (cold: inductor's on-disk cache is off), and what one step of
the regularizer alone dispatches -- tensor operations eagerly; inductor's generated kernels
compiled; on CUDA the kernel launches the profiler counts.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch
import torch._inductor.config as inductor_config
import torch.nn.functional as F

from benchmarks._report import markdown_table
from benchmarks._timing import OpCount, Recordings, machine_line
from benchmarks.reg_step import _load
from benchmarks.segmentation_step import segmentation_share
from reparam import FBetaRegularizer

SAMPLES, POSITIVES, FEATURES, OUTPUTS = 111860, 55930, 3136, 11
ALPHA = 0.1


class Loop:
    """One arm's model, optimizer and (optional) regularizer, and its step."""

    def __init__(self, device: str, with_reg: bool, mode: str) -> None:
        torch.manual_seed(0)
        self.mode = mode
        self.model = torch.nn.Linear(FEATURES, OUTPUTS).to(device)
        labels = torch.zeros(SAMPLES, dtype=torch.int64)
        labels[torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(0))[:POSITIVES]] = 1
        self.reg = FBetaRegularizer(labels).to(device) if with_reg else None
        params = [*self.model.parameters(), *(self.reg.parameters() if with_reg else [])]
        self.opt = torch.optim.Adam(params, lr=1e-3, capturable=device != "cpu")
        if self.reg is not None:
            self.reg.attach(self.opt)  # the sparse tau steps at opt.step()
        self.opt_step, self.loss = self.opt.step, self._loss
        if mode == "reg.compile":
            if self.reg is not None:
                self.reg.compile()
        elif mode != "eager":
            options = {"mode": "reduce-overhead"} if mode == "cudagraphs" else {}
            self.loss = torch.compile(self._loss, fullgraph=True, **options)
            self.opt_step = torch.compile(self.opt.step, **options)

    def _loss(self, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        out = self.model(x)
        loss = F.cross_entropy(out[:, :10], y)
        if self.reg is not None:
            loss = loss + ALPHA * self.reg(out[:, 10], idx)
        return loss

    def step(self, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor) -> None:
        if self.mode == "cudagraphs":  # a new iteration: the graphs' outputs may be reused
            torch.compiler.cudagraph_mark_step_begin()
        self.loss(x, y, idx).backward()
        self.opt_step()
        self.opt.zero_grad()


def _batches(device: str, batch: int, count: int) -> list[tuple[torch.Tensor, ...]]:
    gen = torch.Generator().manual_seed(1)
    out = []
    for _ in range(count):
        idx = torch.randperm(SAMPLES, generator=gen)[:batch]
        x = torch.randn(batch, FEATURES, generator=gen)
        y = torch.randint(0, 10, (batch,), generator=gen)
        out.append((x.to(device), y.to(device), idx.to(device)))
    return out


def time_arms(device: str, modes: list[str], batch: int, steps: int) -> dict[str, dict]:
    """Median and first-step seconds of every (mode, with reg) arm, in rotating order."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    arms = {(m, r): Loop(device, r, m) for m in modes for r in (False, True)}
    batches = _batches(device, batch, 64)
    times: dict = {a: [] for a in arms}
    first: dict = {}  # arms of a mode that fails are dropped
    for a, loop in list(arms.items()):  # the first steps compile: timed apart, one at a time
        if a not in arms:  # its mode failed
            continue
        sync()
        t0 = time.perf_counter()
        try:
            for k in range(3):
                loop.step(*batches[k])
        except Exception as e:
            print(f"{a[0]} ({'with' if a[1] else 'without'} reg) failed: {str(e)[:300]}")
            arms = {b: v for b, v in arms.items() if b[0] != a[0]}
            continue
        sync()
        first[a] = time.perf_counter() - t0
    order = list(arms)
    recorded = {}  # CUDA graphs recorded per arm in its timed steps (cudagraphs)
    for k in range(steps + 20):
        for a in order[k % len(order) :] + order[: k % len(order)]:
            b = batches[k % len(batches)]
            sync()
            with Recordings() if a[0] == "cudagraphs" else contextlib.nullcontext() as rec:
                t0 = time.perf_counter()
                arms[a].step(*b)
                sync()
                t1 = time.perf_counter()
            if k >= 20:  # (after 3 + 20 steps of the arm)
                times[a].append(t1 - t0)
                recorded[a] = recorded.get(a, 0) + (rec.count if rec is not None else 0)
    return {
        a: {"median": statistics.median(times[a]), "first": first[a], "recorded": recorded[a]}
        for a in arms
    }


def dispatched(device: str, mode: str, batch: int) -> tuple[int, str]:
    """What one steady step of the regularizer alone (its forward, its backward and
    ``after_step_``, which steps ``tau``) dispatches: ``(tensor operations eagerly, or inductor
    kernels compiled; unit)``; on CUDA compiled, the kernel launches of the profiler. Compiled
    arms: ``reg.compile()``."""
    loop = Loop(device, True, "eager")
    reg, batches = loop.reg, _batches(device, batch, 4)
    if mode != "eager":
        reg.compile(**({"mode": "reduce-overhead"} if mode == "cudagraphs" else {}))

    def reg_step(u, idx):
        reg(u.requires_grad_(), idx).backward()
        reg.after_step_()  # the sparse step (attach's hook runs it at opt.step())

    def update():  # eps's step between two steps, not counted
        with torch.no_grad():
            reg.eps_param.sub_(reg.eps_param.grad, alpha=1e-3)
            reg.eps_param.grad = None

    u = [torch.randn(batch, device=device) for _ in range(4)]
    if mode == "eager":
        for k in range(3):
            reg_step(u[k].clone(), batches[k][2])
            update()
        with OpCount() as c:
            reg_step(u[3].clone(), batches[3][2])
        return c.ops, "operations"
    from torch._inductor import metrics

    metrics.reset()
    for k in range(3):
        reg_step(u[k].clone(), batches[k][2])
        update()
    if not device.startswith("cuda"):
        return metrics.generated_kernel_count, "kernels (generated)"
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        reg_step(u[3].clone(), batches[3][2])
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return len(kernels), "kernel launches"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--steps", type=int, default=300, help="timed steps per arm")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--cudagraphs", action="store_true", help="also mode='reduce-overhead'")
    p.add_argument("--segmentation", type=int, default=0, help="steps of the DeepLabV3+ table")
    p.add_argument("--note", default="", help="how busy the machine was, for the header")
    p.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    inductor_config.fx_graph_cache = False  # the first steps: a cold compilation
    modes = ["eager", "reg.compile", "compiled"] + (["cudagraphs"] if a.cudagraphs else [])
    load = _load()
    result = time_arms(a.device, modes, a.batch, a.steps)  # (a failing mode is dropped)
    rows = []
    modes = [m for m in modes if (m, True) in result and (m, False) in result]
    for m in modes:
        base, reg = result[(m, False)], result[(m, True)]
        own = reg["median"] - base["median"]
        count, unit = dispatched(a.device, m, a.batch)
        rows.append(
            [
                m,
                f"{base['median'] * 1e3:.3f}",
                f"{reg['median'] * 1e3:.3f}",
                f"{own * 1e3:.3f}",
                f"{reg['median'] / base['median']:.2f}",
                f"{reg['first']:.1f}",
                f"{count} {unit}"
                + (f"; {reg['recorded']} graphs recorded after warm-up" * (m == "cudagraphs")),
            ]
        )
    header = ["arm", "step, no reg (ms)", "step with reg (ms)", "reg's own (ms)", "ratio"]
    table = markdown_table([*header, "first 3 steps with reg (s)", "reg alone: one step"], rows)
    if a.segmentation:
        try:  # compiling DeepLabV3+ takes minutes
            seg_modes = [m for m in modes if m != "reg.compile"]  # (the user's compile)
            seg = segmentation_share(a.device, seg_modes, a.segmentation, ALPHA)
        except ImportError as e:  # segmentation-models-pytorch missing: the first table alone
            print(f"no DeepLabV3+ table: {e}")
            seg = []
        head = ["network", "arm", "DeepLabV3+ step (ms)", "with reg (ms)", "reg's share"]
        table += "\n\nDeepLabV3+, F-beta defaults on one class's pixels\n\n"
        table += markdown_table(head, seg)
    cmd = f"python -m benchmarks.reg_loop --device {a.device} --batch {a.batch} --steps {a.steps}"
    cmd += (f" --threads {a.threads}" if a.threads else "") + (" --cudagraphs" * a.cudagraphs)
    cmd += f" --segmentation {a.segmentation}" if a.segmentation else ""
    busy = f"; {load} at the start, {_load()} at the end" + (f"; {a.note}" if a.note else "")
    a.out.mkdir(parents=True, exist_ok=True)
    stem = "reg_loop" + ("" if a.device == "cpu" else f"_{a.device.split(':')[0]}")
    (a.out / f"{stem}.md").write_text(
        f"<!-- {cmd} -->\n{machine_line(a.device)}{busy}; B = {a.batch}, median of {a.steps} "
        f"steps per arm, arms in rotating order\n\n{table}\n"
    )
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
