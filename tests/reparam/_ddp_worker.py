"""Processes for tests/reparam/test_replicated.py: K gloo processes train a linear head under
``DistributedDataParallel`` with the default F-beta objective replicated on each, as a user writes
the loop (``reg.attach(opt)``, nothing else). ``placement``: ``outside`` (the objective beside the
DDP module) or ``inside`` (a submodule of it, as a Lightning module holds it; DDP then broadcasts
its buffers at every forward). After every step each process checks that its ``tau``, ``eps`` and
remembered scores equal rank 0's; rank 0 writes the largest difference seen."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from reparam import FBetaRegularizer

N, D, B, STEPS = 240, 6, 16, 12


class Net(torch.nn.Module):
    def __init__(self, reg: FBetaRegularizer | None) -> None:
        super().__init__()
        self.head = torch.nn.Linear(D, 1)
        self.reg = reg

    def forward(self, x, idx):
        u = self.head(x)[:, 0]
        return u if self.reg is None else self.reg(u, idx)


def main(rank: int, world: int, port: str, placement: str, accumulate: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=g)
    y = (x[:, 0] + 0.5 * torch.randn(N, generator=g) > 0.6).long()
    reg = FBetaRegularizer(y)
    net = Net(reg if placement == "inside" else None)
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    params = list(net.parameters()) + ([] if placement == "inside" else list(reg.parameters()))
    opt = torch.optim.Adam(params, lr=0.05)
    reg.attach(opt)
    worst = 0.0
    order = torch.randperm(N, generator=torch.Generator().manual_seed(1))
    for step in range(STEPS):
        opt.zero_grad()
        for micro in range(accumulate):
            start = ((step * accumulate + micro) * world + rank) * B % (N - B)
            idx = order[start : start + B]
            if placement == "inside":
                loss = ddp(x[idx], idx)
            else:
                loss = reg(ddp(x[idx], idx), idx)
            loss.backward()
        opt.step()
        mine = torch.cat(
            [reg.tau.flatten(), reg.eps.flatten(), reg.scores.flatten(), reg.lam.flatten()]
        )
        ref = mine.clone()
        dist.broadcast(ref, 0)
        diff = torch.tensor([float((mine - ref).abs().max())])
        dist.all_reduce(diff, op=dist.ReduceOp.MAX)
        worst = max(worst, float(diff))
        if step == STEPS // 2:
            reg.end_epoch_()
    moved = float((reg.tau - 1).abs().max())
    if rank == 0:
        with open(out, "w") as f:
            f.write(f"{worst} {moved}\n")
    dist.barrier()
    # no teardown: freeing the DDP module's reducer joins a gloo thread that waits for the GIL
    # this thread holds (a hang now and then, torch 2.13); every rank is done after the barrier
    os._exit(0)


if __name__ == "__main__":
    rank, world, port, placement, accumulate, out = sys.argv[1:7]
    main(int(rank), int(world), port, placement, int(accumulate), out)
