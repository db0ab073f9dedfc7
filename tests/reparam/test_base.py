"""What every reparameterized objective shares (``reparam.base``): loud misuse, the conveniences
(``attach``, ``epochs``), reported values = the values the loss uses, freshness, versioned state."""

from __future__ import annotations

import warnings

import pytest
import torch

from projections import project_onto_c
from reparam import (
    ROCAUC,
    DenseTau,
    EpochEnd,
    FBetaRegularizer,
    Inline,
    PrecisionAtRecall,
    RecallAtPrecision,
    ShapeHead,
)
from reparam.baselines import FullProjectionsFBeta
from tests.protocol import run_protocol

LABELS = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1, 0, 1] * 4)  # N = 40
MAKERS = {
    "fbeta": lambda **kw: FBetaRegularizer(LABELS, **kw),
    "par": lambda **kw: PrecisionAtRecall(LABELS, recall=0.7, **kw),
    "rap": lambda **kw: RecallAtPrecision(LABELS, precision=0.7, **kw),
    "auc": lambda **kw: ROCAUC(LABELS, grid=3, **kw),
}


def _loop(reg, head, opt, epochs, *, end_epoch=True, after_step=True, batch=8):
    x = torch.linspace(-1, 1, 40)[:, None] + LABELS[:, None].float()
    run_protocol(
        reg,
        head,
        x,
        epochs=epochs,
        batch=batch,
        optimizer=opt,
        end_epoch=end_epoch,
        after_step=after_step,
    )


def _messages(record) -> str:
    return " | ".join(str(w.message) for w in record)


@pytest.mark.parametrize("kind", list(MAKERS))
def test_forgetting_end_epoch_warns_after_one_epoch(kind):
    reg, head = MAKERS[kind](), ShapeHead(1)
    opt = torch.optim.Adam([*head.parameters(), *reg.parameters()], lr=1e-2)
    with pytest.warns(RuntimeWarning, match=r"since the last end_epoch_\(\)"):
        _loop(reg, head, opt, 2, end_epoch=False)
    with warnings.catch_warnings(record=True) as record:  # once, not at every step
        warnings.simplefilter("always")
        _loop(reg, head, opt, 2, end_epoch=False)
    assert "end_epoch_" not in _messages(record)


@pytest.mark.parametrize("kind", list(MAKERS))
def test_regularizer_left_out_of_the_optimizer_warns(kind):
    # P@R and R@P under their default per-batch schedule set tau themselves (next test)
    reg = MAKERS[kind](**({"dual_every": "epoch"} if kind in ("par", "rap") else {}))
    head = ShapeHead(1)
    opt = torch.optim.Adam(head.parameters(), lr=1e-2, fused=True)  # fused: no version bumps
    with pytest.warns(RuntimeWarning, match="pass reg.parameters"):
        _loop(reg, head, opt, 3, end_epoch=True)
    with pytest.raises(ValueError, match=r"optimizer must step the regularizer's parameters"):
        reg.attach(opt)


@pytest.mark.parametrize("kind", ["par", "rap"])
def test_per_batch_schedule_needs_no_optimizer_for_tau(kind):
    """With ``dual_every="step"`` each positive's block is at its saddle whenever the loss reads
    it, so the objective has no parameter: there is nothing to give an optimizer, and no warning
    says otherwise; ``reg.tau`` follows the remembered scores."""
    reg, head = MAKERS[kind](), ShapeHead(1)
    opt = torch.optim.Adam(head.parameters(), lr=1e-2, fused=True)
    before = reg.tau.clone()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _loop(reg, head, opt, 3, end_epoch=True)
    assert not [w for w in record if issubclass(w.category, RuntimeWarning)], _messages(record)
    assert list(reg.parameters()) == [] and not torch.equal(reg.tau, before)


@pytest.mark.parametrize("kind", list(MAKERS))
def test_a_correct_loop_is_silent(kind):
    reg, head = MAKERS[kind](), ShapeHead(1)
    opt = torch.optim.Adam([*head.parameters(), *reg.parameters()], lr=1e-2, fused=True)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _loop(reg, head, opt, 4)
    assert not [w for w in record if issubclass(w.category, RuntimeWarning)], _messages(record)


def test_full_projections_without_after_step_warns():
    reg, head = FullProjectionsFBeta(LABELS), ShapeHead(1)
    opt = torch.optim.SGD([*head.parameters(), *reg.parameters()], lr=1e-2)
    with pytest.warns(
        RuntimeWarning,
        match=r"after_step_\(\) has not been called.*FullProjectionsFBeta projects there",
    ):
        _loop(reg, head, opt, 2, after_step=False)


def test_attach_and_epochs_run_the_hooks():
    reg, head = FullProjectionsFBeta(LABELS), ShapeHead(1)
    opt = torch.optim.SGD([*head.parameters(), *reg.parameters()], lr=1e-2)
    handle = reg.attach(opt)
    x = torch.randn(40, 1)
    seen = []
    for epoch in reg.epochs(3):
        seen.append(epoch)
        for idx in torch.arange(40).split(10):
            loss = reg(head(x[idx]), idx)
            opt.zero_grad()
            loss.backward()
            opt.step()  # the hook projects: 4 projections per epoch
        assert reg.stats()["projections"] == 4 * epoch
    assert seen == [1, 2, 3] and int(reg.epoch) == 3
    assert reg.stats()["projections_last_epoch"] == 4
    assert reg._monitor.hooks == 1  # (attached: the misuse counters skip after_step_'s)
    handle.remove()
    handle.remove()  # (a second remove counts nothing off)
    assert reg._monitor.hooks == 0
    assert list(reg.epochs(5)) == [4, 5] and int(reg.epoch) == 5  # continues from the state


def test_break_out_of_epochs_skips_the_epoch_end():
    reg = MAKERS["par"]()
    for _epoch in reg.epochs(3):
        break
    assert int(reg.epoch) == 0


def test_inline_mode_reports_the_values_the_loss_uses():
    reg = MAKERS["fbeta"](schedule=Inline(), tau=DenseTau())
    with torch.no_grad():
        reg.eps_param.fill_(-0.4)
        reg.tau_param.copy_(torch.linspace(-1, 3, reg.tau_param.numel()))
    e, t = project_onto_c(reg.eps_param.detach()[0], reg.tau_param.detach())
    torch.testing.assert_close(reg.eps[0], e)
    torch.testing.assert_close(reg.tau, t)
    assert reg.stats()["eps"] == pytest.approx(float(e))
    epoch_mode = MAKERS["fbeta"](schedule=EpochEnd(), tau=DenseTau())
    assert epoch_mode.eps is epoch_mode.eps_param  # outside inline mode: the parameter itself


def test_stats_say_how_fresh_the_scores_are():
    reg = MAKERS["auc"]()
    s0 = reg.stats()
    assert s0["scored_fraction"] == 0.0 and s0["score_age_epochs_mean"] is None
    assert s0["train_auc"] is None
    reg(torch.randn(20), torch.arange(20))
    s1 = reg.stats()
    assert s1["scored_fraction"] == 0.5 and s1["score_age_epochs_max"] == 0
    assert s1["train_auc"] is not None
    reg.end_epoch_()
    reg(torch.randn(10), torch.arange(10))
    s2 = reg.stats()
    assert s2["score_age_epochs_max"] == 1 and s2["score_age_epochs_mean"] == pytest.approx(0.5)


def test_merge_scores_dates_the_merged_scores():
    reg = MAKERS["fbeta"]()
    reg.end_epoch_()
    reg(torch.ones(4), torch.tensor([0, 1, 2, 3]))  # recorded in epoch 1
    written = torch.zeros(40, dtype=torch.bool)
    written[:4] = True
    reg._merge_scores_(written, lambda t: t.mul_(1))  # one "process": the identity collective
    assert reg.score_epoch[:4].tolist() == [1, 1, 1, 1] and int(reg.score_epoch[5]) == -1
    with pytest.raises(ValueError, match="written must be a bool tensor of shape"):
        reg._merge_scores_(written.long(), lambda t: t)


@pytest.mark.parametrize("kind", list(MAKERS))
def test_state_layout_is_versioned_and_another_version_is_refused(kind):
    reg = MAKERS[kind]()
    reg(torch.randn(40), torch.arange(40))
    reg.end_epoch_()
    state = reg.state_dict()
    assert state._metadata[""]["version"] == type(reg)._version
    fresh = MAKERS[kind]()
    fresh.load_state_dict(state)  # the same version: loads
    assert torch.equal(fresh.scores, reg.scores)
    version = type(reg)._version  # 5 for F-beta, 4 for P@R and R@P (module docstrings)
    state._metadata[""]["version"] = version + 1
    with pytest.raises(
        RuntimeError, match=rf"layout version {version + 1}, this library reads version {version}"
    ):
        MAKERS[kind]().load_state_dict(state)
    # version 1 (int64 indices and labels, stored seen_ever and class_of): refused, not misread
    v1 = type(state)(
        (k, v.long() if k in ("layout.slot", "layout.pos_index", "layout.tau_group") else v)
        for k, v in state.items()
    )
    v1["seen_ever"], v1["class_of"] = reg.seen_ever.clone(), reg.layout.slot.long().clamp(-1, 0)
    v1._metadata = {k: dict(m) for k, m in state._metadata.items()}
    v1._metadata[""]["version"] = 1
    with pytest.raises(
        RuntimeError, match=rf"layout version 1, this library reads version {version}"
    ):
        MAKERS[kind]().load_state_dict(v1)
    old = {k: v for k, v in reg.state_dict().items() if k != "score_epoch"}  # an older layout
    with pytest.raises(RuntimeError, match=r"Missing key\(s\) in state_dict: \"score_epoch\""):
        MAKERS[kind]().load_state_dict(old)


def test_building_and_dropping_objectives_leaves_no_global_hook():
    import gc

    from torch.optim import optimizer as torch_optimizer

    def hooks() -> int:
        return len(torch_optimizer._global_optimizer_post_hooks) + len(
            torch_optimizer._global_optimizer_pre_hooks
        )

    before = hooks()
    for k in range(100):
        reg, head = MAKERS[list(MAKERS)[k % len(MAKERS)]](), ShapeHead(1)
        opt = torch.optim.Adam([*head.parameters(), *reg.parameters()], lr=1e-2, fused=True)
        _loop(reg, head, opt, 1)
        del reg, head, opt
    gc.collect()
    assert hooks() == before


@pytest.mark.parametrize(
    "case, warns", [("stepped", False), ("not stepped", True), ("zero gradient", False)]
)
def test_the_unstepped_check_compares_the_epoch_ends(case, warns):
    """Parameters with a gradient that did not move between two epoch ends were not stepped; an
    all-zero gradient (Adam without momentum leaves the parameters as they were) is not a
    forgotten optimizer."""
    from reparam._monitor import MisuseMonitor

    monitor = MisuseMonitor("X")
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.zeros(3) if case == "zero gradient" else torch.ones(3)
    monitor.after_epoch_end([p])  # the reference, after an epoch end
    for _ in range(3):  # an epoch of steps
        monitor.on_forward(4, 10, lambda: (True, None, "dual step"))
        if case == "stepped":
            p.data -= 0.1  # the optimizer
        monitor.count_after_step()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        monitor.before_epoch_end(lambda: [("p", p)])
    assert ("no optimizer stepped" in _messages(record)) == warns
