"""Adapters to the optional peers: skipped with the reason when a peer is absent; ``reparam.baselines``
imports without them."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

from reparam import PrecisionAtRecall, RecallAtPrecision
from reparam import functional as fn
from reparam.baselines import (
    cooper_fbeta_problem,
    cooper_optimizer,
    cooper_rate_problem,
    libauc_aucm_pesg,
)
from reparam.lagrangian import batch_lagrangian

HAS_COOPER = importlib.util.find_spec("cooper") is not None
HAS_LIBAUC = importlib.util.find_spec("libauc") is not None
needs_cooper = pytest.mark.skipif(
    not HAS_COOPER, reason="cooper-optim is not installed (pip install cooper-optim==1.0.1)"
)
needs_libauc = pytest.mark.skipif(
    not HAS_LIBAUC, reason="libauc is not installed (pip install --no-deps libauc==2.0.1)"
)


def test_baselines_imports_without_the_peers_and_says_how_to_install_them():
    code = (
        "import sys; sys.modules['cooper'] = None; sys.modules['libauc'] = None\n"
        "import torch, reparam.baselines\n"
        "try:\n"
        "    reparam.baselines.cooper_fbeta_problem(torch.tensor([0, 1]))\n"
        "except ImportError as e:\n"
        "    print('ImportError:', e)\n"
        "try:\n"
        "    reparam.baselines.libauc_aucm_pesg([])\n"
        "except ImportError as e:\n"
        "    print('ImportError:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install -c constraints.txt cooper-optim==1.0.1" in out.stdout
    assert "pip install -c constraints.txt --no-deps libauc==2.0.1" in out.stdout


@needs_cooper
def test_cooper_lagrangian_is_the_minibatch_lagrangian_of_the_method_note():
    """Same u-gradient as reparam's L_B (docs/method/lp.md sec. 3) for the same lambda, eps."""
    labels = torch.tensor([1, 0, 1, 1, 0, 0, 1, 0, 0, 1])
    cmp = cooper_fbeta_problem(labels, beta=0.5)
    g = torch.Generator().manual_seed(0)
    lam = torch.rand(5, generator=g)
    cmp.tau_le_u.multiplier.weight.data = lam.unsqueeze(-1)
    with torch.no_grad():
        cmp.eps.fill_(0.7)
        cmp.tau.copy_(torch.rand(5, generator=g))
    idx = torch.tensor([0, 1, 3, 4, 8, 9])
    u = torch.randn(6, generator=g, requires_grad=True)
    lagrangian = cmp.compute_cmp_state(u, idx).compute_primal_lagrangian().lagrangian
    (g_cooper,) = torch.autograd.grad(lagrangian, u)
    is_pos = labels[idx] == 1
    slots = torch.where(is_pos, torch.cumsum(labels, 0)[idx] - 1, 0)
    scale = 10 / (5 * 6)
    ours = batch_lagrangian(
        cmp.eps.detach(),
        cmp.tau.detach(),
        u,
        lam,
        torch.tensor(0.0),
        is_pos,
        slots,
        beta=0.5,
        scale=scale,
    )
    (g_ours,) = torch.autograd.grad(ours, u)
    torch.testing.assert_close(g_cooper, g_ours)


@needs_cooper
def test_cooper_descent_ascent_runs_with_indexed_multipliers():
    torch.manual_seed(0)
    N = 60
    labels = (torch.arange(N) % 3 == 0).long()
    x = torch.randn(N, 2) + torch.where(labels[:, None] == 1, 1.5, -1.5)
    head = torch.nn.Linear(2, 1)
    cmp = cooper_fbeta_problem(labels)
    opt = cooper_optimizer(cmp, head.parameters(), primal_lr=1e-2, dual_lr=0.5)
    for _ in range(30):
        for idx in torch.randperm(N).split(20):
            opt.roll(compute_cmp_state_kwargs={"scores": head(x[idx])[:, 0], "idx": idx})
    lam = cmp.tau_le_u.multiplier.weight.detach()
    assert lam.shape == (20, 1) and bool((lam >= 0).all()) and float(lam.max()) > 0
    u = head(x)[:, 0].detach()
    assert fn.fbeta_of_decisions(u[labels == 1], u[labels == 0], 1.0) > 0.9


@needs_cooper
@pytest.mark.parametrize("positives", [8, 40, 180])  # of 200: 4 % to 90 % positives
@pytest.mark.parametrize("kind", ["par", "rap"])
def test_the_default_nu_step_is_coopers_hinge_lagrangian_at_its_dual_lr(kind, positives):
    """The objective alone with its default per-step ``nu`` step, dual step first, is Cooper's
    hinge Lagrangian with one multiplier at dual lr ``0.1 sqrt(n / m)`` (P@R) or 0.1 (R@P): P@R's
    ``nu`` is Cooper's times ``m / n`` and its loss ``m / n`` times Cooper's (SGD at ``n / m`` of
    Cooper's learning rate); R@P's are the same. Cooper's trajectory = the library's, step by
    step, at any class ratio."""
    import cooper

    g = torch.Generator().manual_seed(positives)
    N, D = 200, 3
    labels = torch.zeros(N, dtype=torch.long)
    labels[torch.randperm(N, generator=g)[:positives]] = 1
    x = torch.randn(N, D, generator=g)
    n, m = positives, N - positives
    ratio = m / n if kind == "par" else 1.0
    make = {
        "par": lambda: PrecisionAtRecall(labels, recall=0.9, nu_init=0.0),
        "rap": lambda: RecallAtPrecision(labels, precision=0.8, nu_init=0.0),
    }[kind]
    reg = make()
    assert reg.dual_lr_nu_step == pytest.approx(0.1 * ratio**0.5)
    torch.manual_seed(positives)
    ours = torch.nn.Linear(D, 1)
    theirs = torch.nn.Linear(D, 1)
    theirs.load_state_dict(ours.state_dict())
    lr = 0.05
    opt = torch.optim.SGD(ours.parameters(), lr=lr / ratio)
    reg.attach(opt)
    target = {"recall": 0.9} if kind == "par" else {"precision": 0.8}
    cmp = cooper_rate_problem(labels, **target)
    coop = cooper.optim.AlternatingDualPrimalOptimizer(
        primal_optimizers=torch.optim.SGD(theirs.parameters(), lr=lr),
        dual_optimizers=torch.optim.SGD(cmp.dual_parameters(), lr=0.1 / ratio**0.5, maximize=True),
        cmp=cmp,
    )
    for step in range(12):
        idx = torch.randint(0, N, (16,), generator=g)
        loss = reg(ours(x[idx])[:, 0], idx)
        opt.zero_grad()
        loss.backward()
        opt.step()
        reg.after_step_()
        coop.roll(compute_cmp_state_kwargs={"scores": theirs(x[idx])[:, 0], "idx": idx})
        nu_cooper = float(cmp.rate.multiplier.weight.detach().squeeze())
        assert float(reg.nu) == pytest.approx(ratio * nu_cooper, rel=1e-5, abs=1e-6), step
        for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"step {step}")
    assert float(reg.nu) > 0  # the constraint moved the multiplier: the test is not vacuous


@needs_cooper
def test_cooper_rate_problem_recall_at_precision_by_hand():
    cmp = cooper_rate_problem(torch.tensor([0, 1, 1, 0, 1]), precision=0.75)
    state = cmp.compute_cmp_state(torch.tensor([0.5, 2.0, 0.4]), torch.tensor([0, 1, 2]))
    # fp+ = (5 / 3) (1 + 0.5) = 2.5; tp- = (5 / 9) (1 + 0.4) = 7 / 9 (a recall)
    assert state.loss.item() == pytest.approx(-7 / 9)
    violation = state.observed_constraints[cmp.rate].violation
    assert violation.item() == pytest.approx(0.75 * 2.5 / 3 - 0.25 * 7 / 9)


@needs_cooper
@pytest.mark.parametrize(
    ("labels", "kwargs", "message"),
    [
        (torch.tensor([0, 1, 2]), {"recall": 0.9}, "shape_labels must be a non-empty"),
        (torch.tensor([1, 1]), {"recall": 0.9}, "must contain positives and negatives"),
        (torch.tensor([0, 1]), {}, "give exactly one target"),
        (torch.tensor([0, 1]), {"recall": 0.9, "precision": 0.9}, "give exactly one target"),
        (torch.tensor([0, 1]), {"recall": 1.0}, "recall must be a number in \\(0, 1\\)"),
        (torch.tensor([0, 1]), {"precision": True}, "precision must be a number"),
    ],
)
def test_cooper_rate_problem_refuses_bad_input(labels, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cooper_rate_problem(labels, **kwargs)


@needs_cooper
def test_cooper_optimizer_refuses_an_unknown_alternation():
    cmp = cooper_rate_problem(torch.tensor([0, 1]), recall=0.5)
    with pytest.raises(ValueError, match="alternation"):
        cooper_optimizer(cmp, [torch.nn.Parameter(torch.zeros(1))], alternation="primal_dual")


@needs_libauc
def test_libauc_aucm_at_its_saddle_point_is_the_class_mean_squared_hinge():
    g = torch.Generator().manual_seed(1)
    h = torch.rand(40, 1, generator=g)
    y = (torch.rand(40, generator=g) < 0.3).long()
    y[0] = 1
    loss_fn, _ = libauc_aucm_pesg([torch.nn.Parameter(torch.zeros(1))], margin=1.0)
    hp, hn, p = h[y == 1], h[y == 0], float(y.float().mean())
    gap = float(1.0 - (hp.mean() - hn.mean()))
    with torch.no_grad():
        loss_fn.a.fill_(float(hp.mean()))
        loss_fn.b.fill_(float(hn.mean()))
        loss_fn.alpha.fill_(max(0.0, gap))
    value = float(loss_fn(h, y).detach())
    var = float(hp.var(unbiased=False) + hn.var(unbiased=False))
    assert value == pytest.approx(p * (1 - p) * (var + max(0.0, gap) ** 2), rel=1e-5)


@needs_libauc
def test_libauc_pesg_improves_the_auc_of_a_linear_head():
    torch.manual_seed(0)
    y = (torch.arange(200) % 4 == 0).long()
    x = torch.randn(200, 2) + torch.where(y[:, None] == 1, 0.8, -0.8)
    head = torch.nn.Linear(2, 1)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[-1.0, -1.0]]))  # start ranked backwards
    loss_fn, opt = libauc_aucm_pesg(head.parameters(), margin=1.0, lr=0.5)

    def auc():
        u = head(x)[:, 0].detach()
        return float((u[y == 1][:, None] > u[y == 0][None]).double().mean())

    before = auc()
    for _ in range(20):
        for idx in torch.randperm(200).split(50):
            loss = loss_fn(torch.sigmoid(head(x[idx])), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert before < 0.2 and auc() > 0.8
