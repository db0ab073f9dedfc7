"""The alternatives behind the regularizers' protocol (``reparam.baselines.objectives``): the loss each
wraps, degenerate batches, Newton losses, the peers' dual steps, state, and the trainer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from reparam.baselines import (
    LPAUC,
    CooperFBeta,
    LibAUCMargin,
    LPFBeta,
    PairwiseAUC,
    SoftFBeta,
    auc_lp_loss,
    fbeta_lp_loss,
    inject_fisher,
    newton_loss,
    pairwise_squared_hinge_auc_loss,
    soft_fbeta_loss,
)
from tests.protocol import run_protocol
from tests.train.run_utils import smnist_args

ROOT = Path(__file__).resolve().parents[2]
LABELS = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1, 0, 1, 0, 0])


def _have(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def test_each_objective_is_its_loss_on_the_batch():
    gen = torch.Generator().manual_seed(0)
    u = torch.randn(12, generator=gen, dtype=torch.float64) + 1.5 * LABELS
    idx = torch.arange(12)
    y = LABELS
    cases = [
        (
            SoftFBeta(LABELS, beta=0.5, temperature=0.3),
            soft_fbeta_loss(u, y, beta=0.5, temperature=0.3),
        ),
        (PairwiseAUC(LABELS, margin=0.7), pairwise_squared_hinge_auc_loss(u, y, margin=0.7)),
        (LPAUC(LABELS, margin=0.05), auc_lp_loss(u, y, margin=0.05)),
        (LPFBeta(LABELS, infeasibility_cost=50.0), fbeta_lp_loss(u, y, infeasibility_cost=50.0)),
    ]
    for reg, expected in cases:
        torch.testing.assert_close(reg(u, idx).double(), expected.double(), rtol=1e-5, atol=1e-6)
    # the positive class is configurable: class 0 as positive flips the labels
    flipped = SoftFBeta(LABELS, positive_class=0)
    torch.testing.assert_close(
        flipped(u, idx).double(), soft_fbeta_loss(u, 1 - y).double(), rtol=1e-5, atol=1e-6
    )


def test_batches_without_positives_or_negatives_give_a_zero_loss():
    negatives, positives = torch.tensor([0, 3, 5]), torch.tensor([1, 2, 4])
    for reg in (SoftFBeta(LABELS), PairwiseAUC(LABELS), LPAUC(LABELS), LPFBeta(LABELS)):
        u = torch.randn(3, requires_grad=True)
        loss = reg(u, negatives)
        loss.backward()
        assert float(loss.detach()) == 0.0 and torch.equal(u.grad, torch.zeros(3))
    assert float(PairwiseAUC(LABELS)(torch.randn(3), positives)) == 0.0
    assert float(SoftFBeta(LABELS)(torch.randn(3), positives)) != 0.0


@pytest.mark.parametrize("newton", ["hessian", "fisher"])
def test_newton_variants_transform_the_gradient_not_the_objective(newton):
    u = (torch.randn(12, dtype=torch.float64) * 0.5).requires_grad_()
    idx = torch.arange(12)
    reg = SoftFBeta(LABELS, temperature=0.5, newton=newton, newton_tikhonov=0.1)
    reg(u, idx).backward()
    v = u.detach().clone().requires_grad_()
    if newton == "hessian":
        expected = newton_loss(
            lambda w: soft_fbeta_loss(w[:, 0], LABELS, temperature=0.5), v[:, None], tikhonov=0.1
        )
    else:
        expected = soft_fbeta_loss(
            inject_fisher(v[:, None], tikhonov=0.1)[:, 0], LABELS, temperature=0.5
        )
    expected.backward()
    torch.testing.assert_close(u.grad, v.grad, rtol=1e-5, atol=1e-6)  # the module works in float32
    plain = u.detach().clone().requires_grad_()
    soft_fbeta_loss(plain, LABELS, temperature=0.5).backward()
    assert not torch.allclose(u.grad, plain.grad)


def test_stats_report_the_true_figures_of_the_remembered_scores():
    reg = PairwiseAUC(LABELS)
    u = torch.linspace(-1, 1, 12) + 2.0 * LABELS
    reg(u, torch.arange(12))
    stats = reg.stats()
    assert stats["train_auc"] == 1.0 and stats["scored_fraction"] == 1.0
    assert stats["train_recall"] == 1.0 and 0 < stats["train_precision"] <= 1


@pytest.mark.parametrize(
    "make",
    [
        lambda beta: LPFBeta(LABELS, beta=beta),
        lambda beta: SoftFBeta(LABELS, beta=beta),
        pytest.param(
            lambda beta: CooperFBeta(LABELS, beta=beta),
            marks=pytest.mark.skipif(not _have("cooper"), reason="cooper-optim is optional"),
        ),
    ],
)
def test_reported_fbeta_honours_beta(make):
    # u > 0 on positives 1, 2 and negatives 0, 3: tp = 2, fn = 3, fp = 2 (by hand)
    u = torch.tensor([1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0])
    for beta in (1.0, 2.0, 0.5):
        reg = make(beta)
        reg(u, torch.arange(12))
        b2 = beta**2
        expected = (1 + b2) * 2 / ((1 + b2) * 2 + b2 * 3 + 2)
        assert reg.stats()["train_fbeta"] == pytest.approx(expected)


def test_bad_arguments():
    with pytest.raises(ValueError, match="newton must be one of"):
        SoftFBeta(LABELS, newton="quasi")
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        SoftFBeta(LABELS, temperature=0.0)
    with pytest.raises(ValueError, match="positive_class must be an int"):
        PairwiseAUC(LABELS, positive_class=1.0)
    with pytest.raises(ValueError, match="class 7 has 0 positive"):
        LPAUC(LABELS, positive_class=7)


def _loop(reg, epochs=20):
    x = torch.randn(12, 2, generator=torch.Generator().manual_seed(1)) + LABELS[:, None] * 1.5
    head = torch.nn.Linear(2, 1)
    run_protocol(
        reg, head, x, epochs=epochs, batch=6, optimizer=lambda p: torch.optim.Adam(p, 0.05)
    )
    return head


@pytest.mark.skipif(
    not _have("cooper"), reason="cooper-optim is optional: pip install cooper-optim"
)
def test_cooper_objective_ascends_its_multipliers_and_keeps_them_from_the_optimizer():
    reg = CooperFBeta(LABELS, dual_lr=0.5)
    _loop(reg)
    lam = reg.multipliers[0].weight.detach()
    assert bool((lam >= 0).all()) and float(lam.max()) > 0  # ascended, projected onto >= 0
    assert all(p.grad is None for p in reg.multipliers.parameters())  # never seen by Adam
    clone = CooperFBeta(LABELS, dual_lr=0.5)
    clone.load_state_dict(reg.state_dict())
    torch.testing.assert_close(clone.multipliers[0].weight, reg.multipliers[0].weight)
    assert reg.stats()["train_fbeta"] is not None


@pytest.mark.skipif(not _have("libauc"), reason="libauc is optional: pip install --no-deps libauc")
def test_libauc_objective_ascends_alpha_and_descends_a_b():
    reg = LibAUCMargin(LABELS, alpha_lr=0.5)
    assert {n for n, _ in reg.named_parameters()} == {"a", "b"}  # alpha is not the optimizer's
    _loop(reg)
    assert float(reg.alpha) > 0 and reg.stats()["train_auc"] > 0.8
    assert float(reg.a.detach()) != 0.0


@pytest.mark.parametrize("name", ["lp_fbeta", "lp_auc", "soft_fbeta", "pairwise_auc"])
def test_the_trainer_runs_every_alternative(digits_smnist, tmp_path, name):
    from train.__main__ import main

    out = tmp_path / "run"
    extra = ["train.epochs=1", "regularizer.projection=null"]
    extra.append("regularizer.lp_fbeta.infeasibility_cost=100")
    assert main([*smnist_args(digits_smnist, out, *extra), "--regularizer", name]) == 0
    final = json.loads((out / "metrics.json").read_text())["final"]
    assert final["reg_train_auc"] is not None and final["test_shape_auc"] is not None


def test_shared_options_that_do_not_apply_are_an_error():
    from train import config as C

    with pytest.raises(
        ValueError, match=r"regularizer\.projection does not apply to regularizer\.name=soft_fbeta"
    ):
        C.load(
            ROOT / "configs" / "demo.yaml",
            ["regularizer.name=soft_fbeta", "regularizer.projection=inline"],
        )
