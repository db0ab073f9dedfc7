"""Replicated data parallelism with nothing beyond the contract: a plain DDP loop with the default
F-beta objective on 2 and 3 gloo processes, the objective beside the DDP module or inside it, with
and without gradient accumulation (DDP's averaging at each backward). After every step ``tau``,
``eps``, ``lambda`` and the remembered scores are equal on every process
(``tests/reparam/_ddp_worker.py``)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("_ddp_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _run(world: int, placement: str, accumulate: int, tmp_path: Path) -> tuple[float, float]:
    out, port = tmp_path / "result.txt", _port()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                str(r),
                str(world),
                port,
                placement,
                str(accumulate),
                str(out),
            ],
            cwd=ROOT,
            env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    try:
        logs = [p.communicate(timeout=240)[0] for p in procs]
    finally:  # (a hung process group must not outlive the test)
        for p in procs:
            p.kill()
    for p, log in zip(procs, logs, strict=True):
        assert p.returncode == 0, log[-3000:]
    worst, moved = (float(v) for v in out.read_text().split())
    return worst, moved


@pytest.mark.parametrize(
    "world, placement, accumulate",
    [(2, "outside", 1), (2, "inside", 1), (2, "inside", 2), (3, "outside", 2)],
)
def test_replicated_processes_stay_equal_after_every_step(world, placement, accumulate, tmp_path):
    worst, moved = _run(world, placement, accumulate, tmp_path)
    assert worst == 0.0
    assert moved > 1e-3  # tau trained
