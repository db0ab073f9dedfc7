"""The measurements of the projection benchmark: every projection's time on one vector of ``n``
coordinates, near the memory limit against one elementwise pass, against a generic QP solver
(cvxpy) and, batched, against qpth."""

from __future__ import annotations

import functools
import importlib.util
from types import ModuleType

import torch

from benchmarks._timing import median_seconds, rotation_medians
from projections import project_onto_c, soft_project_onto_c
from projections.soft import DIFFSORT_MAX_N

from .spec import SOFT_STRENGTH


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


def time_memory_limit(
    sizes: list[int], repeats: int, device: str, against: ModuleType | None = None
) -> list[dict]:
    """One vector of float32, eps = 0: the linear and tree methods against one
    ``torch.minimum(tau, e)`` pass (allocating, as the projection's output is). Each method is timed
    in turn with the pass (``repeats`` rounds, medians), so that a busy machine slows both alike and
    neither runs right after the other method (whose temporaries evict the caches). ``against``
    (the ``projections`` package of another revision): its tree joins the tree's rotation, as
    ``"tree (against)"``."""
    rows = []
    for n in sizes:
        eps, tau = _data(n, device)
        row: dict = {"n": n}
        for method in ["linear", "tree"]:
            pair = {
                "torch.minimum": lambda eps=eps, tau=tau: torch.minimum(tau, eps),
                method: lambda eps=eps, tau=tau, m=method: project_onto_c(eps, tau, method=m),
            }
            if against is not None and method == "tree":
                pair["tree (against)"] = lambda eps=eps, tau=tau: against.project_onto_c(
                    eps, tau, method="tree"
                )
            times = rotation_medians(pair, repeats, device=device, warmup=True)
            if "tree (against)" in times:
                row["tree (against)"] = times["tree (against)"]
            row[method] = times[method]
            row[f"torch.minimum ({method})"] = times["torch.minimum"]
        row["torch.minimum"] = min(row["torch.minimum (linear)"], row["torch.minimum (tree)"])
        rows.append(row)
        print(f"  n={n:.0e} done", flush=True)
    return rows


def time_clipped(
    sizes: list[int], clipped: list[int], repeats: int, against: ModuleType | None = None
) -> list[dict]:
    """One float32 Gaussian vector, ``eps`` set so that ``k`` coordinates are clipped (``r`` =
    the ``k+1``-th largest value; ``k = 0``: ``eps = 0``): the tree's time by ``k`` (which path
    it takes), in turn with the tree at revision ``against`` and one ``torch.minimum`` pass
    before each call (as in :func:`time_memory_limit`); ``same`` whether both give the same
    ``e*``."""
    rows = []
    for n in sizes:
        _, tau = _data(n, "cpu")
        top = torch.sort(tau, descending=True).values
        for k in (k for k in clipped if k < n):
            delta = 0.0 if k == 0 else float((k + 1) * top[k].double() - top[:k].double().sum())
            eps = torch.tensor(delta)
            calls = {"tree": lambda eps=eps, tau=tau: project_onto_c(eps, tau, method="tree")}
            if against is not None:
                calls["against"] = lambda eps=eps, tau=tau: against.project_onto_c(
                    eps, tau, method="tree"
                )
            before = functools.partial(torch.minimum, tau, eps)
            row = {"n": n, "k": k, **rotation_medians(calls, repeats, before=before)}
            if against is not None:
                row["same"] = float(calls["tree"]()[0]) == float(calls["against"]()[0])
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
