"""The rate objectives' targets bind within a normal budget (``dual_every="step"``), their decision
threshold is tight, and ``calibrate`` picks the held-out threshold (docs/rates.md)."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reparam import EpochEnd, Inline, PrecisionAtRecall, RecallAtPrecision
from reparam import rate_functional as R

# --- the threshold functions against every cut, enumerated ---------------------------------------


def _brute(u_pos, u_neg, kind, target):
    """Every cut ``u > t`` at the midpoints of the distinct scores (and below all), by counting."""
    values = sorted(set(u_pos + u_neg), reverse=True)
    cuts = [(a + b) / 2 for a, b in itertools.pairwise(values)] + [values[-1] - 0.5]
    best = None
    for t in cuts:  # highest first: a tie keeps the earlier (higher) cut
        tp = sum(v > t for v in u_pos)
        k = tp + sum(v > t for v in u_neg)
        recall, precision = tp / len(u_pos), tp / k
        if kind == "recall":
            ok, key = tp >= np.ceil(target * len(u_pos) - 1e-9), precision
        else:
            ok, key = precision >= target - 1e-12, recall
        if ok and (best is None or key > best[0]):
            best = (key, t, recall, precision)
    return best


@settings(max_examples=60, deadline=None)
@given(
    pos=st.lists(st.integers(-5, 5), min_size=1, max_size=12),
    neg=st.lists(st.integers(-5, 5), min_size=0, max_size=12),
    target=st.sampled_from([0.3, 0.5, 0.8, 0.95]),
)
def test_thresholds_match_every_cut_enumerated(pos, neg, target):
    u_pos, u_neg = torch.tensor(pos, dtype=torch.float32), torch.tensor(neg, dtype=torch.float32)
    got = R.threshold_at_recall(u_pos, u_neg, target)
    _, t, recall, precision = _brute(
        [float(v) for v in pos], [float(v) for v in neg], "recall", target
    )
    assert got.met and got.threshold == pytest.approx(t)
    assert (got.recall, got.precision) == pytest.approx((recall, precision))
    got = R.threshold_at_precision(u_pos, u_neg, target)
    want = _brute([float(v) for v in pos], [float(v) for v in neg], "precision", target)
    assert got.met == (want is not None)
    if want is not None:
        assert got.threshold == pytest.approx(want[1])
        assert (got.recall, got.precision) == pytest.approx(want[2:])
    # the decisions reproduce the reported rates
    recall, precision = R.recall_precision(u_pos - got.threshold, u_neg - got.threshold)
    assert recall == pytest.approx(got.recall)


# --- the per-step dual step ------------------------------------------------------------------------


def _labels(n=60, seed=0):
    gen = torch.Generator().manual_seed(seed)
    labels = (torch.rand(n, generator=gen) < 0.4).long()
    labels[:2] = torch.tensor([0, 1])
    return labels, gen


@pytest.mark.parametrize("cls, target", [(PrecisionAtRecall, 0.8), (RecallAtPrecision, 0.7)])
def test_step_puts_the_batch_block_at_its_saddle_then_steps_nu(cls, target):
    labels, gen = _labels()
    key = "recall" if cls is PrecisionAtRecall else "precision"
    reg = cls(labels, **{key: target}, dual_lr_nu_step=0.3)
    assert reg.dual_every == "step"
    idx = torch.randperm(60, generator=gen)[:20]
    u = torch.randn(20, generator=gen) * 2
    nu0 = float(reg.nu)
    pos = labels[idx] == 1
    scale = 60 / (int(labels.sum()) * 20)
    tp = float(u[pos].clamp(max=1).sum())
    if cls is PrecisionAtRecall:
        violation = target - scale * tp
    else:
        fp = float((1 + u[~pos]).clamp_min(0).sum())
        violation = scale * (target * fp - (1 - target) * tp)
    reg(u, idx)
    nu = max(0.0, nu0 + 0.3 * violation)
    assert float(reg.nu) == pytest.approx(nu, rel=1e-5)
    # no per-sample tau or lambda is stored: each positive's block is at its saddle when read
    per_sample = {k for k, v in reg.state_dict().items() if v.dim() and v.shape[0] >= 20}
    layout = {"layout.slot", "layout.pos_index", "layout.tau_group"}
    assert per_sample == {"shape_labels", "scores", "score_epoch", *layout}
    rows = reg.layout.slot[idx[pos]].long()
    tau = reg.tau
    assert torch.allclose(tau[rows], u[pos].clamp(max=1))
    untouched = torch.ones(tau.numel(), dtype=torch.bool)
    untouched[rows] = False
    assert torch.all(tau[untouched] == 1)
    stationary = nu if cls is PrecisionAtRecall else 1 + nu * (1 - target)
    assert reg.stats()["lambda_mean"] == pytest.approx(stationary, rel=1e-5)


def test_step_schedule_refuses_a_lambda_init_it_would_not_keep():
    labels, _ = _labels()
    with pytest.raises(ValueError, match=r"lambda_init=0\.5 .* dual_every='epoch'"):
        PrecisionAtRecall(labels, recall=0.9, lambda_init=0.5)
    assert PrecisionAtRecall(labels, recall=0.9, lambda_init=0.5, dual_every="epoch").lam[0] == 0.5


@pytest.mark.parametrize(
    "cls, key", [(PrecisionAtRecall, "recall"), (RecallAtPrecision, "precision")]
)
def test_batch_violations_average_to_the_full_violation(cls, key):
    """Over a partition of the data into equal batches, the batch estimates average to the
    violation of the remembered scores (the estimate is unbiased)."""
    labels, gen = _labels(60, seed=3)
    reg = cls(labels, **{key: 0.8}, dual_every="epoch")
    u = torch.randn(60, generator=gen)
    estimates = [
        reg._batch_violation(u[idx], labels[idx] == 1) for idx in torch.arange(60).split(12)
    ]
    reg(
        u, torch.arange(60)
    )  # remember every score; with the box, tau = min(u, 1) sets the tau term
    with torch.no_grad():
        reg.tau_param.copy_(u[reg.layout.pos_index.long()].clamp(max=1))
    assert float(torch.stack(estimates).mean()) == pytest.approx(float(reg._violation()), abs=1e-5)


def test_epoch_schedule_moves_nothing_in_the_forward():
    labels, gen = _labels()
    reg = PrecisionAtRecall(labels, recall=0.9, dual_every="epoch")
    before = {k: v.clone() for k, v in reg.state_dict().items() if k in ("nu", "lam", "tau_param")}
    reg(torch.randn(20, generator=gen), torch.arange(20))
    for k, v in before.items():
        assert torch.equal(reg.state_dict()[k], v), k


def test_bad_dual_options_are_value_errors():
    labels, _ = _labels()
    with pytest.raises(ValueError, match="dual_every"):
        PrecisionAtRecall(labels, recall=0.9, dual_every="sometimes")
    with pytest.raises(ValueError, match="dual_lr_nu_step"):
        RecallAtPrecision(labels, precision=0.9, dual_lr_nu_step=-1.0)


# --- the decision threshold binds and is tight -----------------------------------------------------


def _train(x, y, model, reg, epochs, batch, lr, seed=0):
    opt = torch.optim.Adam([*model.parameters(), *reg.parameters()], lr=lr)
    reg.attach(opt)
    gen = torch.Generator().manual_seed(seed)
    for _ in reg.epochs(epochs):
        for idx in torch.randperm(len(y), generator=gen).split(batch):
            loss = reg(model(x[idx]).squeeze(1), idx)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return reg.stats()


def _model(kind, dim, hidden, seed=0):
    torch.manual_seed(seed)
    if kind == "linear":
        return torch.nn.Linear(dim, 1)
    return torch.nn.Sequential(
        torch.nn.Linear(dim, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
    )


def _check_binding(runs, rate_key, slack_hi):
    """Each target met at the objective's own decision within 0.005 and at most ``slack_hi``
    above; the higher target the higher rate; the certificate reported and sound."""
    for target, s in runs.items():
        got = s[f"train_{rate_key}_at_threshold"]
        assert target - 0.005 <= got <= target + slack_hi, (target, got)
        assert s["threshold_met"]
        certified = s[f"certified_{rate_key}"]
        assert certified is None or certified <= s[f"train_{rate_key}"] + 1e-9
    low, high = sorted(runs)
    assert (
        runs[high][f"train_{rate_key}_at_threshold"] > runs[low][f"train_{rate_key}_at_threshold"]
    )


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    x, d = load_digits(return_X_y=True)
    return torch.tensor(x / 16, dtype=torch.float32), torch.tensor((d == 9).astype(np.int64))


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_recall_target_binds_tightly_on_digits(digits, kind):
    """scikit-learn's digits (9 against the rest, 180 positives), 10 epochs of batch 32."""
    x, y = digits
    runs = {
        r: _train(x, y, _model(kind, 64, 64), PrecisionAtRecall(y, recall=r), 10, 32, 1e-2)
        for r in (0.95, 0.99)
    }
    _check_binding(runs, "recall", 0.025)


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_precision_target_binds_on_digits(digits, kind):
    """As above for R@P; precision moves in steps of up to 1/k and the lowest feasible cut can sit
    above a run of negatives on 1,797 samples, so the upper tolerance here is 0.05."""
    x, y = digits
    runs = {
        a: _train(x, y, _model(kind, 64, 64), RecallAtPrecision(y, precision=a), 10, 32, 1e-2)
        for a in (0.9, 0.95)
    }
    _check_binding(runs, "precision", 0.05)


@pytest.fixture(scope="module")
def mnist9(mnist_dir):
    from data_prep.smnist import load_mnist

    images, digits_ = load_mnist(mnist_dir, verify=False)[0]["train"]
    x = torch.from_numpy(images[:50000].reshape(50000, -1).astype(np.float32) / 255)
    return x, torch.from_numpy((digits_[:50000] == 9).astype(np.int64))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["linear", "mlp"])
@pytest.mark.parametrize(
    "cls, key, targets, rate",
    [
        (PrecisionAtRecall, "recall", (0.95, 0.99), "recall"),
        (RecallAtPrecision, "precision", (0.9, 0.95), "precision"),
    ],
)
def test_targets_bind_tightly_on_mnist(mnist9, kind, cls, key, targets, rate):
    """Real MNIST, digit 9 against the rest, 50,000 training images: the user's setting (Adam 1e-3,
    batch 128, the library's defaults) binds within 10 epochs."""
    x, y = mnist9
    runs = {
        t: _train(x, y, _model(kind, 784, 256), cls(y, **{key: t}), 10, 128, 1e-3) for t in targets
    }
    _check_binding(runs, rate, 0.025)


# --- calibrate -----------------------------------------------------------------------------------


def test_calibrate_picks_the_held_out_threshold():
    labels, gen = _labels(200, seed=5)
    reg = PrecisionAtRecall(labels, recall=0.9)
    scores = torch.randn(300, generator=gen)
    val_labels = (torch.rand(300, generator=gen) < 0.3).long()
    scores = scores + 1.5 * val_labels
    got = reg.calibrate(scores, val_labels)
    want = R.threshold_at_recall(scores[val_labels == 1], scores[val_labels == 0], 0.9)
    assert got == want and got.recall >= 0.9
    assert reg.calibrate(scores[:, None].numpy(), val_labels.numpy()) == want
    rap = RecallAtPrecision(labels, precision=0.8).calibrate(scores, val_labels)
    assert rap.met and rap.precision >= 0.8
    assert torch.equal(reg.decision_threshold, torch.zeros(1))  # the state is not changed


@pytest.mark.parametrize(
    "scores, labels, match",
    [
        (torch.randn(10), torch.zeros(10, dtype=torch.long), "labels must contain positives"),
        (torch.randn(10, 2), torch.ones(10, dtype=torch.long), "scores must have shape"),
        (torch.randn(10), torch.ones(9, dtype=torch.long), "labels must have one entry per score"),
        (torch.tensor([0.0, float("nan")]), torch.tensor([1, 0]), "scores must be finite"),
        (torch.arange(4), torch.tensor([1, 0, 1, 0]), "scores must be a floating tensor"),
        (torch.randn(4), torch.tensor([1.0, 0, 1, 0]), "labels must hold integer"),
    ],
)
def test_calibrate_rejects_bad_input(scores, labels, match):
    reg = PrecisionAtRecall(torch.tensor([0, 1, 1, 0]), recall=0.9)
    with pytest.raises(ValueError, match=match):
        reg.calibrate(scores, labels)


def test_decision_threshold_survives_a_state_dict_round_trip():
    labels, gen = _labels()
    reg = PrecisionAtRecall(labels, recall=0.8)
    reg(torch.randn(60, generator=gen), torch.arange(60))
    reg.end_epoch_()
    assert float(reg.decision_threshold) != 0.0
    clone = PrecisionAtRecall(labels, recall=0.8)
    clone.load_state_dict(reg.state_dict())
    assert torch.equal(clone.decision_threshold, reg.decision_threshold)
    assert clone.stats()["decision_threshold"] == reg.stats()["decision_threshold"]


@pytest.mark.parametrize("schedule", [Inline(), EpochEnd()], ids=repr)
@pytest.mark.parametrize(
    "cls, target", [(PrecisionAtRecall, {"recall": 0.8}), (RecallAtPrecision, {"precision": 0.8})]
)
def test_gradient_accumulation_over_per_step_dual_steps(cls, target, schedule):
    """Two batches' losses, one backward: the second forward's dual step writes ``tau`` rows and
    a new ``nu`` while the first batch's graph is alive; the gradient of the first batch is the
    one its own forward saw."""
    labels, gen = _labels(40, seed=1)
    u = torch.randn(40, generator=gen, requires_grad=True)
    reg = cls(labels, **target, schedule=schedule)
    first = reg(u[:10], torch.arange(10))
    (alone,) = torch.autograd.grad(first, u, retain_graph=True)
    second = reg(u[10:20], torch.arange(10, 20))
    (both,) = torch.autograd.grad(first + second, u)
    assert torch.equal(both[:10], alone[:10])


@pytest.mark.parametrize(
    "cls, target", [(PrecisionAtRecall, {"recall": 0.9}), (RecallAtPrecision, {"precision": 0.9})]
)
def test_per_step_schedule_sends_tau_no_gradient_and_no_false_warning(digits, cls, target):
    """At the block's saddle ``L`` is flat in ``tau``: ``tau`` is no parameter at all (R@P's
    coefficient ``lambda - 1 - nu (1 - a)`` is zero only up to rounding, which Adam would turn
    into steps of ~lr), and the misuse monitor raises no false warning."""
    x, y = digits
    reg = cls(y, **target)
    model = _model("linear", 64, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        _train(x, y, model, reg, 3, 64, 1e-2)
    assert list(reg.parameters()) == []
    assert reg.stats()["violation_tau_gt_u_max"] == 0.0
