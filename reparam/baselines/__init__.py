"""Alternatives to the reparameterized regularizer, for comparison studies (method note sec. 9).

* LP layer (Meng et al., NeurIPS 2021): ``solve_lp`` (Mangasarian's Newton method on an
  exterior penalty, batched, unrolled or active-set gradients) and the minibatch LP losses
  ``auc_lp_loss``, ``fbeta_lp_loss``;
* surrogates: ``soft_fbeta_loss``, ``pairwise_squared_hinge_auc_loss``;
* Newton losses (Petersen et al., NeurIPS 2024): ``newton_loss`` (Hessian),
  ``inject_fisher`` (empirical Fisher);
* optional peers, imported lazily: Cooper (``cooper_fbeta_problem``, ``cooper_rate_problem``) and LibAUC
  (``libauc_aucm_pesg``);
* the paper's per-step projection of F-beta: ``FullProjectionsFBeta``;
* all of them behind the protocol of ``reparam``'s regularizers (``reg(scores, idx)``,
  ``after_step_``, ``end_epoch_``, ``stats``): ``LPFBeta``, ``LPAUC``, ``SoftFBeta``,
  ``PairwiseAUC``, ``CooperFBeta``, ``LibAUCMargin`` (``reparam.baselines.objectives``).

>>> import torch
>>> from reparam.baselines import auc_lp_loss, soft_fbeta_loss
>>> u, y = torch.tensor([2.0, -1.0, 0.5, 1.0]), torch.tensor([1, 0, 1, 0])
>>> round(float(auc_lp_loss(u, y)), 4)  # mean pairwise hinge, margin 0.01: (0.01 + 0.5) / 4 pairs
0.1275
>>> round(float(soft_fbeta_loss(u, y)), 4)
0.3324
"""

from .full_projections import FullProjectionsFBeta
from .lp_layer import BACKWARDS, LPSolution, solve_lp, solve_lp_trace
from .lp_losses import (
    AUC_SOLVERS,
    auc_lp_loss,
    auc_lp_problem,
    fbeta_lp_loss,
    fbeta_lp_problem,
)
from .newton import HESSIANS, fisher_step, inject_fisher, newton_loss, newton_step
from .objectives import (
    LPAUC,
    BatchLossObjective,
    CooperFBeta,
    LibAUCMargin,
    LPFBeta,
    PairwiseAUC,
    SoftFBeta,
)
from .peers import cooper_fbeta_problem, cooper_optimizer, cooper_rate_problem, libauc_aucm_pesg
from .surrogates import pairwise_squared_hinge_auc_loss, soft_fbeta_loss

__all__ = [
    "AUC_SOLVERS",
    "BACKWARDS",
    "HESSIANS",
    "LPAUC",
    "BatchLossObjective",
    "CooperFBeta",
    "FullProjectionsFBeta",
    "LPFBeta",
    "LPSolution",
    "LibAUCMargin",
    "PairwiseAUC",
    "SoftFBeta",
    "auc_lp_loss",
    "auc_lp_problem",
    "cooper_fbeta_problem",
    "cooper_optimizer",
    "cooper_rate_problem",
    "fbeta_lp_loss",
    "fbeta_lp_problem",
    "fisher_step",
    "inject_fisher",
    "libauc_aucm_pesg",
    "newton_loss",
    "newton_step",
    "pairwise_squared_hinge_auc_loss",
    "soft_fbeta_loss",
    "solve_lp",
    "solve_lp_trace",
]
