"""The sparse ``tau`` update (``reparam.sparse``, ``tau=SparseTau()``): the step of
its rule on the dense gradient, dense Adam's trajectory, rows a batch did not touch left
bit-for-bit alone, duplicates, accumulation, a non-finite step skipped, loud misuse, state round
trips."""

from __future__ import annotations

import warnings

import pytest
import torch

from reparam import DenseTau, EpochEnd, FBetaRegularizer, Inline, ShapeHead, SparseTau, Tracked

N = 60
LABELS = torch.tensor([0, 1, 2, 1, 0, 2, 1, 1, 0, 2] * 6)  # N = 60; classes 1 and 2 positive
# the short loops below leave the epoch counters alone on purpose
pytestmark = [
    pytest.mark.filterwarnings(r"ignore:.*since the last end_epoch_\(\):RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:.*receive gradients but no optimizer:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:Sparse invariant checks:UserWarning"),
]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _batches(seed: int, steps: int, batch: int = 12, *, repeat: bool = False):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randperm(N, generator=g)[:batch]
        if repeat:  # a sample twice in one batch
            idx = torch.cat([idx, idx[:3]])
        yield idx


def _pair(classes, **kw):
    """A dense and a sparse regularizer with the same start, a head for each (same weights)."""
    torch.manual_seed(0)
    head = ShapeHead(1, len(classes) if len(classes) > 1 else 1)
    common = dict(positive_classes=classes, schedule=EpochEnd(), lambda_init=0.3, **kw)
    dense = FBetaRegularizer(LABELS, tau=DenseTau(), **common)
    return head, dense, common


def _x():
    return torch.linspace(-1, 1, N)[:, None] + LABELS[:, None].float() / 2


def _run(head, reg, batches, make_tau_opt=None, *, eps_lr=0.05):
    """Train ``reg`` with a copy of ``head``: SGD on the head and ``eps``; ``tau`` by
    ``make_tau_opt(tau)`` (the dense reference, fed sparse or dense grads) or, without it, by the
    regularizer's own sparse update in ``after_step_()``."""
    head = _clone(head)
    if make_tau_opt is None:
        assert [n for n, _ in reg.named_parameters()] == ["eps_param"]
    opts = [torch.optim.SGD([*head.parameters(), reg.eps_param], lr=eps_lr)]
    if make_tau_opt is not None:
        opts.append(make_tau_opt(reg.tau_param))
    x = _x().to(reg.tau_param.device)
    head.to(x.device)
    for idx in batches:
        loss = reg(_scores(head, x[idx]), idx.to(x.device))
        for opt in opts:
            opt.zero_grad()
        loss.backward()
        for opt in opts:
            opt.step()
        reg.after_step_()
    return reg


def _scores(head, x):
    u = head(x)
    return u if u.dim() == 1 else torch.cat([torch.zeros_like(u[:, :1]), u], 1)  # column = class


def _clone(head):
    h = ShapeHead(head.linear.in_features, head.linear.out_features)
    h.load_state_dict(head.state_dict())
    return h


class RuleOnDenseGradient:
    """The reference for a sparse ``tau``: the dense regularizer's own ``tau`` gradient (autograd
    through every row), stepped by ``reparam.sparse.sparse_step_`` on the rows it touched, each
    once (a row listed twice in a batch has one summed gradient), with state of its own."""

    def __init__(self, tau, lr):
        n = tau.numel()
        self.tau, self.lr = tau, lr
        like = dict(device=tau.device)
        self.moments = torch.zeros(n, 2, **like)
        self.step_count = torch.zeros((), dtype=torch.int64, **like)
        self.last = torch.zeros(n, dtype=torch.int32, **like)

    def zero_grad(self):
        self.tau.grad = None

    @torch.no_grad()
    def step(self):
        from reparam.sparse import sparse_step_

        grad = self.tau.grad
        rows = (grad != 0).nonzero().squeeze(1)
        acc = torch.zeros(grad.numel(), 3, device=grad.device)
        acc[rows, 0], acc[rows, 1] = grad[rows], 1.0
        touched = torch.ones_like(rows, dtype=torch.bool)
        sparse_step_(
            self.tau.data,
            acc,
            rows,
            touched,
            lr=self.lr,
            moments=self.moments,
            step=self.step_count,
            last=self.last,
        )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("classes", [(1,), (1, 2)])
@pytest.mark.parametrize("repeat", [False, True])
def test_sparse_tau_is_the_rule_on_the_dense_gradient(classes, repeat, device):
    """``tau=SparseTau()``: the gradient its probe collects for the touched rows
    is the dense regularizer's, and each touched row takes one step of the rule (a sample listed
    twice in a batch, one step on the summed gradient)."""
    head, dense, common = _pair(classes)
    reference = []

    def rule(tau):
        reference.append(RuleOnDenseGradient(tau, lr=0.05))
        return reference[0]

    dense = _run(head, dense.to(device), _batches(1, 15, repeat=repeat), rule)
    sparse = FBetaRegularizer(LABELS, tau=SparseTau(lr=0.05), **common)
    sparse = _run(head, sparse.to(device), _batches(1, 15, repeat=repeat))
    torch.testing.assert_close(sparse.tau_param, dense.tau_param.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(sparse.eps_param, dense.eps_param, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(sparse.sparse_tau.moments, reference[0].moments, rtol=1e-6, atol=0)
    assert torch.equal(sparse.sparse_tau.last, reference[0].last)
    assert int(sparse.sparse_tau.step) == 15
    assert not torch.equal(sparse.tau_param, torch.ones_like(sparse.tau_param))  # it moved


def test_rows_outside_the_batch_are_left_bit_for_bit():
    reg = FBetaRegularizer(LABELS, schedule=EpochEnd(), lambda_init=0.5)
    for _ in range(3):  # give every row some moments first
        for idx in torch.arange(N).split(20):
            reg(torch.randn(len(idx), requires_grad=True), idx).backward()
            reg.after_step_()
    before = {k: v.clone() for k, v in reg.state_dict().items()}
    idx = torch.tensor([1, 3, 6, 0])  # positives 1, 3, 6 (class 1) and a negative
    reg(torch.randn(4, requires_grad=True), idx).backward()
    reg.after_step_()
    rows = reg.layout.slot[idx[:3]]
    others = torch.ones(reg.tau_param.numel(), dtype=torch.bool)
    others[rows] = False
    for name in ("tau_param", "sparse_tau.moments", "sparse_tau.last"):
        assert torch.equal(reg.state_dict()[name][others], before[name][others]), name
        assert not torch.equal(reg.state_dict()[name][rows], before[name][rows]), name
    assert torch.count_nonzero(reg.sparse_tau.acc) == 0


def test_gradient_accumulation_sums_like_dense_gradients():
    """Two backward passes, one step: the rule's step on the summed dense gradient."""
    kw = dict(schedule=EpochEnd(), lambda_init=0.4)
    dense = FBetaRegularizer(LABELS, tau=DenseTau(), **kw)
    sparse = FBetaRegularizer(LABELS, tau=SparseTau(lr=0.5), **kw)
    u = torch.randn(N)
    for idx in (torch.arange(0, 20), torch.arange(10, 30)):  # overlapping rows
        dense(u[idx].clone().requires_grad_(), idx).backward()
        sparse(u[idx].clone().requires_grad_(), idx).backward()
    RuleOnDenseGradient(dense.tau_param, lr=0.5).step()
    sparse.after_step_()
    torch.testing.assert_close(sparse.tau_param, dense.tau_param.detach())
    assert not torch.equal(sparse.tau_param, torch.ones_like(sparse.tau_param))


@pytest.mark.parametrize("where", ["one row", "every row"])
def test_a_nonfinite_gradient_skips_the_step(where):
    """A non-finite gradient on one row (or all): nothing of tau's state moves at the step."""
    reg = FBetaRegularizer(LABELS, schedule=EpochEnd(), lambda_init=0.5)
    before = {k: v.clone() for k, v in reg.state_dict().items()}
    loss = reg(torch.randn(3, requires_grad=True), torch.tensor([1, 2, 3]))
    if where == "one row":
        loss.backward()
        reg.sparse_tau.acc[reg.layout.slot[1], 0] = float("nan")  # a positive's row's gradient
    else:
        (loss * float("inf")).backward()  # every gradient non-finite
    reg.after_step_()
    for k, v in reg.state_dict().items():
        if k not in ("scores", "score_epoch", "batches"):  # the forward's memory
            assert torch.equal(v, before[k]), k
    assert torch.count_nonzero(reg.sparse_tau.acc) == 0  # the sums cleared
    # and the next finite step works
    reg(torch.randn(10, requires_grad=True), torch.arange(10)).backward()
    reg.after_step_()
    assert not torch.equal(reg.tau_param, before["tau_param"])


@pytest.mark.parametrize("strength", [0.0, 0.1])
def test_sparse_with_a_coupling_loss_is_refused(strength):
    """``Inline()`` couples every row of tau in each step: the pair with ``SparseTau()`` (the
    default ``tau``) is refused at construction, naming the pairs that run."""
    match = r"schedule=Inline\(strength=.*couples every row.*O\(n\) per step.*tau=DenseTau\(\)"
    with pytest.raises(ValueError, match=match):
        FBetaRegularizer(LABELS, schedule=Inline(strength=strength))
    with pytest.raises(ValueError, match="couples every row"):
        FBetaRegularizer(LABELS, schedule=Inline(), tau=SparseTau(lr=0.1))
    assert FBetaRegularizer(LABELS, schedule=Inline(), tau=DenseTau()).tau_update == "dense"


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (
            lambda: FBetaRegularizer(LABELS, tau="lazy"),
            r"tau must be SparseTau\(\) \| DenseTau\(\)",
        ),
        (
            lambda: FBetaRegularizer(LABELS, tau="dense"),
            r"got 'dense' \(the option is a type: tau=DenseTau\(\)\)",
        ),
        (lambda: FBetaRegularizer(LABELS, tau=SparseTau), "tau must be"),  # the type, not a value
        (lambda: SparseTau(lr=0.0), r"SparseTau\(lr=...\) must be > 0, got 0\.0"),
        (lambda: SparseTau(lr=float("nan")), r"SparseTau\(lr=...\) must be > 0"),
    ],
)
def test_bad_options_name_the_argument(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_forgetting_attach_warns():
    """No ``attach`` (and no explicit step): the sparse tau would not move; said after one
    epoch's worth of samples."""
    reg = FBetaRegularizer(LABELS, schedule=EpochEnd())
    with pytest.warns(RuntimeWarning, match=r"after_step_\(\) has not been called.*tau does not"):
        for _ in range(2):
            for idx in torch.arange(N).split(20):
                reg(torch.randn(len(idx), requires_grad=True), idx).backward()
            reg.end_epoch_()


@pytest.mark.parametrize("schedule", [EpochEnd(), Tracked()], ids=repr)
def test_attach_steps_as_an_explicit_after_step(schedule):
    """``attach``'s hook is the step point: a loop of forward, backward and the optimizer's
    step ends bit for bit where the same loop calling ``after_step_()`` after each step ends,
    and without a warning."""
    states = []
    for attached in (True, False):
        reg = FBetaRegularizer(LABELS, schedule=schedule)
        opt = torch.optim.Adam(reg.parameters(), lr=1e-2)
        if attached:
            reg.attach(opt)
        gen = torch.Generator().manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(2):
                for idx in torch.randperm(N, generator=gen).split(20):
                    u = torch.randn(len(idx), generator=gen, requires_grad=True)
                    reg(u, idx).backward()
                    opt.step()
                    if not attached:
                        reg.sparse_tau.lr = 1e-2
                        reg.after_step_()
                    opt.zero_grad()
                reg.end_epoch_()
        assert int(reg.sparse_tau.step) == 2 * N // 20
        states.append(reg.state_dict())
    for k, value in states[1].items():
        assert torch.equal(states[0][k], value), k


def test_a_forward_without_a_backward_leaves_tau_alone():
    """A forward that records a gradient but gets no backward (a loss only logged): no step,
    and the next step is the one it would have been."""
    runs = []
    for extra in (False, True):
        reg = FBetaRegularizer(LABELS)
        opt = torch.optim.Adam(reg.parameters(), lr=1e-2)
        reg.attach(opt)
        gen = torch.Generator().manual_seed(0)
        for k, idx in enumerate(torch.randperm(N, generator=gen).split(20)):
            u = torch.randn(len(idx), generator=gen)
            if extra and k == 3:  # the same rows as the step's own batch
                reg(u.clone().requires_grad_(), idx)  # no backward
            reg(u.requires_grad_(), idx).backward()
            opt.step()
            opt.zero_grad()
        runs.append(reg.state_dict())
    for k in ("tau_param", "eps_param", "sparse_tau.moments", "sparse_tau.step", "sparse_tau.last"):
        assert torch.equal(runs[0][k], runs[1][k]), k


def test_state_round_trip_and_dense_state_loads_into_sparse_tau():
    reg = FBetaRegularizer(LABELS, schedule=EpochEnd(), lambda_init=0.5)
    for idx in torch.arange(N).split(20):
        reg(torch.randn(len(idx), requires_grad=True), idx).backward()
        reg.after_step_()
    reg.end_epoch_()
    copy = FBetaRegularizer(LABELS, schedule=EpochEnd())
    copy.load_state_dict(reg.state_dict())
    for k, v in reg.state_dict().items():
        assert torch.equal(copy.state_dict()[k], v), k
    dense = FBetaRegularizer(LABELS, schedule=EpochEnd(), tau=DenseTau(), lambda_init=0.5)
    fresh = FBetaRegularizer(LABELS, schedule=EpochEnd())
    fresh.load_state_dict(dense.state_dict())  # no moments in a dense state: start at zero
    assert int(fresh.sparse_tau.step) == 0 and torch.equal(
        fresh.tau_param, dense.tau_param.detach()
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_paired_row_adds_equal_index_add_with_repeated_rows(dtype, index_dtype):
    """``add_rows_`` (scatter over the pair) sums exactly what ``index_add_`` sums, repeats in order."""
    from reparam.sparse import add_rows_

    g = torch.Generator().manual_seed(0)
    rows = torch.randint(0, 50, (400,), generator=g).to(index_dtype)  # many repeats
    values = torch.randn(400, 2, generator=g, dtype=dtype)
    state = torch.randn(50, 2, generator=g, dtype=dtype)
    want = state.clone().index_add_(0, rows, values)
    add_rows_(state, rows, values)
    assert torch.equal(state, want)


@pytest.mark.parametrize("schedule", [EpochEnd(), Tracked()], ids=repr)
def test_several_classes_step_one_row_per_sample_not_one_per_column(schedule):
    """A sample is a positive of one class at most: the sparse step and the tracked set see the
    batch's B rows, not B x classes entries (the 11-class per-image F-beta's cost)."""
    reg = FBetaRegularizer(LABELS, positive_classes=(0, 1, 2), schedule=schedule)
    idx = torch.arange(12)
    u = torch.randn(12, 3, generator=torch.Generator().manual_seed(0), requires_grad=True)
    reg(u, idx).backward()
    rows, touched = reg.sparse_tau.noted_rows, reg.sparse_tau.noted_touched
    assert rows.numel() == touched.numel() == 12
    assert bool(touched.all())  # every sample of LABELS is a positive of one of the 3 classes
    torch.testing.assert_close(reg.sparse_tau.acc[:, 1].sum(), torch.tensor(12.0))  # one each
    assert int((reg.sparse_tau.acc[:, 0] != 0).sum()) == 12


@pytest.mark.parametrize("accumulate", [1, 2])
@pytest.mark.parametrize("schedule", [EpochEnd(), Tracked()], ids=repr)
def test_a_large_cpu_batch_steps_its_touched_rows_only_with_the_same_result(
    schedule, accumulate, monkeypatch
):
    """From ``COMPACT_FROM`` entries the CPU keeps a batch's positives only (the accumulation in
    the backward, the sparse step); the state ends where keeping every entry leaves it."""
    from reparam import sparse

    labels = (torch.rand(20000, generator=torch.Generator().manual_seed(0)) < 0.3).long()
    states = {}
    for compact in (True, False):
        monkeypatch.setattr(sparse, "COMPACT_FROM", 4096 if compact else 10**9)
        reg = FBetaRegularizer(labels, schedule=schedule)
        gen = torch.Generator().manual_seed(1)
        for _ in range(4):
            for _ in range(accumulate):
                idx = torch.randperm(20000, generator=gen)[:5000]
                reg(torch.randn(5000, generator=gen, requires_grad=True), idx).backward()
            if compact:
                rows, touched = reg.sparse_tau.take_noted_()
                assert bool(touched.all()) and rows.numel() <= 5000 * accumulate
                reg.sparse_tau._note_([(rows, touched)])
            reg.after_step_()
        states[compact] = reg.state_dict()
    kept, every = states.values()
    for k, value in every.items():
        torch.testing.assert_close(kept[k], value, rtol=0, atol=0, msg=k)
    assert not torch.equal(every["tau_param"], torch.ones_like(every["tau_param"]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gap", [1, 7, 60])
def test_sparse_adam_ahead_rests_where_dense_adam_goes(gap, device):
    """``"sparse_adam_ahead"`` stores each row's rest point: with gradients that do not depend on
    the values, after the last touch it equals where ``torch.optim.Adam`` (dense, every row every
    step) carries the rows once their momentum is spent; rows touched every ``gap`` steps on
    average, repeats in a batch counted once; and the moments equal dense Adam's at each row's
    last touch, decayed to the present."""
    from reparam.sparse import sparse_step_

    n, steps, lr = 40, 90, 0.05
    g = torch.Generator().manual_seed(gap)
    grads = torch.randn(steps, n, generator=g, dtype=torch.float64)
    touch = torch.rand(steps, n, generator=g, dtype=torch.float64) < 1 / gap
    grads = torch.where(touch, grads, 0.0)
    dense = torch.ones(n, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([dense], lr=lr)
    tau = torch.ones(n, dtype=torch.float64, device=device)
    acc = torch.zeros(n, 3, dtype=torch.float64, device=device)
    moments = torch.zeros(n, 2, dtype=torch.float64, device=device)
    step = torch.zeros((), dtype=torch.int64, device=device)
    last = torch.zeros(n, dtype=torch.int32, device=device)
    for t in range(steps):
        dense.grad = grads[t].clone()
        opt.step()
        rows = touch[t].nonzero().squeeze(1)
        rows = torch.cat([rows, rows[:2], torch.tensor([0])]).to(device)  # repeats, a bystander
        hit = touch[t].to(device)[rows]
        acc.index_add_(
            0,
            rows,
            torch.stack([grads[t].to(device)[rows] * 0.5, hit.double(), 0 * hit.double()], 1),
        )
        acc[:, 0] = torch.where(touch[t].to(device), grads[t].to(device), 0.0)  # summed once
        sparse_step_(tau, acc, rows, hit, lr=lr, moments=moments, step=step, last=last)
    assert int(step) == steps
    state = opt.state[dense]
    k = (steps - last.cpu()).double()
    m = moments.cpu()[:, 0] * 0.9**k
    v = moments.cpu()[:, 1] * 0.999**k
    torch.testing.assert_close(m, state["exp_avg"], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(v, state["exp_avg_sq"], rtol=1e-9, atol=1e-12)
    for _ in range(700):  # spend the momentum: 0.9 / sqrt(0.999) ^ 700 < 1e-31
        dense.grad = torch.zeros(n, dtype=torch.float64)
        opt.step()
    # to Adam's epsilon (1e-8 next to sqrt(v), which the closed form decays without it)
    torch.testing.assert_close(tau.cpu(), dense.detach(), rtol=1e-5, atol=1e-5)
    hit = touch.any(0)
    assert hit.sum() > n // 2 and ((tau.cpu() - 1).abs() > 1e-3).equal(hit)  # touched rows moved


def test_sparse_adam_ahead_table_is_the_momentums_future():
    """``E(t) = sum_{u > t} c_u r^(u - t)`` against the direct sum, and its constant tail."""
    from reparam import sparse

    table = sparse._ahead_table(torch.float64)
    b1, b2 = sparse.ADAM_BETAS
    r = b1 / b2**0.5
    for t in (0, 1, 5, 100, 3000):
        u = torch.arange(t + 1, t + 3001, dtype=torch.float64)
        direct = ((1 - b2**u).sqrt() / (1 - b1**u) * r ** (u - t)).sum()
        torch.testing.assert_close(table[t], direct, rtol=1e-12, atol=0)
    torch.testing.assert_close(table[-1], torch.tensor(r / (1 - r), dtype=torch.float64))


def test_attach_gives_sparse_adam_ahead_the_optimizers_lr():
    """``attach``: ``SparseTau()`` without an explicit ``lr`` steps at the lr of the group that
    steps ``eps``, at every step (an lr scheduler too); an explicit ``SparseTau(lr=...)`` is
    kept."""
    reg = FBetaRegularizer(LABELS)
    assert reg.tau_update == "sparse_adam_ahead"
    opt = torch.optim.Adam([{"params": [torch.zeros(1)]}, {"params": reg.parameters(), "lr": 3e-3}])
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    reg.attach(opt)
    for lr in (3e-3, 1.5e-3):
        reg(torch.randn(10, requires_grad=True), torch.arange(10)).backward()
        opt.step()
        sched.step()
        assert reg.tau_lr == lr
    assert int(reg.sparse_tau.step) == 2  # the hook still steps tau
    other = FBetaRegularizer(LABELS, tau=SparseTau(lr=0.05))
    other_opt = torch.optim.Adam(other.parameters(), lr=3e-3)
    other.attach(other_opt)
    other(torch.randn(10, requires_grad=True), torch.arange(10)).backward()
    other_opt.step()
    assert int(other.sparse_tau.step) == 1 and other.tau_lr == 0.05


def test_a_resume_after_a_step_is_bit_for_bit():
    """Saved after the optimizer's step: a fresh regularizer loaded from the state continues as
    the run that was not interrupted; a 0.3 state (with the rows its step left for their
    re-test: ``schedule.held_*``) loads when none waits, else names its version."""

    def make():
        reg = FBetaRegularizer(LABELS)
        opt = torch.optim.Adam(reg.parameters(), lr=1e-2)
        reg.attach(opt)
        return reg, opt

    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(20, generator=gen), idx) for idx in torch.randperm(N).split(20)[:6]]

    def steps(reg, opt, part):
        for u, idx in part:
            reg(u.clone().requires_grad_(), idx).backward()
            opt.step()
            opt.zero_grad()

    whole, whole_opt = make()
    steps(whole, whole_opt, batches)
    first, first_opt = make()
    steps(first, first_opt, batches[:3])
    resumed, resumed_opt = make()
    resumed.load_state_dict(first.state_dict())
    resumed_opt.load_state_dict(first_opt.state_dict())
    steps(resumed, resumed_opt, batches[3:])
    for k, value in whole.state_dict().items():
        assert torch.equal(resumed.state_dict()[k], value), k
    old = dict(whole.state_dict())
    held = {"held_rows": torch.zeros(2, dtype=torch.int64), "held_values": torch.zeros(2)}
    held |= {"held_first": torch.zeros(2, dtype=torch.bool)}
    for kept in (False, True):
        saved = old | {f"schedule.{k}": v for k, v in held.items()}
        saved["schedule.held_kept"] = torch.full((2,), kept)
        fresh, _ = make()
        if kept:
            with pytest.raises(RuntimeError, match=r"saved by fbeta-reparam 0\.3"):
                fresh.load_state_dict(saved)
        else:
            fresh.load_state_dict(saved)
            assert torch.equal(fresh.tau_param, whole.tau_param)


def test_after_step_after_zero_grad_is_an_error_when_a_clipped_row_follows_eps():
    """Under ``Tracked()`` a row clipped at the threshold follows the step's gradient of ``eps``
    (method note sec. 3b): an ``after_step_()`` that comes after ``zero_grad()`` finds none and
    says so, rather than leaving the row where it is."""
    reg = FBetaRegularizer(LABELS)  # the defaults: Tracked(), SparseTau()
    opt = torch.optim.SGD(reg.parameters(), lr=0.1)
    idx = torch.arange(N)
    with torch.no_grad():
        reg.tau_param.add_(1.0)  # every row above e* until the step re-tests it
    reg(torch.full((N,), -3.0, requires_grad=True), idx).backward()
    assert reg.sparse_tau.acc[:, 2].sum() > 0
    opt.step()
    opt.zero_grad()
    with pytest.raises(ValueError, match=r"before optimizer.zero_grad\(\)"):
        reg.after_step_()
