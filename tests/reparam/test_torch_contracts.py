"""The per-row state under torch's own contracts: what a dense parameter would do, or a loud error.

* a backward whose ``optimizer.step()`` is skipped (a guard that drops a batch, ``GradScaler``
  skipping an inf step), then ``zero_grad()``, leaves no trace in the sparse rows;
* the rule the rows step by is never an ignored choice: an optimizer whose rule the rows would not
  follow is refused at ``attach``;
* a forward in ``eval()`` mode or under ``torch.no_grad()`` changes no state;
* ``torch.compile(optimizer.step)`` with ``attach`` compiles once (no recompile per step).

Each is a differential test against the run without the perturbation, on random data, over every
cell of ``tests/matrix.py`` where the property is the cell's.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch

from reparam import DenseTau, FBetaRegularizer, ShapeHead, SparseTau
from tests.matrix import CELLS

X = torch.randn(400, 16, generator=torch.Generator().manual_seed(0))


def _copied(reg: torch.nn.Module, how: str | None) -> torch.nn.Module:
    """``reg`` itself, or its copy by ``copy.deepcopy`` or ``torch.save`` / ``torch.load``."""
    if how == "deepcopy":
        return copy.deepcopy(reg)
    if how == "torch.save":
        buffer = io.BytesIO()
        torch.save(reg, buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=False)
    return reg


def _build(cell: str, seed: int = 0, optimizer=torch.optim.Adam, copied=None, **options):
    make, columns = CELLS[cell]
    torch.manual_seed(seed)
    head, reg = ShapeHead(16, columns), _copied(make(), copied)
    opt = optimizer([*head.parameters(), *reg.parameters()], lr=1e-2, **options)
    reg.attach(opt)
    return head, reg, opt


def _state(reg: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in reg.state_dict().items() if torch.is_tensor(v)}


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _loss(head, reg, idx: torch.Tensor) -> torch.Tensor:
    return reg(head(X[idx]), idx)


def _train(cell: str, skip: str | None, readme_order: bool, copied: str | None = None) -> dict:
    """Two good steps, each after a batch whose step is skipped: ``skip`` ``"nan"`` (a loss guard
    drops a non-finite batch, after its backward) or ``"finite"`` (a debug backward); ``None``:
    that batch's forward only (it remembers its scores either way). ``copied``: the objective
    is a copy (``_copied``)."""
    head, reg, opt = _build(cell, copied=copied)
    g = torch.Generator().manual_seed(1)
    for _ in range(2):
        b = torch.randperm(400, generator=g)[:64]
        loss = _loss(head, reg, b) * (float("nan") if skip == "nan" else 1.0)
        if skip is not None:
            loss.backward()  # ... and its step is skipped
        opt.zero_grad()
        i = torch.randperm(400, generator=g)[:64]
        if readme_order:  # forward, zero_grad, backward, step
            loss = _loss(head, reg, i)
            opt.zero_grad()
            loss.backward()
        else:
            opt.zero_grad()
            _loss(head, reg, i).backward()
        opt.step()
    return _state(reg)


@pytest.mark.parametrize("readme_order", [False, True], ids=["zero-first", "forward-first"])
@pytest.mark.parametrize("skip", ["nan", "finite"])
@pytest.mark.parametrize("cell", sorted(CELLS))
def test_a_skipped_step_leaves_no_trace(cell: str, skip: str, readme_order: bool) -> None:
    """A backward whose step is skipped, then ``zero_grad()``: the state equals a clean run's,
    bit for bit (the sparse rows used to keep its gradient: up to 5.9e-2 off, or after a NaN the
    next good step dropped)."""
    clean = _train(cell, None, readme_order)
    _assert_same(_train(cell, skip, readme_order), clean)


@pytest.mark.parametrize("copied", ["deepcopy", "torch.save"])
@pytest.mark.parametrize("cell", ["fbeta-tracked-sparse", "fbeta-groups"])
def test_a_copied_objective_keeps_the_contract(cell: str, copied: str) -> None:
    """A copy of the objective (``copy.deepcopy``, ``torch.save`` of the module) ties its rows'
    gradient to its own ``eps`` again (a copied parameter has no hooks): a skipped step leaves
    no trace in it either."""
    clean = _train(cell, None, False, copied)
    _assert_same(_train(cell, "nan", False, copied), clean)
    _assert_same(clean, _train(cell, None, False))


def test_gradscaler_skipping_an_inf_step_leaves_no_trace() -> None:
    """``torch.amp.GradScaler`` on the CPU skips a step whose gradient is not finite (and halves
    its scale): the state is that of a run in which that batch's forward ran alone and the scale
    was halved by hand (to rounding: the loss scales differ, to which Adam is invariant but for
    its eps)."""

    def run(inf: bool) -> tuple[dict, int]:
        head, reg, opt = _build("fbeta-tracked-sparse")
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
        g = torch.Generator().manual_seed(1)
        for k in range(3):
            i = torch.randperm(400, generator=g)[:64]
            opt.zero_grad()
            loss = _loss(head, reg, i)
            if k == 1 and not inf:  # the reference: the forward only, the scale halved
                scaler.update(new_scale=2.0**7)
                continue
            scaler.scale(loss * (float("inf") if k == 1 else 1.0)).backward()
            scaler.step(opt)
            scaler.update()
        return _state(reg), int(reg.sparse_tau.step)

    (state, steps), (reference, reference_steps) = run(True), run(False)
    assert steps == reference_steps == 2  # the inf step skipped, the rows' too
    for key in state:
        torch.testing.assert_close(state[key], reference[key], rtol=1e-5, atol=1e-6, msg=key)


def test_a_step_with_no_backward_since_zero_grad_moves_no_row() -> None:
    """``zero_grad()`` after a backward, then ``step()`` with no backward: a dense parameter with
    no gradient does not move (Adam skips it); neither do the rows."""
    head, reg, opt = _build("fbeta-tracked-sparse")
    i = torch.arange(64)
    _loss(head, reg, i).backward()
    opt.zero_grad()
    before = _state(reg)
    opt.step()
    _assert_same(_state(reg), before)
    assert int(reg.sparse_tau.step) == 0


def test_after_step_by_hand_after_zero_grad_is_an_error() -> None:
    """Without ``attach``: ``after_step_()`` after ``zero_grad()`` would drop the step's rows;
    it says so."""
    torch.manual_seed(0)
    head, reg = ShapeHead(16), CELLS["fbeta-tracked-sparse"][0]()
    opt = torch.optim.Adam([*head.parameters(), *reg.parameters()], lr=1e-2)
    _loss(head, reg, torch.arange(64)).backward()
    opt.step()
    opt.zero_grad()
    with pytest.raises(ValueError, match=r"before optimizer\.zero_grad"):
        reg.after_step_()


def test_two_backward_passes_around_zero_grad_with_no_forward_between_are_refused() -> None:
    """Two forwards, the first one's backward, ``zero_grad()``, the second one's backward: the
    two passes' row sums are in one accumulator and cannot be told apart: a ``RuntimeError``."""
    head, reg, opt = _build("fbeta-tracked-sparse")
    a, b = _loss(head, reg, torch.arange(64)), _loss(head, reg, torch.arange(64, 128))
    a.backward()
    opt.zero_grad()
    with pytest.raises(RuntimeError, match="cannot be told apart"):
        b.backward()


def test_accumulated_passes_step_as_one() -> None:
    """Gradient accumulation (forward, backward, forward, backward, step) is unchanged: the first
    pass's sums are held apart and added back at the step, bit for bit the summed loss's step
    (the rows' sums are added in the same order)."""

    def run(split: bool) -> dict:
        head, reg, opt = _build("fbeta-tracked-sparse")
        g = torch.Generator().manual_seed(1)
        for _ in range(3):
            i = torch.randperm(400, generator=g)[:64]
            opt.zero_grad()
            if split:
                _loss(head, reg, i[:32]).backward()
                _loss(head, reg, i[32:]).backward()
            else:
                (_loss(head, reg, i[:32]) + _loss(head, reg, i[32:])).backward()
            opt.step()
        return _state(reg)

    a, b = run(True), run(False)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-6, atol=1e-7, msg=key)


# --- the rule the rows step by ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("optimizer", "options", "refused"),
    [
        (torch.optim.Adam, {}, False),
        (torch.optim.Adam, {"foreach": False}, False),
        (torch.optim.AdamW, {"weight_decay": 0.0}, False),
        (torch.optim.AdamW, {}, True),  # decoupled weight decay 0.01
        (torch.optim.Adam, {"betas": (0.8, 0.99)}, True),
        (torch.optim.Adam, {"amsgrad": True}, True),
        (torch.optim.Adam, {"weight_decay": 1e-4}, True),
        (torch.optim.SGD, {}, True),
        (torch.optim.SGD, {"momentum": 0.9, "nesterov": True}, True),
        (torch.optim.RMSprop, {}, True),
    ],
)
def test_an_optimizer_whose_rule_the_rows_would_not_follow_is_refused(
    optimizer, options, refused: bool
) -> None:
    """``SparseTau(lr=None)`` follows the optimizer's lr with its own Adam rule: an optimizer
    with another rule is refused at ``attach`` (``SGD(lr=1e-2)`` used to move ``tau`` by 5.7e-2
    in one step, against 1.1e-4 for a dense ``tau`` under the same SGD)."""
    reg = FBetaRegularizer(CELLS["fbeta-tracked-sparse"][0]().shape_labels)
    opt = optimizer(reg.parameters(), lr=1e-2, **options)
    if refused:
        with pytest.raises(ValueError, match=r"tau=DenseTau\(\).*tau=SparseTau\(lr=\.\.\.\)"):
            reg.attach(opt)
    else:
        reg.attach(opt)


@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.RMSprop])
def test_an_explicit_sparse_lr_or_a_dense_tau_takes_any_optimizer(optimizer) -> None:
    """The rule named by an explicit ``SparseTau(lr)`` is the objective's own, whatever optimizer
    steps the rest; ``DenseTau()`` is stepped by the optimizer itself."""
    labels = CELLS["fbeta-tracked-sparse"][0]().shape_labels
    for tau in (SparseTau(lr=1e-2), DenseTau()):
        reg = FBetaRegularizer(labels, tau=tau)
        reg.attach(optimizer(reg.parameters(), lr=1e-2))
    assert "adam(betas=(0.9, 0.999)" in repr(FBetaRegularizer(labels))


# --- a forward that records nothing ----------------------------------------------------------


@pytest.mark.parametrize("mode", ["eval", "no_grad"])
@pytest.mark.parametrize("cell", sorted(CELLS))
def test_an_eval_or_no_grad_forward_changes_no_state(cell: str, mode: str) -> None:
    """A validation loss (``eval()`` or ``torch.no_grad()``) returns the loss and changes nothing:
    the state, the statistics and the next training step are those of a run without it (a
    validation forward used to overwrite 100 remembered training scores)."""
    head, reg, opt = _build(cell)
    for k in range(2):
        i = torch.arange(64 * k, 64 * (k + 1))
        opt.zero_grad()
        _loss(head, reg, i).backward()
        opt.step()
    clean = copy.deepcopy((head, reg))
    before, stats = _state(reg), reg.stats()
    val = torch.arange(300, 400)
    if mode == "eval":
        reg.eval()
        loss = _loss(head, reg, val)
        reg.train()
    else:
        with torch.no_grad():
            loss = _loss(head, reg, val)
    assert torch.isfinite(loss)
    _assert_same(_state(reg), before)
    assert reg.stats() == stats
    assert int(reg.batches) == int(clean[1].batches)


# --- a compiled optimizer step ---------------------------------------------------------------


@pytest.mark.slow
def test_a_compiled_optimizer_step_compiles_once() -> None:
    """``torch.compile(opt.step)`` with ``attach``: at most 2 graphs in all, no recompile, and the
    eager trajectory to rounding (it used to guard on a Python counter of the regularizer and
    recompile at every step until dynamo's limit)."""
    from torch._dynamo.utils import counters

    def run(compiled: bool) -> torch.Tensor:
        head, reg, opt = _build("fbeta-tracked-sparse")
        step = torch.compile(opt.step) if compiled else opt.step
        g = torch.Generator().manual_seed(1)
        for _ in range(12):
            i = torch.randperm(400, generator=g)[:64]
            opt.zero_grad()
            _loss(head, reg, i).backward()
            step()
        return reg.tau.clone()

    torch._dynamo.reset()
    counters.clear()
    eager = run(False)
    compiled = run(True)
    assert counters["stats"]["unique_graphs"] <= 2
    assert not counters["recompiles"]
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


# --- a step's batch split into calls, backward passes ----------------------------------------


def _split_run(
    cell: str, parts: int, passes: bool, epochs: int = 3, copied: str | None = None
) -> dict:
    """``epochs`` epochs of batches of 60, each step's batch as ``parts`` calls whose mean is the
    loss (each call's ``L_B`` is its own batch's estimate, so their mean is the whole batch's;
    ``passes``: one backward pass per call, gradient accumulation); the epoch end after each
    epoch."""
    head, reg, opt = _build(cell, copied=copied)
    g = torch.Generator().manual_seed(1)
    for _ in range(epochs):
        for i in torch.randperm(360, generator=g).split(60):
            opt.zero_grad()
            losses = [_loss(head, reg, c) / parts for c in i.chunk(parts)]
            if passes:
                for loss in losses:
                    loss.backward()
            else:
                sum(losses).backward()
            opt.step()
        reg.end_epoch_()
    return _state(reg)


@pytest.mark.parametrize("passes", [False, True], ids=["calls", "passes"])
@pytest.mark.parametrize("cell", ["fbeta-tracked-sparse", "fbeta-groups"])
def test_a_tracked_step_does_not_depend_on_how_its_batch_is_split(cell: str, passes: bool) -> None:
    """Under ``Tracked()`` a sparse row clipped at the threshold takes the step's gradient of
    ``eps``, not its call's: a step's batch in 1, 2 or 4 calls (or backward passes) gives the
    same state to rounding over 3 epochs."""
    one = _split_run(cell, 1, passes)
    for parts in (2, 4):
        split = _split_run(cell, parts, passes)
        for key in one:
            if one[key].is_floating_point():
                torch.testing.assert_close(split[key], one[key], rtol=1e-4, atol=2e-5, msg=key)
