"""The Lightning guide's module under ``strategy="ddp"`` (2 and 3 CPU processes, gloo), with no
call beyond the guide's: ``tau``, ``eps``, ``lambda`` and the remembered scores are equal on every
rank after every step, with and without ``accumulate_grad_batches`` (one step of ``tau`` per
optimizer step). Skipped without ``lightning``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning")

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("_lightning_ddp_worker.py")


@pytest.mark.parametrize(
    "devices, accumulate",
    [
        (2, 1),
        pytest.param(2, 2, marks=pytest.mark.slow),
        pytest.param(3, 1, marks=pytest.mark.slow),
    ],
)
def test_the_lightning_module_under_ddp_keeps_one_state(devices, accumulate, tmp_path):
    out = tmp_path / "result.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(devices), str(accumulate), str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    worst, moved, steps, batches = out.read_text().split()
    assert float(worst) == 0.0
    assert float(moved) > 1e-3
    # 256 samples, batch 16 per rank: 256 / (16 devices) batches per epoch, 2 epochs
    per_epoch = -(-256 // (16 * devices))
    assert int(batches) == 2 * per_epoch
    assert int(steps) == 2 * -(-per_epoch // accumulate)
