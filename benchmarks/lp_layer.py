"""LP layer benchmark: Newton convergence, and forward+backward time vs batch size B.

    python -m benchmarks.lp_layer                  # full run (minutes on 2 cores), writes the plot
    python -m benchmarks.lp_layer --quick          # small sizes, seconds (smoke test)

Prints two tables measured in one run and writes ``lp_layer.md`` and ``lp_layer.png`` into ``--out``:
(1) Newton steps until the relative gap to HiGHS is <= 1e-6 (and the violation <= 1e-6) on planted
random LPs, the AUC LP and the F-score LP (3'), for our defaults and for the paper's code's setting;
(2) forward+backward time of the LP losses (AUC: |B+||B-| constraints; F-score) next to one step of
the reparameterized regularizer (``reparam.FBetaRegularizer``) on the same scores, and to HiGHS /
cvxpylayers solves of the same LPs where they run (docs/baselines.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import linprog

from benchmarks._report import markdown_table, save_figure, subplots
from benchmarks._timing import fmt_ms, machine_line, median_seconds
from reparam import FBetaRegularizer
from reparam.baselines import (
    auc_lp_loss,
    auc_lp_problem,
    fbeta_lp_loss,
    fbeta_lp_problem,
    solve_lp_trace,
)

OURS = {"eps": 1e-4, "rho": 1e-3}
PAPER_CODE = {"eps": 1e-3, "rho": 1e-4}  # Meng et al.'s released code (rho < eps, full steps)
TOL = 1e-6


# --- reference problems and solvers (the tests use these too) ------------------------------------


def planted_lp(m: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A random feasible bounded LP ``min c^T z, A z <= b, z >= 0`` with a planted optimum.

    ``A`` Gaussian ``(m, n)``; ``p`` random positive coordinates of ``z*`` and ``p`` tight rows with
    positive multipliers, the other rows slack by ``U(0.5, 2)``, reduced costs ``U(0.5, 2)`` on the
    zero coordinates, ``c = w - A^T v``: ``z*`` is the unique, nondegenerate, strictly
    complementary optimum (for generic ``A``).
    """
    g = np.random.default_rng(seed)
    A = g.normal(size=(m, n))
    p = int(g.integers(1, min(n, m) + 1))
    z = np.zeros(n)
    on = g.choice(n, p, replace=False)
    z[on] = g.uniform(0.5, 2, p)
    tight = g.choice(m, p, replace=False)
    v = np.zeros(m)
    v[tight] = g.uniform(0.5, 2, p)
    w = np.zeros(n)
    off = np.setdiff1d(np.arange(n), on)
    w[off] = g.uniform(0.5, 2, off.size)
    b = A @ z
    slack = np.ones(m, bool)
    slack[tight] = False
    b[slack] += g.uniform(0.5, 2, int(slack.sum()))
    return A, b, w - A.T @ v


def highs(A, b, c) -> tuple[float, np.ndarray, np.ndarray]:
    """``(value, z, v)`` of ``min c^T z, A z <= b, z >= 0`` by HiGHS (``v >= 0`` the row duals)."""
    A, b, c = (np.asarray(torch.as_tensor(t).detach().double()) for t in (A, b, c))
    res = linprog(c, A_ub=A, b_ub=b, bounds=[(0, None)] * A.shape[1], method="highs")
    if res.status != 0:
        raise RuntimeError(f"HiGHS: {res.message}")
    return float(res.fun), res.x, -res.ineqlin.marginals


def scores_batch(B: int, seed: int, pos_rate: float = 0.3, shift: float = 2.0):
    """Scores ``(B,)`` float64 and labels: positives ~ N(shift, 1), negatives ~ N(-1, 1)."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.rand(B, generator=g) < pos_rate
    labels[0], labels[-1] = True, False
    u = torch.randn(B, generator=g, dtype=torch.float64) + torch.where(labels, shift, -1.0)
    return u, labels


def steps_to_gap(A, b, c, ref: float, *, steps: int = 60, **solver) -> int | None:
    """First Newton step after which the relative gap and the violation stay <= 1e-6 (None: not in ``steps``)."""
    vals, viol = solve_lp_trace(A, b, c, steps=steps, **solver)
    ok = ((vals - ref).abs() <= TOL * max(1.0, abs(ref))) & (viol <= TOL)
    if not bool(ok[-1]):
        return None
    bad = (~ok).nonzero()
    return int(bad[-1]) + 2 if bad.numel() else 1


def cvxpylayers_lp(
    A: torch.Tensor, c: torch.Tensor
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``b -> z*`` of ``min c^T z, A z <= b, z >= 0`` as a cvxpylayers layer (None: not installed)."""
    if importlib.util.find_spec("cvxpylayers") is None:
        return None
    import cvxpy as cp
    from cvxpylayers.torch import CvxpyLayer

    z = cp.Variable(A.shape[1])
    b = cp.Parameter(A.shape[0])
    prob = cp.Problem(cp.Minimize(c.detach().numpy() @ z), [A.detach().numpy() @ z <= b, z >= 0])
    layer = CvxpyLayer(prob, parameters=[b], variables=[z])

    def solve(bt: torch.Tensor) -> torch.Tensor:
        with warnings.catch_warnings():  # cvxpylayers 1.2's numpy-2 copy= DeprecationWarning
            warnings.simplefilter("ignore", DeprecationWarning)
            return layer(bt, solver_args={"eps": 1e-10, "max_iters": 100_000})[0]

    return solve


# --- (1) convergence ------------------------------------------------------------------------------


def convergence(quick: bool) -> list[list[str]]:
    seeds = range(3) if quick else range(8)
    fam: dict[str, list] = {}
    for m, n in [(12, 3), (30, 6)] if quick else [(12, 3), (30, 6), (60, 8), (200, 20)]:
        fam[f"planted m={m} n={n}"] = [planted_lp(m, n, s) for s in seeds]
    for B in [16, 32] if quick else [16, 32, 48]:
        fam[f"AUC LP (1), B={B} (dense)"] = [auc_lp_problem(*scores_batch(B, s)) for s in seeds]
    for B in [32, 128] if quick else [32, 128, 512]:
        fam[f"F-score LP (3'), B={B}"] = [fbeta_lp_problem(*scores_batch(B, s)) for s in seeds]
    for B in [32] if quick else [32, 128]:
        fam[f"F-score elastic M=100, B={B}"] = [
            fbeta_lp_problem(*scores_batch(B, s, shift=0.5), infeasibility_cost=100.0)
            for s in seeds
        ]
    rows = []
    for name, problems in fam.items():
        row = [name]
        for setting in (OURS, PAPER_CODE):
            its = []
            for A, b, c in problems:
                A, b, c = (torch.as_tensor(t, dtype=torch.float64) for t in (A, b, c))
                its.append(steps_to_gap(A, b, c, highs(A, b, c)[0], **setting))
            done = [k for k in its if k is not None]
            row += [
                f"{len(done)}/{len(its)}",
                f"{statistics.median(done):g} / {max(done)}" if done else "-",
            ]
        rows.append(row)
    return rows


# --- (2) timing ----------------------------------------------------------------------------------


def time_sizes(sizes: list[int], repeats: int) -> list[dict]:
    rows = []
    for B in sizes:
        rows.append(time_one(B, repeats))
        print(f"  B={B} done", flush=True)
    return rows


def _fwd_bwd(loss_fn: Callable[[torch.Tensor], torch.Tensor], u0: torch.Tensor) -> None:
    u = u0.clone().requires_grad_(True)
    loss_fn(u).backward()


def _cvxpylayers_fwd_bwd(layer, b: torch.Tensor, c: torch.Tensor) -> None:
    with warnings.catch_warnings():  # the backward warns too
        warnings.simplefilter("ignore", DeprecationWarning)
        (c * layer(b.clone().requires_grad_(True))).sum().backward()


def time_one(B: int, repeats: int) -> dict:
    """Forward+backward times at batch size ``B`` (float32 scores; reference solvers in float64)."""
    u0, labels = scores_batch(B, seed=B)
    u0 = u0.float()
    n_pos = int(labels.sum())
    r: dict = {"B": B, "pairs": n_pos * (B - n_pos)}

    def t(loss_fn):
        return median_seconds(lambda: _fwd_bwd(loss_fn, u0), repeats=repeats, budget_s=20.0)

    def t_plain(fn):
        return median_seconds(fn, repeats=repeats, budget_s=20.0)

    r["AUC LP diagonal"] = t(lambda u: auc_lp_loss(u, labels))
    dense_ok = r["pairs"] <= 1200
    r["AUC LP dense"] = t(lambda u: auc_lp_loss(u, labels, solver="dense")) if dense_ok else None
    r["F LP unroll"] = t(lambda u: fbeta_lp_loss(u, labels))
    r["F LP active set"] = t(lambda u: fbeta_lp_loss(u, labels, backward="active_set"))
    reg = FBetaRegularizer(labels.long(), beta=1.0)
    idx = torch.arange(B)
    with warnings.catch_warnings():  # it warns that no optimizer steps it: only timed here
        warnings.simplefilter("ignore", RuntimeWarning)
        r["reparam L_B"] = t(lambda u: reg(u, idx))
    A, b, c = fbeta_lp_problem(u0.double(), labels)
    r["F HiGHS (fwd)"] = t_plain(lambda: highs(A, b, c))
    r["AUC HiGHS (fwd)"] = None
    if r["pairs"] <= 5000:  # the dense pairwise LP: (pairs x pairs) doubles, 24 GB at 55k pairs
        Aa, ba, ca = (x.numpy() for x in auc_lp_problem(u0.double(), labels))
        r["AUC HiGHS (fwd)"] = t_plain(lambda: linprog(ca, A_ub=Aa, b_ub=ba, method="highs"))
    layer = cvxpylayers_lp(A, c) if B <= 128 else None
    r["F cvxpylayers"] = t_plain(lambda: _cvxpylayers_fwd_bwd(layer, b, c)) if layer else None
    return r


def plot(rows: list[dict], path: Path) -> None:
    """Two panels: the AUC LP against its number of constraints, the F-score LP against B."""
    fig, (ax_auc, ax_f) = subplots(1, 2, figsize=(11, 4.5))
    panels = {
        ax_auc: ("pairs", ["AUC LP diagonal", "AUC LP dense", "AUC HiGHS (fwd)", "reparam L_B"]),
        ax_f: (
            "B",
            ["F LP unroll", "F LP active set", "F HiGHS (fwd)", "F cvxpylayers", "reparam L_B"],
        ),
    }
    for ax, (x_key, series) in panels.items():
        for key in series:
            pts = [(r[x_key], r[key]) for r in rows if r[key] is not None]
            if pts:
                ax.loglog(*zip(*pts, strict=True), marker="o", label=key)
        ax.set_xlabel("constraints |B+| |B-|" if x_key == "pairs" else "batch size B")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    ax_auc.set_ylabel("median forward + backward time [s]")
    ax_auc.set_title("AUC LP (1)")
    ax_f.set_title("F-score LP (3')")
    save_figure(fig, path, dpi=120, crop=True)


CONVERGENCE = [
    "problem (float64)",
    "ours: converged",
    "ours: median / max steps",
    "paper's code: converged",
    "paper's code: median / max steps",
]
NOTE = (
    f" Newton settings: ours eps={OURS['eps']:g}, rho={OURS['rho']:g}; paper's code "
    f"eps={PAPER_CODE['eps']:g}, rho={PAPER_CODE['rho']:g}; full steps, 60 at most; n/a = not "
    "run at that size (dense AUC: |B+||B-| > 1200; cvxpylayers: B > 128) or not installed."
)


def timing_table(rows: list[dict]) -> str:
    """Per batch size the times of every loss and solver, and two ratios to the regularizer's."""
    keys = [k for k in rows[0] if k not in ("B", "pairs")]
    header = ["B", "pairs B+ x B-", *[f"{k} [ms]" for k in keys]]
    return markdown_table(
        [*header, "F LP unroll / reparam", "AUC diag / reparam"],
        [
            [
                str(r["B"]),
                str(r["pairs"]),
                *[fmt_ms(r[k]) for k in keys],
                f"{r['F LP unroll'] / r['reparam L_B']:.0f}x",
                f"{r['AUC LP diagonal'] / r['reparam L_B']:.1f}x",
            ]
            for r in rows
        ],
    )


def main(argv: list[str] | None = None) -> str:
    """Measure, print and write ``lp_layer.md`` and ``lp_layer.png``; returns the markdown."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/out"), help="where to write")
    ap.add_argument("--quick", action="store_true", help="B = 32, 64 and fewer LPs (smoke test)")
    ap.add_argument("--sizes", type=str, default=None, help="comma list of B, e.g. 32,64")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per cell")
    args = ap.parse_args(argv)
    if args.sizes:
        sizes = [int(s) for s in args.sizes.split(",")]
    else:
        sizes = [32, 64] if args.quick else [32, 64, 128, 256, 512, 1024]
    repeats = args.repeats or (2 if args.quick else 5)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    head = f"# LP layer benchmark\n\n{machine_line()}; median of {repeats} runs; float32 timings."
    print(head + "\n", flush=True)
    conv = markdown_table(CONVERGENCE, convergence(args.quick))
    rows = time_sizes(sizes, repeats)
    sections = {"Newton steps to a relative gap <= 1e-6 (vs HiGHS)": conv}
    sections["Forward + backward time vs B"] = timing_table(rows)
    body = "\n\n".join(f"## {title}\n\n{table}" for title, table in sections.items())
    md, png = args.out / "lp_layer.md", args.out / "lp_layer.png"
    md.write_text(f"{head}{NOTE}\n\n{body}\n")
    plot(rows, png)
    print(f"\n{body}\n\nwrote {md} and {png}")
    return f"{head}{NOTE}\n\n{body}"


if __name__ == "__main__":
    main()
