"""``FullProjectionsFBeta``: the paper's per-step projection, F-beta with a dense ``tau`` projected
onto ``C`` after every optimizer step."""

from __future__ import annotations

import pytest
import torch

from reparam import DenseTau, EpochEnd, FBetaRegularizer, Inline
from reparam.baselines import FullProjectionsFBeta

LABELS = torch.tensor([1, 0, 0, 1, 1, 0] * 10)


def _train(reg, project_by_hand: bool = False):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(60, generator=gen) + LABELS
    w = torch.zeros(1, requires_grad=True)
    opt = torch.optim.Adam([w, *reg.parameters()], lr=0.05)
    reg.attach(opt)
    counts = []
    for _ in range(2):
        for idx in torch.randperm(60, generator=gen).split(10):
            loss = reg(x[idx] * (1 + w), idx)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if project_by_hand:
                reg.project_()
            eps, tau = reg.eps.detach(), reg.tau.detach()
            assert float(eps) >= 0 and bool((tau <= eps).all())  # in C after every step
        reg.end_epoch_()
        counts.append(reg.stats()["projections_last_epoch"])
    return reg, counts


def test_every_step_projects_and_the_trajectory_is_the_manual_loops():
    """Six steps an epoch: six projections; the state is what ``FBetaRegularizer.paper`` (the
    projection at the epoch end, a dense tau) with ``project_()`` after each step reaches (its
    epoch end's projection is then a no-op)."""
    full, counts = _train(FullProjectionsFBeta.paper(LABELS))
    assert counts == [6, 6]
    manual = FBetaRegularizer.paper(LABELS)
    assert manual.options == (EpochEnd(), DenseTau())
    manual, _ = _train(manual, project_by_hand=True)
    for name, value in manual.state_dict().items():
        if "projections" not in name:
            assert torch.equal(full.state_dict()[name], value), name
    assert not torch.equal(full.tau_param, torch.ones_like(full.tau_param))


@pytest.mark.parametrize(
    "option", [{"schedule": Inline()}, {"tau": DenseTau()}], ids=lambda o: next(iter(o))
)
def test_the_options_it_fixes_are_refused(option):
    name = next(iter(option))
    with pytest.raises(ValueError, match=rf"FullProjectionsFBeta fixes {name} .*got {name}="):
        FullProjectionsFBeta(LABELS, **option)
    with pytest.raises(ValueError, match=rf"FullProjectionsFBeta fixes {name}"):
        FullProjectionsFBeta.paper(LABELS, **option)


def test_paper_takes_the_papers_steps_and_keeps_its_own_schedule():
    """``FullProjectionsFBeta.paper``: ``FBetaRegularizer.paper``'s dual steps and uncapped
    scores, a dense tau projected after every step; an option given overrides the paper's."""
    reg = FullProjectionsFBeta.paper(LABELS)
    assert (reg.dual_lr_lambda, reg.dual_lr_mu, reg.cap_scores) == (1e-3, 1e-5, False)
    assert (reg.projection, reg.tau_update) == ("every_step", "dense")
    assert type(reg) is FullProjectionsFBeta
    assert FullProjectionsFBeta.paper(LABELS, dual_lr_mu=0.1).dual_lr_mu == 0.1
    ours = FullProjectionsFBeta(LABELS)  # the library's steps
    assert (ours.dual_lr_lambda, ours.dual_lr_mu, ours.cap_scores) == (0.1, 0.1, True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'preset'"):
        FullProjectionsFBeta(LABELS, preset="paper")
