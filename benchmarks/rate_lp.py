"""LP references for the rate objectives (docs/method/rates.md sec. 8): (8a) P@R, (8b) R@P and (8c)
ROC-AUC with a linear head on fixed features, solved exactly by scipy HiGHS, and the convergence
table of docs/rates.md (run: ``python -m benchmarks.rate_lp``).

Variables of every LP: ``w (d)``, the offsets (one ``b``, or ``b_k`` per grid point), ``tau`` per
positive (and grid point) and one hinge slack ``xi_j >= max(0, 1 + u_j)`` per negative (and grid
point). The solvers return the optimum, the head and the multipliers of the dualized constraints
(HiGHS marginals, sign-flipped to ``lambda, nu >= 0``), so tests can check the Lagrangian.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from reparam import ROCAUC, EpochEnd, Inline, PrecisionAtRecall, RecallAtPrecision
from reparam import rate_functional as R

from ._report import markdown_row, markdown_table
from .fbeta_lp import gaussian_toy, train_head


@dataclass
class RateLP:
    """An exact solution: ``value`` (the LP's objective as written in docs/method/rates.md sec. 8: the
    bound ``fp+/n`` for (8a), ``mean tau`` for (8b), ``(1/K) sum_k mean tau_k`` for (8c)), the head
    ``w``, ``b`` (``(K,)`` offsets for (8c): ``u + b_k``), ``tau`` and the multipliers ``lam`` of
    ``tau <= u (+ b_k)`` and ``nu`` of the rate constraint(s)."""

    value: float
    w: np.ndarray
    b: np.ndarray
    tau: np.ndarray
    lam: np.ndarray
    nu: np.ndarray


def _solve(c, rows, rhs, bounds, maximize: bool) -> tuple[np.ndarray, np.ndarray, float]:
    a_ub = sp.vstack(rows).tocsr()
    res = linprog(
        -c if maximize else c, A_ub=a_ub, b_ub=np.concatenate(rhs), bounds=bounds, method="highs"
    )
    if res.status != 0:
        raise RuntimeError(f"HiGHS: {res.message}")
    return res.x, -res.ineqlin.marginals, float(-res.fun if maximize else res.fun)


def _blocks(a_pos, a_neg, k: int):
    """Sparse rows ``tau_ik - w.a_i - b_k <= 0`` and ``w.a_j + b_k - xi_jk <= -1`` for ``K = k``
    grid points; variable order ``[w, b (k), tau (n k, point-major), xi (m k)]``."""
    n, m, d = len(a_pos), len(a_neg), a_pos.shape[1]
    nv = d + k + n * k + m * k
    it, ix = d + k, d + k + n * k
    eye_k = sp.identity(k, format="csr")
    ones_n, ones_m = np.ones((n, 1)), np.ones((m, 1))
    # tau rows: for point p and positive i: +tau_(p,i) - a_i w - b_p
    tau_rows = sp.hstack(
        [
            -sp.kron(np.ones((k, 1)), sp.csr_matrix(a_pos)),
            -sp.kron(eye_k, ones_n),
            sp.identity(n * k),
            sp.csr_matrix((n * k, m * k)),
        ]
    )
    hinge_rows = sp.hstack(
        [
            sp.kron(np.ones((k, 1)), sp.csr_matrix(a_neg)),
            sp.kron(eye_k, ones_m),
            sp.csr_matrix((m * k, n * k)),
            -sp.identity(m * k),
        ]
    )
    bounds = [(None, None)] * (d + k) + [(None, 1.0)] * (n * k) + [(0, None)] * (m * k)
    return nv, it, ix, tau_rows, hinge_rows, bounds


def solve_precision_at_recall(a: np.ndarray, s: np.ndarray, recall: float) -> RateLP:
    """(8a): ``min (1/n) sum xi`` s.t. ``tau_i <= u_i``, ``mean tau >= r``, ``tau <= 1``."""
    a_pos, a_neg = a[s == 1], a[s == 0]
    n, m, d = len(a_pos), len(a_neg), a.shape[1]
    nv, it, ix, tau_rows, hinge_rows, bounds = _blocks(a_pos, a_neg, 1)
    c = np.zeros(nv)
    c[ix:] = 1.0 / n
    rate = np.zeros((1, nv))
    rate[0, it:ix] = -1.0 / n  # r - mean tau <= 0
    x, marg, value = _solve(
        c,
        [tau_rows, hinge_rows, sp.csr_matrix(rate)],
        [np.zeros(n), -np.ones(m), [-recall]],
        bounds,
        False,
    )
    return RateLP(value, x[:d], x[d : d + 1], x[it:ix], marg[:n], marg[n + m :])


def solve_recall_at_precision(a: np.ndarray, s: np.ndarray, precision: float) -> RateLP:
    """(8b): ``max mean tau`` s.t. ``tau_i <= u_i``, ``a sum xi <= (1 - a) sum tau``, ``tau <= 1``;
    the rate row is scaled by ``1/n`` so its multiplier is the ``nu`` of the Lagrangian."""
    a_pos, a_neg = a[s == 1], a[s == 0]
    n, m, d = len(a_pos), len(a_neg), a.shape[1]
    nv, it, ix, tau_rows, hinge_rows, bounds = _blocks(a_pos, a_neg, 1)
    c = np.zeros(nv)
    c[it:ix] = 1.0 / n
    rate = np.zeros((1, nv))
    rate[0, ix:] = precision / n
    rate[0, it:ix] = -(1 - precision) / n
    x, marg, value = _solve(
        c,
        [tau_rows, hinge_rows, sp.csr_matrix(rate)],
        [np.zeros(n), -np.ones(m), [0.0]],
        bounds,
        True,
    )
    # maximization: HiGHS's marginals are of the minimized -objective; lambda, nu as printed
    return RateLP(value, x[:d], x[d : d + 1], x[it:ix], marg[:n], marg[n + m :])


def solve_roc_auc(a: np.ndarray, s: np.ndarray, grid: int) -> RateLP:
    """(8c): ``max (1/K) sum_k mean_i tau_ik`` s.t. ``tau_ik <= u_i + b_k``,
    ``(1/m) sum_j xi_jk <= t_k``, ``tau <= 1``; one ``w``, ``K`` offsets."""
    a_pos, a_neg = a[s == 1], a[s == 0]
    n, m, d = len(a_pos), len(a_neg), a.shape[1]
    k = grid
    nv, it, ix, tau_rows, hinge_rows, bounds = _blocks(a_pos, a_neg, k)
    c = np.zeros(nv)
    c[it:ix] = 1.0 / (n * k)
    rate = sp.hstack(
        [sp.csr_matrix((k, d + k + n * k)), sp.kron(sp.identity(k), np.ones((1, m)) / m)]
    )
    t = (np.arange(1, k + 1) - 0.5) / k
    x, marg, value = _solve(
        c, [tau_rows, hinge_rows, rate], [np.zeros(n * k), -np.ones(m * k), t], bounds, True
    )
    tau = x[it:ix].reshape(k, n).T
    lam = marg[: n * k].reshape(k, n).T
    return RateLP(value, x[:d], x[d : d + k], tau, lam, marg[n * k + m * k :])


# --- convergence on fixed features ---------------------------------------------------------------

SETTINGS = {  # name -> train_head arguments (Adam lr 1e-2 on (w, b, tau))
    # the library's defaults: multipliers at every batch (ROC-AUC: once per epoch, its default)
    "defaults: inline, eta 0.1 / 1.0, nu step 0.1 sqrt(m/n), B 20, 200 ep": dict(
        schedule=Inline(), dual_lr_lambda=0.1, dual_lr_nu=1.0, batch_size=20, epochs=200
    ),
    "epoch schedule: inline, eta 0.1 / 1.0, B 20, 200 ep": dict(
        schedule=Inline(),
        dual_lr_lambda=0.1,
        dual_lr_nu=1.0,
        dual_every="epoch",
        batch_size=20,
        epochs=200,
    ),
    "paper preset: epoch, eta 1e-3 / 1e-5, B 20, 40 ep": dict(
        schedule=EpochEnd(),
        dual_lr_lambda=1e-3,
        dual_lr_nu=1e-5,
        dual_every="epoch",
        batch_size=20,
        epochs=40,
    ),
}
PROBLEMS = {  # objective -> (its class, cases (dim, mean), target, the exact solver)
    "P@R r=0.8": (
        PrecisionAtRecall,
        [(2, 1.0), (20, 0.2)],
        dict(recall=0.8),
        solve_precision_at_recall,
    ),
    "R@P a=0.8": (
        RecallAtPrecision,
        [(2, 1.0), (10, 0.4)],
        dict(precision=0.8),
        solve_recall_at_precision,
    ),
    "ROC-AUC K=10": (ROCAUC, [(2, 1.0), (20, 0.2)], dict(grid=10), solve_roc_auc),
}
HEADER = [
    "objective",
    "data",
    "seed",
    "setting",
    "LP head recall / precision / AUC",
    "trained head recall / precision / AUC",
    "logistic AUC",
    "time (s)",
]


def _rates(u: Any, s: np.ndarray) -> tuple[float | None, float | None, float]:
    """Recall and precision of ``u > 0``, and the ROC-AUC of ``u``."""
    import torch

    s = torch.as_tensor(s)
    recall, precision = R.recall_precision(u[s == 1], u[s == 0])
    return recall, precision, R.roc_auc(u[s == 1], u[s == 0])


def _rows(objective: str, seeds: int) -> Iterator[list[str]]:
    """Per case, seed and setting: the LP head's rates, the trained head's, logistic regression's
    AUC and the training time (each row printed as it is done)."""
    import torch
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    cls, cases, target, solve = PROBLEMS[objective]
    for dim, mean in cases:
        for seed in range(seeds):
            a, s = gaussian_toy(40, 60, dim, seed=seed, mean=mean)
            lp = solve(a, s, *target.values())
            ref = _rates(torch.tensor(a @ lp.w + lp.b[0]), s)
            logistic = roc_auc_score(
                s, LogisticRegression(C=1e4, max_iter=5000).fit(a, s).decision_function(a)
            )
            for name, cfg in SETTINGS.items():
                t0 = time.perf_counter()
                _, _, u = train_head(a, s, regularizer=cls, seed=seed, **target, **cfg)
                dt = time.perf_counter() - t0
                row = [
                    objective,
                    f"{dim}-D, +-{mean}",
                    str(seed),
                    name,
                    " / ".join(f"{v:.3f}" for v in ref),
                    " / ".join("-" if v is None else f"{v:.3f}" for v in _rates(u, s)),
                    f"{logistic:.3f}",
                    f"{dt:.1f}",
                ]
                print(markdown_row(row), flush=True)
                yield row


def main(argv: list[str] | None = None) -> int:
    """Every objective against its exact LP optimum; writes ``--out`` (docs/figures/rate_lp.md)."""
    import torch

    ap = argparse.ArgumentParser(description="Rate objectives vs their exact LP optimum")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("docs/figures/rate_lp.md"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = [row for objective in PROBLEMS for row in _rows(objective, args.seeds)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        f"<!-- python -m benchmarks.rate_lp --seeds {args.seeds} -->\n"
        + markdown_table(HEADER, rows)
        + "\n"
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
