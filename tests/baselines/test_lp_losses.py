"""The minibatch LP losses (AUC LP (1), F-score LP (3')) against HiGHS, closed forms, cvxpylayers.

Tolerances (float64): values 1e-6 relative to HiGHS; gradients 1e-6 against the closed forms
(pairwise hinge; LP sensitivity from HiGHS duals), 1e-5 against finite differences, 1e-4 against
cvxpylayers (an interior-point cone solver, solved to 1e-10).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from benchmarks.lp_layer import cvxpylayers_lp, highs, scores_batch
from reparam import functional as fn
from reparam.baselines import auc_lp_loss, auc_lp_problem, fbeta_lp_loss, fbeta_lp_problem

BACKWARDS = ["unroll", "active_set"]


def _grad(loss_fn, u):
    u = u.clone().requires_grad_(True)
    loss_fn(u).backward()
    return u.grad


@pytest.mark.parametrize("backward", BACKWARDS)
@pytest.mark.parametrize("solver", ["diagonal", "dense"])
@pytest.mark.parametrize("B, seed", [(12, 0), (24, 1), (40, 2)])
def test_auc_lp_loss_is_the_lp_optimum_and_the_pairwise_hinge(B, seed, solver, backward):
    u, y = scores_batch(B, seed, shift=0.0)  # overlapping classes: many violated pairs
    margin = 0.01
    loss = auc_lp_loss(u, y, margin=margin, solver=solver, backward=backward, reduction="sum")
    ref, _, _ = highs(*auc_lp_problem(u, y, margin=margin))
    assert float(loss) == pytest.approx(ref, rel=1e-6, abs=1e-9)
    hinge = torch.relu(margin - (u[y].unsqueeze(1) - u[~y].unsqueeze(0)))
    assert float(loss) == pytest.approx(float(hinge.sum()), rel=1e-9, abs=1e-9)
    g = _grad(lambda u: auc_lp_loss(u, y, solver=solver, backward=backward), u)
    g_ref = _grad(lambda u: torch.relu(margin - (u[y].unsqueeze(1) - u[~y].unsqueeze(0))).mean(), u)
    torch.testing.assert_close(g, g_ref, atol=1e-6, rtol=0)


@pytest.mark.parametrize("backward", BACKWARDS)
@pytest.mark.parametrize("beta", [1.0, 0.5])
@pytest.mark.parametrize("B, seed", [(16, 0), (32, 1), (64, 2), (128, 3)])
def test_fbeta_lp_loss_matches_highs_and_the_method_note(B, seed, beta, backward):
    u, y = scores_batch(B, seed)
    assert float(u[y].mean()) >= 1  # feasible (docs/method/lp.md sec. 2)
    loss = fbeta_lp_loss(u, y, beta=beta, backward=backward)
    ref, _, v_ref = highs(*fbeta_lp_problem(u, y, beta=beta))
    assert float(loss) == pytest.approx(ref, rel=1e-6)
    # the optimum of (3') with the scores as data: smallest feasible eps, hinge objective
    eps = fn.best_feasible_eps(u[y])
    assert float(loss) == pytest.approx(float(fn.lp_objective(eps, u[~y], int(y.sum()), beta)))
    # gradient = LP sensitivity d f*/d b = -v through b = (u_pos, -u_neg, -1)
    g = _grad(lambda u: fbeta_lp_loss(u, y, beta=beta, backward=backward), u)
    n = int(y.sum())
    np.testing.assert_allclose(g[y].numpy(), -v_ref[:n], atol=1e-6)
    np.testing.assert_allclose(g[~y].numpy(), v_ref[n:-1], atol=1e-6)


def test_fbeta_lp_gradient_matches_finite_differences():
    u, y = scores_batch(24, 5)
    g = _grad(lambda u: fbeta_lp_loss(u, y), u)
    h = 1e-6
    for i in range(24):
        e = torch.zeros_like(u)
        e[i] = h
        fd = (fbeta_lp_loss(u + e, y) - fbeta_lp_loss(u - e, y)) / (2 * h)
        assert float(g[i]) == pytest.approx(float(fd), abs=1e-5)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # cvxpylayers 1.2 on numpy 2
@pytest.mark.skipif(
    importlib.util.find_spec("cvxpylayers") is None, reason="cvxpylayers is not installed"
)
def test_fbeta_lp_solution_gradients_match_cvxpylayers():
    """Gradient of a loss of the primal solution ``z`` through ``b``, ours vs cvxpylayers (diffcp)."""
    u, y = scores_batch(12, 7)
    A, b, c = fbeta_lp_problem(u, y)
    w = torch.linspace(-1, 1, A.shape[1], dtype=torch.float64)
    from reparam.baselines import solve_lp

    ours = {}
    for backward in BACKWARDS:
        bb = b.clone().requires_grad_(True)
        (solve_lp(A, bb, c, backward=backward).z * w).sum().backward()
        ours[backward] = bb.grad
    layer = cvxpylayers_lp(A, c)
    bb = b.clone().requires_grad_(True)
    z = layer(bb)
    np.testing.assert_allclose(z.detach().numpy(), solve_lp(A, b, c).z.numpy(), atol=1e-5)
    (z * w).sum().backward()
    torch.testing.assert_close(ours["unroll"], ours["active_set"], atol=1e-8, rtol=0)
    torch.testing.assert_close(ours["unroll"], bb.grad, atol=1e-4, rtol=0)


def test_elastic_fbeta_lp_equals_exact_on_feasible_batches_and_is_always_feasible():
    u, y = scores_batch(32, 4)
    exact = fbeta_lp_loss(u, y)
    elastic = fbeta_lp_loss(u, y, infeasibility_cost=100.0, steps=80)
    assert float(elastic) == pytest.approx(float(exact), rel=1e-6)
    low, y2 = scores_batch(16, 2, shift=0.0)  # mean u_pos < 1: (3') infeasible
    assert float(low[y2].mean()) < 1
    ref, z, _ = highs(*fbeta_lp_problem(low, y2, infeasibility_cost=100.0))
    assert z[-1] > 0  # the elastic variable pays for the shortfall
    assert float(fbeta_lp_loss(low, y2, infeasibility_cost=100.0, steps=80)) == pytest.approx(
        ref, rel=1e-6
    )


def test_fbeta_lp_problem_maps_back_to_eps_and_tau():
    u, y = scores_batch(16, 3)
    A, b, c = fbeta_lp_problem(u, y)
    n = int(y.sum())
    _, z, _ = highs(A, b, c)
    eps, tau = z[0], z[0] - z[1 : 1 + n]  # tau_i = eps - zeta_i
    assert (tau <= u[y].numpy() + 1e-9).all() and tau.mean() >= 1 - 1e-9
    assert eps == pytest.approx(float(fn.best_feasible_eps(u[y])), rel=1e-7)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda u, y: auc_lp_loss(u, torch.ones_like(y)), "at least one positive and one negative"),
        (lambda u, y: fbeta_lp_loss(u, torch.zeros_like(y)), "at least one positive, got 0"),
        (lambda u, y: auc_lp_loss(u, y.long() * 2), "labels must be 0 or 1"),
        (lambda u, y: auc_lp_loss(u.reshape(2, -1), y), r"scores must have shape \(B,\)"),
        (lambda u, y: auc_lp_loss(u, y[:-1]), "labels must have shape"),
        (lambda u, y: auc_lp_loss(u, y, solver="sparse"), "solver must be one of"),
        (lambda u, y: auc_lp_loss(u, y, margin=-1.0), "margin must be a finite number >= 0"),
        (lambda u, y: fbeta_lp_loss(u, y, beta=0.0), "beta must be a finite number > 0"),
        (lambda u, y: fbeta_lp_loss(u, y.float()), "labels must be a bool or integer"),
    ],
)
def test_bad_input_raises_value_error_naming_it(call, match):
    u, y = scores_batch(8, 0)
    with pytest.raises(ValueError, match=match):
        call(u, y)
