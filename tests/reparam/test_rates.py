"""Rate objectives (PrecisionAtRecall, RecallAtPrecision, ROCAUC): the minibatch Lagrangian, its
gradients, the dual step, the projection schedule, state, bad input, and the rate math."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from reparam import (
    ROCAUC,
    DenseTau,
    EpochEnd,
    Inline,
    PrecisionAtRecall,
    RecallAtPrecision,
    Tracked,
)
from reparam import rate_functional as R
from tests.protocol import run_protocol

N = 60
KINDS = {
    "par": (PrecisionAtRecall, {"recall": 0.7}),
    "rap": (RecallAtPrecision, {"precision": 0.8}),
    "auc": (ROCAUC, {"grid": 4}),
}


def _setup(kind, seed=0, **kwargs):
    cls, target = KINDS[kind]
    gen = torch.Generator().manual_seed(seed)
    labels = (torch.rand(N, generator=gen) < 0.4).long()
    labels[:2] = torch.tensor([0, 1])
    kwargs.setdefault("schedule", EpochEnd())  # the loss sees tau_param itself (closed forms)
    kwargs.setdefault("dual_every", "epoch")  # the forward moves no multiplier (closed forms)
    reg = cls(labels, **target, **kwargs)
    with torch.no_grad():  # a generic state, not the initial one
        reg.tau_param.copy_(torch.rand(reg.tau_param.shape, generator=gen) * 1.5 - 0.3)
        reg.lam.copy_(torch.rand(reg.lam.shape, generator=gen))
        reg.nu.copy_(torch.rand(reg.nu.shape, generator=gen) + 0.2)
        if kind == "auc":
            reg.offsets.copy_(torch.randn(reg.offsets.shape, generator=gen))
    return reg, labels, gen


def _full_lagrangian(kind, reg, u, labels):
    """(8a-c) in float64 from ``reparam.rate_functional`` (independent of the module's code)."""
    pos = labels == 1
    order = pos.nonzero()[:, 0]  # tau rows follow the dataset order of the positives
    u_pos, u_neg = u.double()[order], u.double()[~pos]
    tau, lam, nu = reg.tau.double(), reg.lam.double(), reg.nu.double()
    if kind == "par":
        return R.precision_at_recall_lagrangian(tau, lam, nu[0], u_pos, u_neg, reg.recall)
    if kind == "rap":
        return R.recall_at_precision_lagrangian(tau, lam, nu[0], u_pos, u_neg, reg.precision)
    return R.roc_auc_lagrangian(
        tau, lam, nu, reg.offsets.double(), u_pos, u_neg, reg.fpr_targets.double()
    )


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("batch", [1, 6, 20])
def test_minibatch_estimate_is_unbiased(kind, batch):
    """The mean of ``L_B`` over the batches of an epoch is the full Lagrangian (8a-c)."""
    reg, labels, gen = _setup(kind)
    u = torch.randn(N, generator=gen)
    perm = torch.randperm(N, generator=gen)
    with torch.no_grad():
        mean_lb = torch.stack([reg(u[idx], idx) for idx in perm.split(batch)]).double().mean()
    expected = float(_full_lagrangian(kind, reg, u, labels).detach())
    assert float(mean_lb) == pytest.approx(expected, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("kind", ["par", "rap"])
def test_gradients_match_closed_forms(kind):
    reg, labels, gen = _setup(kind)
    idx = torch.arange(0, N, 3)
    u = torch.randn(idx.numel(), generator=gen).requires_grad_()
    reg(u, idx).backward()
    pos = labels[idx] == 1
    n = float((labels == 1).sum())
    scale = N / (n * idx.numel())
    slots = reg.layout.slot[idx[pos]]
    nu = float(reg.nu[0])
    with torch.no_grad():
        coef = (
            reg.lam[slots] - nu if kind == "par" else reg.lam[slots] - 1 - nu * (1 - reg.precision)
        )
        g_tau = torch.zeros_like(reg.tau_param)
        g_tau.index_add_(0, slots, scale * coef)
        torch.testing.assert_close(reg.tau_param.grad, g_tau)
        neg_w = 1.0 if kind == "par" else nu * reg.precision
        below_cap = (u <= 1).float()  # the pull -lambda_i min(u_i, 1) stops at 1
        g_u = torch.where(
            pos,
            -scale * reg.lam[reg.layout.slot[idx].clamp_min(0)] * below_cap,
            scale * neg_w * (1 + u > 0).float(),
        )
        torch.testing.assert_close(u.grad, g_u)


def test_roc_auc_gradients_match_closed_forms():
    reg, labels, gen = _setup("auc")
    idx = torch.arange(0, N, 2)
    u = torch.randn(idx.numel(), generator=gen).requires_grad_()
    reg(u, idx).backward()
    pos = labels[idx] == 1
    n, m, k = float((labels == 1).sum()), float((labels == 0).sum()), reg.grid
    s_pos, s_neg = N / (n * idx.numel()), N / (m * idx.numel())
    with torch.no_grad():
        slots = reg.layout.slot[idx[pos]]
        z = u[:, None] + reg.offsets[None, :]
        active = (1 + z[~pos] > 0).float()
        g_tau = torch.zeros_like(reg.tau_param)
        g_tau.index_add_(0, slots, s_pos * (reg.lam[slots] - 1) / k)
        torch.testing.assert_close(reg.tau_param.grad, g_tau)
        pull = reg.lam[slots] * (z[pos] <= 1).float()  # -lambda_ik min(z_ik, 1) stops at 1
        g_b = (-s_pos * pull.sum(0) + s_neg * reg.nu * active.sum(0)) / k
        torch.testing.assert_close(reg.offsets.grad, g_b)
        g_u = torch.zeros_like(u)
        g_u[pos] = -s_pos * pull.sum(1) / k
        g_u[~pos] = s_neg * (reg.nu * active).sum(1) / k
        torch.testing.assert_close(u.grad, g_u)


def test_minibatch_lagrangians_pass_gradcheck_in_float64():
    gen = torch.Generator().manual_seed(4)
    b, k = 9, 3
    is_pos = torch.tensor([1, 0, 1, 1, 0, 0, 1, 0, 1], dtype=torch.bool)

    def r(*shape):
        return torch.randn(*shape, dtype=torch.float64, generator=gen)

    tau, lam, u = r(b).requires_grad_(), r(b).abs(), (r(b) * 0.4 + 0.07).requires_grad_()
    nu = torch.tensor(0.6, dtype=torch.float64, requires_grad=True)
    for fn, target in (
        (R.precision_at_recall_minibatch, 0.7),
        (R.recall_at_precision_minibatch, 0.8),
    ):

        def loss(t, v, n, fn=fn, target=target):
            return fn(t, lam, n, v, is_pos, 1.7, target)

        assert torch.autograd.gradcheck(loss, (tau, u, nu))
    tau_k, lam_k = r(b, k).requires_grad_(), r(b, k).abs()
    z = (r(b, k) * 0.4 + 0.07).requires_grad_()
    nu_k = r(k).abs().requires_grad_()
    grid = R.fpr_grid(k)
    assert torch.autograd.gradcheck(
        lambda t, v, n: R.roc_auc_minibatch(t, lam_k, n, v, is_pos, 1.3, 0.9, grid),
        (tau_k, z, nu_k),
    )


@pytest.mark.parametrize("kind", list(KINDS))
def test_dual_step_uses_remembered_scores(kind):
    reg, labels, gen = _setup(
        kind, dual_lr_lambda=0.5, dual_lr_nu=0.25, schedule=Inline(), nu_max=None
    )
    u = torch.randn(N, generator=gen) * 2
    seen = torch.arange(0, N - 6)  # the last 6 samples get no score this epoch
    for idx in seen.split(9):
        reg(u[idx], idx)
    lam0, nu0, tau = reg.lam.clone(), reg.nu.clone(), reg.tau.detach().clone()
    u_rows = u[reg.layout.pos_index]
    have = reg.seen_ever[reg.layout.pos_index]
    reg.end_epoch_()
    pos, neg_seen = labels == 1, (labels == 0) & reg.seen_ever
    if kind == "auc":
        target = (u_rows[:, None] + reg.offsets.detach()[None, :]).clamp(max=1)
        expected_lam = torch.where(have[:, None], (lam0 + 0.5 * (tau - target)).clamp_min(0), lam0)
        fpr = R.hinge_fp(u[neg_seen][:, None] + reg.offsets.detach()[None, :]).mean(0)
        violation = fpr - reg.fpr_targets
    else:
        expected_lam = torch.where(
            have, (lam0 + 0.5 * (tau - u_rows.clamp(max=1))).clamp_min(0), lam0
        )
        if kind == "par":
            violation = reg.recall - tau.mean()
        else:
            fp = R.hinge_fp(u[neg_seen]).mean() * float((labels == 0).sum())
            violation = reg.precision * fp / float(pos.sum()) - (1 - reg.precision) * tau.mean()
    torch.testing.assert_close(reg.lam, expected_lam)
    torch.testing.assert_close(reg.nu, (nu0 + 0.25 * violation).clamp_min(0).reshape(reg.nu.shape))
    assert bool((reg.lam >= 0).all()) and bool((reg.nu >= 0).all())


@pytest.mark.parametrize("positives", [1, 10, 99])  # of 100
def test_the_default_per_step_nu_step_follows_the_class_counts(positives):
    """P@R's ``nu`` weighs ``fp+ / n`` against a recall (scale ``m / n``), so its default step is
    ``0.1 sqrt(m / n)``; R@P's and ROC-AUC's multipliers are on the scale of their rates (0.1); a
    step given is kept as given. Cooper's equal trajectory at this step: test_peers."""
    y = (torch.arange(100) < positives).long()
    m_over_n = (100 - positives) / positives
    want = 0.1 * m_over_n**0.5
    assert PrecisionAtRecall(y, recall=0.9).dual_lr_nu_step == pytest.approx(want)
    assert PrecisionAtRecall(y, recall=0.9).multiplier_scale == pytest.approx(m_over_n)
    assert RecallAtPrecision(y, precision=0.9).dual_lr_nu_step == pytest.approx(0.1)
    assert ROCAUC(y, grid=4, dual_every="step").dual_lr_nu_step == pytest.approx(0.1)
    assert PrecisionAtRecall(y, recall=0.9, dual_lr_nu_step=0.3).dual_lr_nu_step == 0.3
    assert PrecisionAtRecall(y, recall=0.9).dual_lr_nu == 1.0  # the epoch step: as given


def test_nu_cap_and_a_step_size_set_from_the_loop():
    reg, _, gen = _setup("par", dual_lr_nu=50.0, nu_max=2.0)
    with torch.no_grad():
        reg.tau_param.fill_(-1.0)  # recall constraint badly violated: nu would jump by ~85
    reg(torch.randn(N, generator=gen), torch.arange(N))
    reg.end_epoch_()
    assert float(reg.nu) == 2.0 and reg.stats()["nu_capped"]
    reg.dual_lr_nu = 0.5  # a schedule is an assignment between epochs: the next step uses it
    violation = float(reg.recall - reg.tau.detach().mean())
    reg.end_epoch_()
    assert float(reg.nu) == pytest.approx(min(2.0, 2.0 + 0.5 * violation))


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize(
    "schedule, per_epoch", [(EpochEnd(), 1), (Inline(), 0), (Inline(strength=0.1), 0)], ids=repr
)
def test_projection_count_per_epoch_and_box(kind, schedule, per_epoch):
    reg, _, gen = _setup(kind, schedule=schedule)
    opt = torch.optim.SGD(reg.parameters(), lr=0.5)
    u = torch.randn(N, generator=gen)
    for _epoch in range(2):  # 6 steps each, the scores fixed
        run_protocol(reg, torch.nn.Flatten(0), u[:, None], batch=10, optimizer=opt)
        assert reg.stats()["projections_last_epoch"] == per_epoch
    assert reg.stats()["projections"] == 2 * per_epoch
    assert float(reg.tau.detach().max()) <= 1.0  # the tau the loss uses is in the box
    if schedule == Inline():  # the exact projection onto the box
        torch.testing.assert_close(reg.tau, reg.tau_param.detach().clamp(max=1))
    assert (reg.projection, reg.inline_strength) == (
        schedule.name,
        getattr(schedule, "strength", 0),
    )


@pytest.mark.parametrize("kind", list(KINDS))
def test_state_dict_round_trip_and_float32_state(kind):
    reg, labels, gen = _setup(kind, schedule=EpochEnd())
    u = torch.randn(N, generator=gen)
    reg(u, torch.arange(N))
    reg.end_epoch_()
    cls, target = KINDS[kind]
    clone = cls(labels, **target, schedule=EpochEnd(), dual_every=reg.dual_every)
    clone.load_state_dict(copy.deepcopy(reg.state_dict()))
    for (k, a), (_, b) in zip(reg.state_dict().items(), clone.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    for r in (reg, clone):
        r(u[:20], torch.arange(20))
        r.end_epoch_()
    for (k, a), (_, b) in zip(reg.state_dict().items(), clone.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    half = clone.to(torch.bfloat16)
    assert all(
        v.dtype == torch.float32 for v in half.state_dict().values() if v.is_floating_point()
    )
    assert torch.isfinite(half(torch.randn(5, dtype=torch.bfloat16), torch.arange(5)))


def test_numpy_and_int32_labels_are_accepted():
    labels = np.array([0, 1, 1, 0, 1], dtype=np.int32)
    for reg in (
        PrecisionAtRecall(labels, recall=0.5),
        ROCAUC(labels.tolist(), grid=2),
        RecallAtPrecision(torch.tensor(labels), precision=0.5),
    ):
        # stored in the smallest integer dtype holding the labels (tests/reparam/test_state_bytes.py)
        assert reg.shape_labels.dtype == torch.int8 and reg.shape_labels.tolist() == [0, 1, 1, 0, 1]


@pytest.mark.parametrize(
    "cls, kwargs, match",
    [
        (
            PrecisionAtRecall,
            {"recall": 1.0},
            r"recall must be a finite number > 0 and < 1, got 1\.0",
        ),
        (PrecisionAtRecall, {"recall": 0.0}, "recall must be"),
        (RecallAtPrecision, {"precision": -0.2}, "precision must be"),
        (RecallAtPrecision, {"precision": float("nan")}, "precision must be"),
        (ROCAUC, {"grid": 0}, r"grid must be an integer >= 1 \(grid points K\), got 0"),
        (ROCAUC, {"grid": 2.5}, "grid must be an integer"),
        (PrecisionAtRecall, {"recall": 0.5, "nu_max": -1.0}, "nu_max must be a finite number >= 0"),
        (PrecisionAtRecall, {"recall": 0.5, "dual_lr_nu": -1.0}, "dual_lr_nu must be"),
        (PrecisionAtRecall, {"recall": 0.5, "nu_init": 3.0, "nu_max": 2.0}, "nu_init must be"),
        (RecallAtPrecision, {"precision": 0.5, "lambda_init": -1.0}, "lambda_init must be"),
        (
            PrecisionAtRecall,
            {"recall": 0.5, "positive_class": "1"},
            "positive_class must be an int",
        ),
        (ROCAUC, {"positive_class": 3}, "class 3 has 0 positive"),
        (
            ROCAUC,
            {"schedule": "sometimes"},
            r"schedule must be Tracked\(\) \| EpochEnd\(\) \| Inline\(\), got 'sometimes'$",
        ),
        (
            RecallAtPrecision,
            {"precision": 0.5, "schedule": "epoch"},
            r"got 'epoch' \(the option is a type: schedule=EpochEnd\(\)\)",
        ),
        (ROCAUC, {"schedule": DenseTau()}, r"schedule must be .*, got DenseTau\(\)"),
    ],
)
def test_bad_construction(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(torch.tensor([0, 1, 1, 0]), **kwargs)


# --- the rate math ----------------------------------------------------------------------------------


def _pairwise_auc(u_pos, u_neg):
    d = u_pos[:, None] - u_neg[None, :]
    return float(((d > 0).double() + 0.5 * (d == 0).double()).mean())


@given(
    arrays(np.float64, st.integers(1, 30), elements=st.integers(-4, 4).map(float)),
    arrays(np.float64, st.integers(1, 30), elements=st.integers(-4, 4).map(float)),
)
def test_exact_auc_is_mann_whitney_with_ties(u_pos, u_neg):
    """Integer scores: plenty of ties, which count 1/2."""
    u_pos, u_neg = torch.tensor(u_pos), torch.tensor(u_neg)
    assert R.roc_auc(u_pos, u_neg) == pytest.approx(_pairwise_auc(u_pos, u_neg), abs=1e-12)


SCORES = arrays(np.float64, st.integers(1, 25), elements=st.floats(-3, 3))


@given(SCORES, SCORES, st.floats(0.05, 20))
def test_certified_recall_and_precision_never_exceed_the_true_ones(u_pos, u_neg, scale):
    u_pos, u_neg = torch.tensor(u_pos * scale), torch.tensor(u_neg * scale)
    recall, precision = R.recall_precision(u_pos, u_neg)
    assert R.certified_recall(u_pos) <= recall + 1e-12
    cert = R.certified_precision(u_pos, u_neg)
    if cert is not None:
        assert precision is not None and cert <= precision + 1e-12


@given(SCORES, SCORES, st.lists(st.floats(-3, 3), min_size=1, max_size=8), st.floats(0.1, 10))
def test_certified_auc_never_exceeds_the_exact_auc(u_pos, u_neg, offsets, scale):
    u_pos, u_neg = torch.tensor(u_pos * scale), torch.tensor(u_neg * scale)
    b = torch.tensor(offsets, dtype=torch.float64)
    tpr_lower = torch.clamp(u_pos[:, None] + b, max=1).mean(0).clamp_min(0)
    fpr_upper = R.hinge_fp(u_neg[:, None] + b).mean(0)
    assert R.certified_auc(tpr_lower, fpr_upper) <= R.roc_auc(u_pos, u_neg) + 1e-12


def test_stats_report_sound_bounds_for_each_target():
    """The module's own figures on remembered scores: certificates below the true metrics."""
    gen = torch.Generator().manual_seed(5)
    labels = (torch.rand(200, generator=gen) < 0.4).long()
    u = torch.where(labels == 1, 1.5, -1.5) * 2 + torch.randn(200, generator=gen) * 2
    for reg in (
        PrecisionAtRecall(labels, recall=0.6),
        RecallAtPrecision(labels, precision=0.95),
        ROCAUC(labels, grid=5),
    ):
        reg(u, torch.arange(200))
        stats = reg.stats()
        if isinstance(reg, ROCAUC):
            assert stats["certified_auc"] <= stats["train_auc"]
            assert stats["train_auc"] == pytest.approx(R.roc_auc(u[labels == 1], u[labels == 0]))
        else:
            assert stats["certified_recall"] <= stats["train_recall"]
            assert stats["certified_precision"] <= stats["train_precision"]


def test_best_rescaled_margin_is_the_lp_over_rescalings():
    """``best_rescaled_precision_margin`` against HiGHS on the LP in (c >= 0, d) and the slacks."""
    from scipy.optimize import linprog

    gen = torch.Generator().manual_seed(2)
    for trial in range(6):
        n, m = 12 + trial, 15
        u_pos = torch.randn(n, generator=gen, dtype=torch.float64) + 0.8 * trial / 5
        u_neg = torch.randn(m, generator=gen, dtype=torch.float64) - 0.8 * trial / 5
        a = 0.7
        # variables [c, d, t_i (n), xi_j (m)]: max ((1-a) sum t - a sum xi) / n
        nv = 2 + n + m
        cost = np.zeros(nv)
        cost[2 : 2 + n], cost[2 + n :] = -(1 - a) / n, a / n
        rows, rhs = [], []
        for i in range(n):  # t_i <= c u_i + d ; t_i <= 1 (bound)
            r = np.zeros(nv)
            r[0], r[1], r[2 + i] = -float(u_pos[i]), -1.0, 1.0
            rows.append(r)
            rhs.append(0.0)
        for j in range(m):  # xi_j >= 1 + c u_j + d
            r = np.zeros(nv)
            r[0], r[1], r[2 + n + j] = float(u_neg[j]), 1.0, -1.0
            rows.append(r)
            rhs.append(-1.0)
        bounds = [(0, None), (None, None)] + [(None, 1)] * n + [(0, None)] * m
        res = linprog(cost, A_ub=np.array(rows), b_ub=rhs, bounds=bounds, method="highs")
        assert res.status == 0
        ours = R.best_rescaled_precision_margin(u_pos, u_neg, a)
        assert ours == pytest.approx(-res.fun, abs=1e-5 * (1 + abs(res.fun)))


@pytest.mark.parametrize(
    "make, target",
    [(PrecisionAtRecall, {"recall": 0.8}), (RecallAtPrecision, {"precision": 0.8}), (ROCAUC, {})],
)
def test_rates_refuse_the_tracked_projection(make, target):
    """``Tracked()`` tracks F-beta's shared threshold; the rates' box has none."""
    with pytest.raises(ValueError, match=r"schedule=Tracked\(\) tracks F-beta's shared threshold"):
        make(torch.tensor([0, 1, 1, 0]), schedule=Tracked(), **target)


@pytest.mark.parametrize(
    "make, target",
    [(PrecisionAtRecall, {"recall": 0.8}), (RecallAtPrecision, {"precision": 0.8}), (ROCAUC, {})],
)
@pytest.mark.parametrize(
    "option", [{"projection": "epoch"}, {"inline_strength": 0.1}], ids=lambda o: next(iter(o))
)
def test_rates_take_the_schedule_as_a_type(make, target, option):
    """The default is ``Inline()``; ``projection=``/``inline_strength=`` (strings before 0.4) are
    gone: not keywords any more."""
    labels = torch.tensor([0, 1, 1, 0])
    reg = make(labels, **target)
    assert (reg.projection, reg.inline_strength) == ("inline", 0.0)
    assert make(labels, schedule=Inline(strength=0.2), **target).inline_strength == 0.2
    with pytest.raises(TypeError, match=rf"unexpected keyword argument '{next(iter(option))}'"):
        make(labels, **option, **target)
