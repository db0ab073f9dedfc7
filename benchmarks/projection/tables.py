"""The report and the plot of the projection benchmark (one vector, near the memory limit, against a
generic QP solver, batched against qpth)."""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks._report import markdown_table, save_figure, subplots
from benchmarks._timing import fmt_ms, machine_line

from .spec import SOFT_STRENGTH


def _power(n: int) -> str:
    return f"1e{round(math.log10(n))}"


def sizes_table(rows: list[dict]) -> str:
    """Every method's time per ``n``, and the ratios of the exact ones to one pass over ``tau``."""
    keys = [k for k in rows[0] if k != "n"]
    ratios = ["linear / torch.sort", "sort / torch.sort", "tree / torch.minimum"]
    return markdown_table(
        ["n", *[f"{k} [ms]" for k in keys], *ratios],
        [
            [
                _power(r["n"]) if r["n"] > 0 else "0",
                *[fmt_ms(r[k]) for k in keys],
                f"{r['linear'] / r['torch.sort']:.3f}",
                f"{r['sort'] / r['torch.sort']:.2f}",
                f"{r['tree'] / r['torch.minimum']:.2f}",
            ]
            for r in rows
        ],
    )


def memory_table(mem: list[dict], against: str | None = None) -> str:
    """Near the memory limit: linear and tree against one ``torch.minimum`` pass each (and the tree
    at revision ``against``, timed in the tree's rotation)."""
    extra = [] if against is None else [f"tree at {against} [ms]", f"tree at {against} / minimum"]
    header = [
        "n (float32)",
        "torch.minimum(tau, e) [ms]",
        "linear [ms]",
        "tree [ms]",
        "tree / minimum (target <= 3)",
        "linear / minimum",
        *extra,
    ]
    return markdown_table(
        header,
        [
            [
                _power(r["n"]),
                fmt_ms(r["torch.minimum"]),
                fmt_ms(r["linear"]),
                fmt_ms(r["tree"]),
                f"{r['tree'] / r['torch.minimum (tree)']:.2f}",
                f"{r['linear'] / r['torch.minimum (linear)']:.1f}",
                *(
                    []
                    if against is None
                    else [
                        fmt_ms(r["tree (against)"]),
                        f"{r['tree (against)'] / r['torch.minimum (tree)']:.2f}",
                    ]
                ),
            ]
            for r in mem
        ],
    )


def clipped_table(rows: list[dict], against: str | None = None) -> str:
    """The tree by the number of clipped coordinates (and at revision ``against``)."""
    extra = [] if against is None else [f"tree at {against} [ms]", "now / then", "same e*"]
    return markdown_table(
        ["n (float32)", "clipped", "tree [ms]", *extra],
        [
            [
                _power(r["n"]),
                str(r["k"]),
                fmt_ms(r["tree"]),
                *(
                    []
                    if against is None
                    else [fmt_ms(r["against"]), f"{r['tree'] / r['against']:.2f}", str(r["same"])]
                ),
            ]
            for r in rows
        ],
    )


def qp_table(qp: dict) -> str:
    """Ours against cvxpy's QP solvers on one vector (float64)."""
    header = [
        "n (float64)",
        "cvxpy+Clarabel solve() [ms]",
        "Clarabel solver-only [ms]",
        "cvxpy+OSQP solve() [ms]",
        "ours auto [ms]",
        "ours sort [ms]",
        "speed-up vs Clarabel (solve / ours auto)",
        "vs solver-only",
        "abs diff eps",
    ]
    row = [
        f"{qp['n']}",
        *(fmt_ms(qp[k]) for k in ("cvxpy CLARABEL", "CLARABEL solver-only", "cvxpy OSQP")),
        fmt_ms(qp["ours (auto)"]),
        fmt_ms(qp["ours (sort)"]),
        f"{qp['cvxpy CLARABEL'] / qp['ours (auto)']:.0f}x",
        f"{qp['CLARABEL solver-only'] / qp['ours (auto)']:.0f}x",
        f"{qp['abs diff of eps']:.1e}",
    ]
    return markdown_table(header, [row])


def batched_table(b: dict | None) -> str:
    """Ours against qpth on a batch of rows (or why there is no comparison)."""
    if b is None:
        return "qpth is not installed: batched comparison skipped."
    times = ["qpth fwd", "qpth fwd+bwd", "ours sort fwd", "ours linear fwd", "ours auto fwd"]
    times.append("ours sort fwd+bwd")
    header = [
        "batch",
        *[f"{k} [ms]" for k in times],
        "speed-up fwd (qpth / ours auto)",
        "speed-up fwd+bwd",
        "max abs diff",
    ]
    row = [
        b["shape"],
        *(fmt_ms(b[k]) for k in times),
        f"{b['qpth fwd'] / b['ours auto fwd']:.0f}x",
        f"{b['qpth fwd+bwd'] / b['ours sort fwd+bwd']:.0f}x",
        f"{b['max abs diff']:.1e}",
    ]
    return markdown_table(header, [row])


def report(
    rows: list[dict],
    mem: list[dict],
    qp: dict,
    b: dict | None,
    device: str,
    repeats: int,
    against: str | None = None,
) -> str:
    """The markdown of ``projection.md``: the four tables under the machine's line."""
    return "\n\n".join(
        [
            f"# Projection benchmark\n\n{machine_line(device)}; median of {repeats} runs; "
            f"soft strength {SOFT_STRENGTH}; n/a = backend not installed or above its size limit.",
            "## One vector of n coordinates\n\n" + sizes_table(rows),
            "## Near the memory limit\n\nOne vector, float32, eps = 0; each method timed in turn "
            "with one torch.minimum pass (interleaved), medians; ratios within each pairing.\n\n"
            + memory_table(mem, against),
            "## Generic QP solver\n\n" + qp_table(qp),
            "## Batched\n\n" + batched_table(b),
        ]
    )


def plot(rows: list[dict], path: Path) -> None:
    """Every method's median time against ``n`` (log-log; the torch passes dashed)."""
    fig, ax = subplots(figsize=(7, 4.5))
    keys = [k for k in rows[0] if k != "n"]
    for k in keys:
        pts = [(r["n"], r[k]) for r in rows if r[k] is not None]
        if pts:
            ax.loglog(
                *zip(*pts, strict=True),
                marker="o",
                label=k,
                linestyle="--" if k.startswith("torch.") else "-",
            )
    ax.set_xlabel("n (coordinates of tau)")
    ax.set_ylabel("median time [s]")
    ax.set_title("Projection onto C (one vector)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path, dpi=120)
