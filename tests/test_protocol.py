"""One conformance suite: every objective of the trainer's registry (``train.config.REGULARIZERS``,
the reparameterized ones and the alternatives) behind the same protocol and the same tests. A new
objective is one registry line."""

from __future__ import annotations

import importlib.util
import inspect
import json
import warnings

import pytest
import torch

from reparam import ShapeHead
from reparam import functional as Fn
from tests.protocol import run_protocol
from train import config as C
from train.build import build_regularizer

LABELS = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1, 0, 1] * 4)  # N = 40
X = torch.linspace(-1, 1, 40)[:, None] + LABELS[:, None].float()
PEERS = {"cooper_fbeta": "cooper", "libauc_auc": "libauc"}  # optional extras
REQUIRED = {"precision_at_recall": {"recall": 0.8}, "recall_at_precision": {"precision": 0.8}}


def _params(name: str) -> list:
    marks = []
    if name in PEERS and importlib.util.find_spec(PEERS[name]) is None:
        marks.append(pytest.mark.skip(reason=f"{PEERS[name]} is an optional extra"))
    return pytest.param(name, marks=marks)


NAMES = [_params(name) for name in C.REGULARIZERS]


def make(name: str, **options) -> torch.nn.Module:
    """``name`` as the trainer builds it: the config's defaults, ``options`` in its sub-section."""
    cfg = C.from_dict({"regularizer": {"name": name, name: REQUIRED.get(name, {}) | options}})
    return build_regularizer(cfg.regularizer, LABELS)


def trained(name: str, epochs: int = 2, **options) -> torch.nn.Module:
    torch.manual_seed(0)
    reg = make(name, **options)
    run_protocol(reg, ShapeHead(1), X, epochs=epochs)
    return reg


@pytest.mark.parametrize("name", NAMES)
def test_an_empty_batch_gives_a_zero_loss_that_backpropagates(name):
    reg = make(name)
    u = torch.zeros(0, requires_grad=True)
    loss = reg(u, torch.zeros(0, dtype=torch.int64))
    assert loss.dim() == 0 and float(loss.detach()) == 0.0
    loss.backward()
    assert u.grad is not None and u.grad.shape == (0,)


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_round_trip_into_a_fresh_instance_continues_identically(name):
    reg = trained(name)
    fresh = make(name)
    fresh.load_state_dict(reg.state_dict())
    for (k, a), (_, b) in zip(reg.state_dict().items(), fresh.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    u, idx = torch.linspace(-2, 2, 8), torch.arange(8, 16)
    torch.testing.assert_close(fresh(u, idx), reg(u, idx), rtol=0, atol=0)
    # ``inert`` is the last epoch end's diagnosis, not state: the next epoch end says it again
    state_stats = [{k: v for k, v in r.stats().items() if k != "inert"} for r in (fresh, reg)]
    assert json.dumps(state_stats[0]) == json.dumps(state_stats[1])


@pytest.mark.parametrize("name", NAMES)
def test_floating_state_stays_float32_after_double(name):
    reg = make(name).double()
    kept = [  # float64 accumulators (the tracked schedule's sums) stay
        f"{prefix}.{k}".lstrip(".")
        for prefix, module in reg.named_modules()
        for k in getattr(module, "_float64_buffers", ())
    ]
    state = [*reg.parameters(), *(b for k, b in reg.named_buffers() if k not in kept)]
    floating = [t for t in state if t.is_floating_point()]
    assert floating and all(t.dtype == torch.float32 for t in floating)
    assert all(reg.get_buffer(k).dtype == torch.float64 for k in kept)
    loss = reg(torch.randn(8, dtype=torch.float64), torch.arange(8))  # still takes float64 scores
    assert torch.isfinite(loss)


@pytest.mark.parametrize("name", NAMES)
def test_device_moves_keep_the_state(name):
    reg = trained(name, epochs=1)
    before = {k: v.clone() for k, v in reg.state_dict().items()}
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in [*devices, "cpu"]:
        reg = reg.to(device)
        assert all(t.device.type == device for t in reg.state_dict().values())
    for k, v in reg.state_dict().items():
        assert torch.equal(v, before[k]), k


@pytest.mark.parametrize("name", NAMES)
def test_merge_scores_with_an_identity_all_reduce_changes_nothing(name):
    reg = make(name)
    reg(torch.linspace(-1, 1, 10), torch.arange(10))
    before = {k: v.clone() for k, v in reg.state_dict().items()}
    written = torch.zeros(40, dtype=torch.bool)
    written[:10] = True
    reg._merge_scores_(written, lambda t: t)  # one process
    for k, v in reg.state_dict().items():
        assert torch.equal(v, before[k]), k


@pytest.mark.parametrize("name", NAMES)
def test_stats_are_plain_python_values(name):
    stats = trained(name).stats()
    allowed = (float, int, bool, str, list, type(None))
    bad = {k: type(v).__name__ for k, v in stats.items() if not isinstance(v, allowed)}
    assert not bad, bad
    json.dumps(stats)  # loggable as they are
    assert {"epoch", "scored_fraction"} <= set(stats)


@pytest.mark.parametrize("name", NAMES)
def test_a_correct_loop_raises_no_warning(name):
    torch.manual_seed(0)
    reg = make(name)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        run_protocol(reg, ShapeHead(1), X, epochs=3)
    ours = [str(w.message) for w in record if issubclass(w.category, RuntimeWarning)]
    assert not ours, ours


@pytest.mark.parametrize(
    "name",
    [n for n in NAMES if "beta" in inspect.signature(C.REGULARIZERS[n.values[0]]).parameters],
)
def test_the_reported_fbeta_honours_beta(name):
    reg = make(name, beta=2.0)
    u = torch.tensor([1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0] * 4)
    reg(u, torch.arange(40))
    pos = LABELS == 1
    expected = Fn.fbeta_of_decisions(u[pos], u[~pos], 2.0)
    assert expected != pytest.approx(Fn.fbeta_of_decisions(u[pos], u[~pos], 1.0))
    assert reg.stats()["train_fbeta"] == pytest.approx(expected)
