"""The Lightning guide's module (docs/guide/lightning.md) under ``strategy="ddp"`` on CPU processes
(tests/test_lightning_ddp.py): after every optimizer step each rank compares its regularizer's
``tau``, ``eps``, ``lambda`` and remembered scores with rank 0's; rank 0 writes the largest
difference seen, and how far ``tau`` moved. Run as a script: Lightning starts the other ranks by
running it again."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
# run as a script, its folder (tests/, whose tests/reparam/ would shadow the library) leaves the path
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]


def guide_model() -> type:
    """The guide's ``Model`` class, taken from the page's code block (up to its trainer)."""
    text = (ROOT / "docs" / "guide" / "lightning.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", text, re.S)
    scope: dict = {"__name__": "lightning_guide"}
    exec(compile(code.split("\ntrainer = ")[0], "docs/guide/lightning.md", "exec"), scope)
    return scope["Model"], scope["data"], scope["s"]


class Compare(L.Callback):
    """After every optimizer step (every ``accumulate`` batches): the largest difference of the
    regularizer's state from rank 0's, over the ranks."""

    def __init__(self, accumulate: int) -> None:
        self.worst, self.steps, self.accumulate = 0.0, 0, accumulate

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.steps += 1
        if (batch_idx + 1) % self.accumulate:  # (between a step's micro-batches)
            return
        reg = module.reg
        mine = torch.cat([reg.tau, reg.eps, reg.lam, reg.scores.flatten()]).detach().clone()
        ref = mine.clone()
        dist.broadcast(ref, 0)
        diff = torch.tensor([float((mine - ref).abs().max())])
        dist.all_reduce(diff, op=dist.ReduceOp.MAX)
        self.worst = max(self.worst, float(diff))


def main(devices: int, accumulate: int, out: str) -> None:
    torch.manual_seed(0)  # the guide's data, the same on every rank
    Model, data, s = guide_model()
    compare = Compare(accumulate)
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=devices,
        strategy="ddp",
        accumulate_grad_batches=accumulate,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[compare],
    )
    model = Model(s)
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=16, shuffle=True))
    if trainer.global_rank == 0:
        moved = float((model.reg.tau - 1).abs().max())
        steps = int(model.reg.sparse_tau.step)
        Path(out).write_text(f"{compare.worst} {moved} {steps} {compare.steps}\n")
    # no interpreter teardown: freeing a DDP reducer can wait on a gloo thread that waits for
    # the GIL (a hang now and then, torch 2.13); the result is written
    os._exit(0)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
