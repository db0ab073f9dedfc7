"""Starting the gloo processes of ``tests/reparam/_sharded_worker.py`` (the sharded and
resharding tests), and the default suite's cases that share one start (``POOLED``)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).with_name("_sharded_worker.py")
ROOT = Path(__file__).resolve().parents[2]
# the child processes: this checkout on the path, one thread each
ENV = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}

# the default suite's cases on 2 processes, run in one group of processes (the ``sharded_pool``
# fixture): a start of the processes costs more than a case
POOLED = (
    ("fbeta", "global"),
    ("fbeta", "owner"),
    ("fbeta_ordered", "global"),
    ("fbeta_classes", "global"),
    ("roc", "global"),
    ("fbeta_groups", "global"),
    ("faults", "owner"),
    ("errors", "global"),
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(k: int, kind: str, sampling: str, out: Path, env: dict | None = None) -> None:
    """The worker's ``kind`` on ``k`` gloo processes, writing to ``out`` (``env``: more
    environment variables)."""
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(k), str(_free_port()), kind, sampling, str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=ENV | (env or {}),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


def run_pool(folder: Path) -> Path:
    """Every case of ``POOLED`` in one group of 2 processes: ``folder/<kind>-<sampling>.pt``."""
    spawn(2, "pool", ",".join(f"{kind}:{sampling}" for kind, sampling in POOLED), folder)
    return folder
