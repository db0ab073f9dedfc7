"""Projection benchmark: exact (sort, linear, tree) and soft Pi_C vs torch.sort, one elementwise
pass, a generic QP solver, qpth.

    python -m benchmarks.projection                  # full run (~3 min on 2 cores), writes the plot
    python -m benchmarks.projection --quick          # small sizes, seconds (smoke test)

Prints four tables measured in one run and writes ``projection.md`` and ``projection.png`` into
``--out``. Targets (issue 2): linear at n = 1e6 <= 0.1 x torch.sort; exact at n = 1e4 >= 1000x
faster than the generic QP solver; batched 64 x 256 >= 100x faster than qpth. Issue 15: one
vector at n = 1e6 and 1e7 (float32) in <= 3x the time of one ``torch.minimum(tau, e)`` pass.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import torch

from benchmarks._timing import machine_line, median_seconds
from benchmarks.projection_tables import batched_table, memory_table, plot, qp_table, sizes_table
from projections import project_onto_c, soft_project_onto_c
from projections.soft import DIFFSORT_MAX_N

SOFT_STRENGTH = 1e-2


def _data(n: int, device: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.zeros((), device=device), torch.randn(n, generator=gen).to(device)


def time_sizes(sizes: list[int], repeats: int, device: str) -> list[dict]:
    has_torchsort = importlib.util.find_spec("torchsort") is not None
    rows = []
    for n in sizes:
        eps, tau = _data(n, device)
        r = {"n": n}

        def t(fn, eps=eps, tau=tau):
            return median_seconds(lambda: fn(eps, tau), repeats=repeats, device=device)

        r["torch.sort"] = t(lambda eps, tau: torch.sort(tau, descending=True))
        r["torch.minimum"] = t(lambda eps, tau: torch.minimum(tau, eps))
        r["sort"] = t(lambda eps, tau: project_onto_c(eps, tau, method="sort"))
        r["linear"] = t(lambda eps, tau: project_onto_c(eps, tau, method="linear"))
        r["tree"] = t(lambda eps, tau: project_onto_c(eps, tau, method="tree"))
        r["soft smooth"] = t(lambda eps, tau: soft_project_onto_c(eps, tau, strength=SOFT_STRENGTH))
        r["soft sort (torchsort)"] = (
            t(
                lambda eps, tau: soft_project_onto_c(
                    eps, tau, strength=SOFT_STRENGTH, method="sort", sort_backend="torchsort"
                )
            )
            if has_torchsort
            else None
        )
        r["soft sort (diffsort)"] = (
            t(
                lambda eps, tau: soft_project_onto_c(
                    eps, tau, strength=SOFT_STRENGTH, method="sort", sort_backend="diffsort"
                )
            )
            if n <= DIFFSORT_MAX_N
            else None
        )
        rows.append(r)
        print(f"  n={n:.0e} done", flush=True)
    return rows


def time_memory_limit(sizes: list[int], repeats: int, device: str) -> list[dict]:
    """One vector of float32, eps = 0: the linear and tree methods against one
    ``torch.minimum(tau, e)`` pass (allocating, as the projection's output is). Each method is timed
    in turn with the pass (``repeats`` rounds, medians), so that a busy machine slows both alike and
    neither runs right after the other method (whose temporaries evict the caches)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    rows = []
    for n in sizes:
        eps, tau = _data(n, device)
        row: dict = {"n": n}
        for method in ["linear", "tree"]:
            pair = {
                "torch.minimum": lambda eps=eps, tau=tau: torch.minimum(tau, eps),
                method: lambda eps=eps, tau=tau, m=method: project_onto_c(eps, tau, method=m),
            }
            times: dict[str, list[float]] = {k: [] for k in pair}
            for fn in pair.values():
                fn()  # warm-up
            for _ in range(repeats):
                for k, fn in pair.items():
                    sync()
                    t0 = time.perf_counter()
                    fn()
                    sync()
                    times[k].append(time.perf_counter() - t0)
            row[method] = statistics.median(times[method])
            row[f"torch.minimum ({method})"] = statistics.median(times["torch.minimum"])
        row["torch.minimum"] = min(row["torch.minimum (linear)"], row["torch.minimum (tree)"])
        rows.append(row)
        print(f"  n={n:.0e} done", flush=True)
    return rows


def time_qp_solver(n: int, repeats: int) -> dict:
    """A generic QP solver (cvxpy, default QP solver and OSQP) on the same projection problem; ours
    in float64 like the solvers."""
    import cvxpy as cp

    eps, tau = (v.double() for v in _data(n, "cpu"))
    gamma = tau.numpy()
    e, t = cp.Variable(), cp.Variable(n)
    prob = cp.Problem(cp.Minimize(cp.square(e - 0.0) + cp.sum_squares(t - gamma)), [e >= 0, t <= e])
    out = {"n": n}
    for solver in ["CLARABEL", "OSQP"]:
        # time of prob.solve() as a user calls it (canonicalization included) and solver-only
        out[f"cvxpy {solver}"] = median_seconds(
            lambda s=solver: prob.solve(solver=s), repeats=repeats, warmup=1
        )
        out[f"{solver} solver-only"] = prob.solver_stats.solve_time
        e_ref = float(e.value)
    e_ours, _ = project_onto_c(eps, tau)
    out["abs diff of eps"] = abs(e_ref - float(e_ours))
    out["ours (auto)"] = median_seconds(lambda: project_onto_c(eps, tau), repeats=max(repeats, 50))
    out["ours (sort)"] = median_seconds(
        lambda: project_onto_c(eps, tau, method="sort"), repeats=max(repeats, 20)
    )
    return out


def time_batched(rows: int, n: int, repeats: int) -> dict | None:
    """Batched rows x n: ours vs qpth's batched primal-dual interior point QP (forward, fwd+bwd)."""
    if importlib.util.find_spec("qpth") is None:
        return None
    from qpth.qp import QPFunction, QPSolvers

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, n + 1, generator=gen, dtype=torch.float64)
    q = 2 * torch.eye(n + 1, dtype=torch.float64)
    g = torch.zeros(n + 1, n + 1, dtype=torch.float64)
    g[0, 0] = -1.0
    g[1:, 0] = -1.0
    g[1:, 1:] = torch.eye(n, dtype=torch.float64)
    h = torch.zeros(n + 1, dtype=torch.float64)
    empty = torch.empty(0, dtype=torch.float64)
    qp = QPFunction(verbose=-1, eps=1e-10, maxIter=50, solver=QPSolvers.PDIPM_BATCHED)

    def qpth_fwd(x=x):
        return qp(q, -2 * x, g, h, empty, empty)

    def qpth_fwd_bwd():
        xr = x.clone().requires_grad_()
        qp(q, -2 * xr, g, h, empty, empty).sum().backward()

    def ours(method, x=x):
        return project_onto_c(x[:, 0], x[:, 1:], method=method)

    def ours_fwd_bwd():
        xr = x.clone().requires_grad_()
        e, t = project_onto_c(xr[:, 0], xr[:, 1:], method="sort")
        (e.sum() + t.sum()).backward()

    z = qpth_fwd()
    e, t = ours("sort")
    out = {
        "shape": f"{rows} x {n}",
        "max abs diff": float((z - torch.cat([e[:, None], t], 1)).abs().max()),
    }
    out["qpth fwd"] = median_seconds(qpth_fwd, repeats=repeats)
    out["qpth fwd+bwd"] = median_seconds(qpth_fwd_bwd, repeats=repeats)
    for m in ["sort", "linear", "auto"]:
        out[f"ours {m} fwd"] = median_seconds(lambda m=m: ours(m), repeats=max(repeats, 50))
    out["ours sort fwd+bwd"] = median_seconds(ours_fwd_bwd, repeats=max(repeats, 50))
    return out


def main(argv: list[str] | None = None) -> str:
    """Measure, print and write ``projection.md`` and ``projection.png``; returns the markdown."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    ap.add_argument("--sizes", type=str, default=None, help="comma list, e.g. 1e3,1e4")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    args = ap.parse_args(argv)
    if args.sizes:
        sizes = [int(float(s)) for s in args.sizes.split(",")]
    else:
        sizes = [1_000, 10_000] if args.quick else [10**k for k in range(3, 8)]
    repeats = args.repeats or (2 if args.quick else 7)
    qp_n = 1_000 if args.quick else 10_000
    batch = (8, 64) if args.quick else (64, 256)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)

    print(
        f"# Projection benchmark\n\n{machine_line(args.device)}; median of {repeats} runs.\n",
        flush=True,
    )
    rows = time_sizes(sizes, repeats, args.device)
    mem_sizes = [10_000, 100_000] if args.quick else [1_000_000, 10_000_000]
    mem = time_memory_limit(mem_sizes, 3 if args.quick else 31, args.device)
    qp = time_qp_solver(qp_n, 3 if args.quick else 5)
    b = time_batched(*batch, repeats=3 if args.quick else 5)
    report = "\n\n".join(
        [
            f"# Projection benchmark\n\n{machine_line(args.device)}; median of {repeats} runs; "
            f"soft strength {SOFT_STRENGTH}; n/a = backend not installed or above its size limit.",
            "## One vector of n coordinates\n\n" + sizes_table(rows),
            "## Near the memory limit\n\nOne vector, float32, eps = 0; each method timed in turn "
            "with one torch.minimum pass (interleaved), medians; ratios within each pairing.\n\n"
            + memory_table(mem),
            "## Generic QP solver\n\n" + qp_table(qp),
            "## Batched\n\n" + batched_table(b),
        ]
    )
    print("\n" + report.split("\n\n", 2)[2])
    (args.out / "projection.md").write_text(report + "\n")
    plot(rows, args.out / "projection.png")
    print(f"\nwrote {args.out / 'projection.md'} and {args.out / 'projection.png'}")
    return report


if __name__ == "__main__":
    main()
