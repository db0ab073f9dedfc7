"""Measurements in fresh processes, alone or as a gloo group (``benchmarks.scale_n``,
``benchmarks.scale_shards``): each measurement's peak memory is its own."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure_in_fresh_processes(module: str, args: list, world: int) -> dict[str, float]:
    """``python -m <module> --child <json>``, whose ``--child`` calls :func:`run_child` with
    ``args``, ``world`` and an output prefix; the largest value of each figure over the
    processes (the slower rank's times, the larger rank's memory)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/result"
        spec = json.dumps([*args, world, out])
        subprocess.run([sys.executable, "-m", module, "--child", spec], cwd=ROOT, check=True)
        ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(world)]
    return {key: max(r[key] for r in ranks) for key in ranks[0]}


def run_child(measure: Callable[..., dict], args: list, world: int, out: str) -> None:
    """``measure(*args)`` in this process (``world`` 1), or in each of ``world`` gloo processes;
    rank ``r`` writes its figures to ``<out>.<r>``."""
    if world == 1:
        Path(f"{out}.0").write_text(json.dumps(measure(*args)))
        return
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_group_worker, args=(world, port, measure, args, out), nprocs=world)


def _group_worker(rank: int, world: int, port: int, measure, args: list, out: str) -> None:
    import torch.distributed as dist

    from train import distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        Path(f"{out}.{rank}").write_text(json.dumps(measure(*args)))
    except BaseException:
        distributed.shutdown(False)
        raise
    # Every rank's figures are on disk: wait for the others, then leave without tearing gloo down.
    # Its teardown at exit now and then aborts a process ("terminate called without an active
    # exception", SIGABRT) after its work is done, which failed a measurement that had succeeded.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
