"""Euclidean projection onto C = {(eps, tau) : tau_i <= eps, eps >= 0} (method note sec. 4 and 5).

>>> import torch
>>> from projections import project_onto_c
>>> eps, tau = project_onto_c(torch.tensor(-1.0), torch.tensor([3.0, 0.5, -2.0]))
>>> eps.item(), tau.tolist()
(1.0, [1.0, 0.5, -2.0])
"""

from ._checks import METHODS as PROJECTION_METHODS
from .exact import AUTO_SORT_MAX_N, project_onto_c, project_onto_c_, projection_root
from .soft import SOFT_METHODS, SORT_BACKENDS, soft_project_onto_c

__all__ = [
    "AUTO_SORT_MAX_N",
    "PROJECTION_METHODS",
    "SOFT_METHODS",
    "SORT_BACKENDS",
    "project_onto_c",
    "project_onto_c_",
    "projection_root",
    "soft_project_onto_c",
]
