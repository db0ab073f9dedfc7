"""``FBetaRegularizer.compile()``: the compiled per-step math (``L_B`` with its closed-form
derivatives, the sparse ``tau`` step) gives the eager results to rounding. Compiling takes ~15 s on
2 CPU cores."""

from __future__ import annotations

import pytest
import torch

from reparam import FBetaRegularizer, ShapeHead

LABELS = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1, 0, 1] * 10)  # N = 100
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _train(compiled: bool, device: str, **options):
    torch.manual_seed(0)
    head = ShapeHead(2).to(device)
    reg = FBetaRegularizer(LABELS, lambda_init=0.3, **options).to(device)
    if compiled:
        reg.compile()
    opt = torch.optim.Adam([*head.parameters(), *reg.parameters()], lr=1e-2)
    x = (torch.linspace(-1, 1, 100)[:, None] * torch.tensor([1.0, -0.5]) + LABELS[:, None]).to(
        device
    )
    losses = []
    for _ in range(2):
        for idx in torch.randperm(100, generator=torch.Generator().manual_seed(1)).split(24):
            loss = reg(head(x[idx.to(device)]), idx)
            opt.zero_grad()
            loss.backward()
            opt.step()
            reg.after_step_()
            losses.append(loss.detach())
        reg.end_epoch_()
    return torch.stack(losses), reg


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "options",
    [dict(projection="epoch", tau_update="sparse_adam"), dict(preset="paper"), dict()],
    ids=["sparse_adam", "paper-dense", "defaults-inline"],
)
def test_compiled_regularizer_matches_eager(options, device):
    eager_losses, eager = _train(False, device, **options)
    compiled_losses, compiled = _train(True, device, **options)
    torch.testing.assert_close(compiled_losses, eager_losses, rtol=1e-5, atol=1e-6)
    for name, value in eager.state_dict().items():
        torch.testing.assert_close(compiled.state_dict()[name], value, rtol=1e-5, atol=1e-6)
