"""What the projection benchmark times: the soft projection's strength and the budget of a full run
and of ``--quick`` (sizes and repeats of each table)."""

from __future__ import annotations

from dataclasses import dataclass

SOFT_STRENGTH = 1e-2
CLIPPED = (0, 20, 100, 300, 1000, 3000, 10_000, 100_000)  # --clipped: coordinates clipped


@dataclass(frozen=True)
class Budget:
    """The sizes and the repeats (medians) of each table."""

    sizes: tuple[int, ...]  # one vector of n coordinates
    repeats: int
    memory_sizes: tuple[int, ...]  # near the memory limit: one float32 vector
    memory_repeats: int
    qp_n: int  # against the generic QP solver
    qp_repeats: int
    batch: tuple[int, int]  # rows x n, against qpth
    batch_repeats: int


FULL = Budget(
    tuple(10**k for k in range(3, 8)), 7, (1_000_000, 10_000_000), 31, 10_000, 5, (64, 256), 5
)
QUICK = Budget((1_000, 10_000), 2, (10_000, 100_000), 3, 1_000, 3, (8, 64), 3)  # a smoke test
