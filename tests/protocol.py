"""The regularizers' protocol as a test helper: one correct training loop over any objective.

``loss = task + reg(scores, idx)`` per step, ``optimizer.step()`` on the model's and the objective's
parameters, ``reg.after_step_()`` after every step and ``reg.end_epoch_()`` after every epoch (the
loop of docs/method/dual-ascent.md sec. 3b and of the README).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn


def run_protocol(
    reg: nn.Module,
    head: nn.Module,
    x: Tensor,
    *,
    epochs: int = 1,
    batch: int = 8,
    optimizer: torch.optim.Optimizer | Callable[..., torch.optim.Optimizer] | None = None,
    generator: torch.Generator | None = None,
    end_epoch: bool = True,
    after_step: bool = True,
) -> torch.optim.Optimizer:
    """Train ``head(x)``'s score with ``reg`` for ``epochs`` (batches of ``batch`` dataset indices,
    shuffled by ``generator`` when given). ``optimizer``: an optimizer, or a factory taking the
    head's and the objective's parameters (default Adam, lr 1e-2). Returns the optimizer."""
    if isinstance(optimizer, torch.optim.Optimizer):
        opt = optimizer
    else:
        params = [*head.parameters(), *reg.parameters()]
        opt = (optimizer or (lambda p: torch.optim.Adam(p, lr=1e-2)))(params)
    n = len(x)
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
        for idx in order.split(batch):
            loss = reg(head(x[idx]), idx)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if after_step:
                reg.after_step_()
        if end_epoch:
            reg.end_epoch_()
    return opt
