"""The supported matrix, written once: every schedule of every objective the library keeps, and the
layouts of F-beta. What is not here is not supported.

The cells are used by:

* ``tests/reparam/test_matrix.py``: every cell trains and resumes bit for bit from the
  ``state_dict`` of the regularizer, the head and the optimizer taken mid-epoch;
* ``tests/reparam/test_fullgraph.py``: every cell traces whole under
  ``torch.compile(fullgraph=True)`` of a user's step (but ``NOT_TRACED_WHOLE``), and the compiled
  training equals eager;
* ``tests/reparam/test_lagrangian.py``: gradcheck in float64 of the one autograd node every F-beta
  cell's loss goes through (clipped or not, capped or not, one problem or several);
* LP optimality against HiGHS: ``tests/reparam/test_lp.py`` (the defaults, ``FBetaRegularizer.paper``,
  inline), ``tests/reparam/test_grouped.py`` (groups), ``tests/reparam/test_rates_lp.py`` (the
  rate objectives);
* sharding (``reparam.Shard``): the cells ``SHARDED`` lists, against one process at K = 2 and 3
  (``tests/reparam/test_sharded.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from reparam import (
    ROCAUC,
    DenseTau,
    EpochEnd,
    FBetaRegularizer,
    Inline,
    PrecisionAtRecall,
    RecallAtPrecision,
)

N = 400
LABELS = (torch.rand(N, generator=torch.Generator().manual_seed(0)) < 0.3).long()
THREE = torch.arange(N) % 3  # three shape classes: 1 and 2 positive
GROUPS = torch.arange(N) % 7

# name -> (constructor of the cell's regularizer, score columns its head gives)
CELLS: dict[str, tuple[Callable[[], torch.nn.Module], int]] = {
    # F-beta: the projection's schedule x the storage of tau
    "fbeta-tracked-sparse": (lambda: FBetaRegularizer(LABELS), 1),  # the defaults
    "fbeta-tracked-dense": (lambda: FBetaRegularizer(LABELS, tau=DenseTau()), 1),
    "fbeta-epoch-dense": (lambda: FBetaRegularizer.paper(LABELS), 1),  # Algorithm 3
    "fbeta-epoch-sparse": (lambda: FBetaRegularizer(LABELS, schedule=EpochEnd()), 1),
    "fbeta-inline-exact": (lambda: FBetaRegularizer(LABELS, schedule=Inline(), tau=DenseTau()), 1),
    "fbeta-inline-soft": (
        lambda: FBetaRegularizer(LABELS, schedule=Inline(strength=0.1), tau=DenseTau()),
        1,
    ),
    # F-beta's layouts (with the defaults)
    "fbeta-classes": (lambda: FBetaRegularizer(THREE, positive_classes=(1, 2)), 3),
    "fbeta-groups": (lambda: FBetaRegularizer(LABELS, groups=GROUPS), 1),
    # the rate objectives: their two schedules
    "precision-at-recall-inline": (lambda: PrecisionAtRecall(LABELS, recall=0.9), 1),
    "precision-at-recall-epoch": (
        lambda: PrecisionAtRecall(LABELS, recall=0.9, schedule=EpochEnd()),
        1,
    ),
    "recall-at-precision-inline": (lambda: RecallAtPrecision(LABELS, precision=0.8), 1),
    "recall-at-precision-epoch": (
        lambda: RecallAtPrecision(LABELS, precision=0.8, schedule=EpochEnd()),
        1,
    ),
    "roc-auc-inline": (lambda: ROCAUC(LABELS), 1),
    "roc-auc-epoch": (lambda: ROCAUC(LABELS, schedule=EpochEnd()), 1),
}

# the inline projection of all of tau reads values (the exact one's root search, the soft one's
# checks): graph breaks (docs/method/cost.md sec. 11b)
NOT_TRACED_WHOLE = ("fbeta-inline-exact", "fbeta-inline-soft")
# the cells a sharded state supports (tests/reparam/test_sharded.py)
SHARDED = (  # the cases of tests/reparam/test_sharded.py (groups: blocks of whole groups)
    "fbeta-tracked-sparse",
    "fbeta-epoch-sparse",
    "fbeta-classes",
    "fbeta-groups",
    "precision-at-recall-epoch",
    "recall-at-precision-epoch",
    "roc-auc-epoch",
)


def build(name: str) -> tuple[torch.nn.Module, int]:
    """The cell's regularizer (seeded) and the number of score columns its head gives."""
    make, columns = CELLS[name]
    torch.manual_seed(0)
    return make(), columns
