"""FBetaRegularizer: the minibatch Lagrangian, dual ascent, projection schedule, state, bad input."""

from __future__ import annotations

import copy
import re

import pytest
import torch

from projections import project_onto_c, projection_root
from reparam import DenseTau, EpochEnd, FBetaRegularizer, Inline, ShapeHead, SparseTau, Tracked
from reparam import functional as fn
from reparam.lagrangian import batch_lagrangian
from tests.protocol import run_protocol


def _setup(n=60, seed=0, p_pos=0.4, **kwargs):
    gen = torch.Generator().manual_seed(seed)
    labels = (torch.rand(n, generator=gen) < p_pos).long()
    labels[:2] = torch.tensor([0, 1])
    reg = FBetaRegularizer.paper(
        labels, **kwargs
    )  # the paper's form, whose closed forms are tested
    with torch.no_grad():  # a generic state, not the initial one
        reg.eps.fill_(1.3)
        reg.tau.copy_(torch.randn(reg.tau.shape, generator=gen))
        reg.lam.copy_(torch.rand(reg.lam.shape, generator=gen))
        reg.mu.fill_(-0.7)
    return reg, labels, gen


def _full_lagrangian(reg, u, labels):
    """(4') in float64, computed independently of the module's code path."""
    pos, neg = labels == 1, labels == 0
    n = int(pos.sum())
    eps, tau = reg.eps.double()[0], reg.tau.double()
    lam, mu = reg.lam.double(), reg.mu.double()[0]
    order = pos.nonzero()[:, 0]  # tau slots follow dataset order of the positives
    u_pos, u_neg = u.double()[order], u.double()[neg]
    return (
        reg.beta**2 * eps
        + torch.relu(eps + u_neg).sum() / n
        + mu * (tau.mean() - 1)
        + (lam * (tau - u_pos)).sum() / n
    )


@pytest.mark.parametrize("batch", [1, 6, 20])
def test_minibatch_estimate_is_unbiased(batch):
    reg, labels, gen = _setup()
    u = torch.randn(60, generator=gen)
    perm = torch.randperm(60, generator=gen)
    with torch.no_grad():
        mean_lb = torch.stack([reg(u[idx], idx) for idx in perm.split(batch)]).double().mean()
    expected = (_full_lagrangian(reg, u, labels) + reg.mu.double()[0]).detach()
    assert float(mean_lb) == pytest.approx(float(expected), rel=1e-5, abs=1e-5)


def test_gradients_match_closed_forms():
    reg, labels, gen = _setup()
    head = ShapeHead(3)
    x = torch.randn(60, 3, generator=gen)
    idx = torch.arange(0, 60, 3)  # a batch of 20 with positives and negatives
    loss = reg(head(x[idx]), idx)
    loss.backward()
    n, big_n, b = float(reg.layout.n_pos[0]), 60, idx.numel()
    scale = big_n / (n * b)
    with torch.no_grad():
        u = head(x[idx])
        pos = labels[idx] == 1
        slots = reg.layout.slot[idx[pos]]
        # d/dtau_i = scale (mu + lambda_i) on the batch's positives, 0 elsewhere
        g_tau = torch.zeros_like(reg.tau)
        g_tau[slots] = scale * (reg.mu[0] + reg.lam[slots])
        torch.testing.assert_close(reg.tau.grad, g_tau)
        # d/deps = beta^2 + scale sum_neg 1[eps + u_j > 0]
        act = (reg.eps[0] + u[~pos] > 0).float()
        torch.testing.assert_close(reg.eps.grad, (1 + scale * act.sum()).reshape(1))
        # d/dw = scale (-sum_pos lambda_i a_i + sum_neg 1[eps + u_j > 0] a_j)
        a = x[idx]
        g_w = scale * (-(reg.lam[slots, None] * a[pos]).sum(0) + (act[:, None] * a[~pos]).sum(0))
        torch.testing.assert_close(head.linear.weight.grad[0], g_w)


def test_dual_step_uses_remembered_scores_and_keeps_lambda_nonnegative():
    reg, _labels, gen = _setup(dual_lr_lambda=0.5, dual_lr_mu=0.25, schedule=Inline())
    u = torch.randn(60, generator=gen) * 3
    for idx in torch.arange(60).split(7):
        reg(u[idx], idx)  # the forward pass records the scores: no extra pass needed
    lam0, mu0, tau = reg.lam.clone(), reg.mu.clone(), reg.tau.detach().clone()
    u_pos = u[reg.layout.pos_index]
    reg.end_epoch_()
    torch.testing.assert_close(reg.lam, (lam0 + 0.5 * (tau - u_pos)).clamp_min(0))
    assert bool((reg.lam >= 0).all()) and bool((reg.lam == 0).any())  # some were clipped at 0
    torch.testing.assert_close(reg.mu, mu0 + 0.25 * (tau.mean() - 1))


def test_dual_step_sizes_are_attributes_a_loop_can_schedule():
    """No schedule option: the step sizes are plain attributes, read at every epoch end, so
    ``reg.dual_lr_mu = c / e`` in the user's loop is the paper's decaying schedule."""
    reg, _, _ = _setup(dual_lr_lambda=0.3, dual_lr_mu=0.06)
    reg.scores.zero_()
    reg.score_epoch.fill_(0)  # every sample scored (seen_ever is derived from it)
    for e in (1, 2, 3):
        reg.dual_lr_lambda, reg.dual_lr_mu = 0.3 / e, 0.06 / e
        mu0, lam0 = reg.mu.clone(), reg.lam.clone()
        reg.end_epoch_()  # mode "epoch": projection first, then the dual step with 0.06 / e
        tau = reg.tau.detach()
        torch.testing.assert_close(reg.mu, mu0 + 0.06 / e * (tau.mean() - 1))
        torch.testing.assert_close(reg.lam, (lam0 + 0.3 / e * tau).clamp_min(0))
    assert int(reg.epoch) == 3


@pytest.mark.parametrize(
    "schedule, per_epoch",
    [(EpochEnd(), 1), (Inline(), 0), (Tracked(), 0)],
    ids=repr,
)
def test_projection_count_per_epoch(schedule, per_epoch):
    reg, _, gen = _setup(schedule=schedule)
    opt = torch.optim.SGD(reg.parameters(), lr=0.1)
    u = torch.randn(60, generator=gen)
    for _epoch in range(2):  # 6 steps each, the scores fixed
        run_protocol(reg, torch.nn.Flatten(0), u[:, None], batch=10, optimizer=opt)
        assert reg.stats()["projections_last_epoch"] == per_epoch
    assert reg.stats()["projections"] == 2 * per_epoch
    if not isinstance(schedule, Inline):  # (eps, tau) in C right after the projection
        assert float(reg.eps.detach()) >= 0 and bool((reg.tau <= reg.eps).all())


def test_inline_mode_differentiates_through_the_projection():
    reg, _, gen = _setup(schedule=Inline())
    with torch.no_grad():
        reg.eps_param.fill_(-0.5)  # infeasible raw parameters: the loss sees Pi_C of them
    e, t = reg.constrained_parameters()
    pe, pt = project_onto_c(reg.eps_param.detach()[0], reg.tau_param.detach())
    torch.testing.assert_close(e.detach()[0], pe)
    torch.testing.assert_close(t.detach(), pt)
    reg(torch.randn(8, generator=gen), torch.arange(8)).backward()
    assert reg.tau_param.grad is not None and reg.eps_param.grad is not None
    soft = FBetaRegularizer(reg.shape_labels, schedule=Inline(strength=0.05), tau=DenseTau())
    soft(torch.randn(8, generator=gen), torch.arange(8)).backward()
    assert soft.tau_param.grad is not None


def test_multiclass_is_the_mean_of_one_vs_rest_terms():
    gen = torch.Generator().manual_seed(3)
    labels = torch.randint(0, 3, (45,), generator=gen)
    labels[:3] = torch.tensor([0, 1, 2])
    multi = FBetaRegularizer(labels, positive_classes=(1, 2))
    ones = [FBetaRegularizer((labels == c).long()) for c in (1, 2)]
    scores = torch.randn(45, 3, generator=gen)
    idx = torch.randperm(45, generator=gen)[:16]
    expected = (ones[0](scores[idx, 1], idx) + ones[1](scores[idx, 2], idx)) / 2
    torch.testing.assert_close(multi(scores[idx], idx), expected)
    with torch.no_grad():  # the grouped projection projects each class onto its own eps
        multi.tau.copy_(torch.randn(multi.tau.shape, generator=gen) * 3)
        multi.eps.copy_(torch.tensor([-1.0, 0.5]))
    tau0, eps0 = multi.tau.detach().clone(), multi.eps.detach().clone()
    multi.project_()
    for j in range(2):
        e, t = project_onto_c(eps0[j], tau0[multi.layout.tau_group == j])
        torch.testing.assert_close(multi.eps[j].detach(), e)
        torch.testing.assert_close(multi.tau.detach()[multi.layout.tau_group == j], t)
    assert len(multi.stats()["eps_per_class"]) == 2


def test_batches_without_positives_or_negatives():
    reg, labels, _ = _setup()
    for idx in [(labels == 0).nonzero()[:5, 0], (labels == 1).nonzero()[:5, 0]]:
        u = torch.randn(idx.numel(), requires_grad=True)
        loss = reg(u, idx)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(u.grad).all()
    assert torch.isfinite(reg(torch.empty(0), torch.empty(0, dtype=torch.int64)))


def test_state_dict_round_trip_continues_identically():
    reg, _, gen = _setup(schedule=EpochEnd())
    u = torch.randn(60, generator=gen)
    reg(u, torch.arange(60))
    reg.end_epoch_()
    clone = FBetaRegularizer.paper(reg.shape_labels)
    clone.load_state_dict(copy.deepcopy(reg.state_dict()))
    for (k, a), (_, b) in zip(reg.state_dict().items(), clone.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    for r in (reg, clone):
        r(u[:20], torch.arange(20))
        r.end_epoch_()
    assert torch.equal(reg.lam, clone.lam) and torch.equal(reg.mu, clone.mu)
    assert clone.stats() == reg.stats()


def test_low_precision_network_keeps_float32_state(device):
    reg, _, gen = _setup()
    model = torch.nn.ModuleDict({"head": ShapeHead(4), "reg": reg}).to(device, torch.bfloat16)
    assert model["head"].linear.weight.dtype == torch.bfloat16
    for t in [*reg.parameters(), *(b for b in reg.buffers() if b.is_floating_point())]:
        assert t.dtype == torch.float32 and t.device.type == device
    x = torch.randn(10, 4, generator=gen).to(device, torch.bfloat16)
    loss = reg(model["head"](x), torch.arange(10, device=device))
    assert loss.dtype == torch.float32
    loss.backward()
    assert reg.tau.grad.dtype == torch.float32


def test_shape_head_pools_feature_maps():
    head = ShapeHead(8, num_scores=3)
    assert head(torch.randn(2, 8, 5, 7)).shape == (2, 3)
    assert ShapeHead(8)(torch.randn(4, 8)).shape == (4,)
    with pytest.raises(ValueError, match=r"features must have shape \(B, 8\)"):
        head(torch.randn(2, 7))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"shape_labels": torch.zeros(5, dtype=torch.int64)}, "class 1 has 0 positive"),
        (
            {"shape_labels": torch.ones(5, dtype=torch.int64)},
            "class 1 has 5 positive and 0 negative",
        ),
        ({"shape_labels": torch.tensor([0.0, 1.0])}, "shape_labels must hold integer class ids"),
        ({"beta": 0.0}, "beta must be a finite number > 0"),
        (
            {"schedule": "sometimes"},
            r"schedule must be Tracked\(\) \| EpochEnd\(\) \| Inline\(\), got 'sometimes'$",
        ),
        ({"tau": "sometimes"}, r"tau must be SparseTau\(\) \| DenseTau\(\), got 'sometimes'$"),
        ({"schedule": DenseTau()}, r"schedule must be .*, got DenseTau\(\)"),
        ({"tau": EpochEnd()}, r"tau must be .*, got EpochEnd\(\)"),
        ({"dual_lr_lambda": -1.0}, "dual_lr_lambda must be a finite number >= 0"),
        ({"dual_lr_mu": float("nan")}, "dual_lr_mu must be a finite number >= 0"),
        ({"positive_classes": (1, 1)}, "positive_classes must be distinct"),
    ],
)
def test_bad_construction(kwargs, match):
    kwargs = {"shape_labels": torch.tensor([0, 1, 1, 0])} | kwargs
    with pytest.raises(ValueError, match=match):
        FBetaRegularizer(**kwargs)


@pytest.mark.parametrize(
    "scores, idx, match",
    [
        (torch.randn(3), torch.tensor([0, 1, 99]), r"idx must hold dataset indices in \[0, 60\)"),
        (torch.randn(3), torch.tensor([0, -1, 2]), r"idx must hold dataset indices"),
        (torch.randn(3), torch.tensor([0.0, 1.0, 2.0]), "idx must be an int64 tensor"),
        (torch.randn(3, 4, 5), torch.tensor([0, 1, 2]), "scores must have shape"),
        (torch.randn(3), torch.tensor([0, 1]), "same batch size"),
        (torch.tensor([1.0, float("nan"), 0.0]), torch.tensor([0, 1, 2]), "scores must be finite"),
        (torch.tensor([1, 2, 3]), torch.tensor([0, 1, 2]), "scores must be a floating-point"),
    ],
)
def test_bad_batches(scores, idx, match):
    reg, _, _ = _setup()
    with pytest.raises(ValueError, match=match):
        reg(scores, idx)


def test_fused_batch_lagrangian_equals_the_reference_and_passes_gradcheck():
    """The hot path (one autograd node) vs ``minibatch_lagrangian`` on the split batch."""
    gen = torch.Generator().manual_seed(3)
    n_pos, batch = 9, 12
    eps = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)
    tau = torch.randn(n_pos, dtype=torch.float64, generator=gen).requires_grad_()
    u = torch.randn(batch, dtype=torch.float64, generator=gen).requires_grad_()
    lam = torch.rand(n_pos, dtype=torch.float64, generator=gen)
    mu = torch.tensor(-0.8, dtype=torch.float64)
    is_pos = torch.tensor([1, 0, 1, 1, 0, 0, 1, 0, 1, 0, 0, 1], dtype=torch.bool)
    slots = torch.tensor([4, 0, 2, 7, 0, 0, 4, 0, 1, 0, 0, 8])  # slot 4 twice: gradients add up
    kw = dict(beta=0.7, scale=1.9)
    fused = batch_lagrangian(eps, tau, u, lam, mu, is_pos, slots, **kw)
    ref = fn.minibatch_lagrangian(
        eps, tau[slots[is_pos]], lam[slots[is_pos]], u[is_pos], mu, u[~is_pos], **kw
    )
    torch.testing.assert_close(fused, ref)
    g_fused = torch.autograd.grad(fused, (eps, tau, u))
    g_ref = torch.autograd.grad(ref, (eps, tau, u))
    for a, b in zip(g_fused, g_ref, strict=True):
        torch.testing.assert_close(a, b)
    u_off = (u.detach() + 0.05).requires_grad_()  # keep eps + u away from the hinge's kink
    assert torch.autograd.gradcheck(
        lambda e, t, v: batch_lagrangian(e, t, v, lam, mu, is_pos, slots, **kw),
        (eps, tau, u_off),
    )


def _one_epoch(reg: FBetaRegularizer, scores: torch.Tensor) -> dict:
    reg(scores, torch.arange(len(scores)))
    reg.end_epoch_()
    return reg.stats()


def test_inert_regularizer_says_why_and_what_to_change():
    s = torch.tensor([1, 0] * 10)
    # the paper's options with the scores all below 0 (what CamVid showed): one decision for all
    reg = FBetaRegularizer.paper(s)
    stats = _one_epoch(reg, torch.where(s == 1, -0.5, -2.0))
    assert "at or below 0" in stats["inert"] and "lambda_init=1" in stats["inert"]
    assert "no certified F-beta bound" in stats["inert"]
    # no optimizer step between two epoch ends while tau_i <= u_i is violated: the SGD symptom
    second = _one_epoch(reg, torch.where(s == 1, -0.5, -2.0))["inert"]
    assert "eps and tau moved by < 1e-3" in second and "optim.regularizer_lr" in second
    # mean tau off 1 and a negligible mu step (the paper's 1e-5)
    reg = FBetaRegularizer.paper(s)
    with torch.no_grad():
        reg.tau_param.fill_(1.5)
        reg.eps_param.fill_(1.5)
    good = torch.where(s == 1, 2.0, -2.0)
    _one_epoch(reg, good)
    assert "dual_lr_mu=1e-05 is too small" in _one_epoch(reg, good)["inert"]
    # separable scores above the margin, at the LP's fixed point: nothing to say
    healthy = FBetaRegularizer(s)
    assert _one_epoch(healthy, good)["inert"] is None
    assert _one_epoch(healthy, good + 0.1)["inert"] is None


def _tracked_pair(**options):
    """An inline and a tracked regularizer in the same state, rows of tau spread around eps."""
    s = torch.tensor([1, 0] * 20)
    regs = [
        FBetaRegularizer(s, schedule=m, tau=DenseTau(), **options) for m in (Inline(), Tracked())
    ]
    for reg in regs:
        with torch.no_grad():
            reg.tau_param.copy_(torch.linspace(0.5, 1.5, reg.tau_param.numel()))
            reg.eps_param.fill_(0.9)
            reg.lam.copy_(torch.linspace(0, 2, reg.lam.numel()))
    return regs


def test_tracked_mode_is_the_inline_projection_when_its_active_set_is_exact():
    """Mode ``"tracked"`` right after an epoch end (its active set ``A`` re-computed from the exact
    root): ``reg.eps`` / ``reg.tau`` are ``Pi_C`` of the raw parameters, the loss is inline's, and
    so are the gradients of ``eps`` and of the batch's rows (``d e*/d tau_k = 1/(|A|+1)`` for a
    clipped row). Rows outside the batch get none (inline moves every active row: O(n))."""
    inline, tracked = _tracked_pair()
    for reg in (inline, tracked):
        reg.score_epoch.fill_(0)
        reg.end_epoch_()  # tracked: A from the exact root; both: the same dual step
    # inline's raw parameters are the point tracked represents (A's rows as offsets above eps)
    e, t = project_onto_c(inline.eps_param.detach()[0], inline.tau_param.detach())
    torch.testing.assert_close(tracked.eps, e.reshape(1))
    torch.testing.assert_close(tracked.tau, t)
    torch.testing.assert_close(tracked.eps, inline.eps)
    active = inline.tau_param.detach() > e
    assert (
        torch.equal(tracked.schedule.tau_active, active) and 0 < int(active.sum()) < active.numel()
    )
    offsets = inline.tau_param.detach() - inline.eps_param.detach()
    torch.testing.assert_close(tracked.tau_param[active], offsets[active])
    idx = torch.arange(0, 16)  # positives 0, 2, ..., 14: rows 0-7, the low end of tau
    idx = torch.cat([idx, torch.arange(38, 40)])  # row 19: the top, clipped
    u = torch.linspace(-1, 2, idx.numel())
    losses = [reg(u.clone().requires_grad_(), idx) for reg in (inline, tracked)]
    torch.testing.assert_close(losses[1], losses[0])
    for loss in losses:
        loss.backward()
    torch.testing.assert_close(tracked.eps_param.grad, inline.eps_param.grad)
    rows = tracked.layout.slot[idx][tracked.layout.slot[idx] >= 0].long()
    torch.testing.assert_close(tracked.tau_param.grad[rows], inline.tau_param.grad[rows])
    clipped = tracked.schedule.tau_active.clone()
    clipped[rows] = False
    assert bool(clipped.any()) and bool((inline.tau_param.grad[clipped] != 0).all())
    assert bool((tracked.tau_param.grad[clipped] == 0).all())


@pytest.mark.parametrize("classes", [(1,), (1, 2)])
def test_tracked_mode_follows_its_active_set_in_O_B(classes):
    """With a sparse tau the tracked sums ``[sum of A's offsets above eps, |A|]`` follow each step
    from the touched rows alone (a sample twice in a batch counted once), the touched rows are
    re-tested against the moved threshold, and the epoch end re-computes ``A`` from the exact
    root of the rows' values."""
    gen = torch.Generator().manual_seed(0)
    s = torch.randint(0, 3, (90,), generator=gen)
    reg = FBetaRegularizer(
        s,
        positive_classes=classes,
        schedule=Tracked(),
        tau=SparseTau(lr=0.2),
    )
    with torch.no_grad():
        reg.tau_param.uniform_(0.5, 1.5, generator=gen)
    reg.end_epoch_()
    opt = torch.optim.Adam(reg.parameters(), lr=0.05)
    groups = reg.layout.tau_group.long()
    retested = 0
    for _epoch in range(3):
        for _ in range(3):  # 72 of the 90 samples per epoch
            idx = torch.randint(0, 90, (24,), generator=gen)
            idx[1] = idx[0]  # a duplicate
            u = torch.randn(24, 3 if len(classes) > 1 else 1, generator=gen).squeeze(-1)
            loss = reg(u.requires_grad_(), idx)
            opt.zero_grad()
            loss.backward()
            opt.step()
            was = reg.schedule.tau_active.clone()
            reg.after_step_()
            tau, active, eps = reg.tau_param, reg.schedule.tau_active, reg.eps_param.detach()
            values = torch.where(active, tau + eps[groups], tau)  # A's rows: offsets above eps
            sums = torch.zeros(len(classes), 2, dtype=torch.float64)
            parts = torch.stack([torch.where(active, tau, 0), active], 1).double()
            torch.testing.assert_close(
                reg.schedule.active_sums, sums.index_add_(0, groups, parts), rtol=0, atol=1e-9
            )
            # the touched rows were re-tested against the root of the old A at the stepped values
            mid = torch.zeros(len(classes), 2, dtype=torch.float64)
            offsets = torch.where(was, values - eps[groups], 0)
            mid.index_add_(0, groups, torch.stack([offsets, was], 1).double())
            r = eps + (mid[:, 0] / (1 + mid[:, 1])).float()
            rows = reg.layout.slot[idx][reg.layout.slot[idx] >= 0].long()
            assert torch.equal(active[rows], values[rows] > r[groups[rows]])
            retested += int(rows.numel())
        reg.end_epoch_()  # A from the exact root of the values
        eps = reg.eps_param.detach()
        if len(classes) == 1:
            root = projection_root(eps[0], values).view(1)
        else:
            root = projection_root(eps, values, groups=groups)
        assert torch.equal(reg.schedule.tau_active, values > root[groups])
        torch.testing.assert_close(reg.tau, torch.minimum(values, root.clamp_min(0)[groups]))
    assert retested > 0


def test_epoch_end_projects_inline_once(monkeypatch):
    """``end_epoch_`` reads ``reg.eps`` / ``reg.tau`` several times (dual step, inert check,
    statistics): in mode ``"inline"`` one projection of all of ``tau`` serves every read of one
    epoch end."""
    s = torch.tensor([1, 0] * 20)
    reg = FBetaRegularizer(s, schedule=Inline(), tau=DenseTau())
    with torch.no_grad():
        reg.tau_param.copy_(torch.linspace(0.5, 1.5, reg.tau_param.numel()))
    reg.score_epoch.fill_(0)
    calls = []
    project = reg._project
    monkeypatch.setattr(reg, "_project", lambda *a, **k: calls.append(1) or project(*a, **k))
    reg.end_epoch_()
    assert len(calls) == 1
    reg.stats()  # outside the epoch end: computed afresh
    assert len(calls) == 2  # stats() too: one projection


def test_inert_message_names_only_remedies_not_in_effect():
    """A run on the library defaults is not told to use them (issue 30: CamVid sky at epoch 1
    advised the defaults to a run already on them); a run on ``FBetaRegularizer.paper`` is."""
    s = torch.tensor([1, 0] * 10)
    below = torch.where(s == 1, -0.5, -2.0)
    defaults = _one_epoch(FBetaRegularizer(s), below)["inert"]
    assert "at or below 0" in defaults and "library defaults" not in defaults
    paper = _one_epoch(FBetaRegularizer.paper(s), below)["inert"]
    assert "library defaults" in paper


@pytest.mark.parametrize(
    ("option", "value", "instead"),
    [
        ("schedule", "tracked", "Tracked()"),
        ("schedule", "epoch", "EpochEnd()"),
        ("schedule", "inline", "Inline()"),
        ("tau", "dense", "DenseTau()"),
        ("tau", "sparse_adam_ahead", "SparseTau()"),
    ],
)
def test_an_option_given_by_its_old_name_names_the_type_to_use(option, value, instead):
    """The options were strings before 0.4 (``projection="inline"``, ``tau_update="dense"``): a
    string under the new keyword names the type that replaced it."""
    hint = rf"got '{value}' \(the option is a type: {option}={re.escape(instead)}\)$"
    with pytest.raises(ValueError, match=rf"{option} must be .*{hint}"):
        FBetaRegularizer(torch.tensor([0, 1] * 5), **{option: value})


@pytest.mark.parametrize(
    "option",
    [
        {"projection": "tracked"},
        {"tau_update": "dense"},
        {"inline_strength": 0.1},
        {"tau_lr": 0.1},
        {"preset": "paper"},
    ],
    ids=lambda o: next(iter(o)),
)
def test_the_retired_string_options_are_not_keywords(option):
    """``projection``, ``tau_update``, ``inline_strength``, ``tau_lr`` and ``preset`` are gone:
    ``schedule=``, ``tau=`` and ``FBetaRegularizer.paper`` replace them, and an old keyword is
    not silently ignored."""
    with pytest.raises(TypeError, match=rf"unexpected keyword argument '{next(iter(option))}'"):
        FBetaRegularizer(torch.tensor([0, 1] * 5), **option)


def test_a_soft_strength_belongs_to_the_inline_schedule():
    """The smooth projection's strength is ``Inline(strength)``'s, so no other schedule can take
    one (an ignored strength cannot be written); it is checked where it is given, and read back
    as ``reg.inline_strength``."""
    labels = torch.tensor([0, 1] * 5)
    with pytest.raises(ValueError, match=r"Inline\(strength=\.\.\.\) must be >= 0, got -0\.05"):
        Inline(strength=-0.05)
    with pytest.raises(ValueError, match=r"Inline\(strength=\.\.\.\) must be >= 0, got 'soft'"):
        Inline(strength="soft")
    soft = FBetaRegularizer(labels, schedule=Inline(strength=0.05), tau=DenseTau())
    assert (soft.projection, soft.inline_strength) == ("inline", 0.05)
    assert soft.options == (Inline(strength=0.05), DenseTau())
    assert FBetaRegularizer(labels).inline_strength == 0.0
