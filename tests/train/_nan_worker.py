"""One rank of a gloo process group that plays many non-finite-step draws (tests/train/test_faults.py).

Started by ``torch.multiprocessing`` (spawn): every rank builds the same small S-MNIST MLP
(wrapped in DDP by the trainer's own helper) and F-beta regularizer (attached to the optimizer, as
the trainer does), then, per draw, resets them and runs a few steps of the trainer's real
``train.loop.train_step`` under its real ``NonFiniteGuard`` (``train.nonfinite`` skip or stop), with
NaN logits or an infinite shape score on one rank at one step. It records per draw what it decided
(the steps it dropped, the error it raised) and the bytes of its model and regularizer state;
the test compares the ranks. One process group for all draws keeps them cheap.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from reparam import FBetaRegularizer
from train import distributed
from train.config import ModelConfig
from train.loop import train_step
from train.models import SMNISTNet
from train.nonfinite import NonFiniteGuard, NonFiniteLossError
from train.setup import Setup, _data_parallel
from train.state import TrainState

STEPS, BATCH = 6, 8  # steps per draw, samples per rank and step
ALPHA = 0.1


def draw(seed: int, world: int) -> dict[str, Any]:
    """What draw ``seed`` does (the same on every rank): ``train.nonfinite``, its read period, and
    where the non-finite value appears."""
    rng = random.Random(seed)
    return {
        "mode": rng.choice(("skip", "stop")),
        "check_every": rng.choice((1, 2, 100)),
        "rank": rng.randrange(world),
        "step": rng.randint(1, STEPS),
        "target": rng.choice(("logits", "u")),
    }


def state_bytes(*modules: torch.nn.Module) -> bytes:
    """Every tensor of the modules' state dicts, as raw bytes (NaN compares equal to itself)."""
    parts = []
    for module in modules:
        for value in module.state_dict().values():
            if isinstance(value, torch.Tensor):
                parts.append(
                    value.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                )
    return b"".join(parts)


def worker(rank: int, world: int, port: int, folder: str, seeds: list[int]) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(1)
    ctx = distributed.init_from_env("cpu", timeout_s=30.0)  # a rank left waiting fails, no hang
    device = torch.device("cpu")
    n = world * BATCH * STEPS
    generator = torch.Generator().manual_seed(0)  # the same data set on every rank
    images = torch.rand(n, 8, 8, generator=generator)
    labels = torch.randint(0, 4, (n,), generator=generator)
    shapes = (torch.arange(n) % 3 == 0).long()
    torch.manual_seed(0)
    model = SMNISTNet((8, 8), 4, ModelConfig(name="mlp", hidden=[16]))
    reg = FBetaRegularizer(shapes)
    optimizer = torch.optim.Adam([*model.parameters(), *reg.parameters()], lr=1e-2)
    reg.attach(optimizer)
    net = _data_parallel(model, ctx, device, find_unused=False)
    initial = [
        {k: v.clone() for k, v in model.state_dict().items()},
        {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in reg.state_dict().items()},
        optimizer.state_dict(),  # before any step: no per-parameter state
    ]
    state = TrainState({}, model, optimizer, None, None, reg, None)
    s = Setup(
        out=Path(folder),
        device=device,
        data=None,
        model=model,
        net=net,
        reg=reg,
        optimizer=optimizer,
        scheduler=None,
        scaler=None,
        train_loader=None,
        test_loader=None,
        val_loader=None,
        groups=None,
        state=state,
        written=None,  # (a reparameterized objective exchanges its scores itself)
        pixel_classes=None,
        last_checkpoint="none yet",
        reg_params=[],
        criterion=None,
    )
    plan: dict[str, Any] = {}
    forward = model.forward

    def poisoned(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, u = forward(x)
        if plan["now"] == plan["step"] and rank == plan["rank"]:
            if plan["target"] == "logits":
                logits = logits * float("nan")
            else:
                u = u + float("inf")
        return logits, u

    model.forward = poisoned
    records = []
    for seed in seeds:
        plan.update(draw(seed, world))
        model.load_state_dict(initial[0])
        reg.load_state_dict(initial[1])
        optimizer.load_state_dict(initial[2])
        state.totals, state.global_step = None, 0
        state.begin_epoch(device)
        guard = NonFiniteGuard(plan["mode"], ctx.enabled, "none yet")
        guard.begin_epoch(1, state.totals)
        dropped, error = [], None
        try:
            for k in range(1, STEPS + 1):  # as train.loop._train runs an epoch's steps
                plan["now"] = k
                first = ((k - 1) * world + rank) * BATCH  # this rank's share of global batch k
                idx = torch.arange(first, first + BATCH)
                batch = {
                    "image": images[idx],
                    "label": labels[idx],
                    "index": idx,
                    "shape": shapes[idx],
                }
                check = guard.skip or k % plan["check_every"] == 0
                if not train_step(s, batch, k, guard, ALPHA, None, check=check):
                    dropped.append(k)
                    continue
                state.global_step += 1
            guard.read()  # the epoch end's read
        except NonFiniteLossError as e:
            found = re.search(r"at epoch 1 step (\d+) ", str(e))
            error = int(found[1]) if found else str(e)
        except Exception as e:  # a collective that timed out, ...: recorded, and the group is done
            records.append({"seed": seed, "failure": f"{type(e).__name__}: {e}"})
            break
        records.append(
            {
                "seed": seed,
                "dropped": dropped,
                "error_step": error,
                "global_step": state.global_step,
                "finite": all(bool(torch.isfinite(p).all()) for p in model.parameters()),
                "state": state_bytes(model, reg),
            }
        )
    torch.save(records, Path(folder) / f"rank{rank}.pt")
    try:
        dist.barrier()
    except RuntimeError:  # the group is broken (a failure recorded above): the test names it
        pass
    # no interpreter teardown: freeing DDP's reducer can join a gloo thread waiting for the GIL
    os._exit(0)
