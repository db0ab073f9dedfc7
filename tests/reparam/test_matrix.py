"""Every cell of the supported matrix (``tests/matrix.py``) trains and resumes bit for bit: the
``state_dict`` of the regularizer, the head and the optimizer taken in the middle of the second
epoch and loaded into fresh objects continue to exactly the state of the uninterrupted run."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.matrix import CELLS, build

STEPS_PER_EPOCH = 8  # N = 400 in batches of 50


def _parts(name: str):
    reg, columns = build(name)
    head = torch.nn.Linear(5, columns)
    opt = torch.optim.Adam([*head.parameters(), *reg.parameters()], lr=1e-2)
    reg.attach(opt)
    return reg, head, opt, columns


def _train(parts, steps: range):
    """The steps ``steps`` of a fixed schedule (batches and features from the step's number)."""
    reg, head, opt, columns = parts
    x = torch.randn(400, 5, generator=torch.Generator().manual_seed(1))
    for k in steps:
        epoch, b = divmod(k, STEPS_PER_EPOCH)
        order = torch.randperm(400, generator=torch.Generator().manual_seed(epoch))
        idx = order[b * 50 : (b + 1) * 50]
        out = head(x[idx])
        loss = reg(out if columns > 1 else out[:, 0], idx) + 0.1 * out.square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()  # attach: reg.after_step_()
        if b == STEPS_PER_EPOCH - 1:
            reg.end_epoch_()


@pytest.mark.parametrize("name", list(CELLS))
def test_every_cell_resumes_bit_for_bit(name):
    whole = _parts(name)
    _train(whole, range(24))  # three epochs
    first = _parts(name)
    _train(first, range(13))  # stopped mid-epoch 2, after an epoch end
    saved = copy.deepcopy([first[0].state_dict(), first[1].state_dict(), first[2].state_dict()])
    resumed = _parts(name)
    for part, state in zip(resumed[:3], saved, strict=True):
        part.load_state_dict(state)
    _train(resumed, range(13, 24))
    want, got = whole[0].state_dict(), resumed[0].state_dict()
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert torch.equal(got[key], value), key
    for key, value in whole[1].state_dict().items():
        assert torch.equal(resumed[1].state_dict()[key], value), key
    assert int(want["epoch"]) == 3
