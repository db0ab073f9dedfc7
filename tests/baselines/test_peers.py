"""Adapters to the optional peers: skipped with the reason when a peer is absent; ``reparam.baselines``
imports without them."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

from reparam import functional as fn
from reparam.baselines import cooper_fbeta_problem, cooper_optimizer, libauc_aucm_pesg
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
