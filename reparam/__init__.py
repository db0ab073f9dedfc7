"""Nondecomposable objectives by Lagrangian reparameterization (method note sec. 1-3b, 8).

``FBetaRegularizer`` (F-beta), ``PrecisionAtRecall``, ``RecallAtPrecision`` and ``ROCAUC`` share
one contract: ``loss = task_loss + alpha * reg(scores, idx)``, ``reg.parameters()`` in the
optimizer, ``reg.attach(optimizer)`` once (the per-row state steps with ``optimizer.step()``),
``reg.epochs(E)`` or ``reg.end_epoch_()`` once per epoch, ``reg.stats()`` to log, and ``Shard`` for
a state spread over processes.

>>> import torch
>>> from reparam import FBetaRegularizer
>>> reg = FBetaRegularizer(shape_labels=torch.tensor([0, 1, 1, 0, 1]))
>>> loss = reg(torch.randn(2), torch.tensor([0, 2]))   # L_B for the batch of samples 0 and 2
"""

__version__ = "0.4.0"  # the one place of the version (pyproject.toml reads it; CHANGELOG.md)

from . import functional, rate_functional
from .base import ReparamRegularizer
from .fbeta import FBetaRegularizer
from .functional import certified_fbeta_bound
from .head import ShapeHead
from .options import DenseTau, EpochEnd, Inline, SparseTau, Tracked
from .rate_functional import RateThreshold
from .rates import ROCAUC, PrecisionAtRecall, RecallAtPrecision
from .resharding import needed_blocks, reshard_state
from .sharding import Shard

__all__ = [
    "ROCAUC",
    "DenseTau",
    "EpochEnd",
    "FBetaRegularizer",
    "Inline",
    "PrecisionAtRecall",
    "RateThreshold",
    "RecallAtPrecision",
    "ReparamRegularizer",
    "ShapeHead",
    "Shard",
    "SparseTau",
    "Tracked",
    "certified_fbeta_bound",
    "functional",
    "needed_blocks",
    "rate_functional",
    "reshard_state",
]
