"""``model.shared_gemm``: the class outputs and the shape node in one GEMM give the two-layer
path's outputs and gradients (to rounding), with the same parameters and state_dict keys."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from train.config import ModelConfig
from train.models import SMNISTNet


@pytest.mark.parametrize("name", ["linear", "mlp"])
@pytest.mark.parametrize("scores", [1, 3])
def test_shared_gemm_matches_the_two_layer_path(name, scores):
    cfg = ModelConfig(name=name, hidden=[16])
    torch.manual_seed(0)
    two = SMNISTNet((6, 5), 10, cfg, scores)
    torch.manual_seed(0)
    one = SMNISTNet((6, 5), 10, dataclasses.replace(cfg, shared_gemm=True), scores)
    assert list(one.state_dict()) == list(two.state_dict())
    for k, v in two.state_dict().items():  # same initialization from the same seed
        assert torch.equal(one.state_dict()[k], v), k
    x = torch.randint(0, 256, (7, 6, 5), dtype=torch.uint8)
    outs = []
    for net in (two, one):
        logits, u = net(x)
        (
            logits.square().sum() + (u * torch.arange(1, u.numel() + 1).view(u.shape)).sum()
        ).backward()
        outs.append((logits, u, {n: p.grad for n, p in net.named_parameters()}))
    (l2, u2, g2), (l1, u1, g1) = outs
    assert u1.shape == u2.shape == ((7,) if scores == 1 else (7, scores))
    torch.testing.assert_close(l1, l2)
    torch.testing.assert_close(u1, u2)
    for n in g2:
        torch.testing.assert_close(g1[n], g2[n], msg=n)


def test_shared_gemm_needs_the_features_input():
    with pytest.raises(ValueError, match=r"model\.shared_gemm needs model\.shape_input=features"):
        SMNISTNet((6, 5), 10, ModelConfig(shared_gemm=True, shape_input="logits"))
