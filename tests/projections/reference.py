"""Reference solutions of the projection onto C from a generic QP solver (cvxpy + OSQP).

OSQP with solution polishing solves the active-set KKT system at the end, so it is exact to
~1e-12 even at degenerate points (root exactly at 0, ties), where interior-point solvers such as
Clarabel stop ~1e-6 away.
"""

from __future__ import annotations

import warnings

import numpy as np


def qp_project(delta: float, gamma: np.ndarray) -> tuple[float, np.ndarray]:
    """argmin (e - delta)^2 + ||t - gamma||^2  s.t.  t <= e, e >= 0, by a generic QP solver.

    The problem is scaled to unit size before solving (the solver's tolerances are absolute).
    """
    import cvxpy as cp

    gamma = np.asarray(gamma, dtype=np.float64)
    scale = max(abs(delta), float(np.abs(gamma).max(initial=0.0))) or 1.0
    e = cp.Variable()
    cons = [e >= 0]
    obj = cp.square(e - delta / scale)
    if gamma.size:
        t = cp.Variable(gamma.size)
        cons.append(t <= e)
        obj = obj + cp.sum_squares(t - gamma / scale)
    prob = cp.Problem(cp.Minimize(obj), cons)
    for tol in (1e-10, 1e-9, 1e-8):  # the polish needs the right active set, not a tiny tol
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "solution may be inaccurate": we retry below
            prob.solve(solver=cp.OSQP, eps_abs=tol, eps_rel=tol, polishing=True, max_iter=200_000)
        if prob.status == cp.OPTIMAL and prob.solver_stats.extra_stats.info.status_polish == 1:
            break
    else:
        raise AssertionError(f"OSQP did not reach a polished optimum: {prob.status}")
    tv = t.value * scale if gamma.size else np.zeros(0)
    return float(e.value) * scale, tv
