"""The rate objectives against their exact LPs (scipy HiGHS, ``benchmarks.rate_lp``): the Lagrangian
of the code has the LP's optimum, and the regularizer alone trains a linear head on fixed features
to the LP head's true metrics (the settings of docs/rates.md)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from benchmarks.fbeta_lp import gaussian_toy, train_head
from benchmarks.rate_lp import (
    solve_precision_at_recall,
    solve_recall_at_precision,
    solve_roc_auc,
)
from reparam import ROCAUC, Inline, PrecisionAtRecall, RecallAtPrecision
from reparam import rate_functional as R

CASES = [(2, 1.0, 0), (20, 0.2, 3), (10, 0.4, 2)]  # (dim, class mean, seed); 40 / 60 samples


def _lagrangian(kind, lp, a, s, *, tau=None, w=None, b=None):
    """The code's full Lagrangian (8a-c) at a primal point (default: the LP's) with the LP's
    multipliers; for (8b, 8c) the minimization form, so its optimum is ``-value``."""
    w, b = lp.w if w is None else w, lp.b if b is None else b
    tau = torch.tensor(lp.tau if tau is None else tau)
    lam, nu = torch.tensor(lp.lam), torch.tensor(lp.nu)
    u = torch.tensor(a @ w)
    u_pos, u_neg = u[s == 1], u[s == 0]
    if kind == "par":
        return float(
            R.precision_at_recall_lagrangian(tau, lam, nu[0], u_pos + b[0], u_neg + b[0], 0.8)
        )
    if kind == "rap":
        return float(
            R.recall_at_precision_lagrangian(tau, lam, nu[0], u_pos + b[0], u_neg + b[0], 0.8)
        )
    return float(R.roc_auc_lagrangian(tau, lam, nu, torch.tensor(b), u_pos, u_neg, R.fpr_grid(5)))


@pytest.mark.parametrize("dim, mean, seed", CASES)
@pytest.mark.parametrize("kind", ["par", "rap", "auc"])
def test_the_lagrangian_with_the_lp_multipliers_has_the_lp_optimum(kind, dim, mean, seed):
    """Strong duality for the partial dualization: at the LP's (primal, multipliers) the code's
    Lagrangian equals the optimum, and no primal point of the box ``tau <= 1`` goes below it
    (the LP's solution minimizes the Lagrangian: the multipliers are the right ones)."""
    a, s = gaussian_toy(40, 60, dim, seed=seed, mean=mean)
    solve = {
        "par": lambda: solve_precision_at_recall(a, s, 0.8),
        "rap": lambda: solve_recall_at_precision(a, s, 0.8),
        "auc": lambda: solve_roc_auc(a, s, 5),
    }[kind]
    lp = solve()
    optimum = lp.value if kind == "par" else -lp.value
    assert _lagrangian(kind, lp, a, s) == pytest.approx(optimum, abs=1e-6)
    rng = np.random.default_rng(seed)
    for _ in range(200):  # random primal points around the optimum, tau in its box
        tau = np.minimum(lp.tau + rng.normal(0, 0.5, lp.tau.shape), 1.0)
        w = lp.w + rng.normal(0, 0.5, lp.w.shape)
        b = lp.b + rng.normal(0, 0.5, lp.b.shape)
        assert _lagrangian(kind, lp, a, s, tau=tau, w=w, b=b) >= optimum - 1e-9


def _metrics(u, s):
    s = torch.as_tensor(s)
    recall, precision = R.recall_precision(u[s == 1], u[s == 0])
    return recall, precision, R.roc_auc(u[s == 1], u[s == 0])


def _lp_head_metrics(lp, a, s, column=0):
    return _metrics(torch.tensor(a @ lp.w + lp.b[column]), s)


@pytest.mark.parametrize("dim, mean, seed", [(2, 1.0, 0), (2, 1.0, 1), (20, 0.2, 0)])
def test_precision_at_recall_converges_to_the_lp_head(dim, mean, seed):
    a, s = gaussian_toy(40, 60, dim, seed=seed, mean=mean)
    lp_recall, lp_precision, _ = _lp_head_metrics(solve_precision_at_recall(a, s, 0.8), a, s)
    _, _reg, u = train_head(
        a,
        s,
        regularizer=PrecisionAtRecall,
        recall=0.8,
        schedule=Inline(),
        epochs=200,
        batch_size=20,
        seed=seed,
    )
    recall, precision, _ = _metrics(u, s)
    assert recall >= 0.8 - 0.03
    assert precision >= lp_precision - 0.05, (precision, lp_precision, lp_recall)


@pytest.mark.parametrize("dim, mean, seed", [(2, 1.0, 0), (2, 1.0, 1), (10, 0.4, 2)])
def test_recall_at_precision_converges_to_the_lp_head(dim, mean, seed):
    a, s = gaussian_toy(40, 60, dim, seed=seed, mean=mean)
    lp_recall, lp_precision, _ = _lp_head_metrics(solve_recall_at_precision(a, s, 0.8), a, s)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # feasible: no infeasibility warning
        _, reg, u = train_head(
            a,
            s,
            regularizer=RecallAtPrecision,
            precision=0.8,
            schedule=Inline(),
            epochs=200,
            batch_size=20,
            seed=seed,
        )
    recall, precision, _ = _metrics(u, s)
    assert precision >= 0.8 - 0.03
    assert abs(recall - lp_recall) <= 0.05, (recall, lp_recall, lp_precision)
    assert not reg.stats()["infeasible_suspected"] and reg.stats()["certifiable_margin"] > 0


@pytest.mark.parametrize("dim, mean, seed", [(2, 1.0, 0), (20, 0.2, 0), (20, 0.2, 1)])
def test_roc_auc_converges_to_the_lp_head_and_logistic_regression(dim, mean, seed):
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    a, s = gaussian_toy(40, 60, dim, seed=seed, mean=mean)
    lp_auc = _lp_head_metrics(solve_roc_auc(a, s, 10), a, s)[2]
    logistic = roc_auc_score(
        s, LogisticRegression(C=1e4, max_iter=5000).fit(a, s).decision_function(a)
    )
    _, reg, u = train_head(
        a, s, regularizer=ROCAUC, grid=10, schedule=Inline(), epochs=200, batch_size=20, seed=seed
    )
    auc = _metrics(u, s)[2]
    assert auc >= lp_auc - 0.02 and auc >= logistic - 0.02, (auc, lp_auc, logistic)
    stats = reg.stats()  # on the scores remembered during the last epoch
    assert stats["certified_auc"] <= stats["train_auc"] and abs(stats["train_auc"] - auc) < 0.02


def _rap_on_toy(a, s, precision: float, **options):
    """``RecallAtPrecision`` trained on a 2-D toy as the watch's tests do (120 epochs of 5
    steps, seed 3): ``(head, regularizer, scores)``."""
    return train_head(
        a,
        s,
        regularizer=RecallAtPrecision,
        precision=precision,
        schedule=Inline(),
        epochs=120,
        batch_size=20,
        seed=3,
        **options,
    )


def test_an_uncertifiable_precision_met_at_the_threshold_is_no_alarm_and_nu_can_be_capped():
    """2-D seed 3, precision 0.8: HiGHS proves (8b) infeasible, and the regularizer says the
    certificate is out of reach; the target itself is met at the learned threshold (precision
    0.81 at recall 0.88 on the training scores), so no alarm: no warning,
    ``infeasible_suspected`` false. ``nu`` grows without limit unless capped."""
    a, s = gaussian_toy(40, 60, 2, seed=3, mean=1.0)
    with pytest.raises(RuntimeError, match="infeasible"):
        solve_recall_at_precision(a, s, 0.8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no alarm
        _, reg, _ = _rap_on_toy(a, s, 0.8)
    stats = reg.stats()
    assert stats["certificate_out_of_reach"] and stats["certifiable_margin"] < 0
    assert stats["threshold_met"] and stats["train_precision_at_threshold"] >= 0.8
    assert not stats["infeasible_suspected"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        _, capped, _ = _rap_on_toy(a, s, 0.8, nu_max=2.0)
    assert float(capped.nu) <= 2.0 and capped.stats()["nu_capped"]
    assert float(reg.nu) > 2.0  # uncapped, it keeps growing


def test_a_precision_out_of_reach_of_the_certificate_and_of_every_cut_is_an_alarm():
    """2-D seed 3 with overlapping classes (mean 0.3), precision 0.95: no rescaling certifies it
    and no cut of the training scores reaches it: ``infeasible_suspected``, and one warning that
    names both."""
    a, s = gaussian_toy(40, 60, 2, seed=3, mean=0.3)
    with pytest.warns(RuntimeWarning, match="no cut of the head's remembered training scores") as w:
        _, reg, _ = _rap_on_toy(a, s, 0.95)
    assert "no rescaling of them certifies it" in str(w[0].message)
    stats = reg.stats()
    assert stats["infeasible_suspected"] and stats["certificate_out_of_reach"]
    assert not stats["threshold_met"] and stats["train_precision_at_threshold"] < 0.95
