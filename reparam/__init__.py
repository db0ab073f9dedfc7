"""The F-beta S-measure regularizer by Lagrangian reparameterization (docs/method.md sec. 1-3b, 6).

>>> import torch
>>> from reparam import FBetaRegularizer
>>> reg = FBetaRegularizer(shape_labels=torch.tensor([0, 1, 1, 0, 1]))
>>> loss = reg(torch.randn(2), torch.tensor([0, 2]))   # L_B for the batch of samples 0 and 2
"""

from . import functional
from .functional import NEGATIVE_LOSSES, certified_fbeta_bound, negative_loss
from .regularizer import DUAL_SCHEDULES, PROJECTION_MODES, FBetaRegularizer, ShapeHead

__all__ = [
    "DUAL_SCHEDULES",
    "NEGATIVE_LOSSES",
    "PROJECTION_MODES",
    "FBetaRegularizer",
    "ShapeHead",
    "certified_fbeta_bound",
    "functional",
    "negative_loss",
]
