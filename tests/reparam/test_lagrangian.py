"""``reparam.lagrangian``: the minibatch Lagrangian in one ``autograd.Function`` (issue 31) against
the autograd composition it replaced (``tests/reparam/reference_lagrangian.py``) on random inputs,
for every option the F-beta regularizer passes; ``gradcheck`` in float64; and whole training runs
of ``FBetaRegularizer`` in every mode with either implementation."""

from __future__ import annotations

import functools
import itertools

import pytest
import torch

from reparam import DenseTau, EpochEnd, FBetaRegularizer, Inline, ShapeHead, SparseTau, Tracked
from reparam import fbeta as fbeta_module
from reparam.lagrangian import batch_lagrangian
from tests.reparam import reference_lagrangian as ref

CASES = [  # share: the tracked projection's clipping (mode "tracked")
    dict(problems=p, share=s, cap=cap)
    for p, s, cap in itertools.product((1, 3), (False, True), (False, True))
]


def _ids(case: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in case.items())


def _inputs(seed: int, problems: int, share: bool, dtype=torch.float64, eps_dim=1):
    """A batch of 16 entries over 7 rows of ``tau`` (repeated rows, negatives at row 0; the even
    rows above every ``eps``, the odd ones below), values away from the kinks (hinge, cap, clip) by
    > 1e-3, so that ``gradcheck``'s steps do not cross them."""
    gen = torch.Generator().manual_seed(seed)
    n, b = 7, 16

    def rand(*shape, lo=-1.0, hi=1.0):
        return lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=dtype)

    is_pos = torch.rand(b, generator=gen) < 0.5
    is_pos[:3] = torch.tensor([True, False, True])
    slots = torch.where(is_pos, torch.randint(0, n, (b,), generator=gen), 0)
    slots[:3] = torch.tensor([0, 0, 1])  # an even row (above every eps) and an odd one (below)
    kw: dict = dict(beta=0.7)
    if problems == 1:
        shape = () if eps_dim == 0 else (1,)
        eps, mu = rand(*shape, lo=0.2, hi=0.8), rand(*shape, lo=-1.0, hi=-0.5)
        kw["scale"] = 1.9
        eps_e = eps.expand(b)
    else:
        eps, mu = rand(problems, lo=0.2, hi=0.8), rand(problems, lo=-1.0, hi=-0.5)
        problem = torch.randint(-1, problems, (b,), generator=gen)
        problem[:3] = torch.tensor([0, 1, 0])
        is_pos &= problem >= 0
        kw |= dict(problem=problem, scale=rand(problems, lo=0.5, hi=2.0))
        kw["eps_weight"] = rand(problems, lo=0.1, hi=1.0)
        eps_e = eps.index_select(0, problem.clamp_min(0))
    if share:
        kw["share"] = rand(*eps.shape, lo=0.1, hi=0.5)
    tau = torch.where(torch.arange(n) % 2 == 0, rand(n, lo=0.9, hi=1.4), rand(n, lo=-0.5, hi=0.1))
    lam, u = rand(n, lo=0.0, hi=1.0), rand(b, lo=-1.5, hi=1.5)
    for _ in range(100):  # keep eps + u, u - eps and tau - eps away from 0
        near = ((eps_e + u).abs() < 1e-3) | ((u - eps_e).abs() < 1e-3)
        if not bool(near.any()):
            break
        u = torch.where(near, u + 0.01, u)
    t_e = tau.index_select(0, slots)
    assert bool(((t_e - eps_e).abs() > 1e-3).all())
    over = is_pos & (t_e > eps_e)
    assert bool(over.any()) and bool((is_pos & ~over).any())  # clipped rows and others
    return eps, tau, u, lam, mu, is_pos, slots, kw


def _grads(fn, eps, tau, u):
    """Value and gradients of ``fn(eps, tau, u)``."""
    eps, u = eps.detach().requires_grad_(), u.detach().requires_grad_()
    tau = tau.detach().requires_grad_()
    loss = fn(eps, tau, u)
    g_eps, g_tau, g_u = torch.autograd.grad(loss, (eps, tau, u))
    return loss.detach(), g_eps, g_tau, g_u


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_the_function_equals_the_composition_it_replaced(case, dtype):
    """Value and every gradient equal the old composition's (cap applied outside by autograd,
    the old terms function inside its own Function) to float tolerance, on 5 random batches."""
    for seed in range(5):
        eps, tau, u, *rest, kw = _inputs(
            seed, case["problems"], case["share"], dtype=dtype, eps_dim=seed % 2
        )
        kw["cap"] = case["cap"]
        new = functools.partial(_call, batch_lagrangian, rest, kw)
        old = functools.partial(_call, _old_batch_lagrangian, rest, kw)
        got, want = _grads(new, eps, tau, u), _grads(old, eps, tau, u)
        assert got[0].shape == () and got[1].shape == eps.shape
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b.to(a.dtype).reshape(a.shape))


def _call(fn, rest, kw, eps, tau, u):
    return fn(eps, tau, u, *rest, **kw)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_gradcheck_in_float64(case):
    """The closed-form gradient is the derivative of the value where it is meant to be: ``u``
    always; ``eps`` unless ``cap`` (the cap is ``eps`` detached); ``tau`` unless clipped
    (``share``: a clipped row follows ``eps`` by design)."""
    eps, tau, u, lam, mu, is_pos, slots, kw = _inputs(11, case["problems"], case["share"])
    cap = case["cap"]
    wrt = {"u": u, **({} if cap else {"eps": eps}), **({} if case["share"] else {"tau": tau})}
    fixed = {"eps": eps, "tau": tau, "u": u}

    def fn(*args):
        x = fixed | dict(zip(wrt, args, strict=True))
        return batch_lagrangian(x["eps"], x["tau"], x["u"], lam, mu, is_pos, slots, cap=cap, **kw)

    inputs = tuple(v.detach().requires_grad_() for v in wrt.values())
    assert torch.autograd.gradcheck(fn, inputs)


# Every option of FBetaRegularizer that reaches the loss: the schedules, the storages of tau, the
# cap, several classes, groups (paper=True: FBetaRegularizer.paper with the other options).
RUNS = {
    "paper": dict(paper=True),
    "paper-beta": dict(paper=True, beta=0.5),
    "defaults": dict(),
    "inline": dict(schedule=Inline(), tau=DenseTau()),
    "inline-soft": dict(schedule=Inline(strength=0.1), tau=DenseTau()),
    "tracked-dense": dict(tau=DenseTau()),
    "epoch-sparse-uncapped": dict(schedule=EpochEnd(), cap_scores=False),
    "classes": dict(positive_classes=(1, 2)),
    "classes-paper-tracked": dict(paper=True, schedule=Tracked(), positive_classes=(1, 2)),
    "groups": dict(groups=torch.arange(60) % 4),
    "groups-inline": dict(groups=torch.arange(60) % 4, schedule=Inline(), tau=DenseTau()),
}


def _train(options: dict, reference: bool, monkeypatch) -> tuple[torch.Tensor, dict]:
    if reference:
        monkeypatch.setattr(fbeta_module, "batch_lagrangian", _old_batch_lagrangian)
    else:
        monkeypatch.setattr(fbeta_module, "batch_lagrangian", batch_lagrangian)
    labels = torch.tensor([0, 1, 2, 1, 0, 1] * 10)
    classes = options.get("positive_classes", (1,))
    if len(classes) == 1:
        labels = (labels == 1).long()
    torch.manual_seed(0)
    head = ShapeHead(3, 1 if len(classes) == 1 else 3)
    options = dict(options)
    make = FBetaRegularizer.paper if options.pop("paper", False) else FBetaRegularizer
    reg = make(labels, lambda_init=0.3, **options)
    opt = torch.optim.Adam([*head.parameters(), *reg.parameters()], lr=1e-2)
    x = torch.randn(60, 3, generator=torch.Generator().manual_seed(1)) + labels[:, None]
    losses = []
    for _ in range(3):
        for idx in torch.randperm(60, generator=torch.Generator().manual_seed(2)).split(16):
            loss = reg(head(x[idx]), idx)
            opt.zero_grad()
            loss.backward()
            opt.step()
            reg.after_step_()
            losses.append(loss.detach())
        reg.end_epoch_()
    return torch.stack(losses), reg.state_dict()


def _old_batch_lagrangian(*args, **kwargs):
    """The old composition, which took the clipping as a flag of its own beside ``share``."""
    return ref.capped_batch_lagrangian(*args, clip=kwargs.get("share") is not None, **kwargs)


@pytest.mark.parametrize("options", list(RUNS.values()), ids=list(RUNS))
def test_training_runs_equal_the_old_composition(options, monkeypatch):
    """Three epochs of every mode give the losses and the state (``eps``, ``tau``, ``lambda``,
    ``mu``, Adam moments, remembered scores) of the old composition to float32 rounding."""
    new_losses, new_state = _train(options, False, monkeypatch)
    old_losses, old_state = _train(options, True, monkeypatch)
    torch.testing.assert_close(new_losses, old_losses, rtol=1e-5, atol=1e-6)
    assert new_state.keys() == old_state.keys()
    for name, value in old_state.items():
        torch.testing.assert_close(new_state[name], value, rtol=1e-5, atol=1e-6, msg=name)


# Dispatched tensor operations of one steady step (FBetaRegularizer.paper, B = 100; the backward without
# zero_grad). Eager and compiled share one form: the forward makes its two constants (a row of
# ones for the sums as matrix-vector products, the 1 of d eps) and notes the sparse rows (two
# concatenations); they enter the loss through reparam.sparse.RowGradient, whose backward adds
# their gradient to the accumulator (its first two columns: no follow weight outside "tracked");
# after_step_ (the optimizer's step) steps them with fixed
# shapes, one entry per row elected to carry its update.
# The forward tells positives from negatives by 0/1 floats (a bool select costs ten float
# operations on the CPU at a batch of pixels: four more dispatches here); the step elects one entry
# per row and adds the last touch (one more).
OP_BUDGET = {
    "dense": {"forward": 32, "backward": 10, "after_step_": 0},
    "sparse_adam_ahead": {"forward": 37, "backward": 12, "after_step_": 83},
}
TAUS = {"dense": DenseTau(), "sparse_adam_ahead": SparseTau()}


@pytest.mark.parametrize("tau_update", list(OP_BUDGET))
def test_a_step_dispatches_no_more_operations_than_measured(tau_update):
    """The per-step cost is its dispatched tensor operations (docs/figures/reg_step.md): a
    change that adds one to the hot path shows here."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            return func(*args, **(kwargs or {}))

    labels = torch.zeros(1000, dtype=torch.int64)
    labels[::2] = 1
    reg = FBetaRegularizer.paper(labels, tau=TAUS[tau_update])
    assert reg.tau_update == tau_update
    opt = torch.optim.Adam(reg.parameters(), lr=1e-3, fused=True)
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):  # the last one counted: a steady step
        idx = torch.randperm(1000, generator=gen)[:100]
        u = torch.randn(100, generator=gen).requires_grad_()
        counts = {}
        with Count() as c:
            loss = reg(u, idx)
        counts["forward"] = c.ops
        opt.zero_grad(set_to_none=True)
        with Count() as c:
            loss.backward()
        counts["backward"] = c.ops
        opt.step()
        with Count() as c:
            reg.after_step_()
        counts["after_step_"] = c.ops
    for part, budget in OP_BUDGET[tau_update].items():
        assert counts[part] <= budget, (part, counts)


# The eager operations each cell of tests/matrix.py adds to one training step (forward, backward
# and opt.step() with attach; B = 100, Adam; the plain head's own subtracted), as measured: a
# change that adds one to a cell's hot path shows here. The library's goals are lower (the
# defaults 100, groups and classes 160, the paper's cell 40, the other F-beta cells 100, the rate
# and AUC cells 40): docs/method/cost.md sec. 11 says what each cell spends them on.
CELL_OP_BUDGET = {
    "fbeta-tracked-sparse": 246,
    "fbeta-tracked-dense": 136,
    "fbeta-epoch-dense": 51,
    "fbeta-epoch-sparse": 137,
    "fbeta-inline-exact": 106,
    "fbeta-inline-soft": 247,
    "fbeta-classes": 377,
    "fbeta-groups": 460,
    "precision-at-recall-inline": 40,
    "precision-at-recall-epoch": 40,
    "recall-at-precision-inline": 56,
    "recall-at-precision-epoch": 56,
    "roc-auc-inline": 78,
    "roc-auc-epoch": 74,
}


@pytest.mark.parametrize("cell", sorted(CELL_OP_BUDGET))
def test_each_cell_adds_no_more_operations_than_measured(cell):
    """The operations a cell adds to a steady training step (the fourth), counted by a dispatch
    mode, against ``CELL_OP_BUDGET``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from reparam import ShapeHead
    from tests.matrix import CELLS

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            return func(*args, **(kwargs or {}))

    x = torch.randn(400, 16, generator=torch.Generator().manual_seed(0))

    def step_ops(regularized: bool) -> int:
        make, columns = CELLS[cell]
        torch.manual_seed(0)
        head, reg = ShapeHead(16, columns), make()
        params = [*head.parameters(), *(reg.parameters() if regularized else ())]
        opt = torch.optim.Adam(params, lr=1e-2)
        if regularized:
            reg.attach(opt)
        gen = torch.Generator().manual_seed(1)
        for _ in range(4):
            idx = torch.randperm(400, generator=gen)[:100]
            with Count() as c:
                u = head(x[idx])
                loss = reg(u, idx) if regularized else u.square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        return c.ops

    added = step_ops(True) - step_ops(False)
    assert added <= CELL_OP_BUDGET[cell], (cell, added)
