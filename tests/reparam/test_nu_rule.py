"""The rate objectives' multiplier rules (``nu_rule``): the normalized rule's formula, its
scale-freedom, that it is the only step of ``nu``, and its state under torch's contracts."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from reparam import ROCAUC, PrecisionAtRecall, RecallAtPrecision
from reparam.rate_base import NU_CEILING, NU_FLOOR, NU_RMS_DECAY

N = 200


def _labels(seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    y = (torch.rand(N, generator=gen) < 0.2).long()
    y[:2] = torch.tensor([0, 1])
    return y


def _batches(seed: int, steps: int = 8, batch: int = 25):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randperm(N, generator=gen)[:batch]
        yield idx, torch.randn(batch, generator=gen) * 1.5


def test_normalized_rule_follows_its_formula():
    """``log nu += eta v / RMS(v)``, the RMS a bias-corrected running mean square of the batches'
    violations ``v = r - (N / (n B)) sum_{B+} min(u, 1)``, against a float64 reference."""
    y = _labels()
    reg = PrecisionAtRecall(y, recall=0.8, nu_rule="normalized", dual_lr_nu_step=0.3)
    n_pos = int(y.sum())
    nu, sq, weight = 1.0, 0.0, 0.0
    for idx, u in _batches(0):
        reg(u, idx)
        pos = y[idx] == 1
        v = 0.8 - N / (n_pos * idx.numel()) * float(u.double()[pos].clamp(max=1).sum())
        sq = NU_RMS_DECAY * sq + (1 - NU_RMS_DECAY) * v * v
        weight = NU_RMS_DECAY * weight + (1 - NU_RMS_DECAY)
        nu = max(nu * math.exp(0.3 * v / math.sqrt(sq / weight)), NU_FLOOR)
        assert float(reg.nu[0]) == pytest.approx(nu, rel=1e-5)
    assert reg.nu_rule == "normalized" and "nu_rule='normalized'" in repr(reg)


def test_normalized_rule_is_scale_free_in_nu():
    """Its steps are relative: from 10 times the start, ``nu`` stays 10 times as large on the
    same batches (the additive rule's does not)."""
    y = _labels(1)
    for rule, free in (("normalized", True), ("additive", False)):
        regs = [
            PrecisionAtRecall(y, recall=0.9, nu_rule=rule, nu_init=start, dual_lr_nu_step=0.2)
            for start in (1.0, 10.0)
        ]
        for idx, u in _batches(1):
            for reg in regs:
                reg(u, idx)
        ratio = float(regs[1].nu[0] / regs[0].nu[0])
        assert (ratio == pytest.approx(10.0, rel=1e-5)) == free, (rule, ratio)


def test_normalized_rule_is_scale_free_in_the_violation():
    """A violation that is ``c`` times larger (the same batches at a target further off) moves
    ``nu`` by the same relative steps once every batch violates it by the same sign: only the
    violation over its RMS counts."""
    y = _labels(2)
    reg = RecallAtPrecision(y, precision=0.9, nu_rule="normalized")
    reg.nu_sq.fill_(4.0)  # a running RMS of 2
    reg.nu_sq_weight.fill_(1.0)
    reg._normalized_nu_step_(torch.tensor([2.0]))
    first = float(reg.nu[0])
    reg.nu.fill_(1.0), reg.nu_sq.fill_(400.0), reg.nu_sq_weight.fill_(1.0)  # 10x: RMS 20
    reg._normalized_nu_step_(torch.tensor([20.0]))
    assert float(reg.nu[0]) == pytest.approx(first, rel=1e-6)
    assert first > 1.0


def test_normalized_rule_is_the_only_step_of_nu():
    """The epoch end's step (``dual_lr_nu``) leaves ``nu`` to the batches' rule; the additive
    rule's epoch end moves it."""
    y = _labels(3)
    for rule, moves in (("normalized", False), ("additive", True)):
        reg = PrecisionAtRecall(y, recall=0.9, nu_rule=rule, dual_lr_nu=5.0)
        for idx, u in _batches(3, steps=4):
            reg(u, idx)
        before = reg.nu.clone()
        reg.end_epoch_()
        assert (not torch.equal(before, reg.nu)) == moves, rule


def test_a_validation_forward_moves_no_multiplier_state():
    """In ``eval()`` or under ``no_grad`` the forward returns the loss and moves neither ``nu``
    nor the violation's running mean square."""
    reg = PrecisionAtRecall(_labels(4), recall=0.9, nu_rule="normalized")
    for idx, u in _batches(4, steps=3):
        reg(u, idx)
    state = copy.deepcopy(reg.state_dict())
    idx, u = next(_batches(5))
    with torch.no_grad():
        reg(u, idx)
    reg.eval()
    reg(u, idx)
    for key, value in reg.state_dict().items():
        assert torch.equal(value, state[key]), key


def test_normalized_state_resumes_exactly():
    """``nu`` and the running mean square are in the ``state_dict``: a run stopped and loaded
    into a fresh objective goes on as the uninterrupted one, bit for bit."""
    y = _labels(6)
    batches = list(_batches(6))
    whole = PrecisionAtRecall(y, recall=0.85, nu_rule="normalized")
    for idx, u in batches:
        whole(u, idx)
    first = PrecisionAtRecall(y, recall=0.85, nu_rule="normalized")
    for idx, u in batches[:4]:
        first(u, idx)
    assert {"nu_sq", "nu_sq_weight"} <= set(first.state_dict())
    resumed = PrecisionAtRecall(y, recall=0.85, nu_rule="normalized")
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    for idx, u in batches[4:]:
        resumed(u, idx)
    for key, value in whole.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key


@pytest.mark.parametrize(
    "make, match",
    [
        (
            lambda y: PrecisionAtRecall(y, recall=0.9, nu_rule="pi"),
            r"nu_rule must be one of \('additive', 'normalized'\), got 'pi'",
        ),
        (
            lambda y: PrecisionAtRecall(y, recall=0.9, nu_rule="normalized", dual_every="epoch"),
            "nu_rule='normalized' moves nu at every batch, which dual_every='epoch' does not",
        ),
        (
            lambda y: ROCAUC(y, nu_rule="normalized"),  # (its default dual_every is "epoch")
            "pass dual_every='step' with it",
        ),
    ],
)
def test_bad_rules_are_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make(_labels())


def test_a_start_at_zero_is_lifted_to_the_floor():
    """A product cannot leave 0: ``nu_init=0`` starts the normalized rule at ``NU_FLOOR``."""
    reg = PrecisionAtRecall(_labels(), recall=0.9, nu_rule="normalized", nu_init=0.0)
    assert float(reg.nu[0]) == pytest.approx(NU_FLOOR)


def test_an_unreachable_target_stops_nu_at_its_ceiling():
    """A violation that never falls (an unreachable precision) grows the product without limit:
    it stops at ``NU_CEILING`` times the multiplier's scale, or at ``nu_max``, and the loss stays
    finite."""
    y = _labels(7)
    for nu_max, want in ((None, NU_CEILING), (50.0, 50.0)):
        reg = RecallAtPrecision(
            y, precision=0.9, nu_rule="normalized", nu_max=nu_max, dual_lr_nu_step=0.05
        )
        for _ in range(2000):
            reg._normalized_nu_step_(torch.tensor([0.3]))
        assert float(reg.nu[0]) == pytest.approx(want)
        idx, u = next(_batches(7))
        assert torch.isfinite(reg(u, idx))
