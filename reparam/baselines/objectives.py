r"""The alternatives behind the regularizers' protocol (method note sec. 9), so that one training
loop, one trainer config and one comparison script run them all:
``loss = task + alpha * reg(scores, idx)``, ``reg.after_step_()``, ``reg.end_epoch_()``, ``reg.stats()``.

* ``BatchLossObjective`` wraps any minibatch loss ``loss(u, y)`` on the shape node's scores
  (``y`` = 1 for the positive shape class): ``LPFBeta``, ``LPAUC`` (the LP layer),
  ``SoftFBeta``, ``PairwiseAUC`` (surrogates), optionally through a Newton loss
  (``newton="hessian" | "fisher"``, for the non-convex surrogates);
* ``CooperFBeta``: LP (3') as a Cooper problem with per-sample indexed multipliers, its dual
  ascent run after every optimizer step (simultaneous GDA);
* ``LibAUCMargin``: LibAUC's AUC-margin loss; ``a, b`` are parameters for the user's
  optimizer, ``alpha`` takes PESG's projected ascent step after every optimizer step.

They inherit ``reparam``'s score memory, so ``stats()`` reports the true F-beta, precision, recall
and AUC of the remembered scores for every method alike. Batches without a positive (or, for the
pairwise and AUC losses, without a negative) contribute a zero loss: a minibatch objective is not
defined on them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from reparam import functional as Fn
from reparam import rate_functional as R
from reparam.objective import ShapeObjective

from ._checks import check_choice, check_positive
from .lp_losses import auc_lp_loss, fbeta_lp_loss
from .newton import inject_fisher, newton_loss
from .peers import _require, cooper_fbeta_problem
from .surrogates import pairwise_squared_hinge_auc_loss, soft_fbeta_loss

NEWTON = ("none", "hessian", "fisher")


class BatchLossObjective(ShapeObjective):
    """A minibatch loss ``loss(u, y)`` on the scores of the batch, ``y = 1[s == positive_class]``.

    Args:
        shape_labels: ``(N,)`` integer shape labels of the training set.
        loss: ``(scores (B,), labels (B,) 0/1) -> scalar``.
        positive_class: the shape class counted as positive.
        needs_negatives: the loss needs a negative in the batch too (else a zero loss).
        newton: ``"none"``, ``"hessian"`` (``reparam.baselines.newton_loss`` around the loss, the batch's
            scores as the ``(B, 1)`` output) or ``"fisher"`` (``reparam.baselines.inject_fisher`` on the
            scores).
        newton_tikhonov: the Newton loss's ``lambda`` (``>= 0``).

    Examples:
        >>> import torch
        >>> from reparam.baselines import BatchLossObjective
        >>> mse = lambda u, y: (u - y).square().mean()  # any loss(u, y) of the batch
        >>> reg = BatchLossObjective(torch.tensor([0, 1, 1, 0, 1]), mse)
        >>> loss = reg(torch.tensor([0.5, 1.0]), torch.tensor([0, 2]))  # y = (0, 1)
        >>> round(loss.item(), 4)
        0.125
        >>> reg.after_step_(); reg.end_epoch_()
        >>> reg.stats()["train_precision"]  # of u > 0 on the remembered scores
        0.5
    """

    _needs_end_epoch = False  # nothing happens at an epoch end but the counting

    def __init__(
        self,
        shape_labels: object,
        loss: Callable[[Tensor, Tensor], Tensor],
        *,
        positive_class: int = 1,
        needs_negatives: bool = False,
        newton: str = "none",
        newton_tikhonov: float = 1.0,
    ) -> None:
        if isinstance(positive_class, bool) or not isinstance(positive_class, int):
            raise ValueError(f"positive_class must be an int class id, got {positive_class!r}")
        super().__init__(shape_labels, positive_classes=(positive_class,))
        self.loss_fn, self.positive_class, self.needs_negatives = (
            loss,
            positive_class,
            needs_negatives,
        )
        self.newton = check_choice("newton", newton, NEWTON)
        self.newton_tikhonov = check_positive("newton_tikhonov", newton_tikhonov, allow_zero=True)

    def _loss(self, u: Tensor, idx: Tensor, rows: Tensor) -> Tensor:
        y = (rows >= 0).long()
        n_pos = int(y.sum())
        if n_pos == 0 or (self.needs_negatives and n_pos == y.numel()):
            return (u * 0.0).sum()
        if self.newton == "hessian":
            return newton_loss(
                lambda v: self.loss_fn(v[:, 0], y),
                u[:, None],
                tikhonov=self.newton_tikhonov,
                hessian="full",
            )
        if self.newton == "fisher":
            u = inject_fisher(u[:, None], tikhonov=self.newton_tikhonov)[:, 0]
        return self.loss_fn(u, y)

    def _objective_stats(self) -> dict[str, float | int | list | bool | None]:
        """True F-beta (the objective's ``beta``; 1 for the AUC losses), precision, recall of
        ``u > 0`` and the exact AUC on the remembered scores."""
        return score_figures(*self._split_scores(), getattr(self, "beta", 1.0))


class LPFBeta(BatchLossObjective):
    """The LP layer on LP (3') of the batch, differentiated through the unrolled Newton steps.

    Its optimal value (``reparam.baselines.fbeta_lp_loss``) is a function of the scores. The LP is
    infeasible on batches whose positives' mean score is below 1; ``infeasibility_cost`` (``M``)
    adds the elastic variable that keeps it feasible (exact when ``M`` exceeds the optimum).

    Args:
        shape_labels: ``(N,)`` integer shape labels of the training set.
        beta: the ``beta`` of F-beta (``> 0``).
        positive_class: the shape class counted as positive.
        infeasibility_cost: ``M``, the cost of the elastic variable (``None``: the exact LP (3')).
        steps: the LP layer's Newton steps (``reparam.baselines.solve_lp``).

    Examples:
        >>> import torch
        >>> from reparam.baselines import LPFBeta
        >>> reg = LPFBeta(torch.tensor([0, 1, 1, 0, 1]))
        >>> scores = torch.tensor([0.5, 2.0, 1.5], requires_grad=True)  # samples 0, 1, 2
        >>> loss = reg(scores, torch.tensor([0, 1, 2]))  # f*_B: eps = 1, hinge (1 + 0.5) / 2
        >>> round(loss.item(), 4), round(2 / (1 + loss.item()), 4)  # and the F-1 it certifies
        (1.75, 0.7273)
        >>> loss.backward(); scores.grad  # only the negative's hinge is active
        tensor([0.5000, 0.0000, 0.0000])
    """

    def __init__(
        self,
        shape_labels: object,
        *,
        beta: float = 1.0,
        positive_class: int = 1,
        infeasibility_cost: float | None = None,
        steps: int = 30,
    ) -> None:
        check_positive("beta", beta)

        def loss(u: Tensor, y: Tensor) -> Tensor:
            return fbeta_lp_loss(
                u, y, beta=beta, infeasibility_cost=infeasibility_cost, steps=steps
            )

        super().__init__(shape_labels, loss, positive_class=positive_class)
        self.beta = beta


class LPAUC(BatchLossObjective):
    """The LP layer on the paper's pairwise AUC LP of the batch (``reparam.baselines.auc_lp_loss``).

    Args:
        shape_labels: ``(N,)`` integer shape labels of the training set.
        margin: the pairs' margin (``>= 0``; the paper's ``epsilon`` of its LP (1)).
        positive_class: the shape class counted as positive.

    Examples:
        >>> import torch
        >>> from reparam.baselines import LPAUC
        >>> reg = LPAUC(torch.tensor([0, 1, 1, 0, 1]))
        >>> scores = torch.tensor([0.5, 2.0, 0.0], requires_grad=True)  # samples 0, 1, 2
        >>> loss = reg(scores, torch.tensor([0, 1, 2]))  # pair (2, 0) violates: 0.01 + 0.5
        >>> round(loss.item(), 4)  # mean over the 2 pairs
        0.255
        >>> loss.backward(); scores.grad
        tensor([ 0.5000,  0.0000, -0.5000])
    """

    def __init__(
        self, shape_labels: object, *, margin: float = 0.01, positive_class: int = 1
    ) -> None:
        check_positive("margin", margin, allow_zero=True)
        super().__init__(
            shape_labels,
            lambda u, y: auc_lp_loss(u, y, margin=margin),
            positive_class=positive_class,
            needs_negatives=True,
        )


class SoftFBeta(BatchLossObjective):
    """``1 - soft F-beta`` of the batch with sigmoid counts at temperature ``T``.

    The loss of ``reparam.baselines.soft_fbeta_loss``, optionally through a Newton loss.

    Args:
        shape_labels: ``(N,)`` integer shape labels of the training set.
        beta: the ``beta`` of F-beta (``> 0``).
        temperature: ``T`` of the sigmoid counts (``> 0``).
        positive_class: the shape class counted as positive.
        newton: ``"none"``, ``"hessian"`` or ``"fisher"`` (as in ``BatchLossObjective``).
        newton_tikhonov: the Newton loss's ``lambda`` (``>= 0``).

    Examples:
        >>> import torch
        >>> from reparam.baselines import SoftFBeta
        >>> reg = SoftFBeta(torch.tensor([0, 1, 1, 0, 1]))
        >>> loss = reg(torch.tensor([0.5, 2.0, 0.0]), torch.tensor([0, 1, 2]))
        >>> round(loss.item(), 4)  # 1 - soft F-1 of the batch
        0.3102
        >>> reg = SoftFBeta(torch.tensor([0, 1, 1, 0, 1]), newton="hessian")
        >>> round(reg(torch.tensor([0.5, 2.0, 0.0]), torch.tensor([0, 1, 2])).item(), 4)
        0.0047
    """

    def __init__(
        self,
        shape_labels: object,
        *,
        beta: float = 1.0,
        temperature: float = 1.0,
        positive_class: int = 1,
        newton: str = "none",
        newton_tikhonov: float = 1.0,
    ) -> None:
        check_positive("beta", beta)
        check_positive("temperature", temperature)

        def loss(u: Tensor, y: Tensor) -> Tensor:
            return soft_fbeta_loss(u, y, beta=beta, temperature=temperature)

        super().__init__(
            shape_labels,
            loss,
            positive_class=positive_class,
            newton=newton,
            newton_tikhonov=newton_tikhonov,
        )
        self.beta = beta


class PairwiseAUC(BatchLossObjective):
    """The pairwise squared hinge on the batch's score gaps, optionally through a Newton loss.

    The loss of ``reparam.baselines.pairwise_squared_hinge_auc_loss``.

    Args:
        shape_labels: ``(N,)`` integer shape labels of the training set.
        margin: the hinge's margin ``m`` (``>= 0``).
        positive_class: the shape class counted as positive.
        newton: ``"none"``, ``"hessian"`` or ``"fisher"`` (as in ``BatchLossObjective``).
        newton_tikhonov: the Newton loss's ``lambda`` (``>= 0``).

    Examples:
        >>> import torch
        >>> from reparam.baselines import PairwiseAUC
        >>> reg = PairwiseAUC(torch.tensor([0, 1, 1, 0, 1]))
        >>> scores = torch.tensor([0.5, 2.0, 0.0], requires_grad=True)  # samples 0, 1, 2
        >>> loss = reg(scores, torch.tensor([0, 1, 2]))  # pairs: (1 - 1.5)+^2, (1 + 0.5)^2
        >>> loss.item()
        1.125
        >>> loss.backward(); scores.grad
        tensor([ 1.5000,  0.0000, -1.5000])
    """

    def __init__(
        self,
        shape_labels: object,
        *,
        margin: float = 1.0,
        positive_class: int = 1,
        newton: str = "none",
        newton_tikhonov: float = 1.0,
    ) -> None:
        check_positive("margin", margin, allow_zero=True)
        super().__init__(
            shape_labels,
            lambda u, y: pairwise_squared_hinge_auc_loss(u, y, margin=margin),
            positive_class=positive_class,
            needs_negatives=True,
            newton=newton,
            newton_tikhonov=newton_tikhonov,
        )


class CooperFBeta(ShapeObjective):
    """LP (3') posed as a Cooper problem: primal descent, Cooper's dual ascent.

    The problem is ``reparam.baselines.cooper_fbeta_problem``: ``eps``, ``tau`` are parameters
    for the user's optimizer, the indexed multipliers take Cooper's dual ascent step (SGD,
    ``dual_lr``) after every optimizer step, on the multipliers' gradients of the same batch
    (simultaneous gradient descent-ascent), then Cooper's projection of the inequality
    multipliers onto ``>= 0``. Needs ``pip install cooper-optim``.

    Args:
        shape_labels: ``(N,)`` integer shape labels of the training set.
        beta: the ``beta`` of F-beta (``> 0``).
        positive_class: the shape class counted as positive.
        dual_lr: the multipliers' ascent step (``> 0``).

    Examples:
        >>> import torch
        >>> from reparam.baselines import CooperFBeta
        >>> reg = CooperFBeta(torch.tensor([0, 1, 1, 0, 1]))  # eps = tau_i = 1
        >>> scores = torch.tensor([0.5, 2.0, 1.5], requires_grad=True)  # samples 0, 1, 2
        >>> opt = torch.optim.SGD([scores, *reg.parameters()], lr=0.1)
        >>> loss = reg(scores, torch.tensor([0, 1, 2]))  # beta^2 eps + (5 / 9) (1 + 0.5)
        >>> round(loss.item(), 4)
        1.8333
        >>> loss.backward(); opt.step(); reg.after_step_()  # the dual ascent step
        >>> round(reg.stats()["eps"], 4)
        0.8444
    """

    _needs_end_epoch = False

    def __init__(
        self,
        shape_labels: object,
        *,
        beta: float = 1.0,
        positive_class: int = 1,
        dual_lr: float = 0.1,
    ) -> None:
        super().__init__(shape_labels, positive_classes=(positive_class,))
        binary = (self.shape_labels == positive_class).long()
        self.cmp = cooper_fbeta_problem(binary, beta=beta)  # starts at eps = tau_i = 1, as F-beta
        self.eps_param, self.tau_param = self.cmp.eps, self.cmp.tau  # registered: the optimizer's
        self.multipliers = nn.ModuleList(
            [
                c.multiplier
                for c in (
                    self.cmp.tau_le_u,
                    self.cmp.tau_le_eps,
                    self.cmp.eps_nonneg,
                    self.cmp.mean_tau,
                )
            ]
        )
        lr = check_positive("dual_lr", dual_lr)
        self.dual = torch.optim.SGD(
            self.multipliers.parameters(), lr=lr, maximize=True, foreach=False
        )
        self.beta, self.positive_class = beta, positive_class
        self._dual_lagrangian: Tensor | None = None

    def _loss(self, u: Tensor, idx: Tensor, rows: Tensor) -> Tensor:
        state = self.cmp.compute_cmp_state(u, idx)
        primal = state.compute_primal_lagrangian()
        self._dual_lagrangian = state.compute_dual_lagrangian().lagrangian
        return primal.lagrangian

    def _after_step_body_(self) -> None:
        if self._dual_lagrangian is None:
            return
        with torch.enable_grad():
            self.dual.zero_grad()
            self._dual_lagrangian.backward()
        self.dual.step()
        for m in self.multipliers:
            m.post_step_()  # inequality multipliers back onto >= 0
        self.dual.zero_grad(set_to_none=True)  # the user's optimizer must never see them
        self._dual_lagrangian = None

    def _objective_stats(self) -> dict[str, float | int | list | bool | None]:
        lam = self.multipliers[0].weight.detach()
        return score_figures(*self._split_scores(), self.beta) | {
            "eps": float(self.eps_param.detach()),
            "mu": float(self.multipliers[3].weight.detach().mean()),
            "lambda_mean": float(lam.mean()),
            "lambda_max": float(lam.max()),
        }


class LibAUCMargin(ShapeObjective):
    """LibAUC's AUC-margin loss on ``sigmoid(u)``, ``alpha`` stepped by PESG's ascent.

    The loss is ``libauc.losses.AUCMLoss``: ``a``, ``b`` are parameters for the user's
    optimizer; ``alpha`` takes PESG's projected ascent step ``alpha <- max(0, alpha + alpha_lr
    grad)`` after every optimizer step (the network keeps the user's optimizer;
    ``reparam.baselines.libauc_aucm_pesg`` gives LibAUC's own PESG for everything).
    Needs ``pip install --no-deps libauc``.

    Args:
        shape_labels: ``(N,)`` integer shape labels of the training set (their positive ratio is
            LibAUC's ``imratio``).
        margin: the AUC margin ``m`` (``>= 0``).
        positive_class: the shape class counted as positive.
        alpha_lr: ``alpha``'s ascent step (``> 0``).

    Examples:
        >>> import torch
        >>> from reparam.baselines import LibAUCMargin
        >>> reg = LibAUCMargin(torch.tensor([0, 1, 1, 0, 1]))  # a = b = alpha = 0
        >>> scores = torch.tensor([0.0, 0.0, 0.0], requires_grad=True)  # samples 0, 1, 2
        >>> opt = torch.optim.SGD([scores, *reg.parameters()], lr=0.1)
        >>> loss = reg(scores, torch.tensor([0, 1, 2]))
        >>> round(loss.item(), 4)  # sigmoid(0) = 1/2: 0.4 (1/4) (2/3) + 0.6 (1/4) (1/3)
        0.1167
        >>> loss.backward(); opt.step(); reg.after_step_()  # PESG's ascent on alpha
        >>> round(float(reg.alpha), 4)
        0.0413
    """

    _needs_end_epoch = False

    def __init__(
        self,
        shape_labels: object,
        *,
        margin: float = 1.0,
        positive_class: int = 1,
        alpha_lr: float = 0.1,
    ) -> None:
        losses = _require("libauc.losses")
        super().__init__(shape_labels, positive_classes=(positive_class,))
        imratio = self.layout.n_pos_list[0] / self.n_samples
        aucm = losses.AUCMLoss(
            margin=check_positive("margin", margin, allow_zero=True), imratio=imratio, device="cpu"
        )
        self.a, self.b = (
            nn.Parameter(aucm.a.detach().clone()),
            nn.Parameter(aucm.b.detach().clone()),
        )
        self.register_buffer("alpha", aucm.alpha.detach().clone())
        del aucm.alpha  # from here on the forward pass hands it a leaf copy of our buffer
        aucm.a, aucm.b = self.a, self.b
        object.__setattr__(self, "_aucm", aucm)  # not a submodule: a, b are ours already
        self.alpha_lr, self.margin, self.positive_class = (
            check_positive("alpha_lr", alpha_lr),
            margin,
            positive_class,
        )
        self._alpha_grad: Tensor | None = None

    def _loss(self, u: Tensor, idx: Tensor, rows: Tensor) -> Tensor:
        y = (rows >= 0).float()
        alpha = self.alpha.clone().requires_grad_()
        self._aucm.alpha = alpha
        loss = self._aucm(torch.sigmoid(u), y, auto=False)  # p: the training set's ratio
        self._alpha_leaf = alpha
        return loss

    def _after_step_body_(self) -> None:
        leaf = getattr(self, "_alpha_leaf", None)
        if leaf is not None and leaf.grad is not None:
            self.alpha.copy_((self.alpha + self.alpha_lr * leaf.grad).clamp_min(0))
        self._alpha_leaf = None

    def _objective_stats(self) -> dict[str, float | int | list | bool | None]:
        return score_figures(*self._split_scores()) | {
            "a": float(self.a.detach()),
            "b": float(self.b.detach()),
            "alpha": float(self.alpha),
        }


def score_figures(u_pos: Tensor, u_neg: Tensor, beta: float = 1.0) -> dict[str, float | None]:
    """True F-beta, precision, recall of ``u > 0`` and the exact AUC (``None`` where undefined)."""
    if u_pos.numel() == 0:
        return {
            "train_fbeta": None,
            "train_precision": None,
            "train_recall": None,
            "train_auc": None,
        }
    recall, precision = R.recall_precision(u_pos, u_neg)
    return {
        "train_fbeta": Fn.fbeta_of_decisions(u_pos, u_neg, beta),
        "train_precision": precision,
        "train_recall": recall,
        "train_auc": R.roc_auc(u_pos, u_neg),
    }
