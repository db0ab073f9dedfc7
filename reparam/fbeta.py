r"""``FBetaRegularizer``: Algorithm 3 of the paper (docs/method.md sec. 3b) as an ``nn.Module``.

State (docs/method.md sec. 3): ``eps_param`` (one per positive shape class) and ``tau_param`` (one
per positive training sample, indexed by dataset index) are ``nn.Parameter``s stepped by the user's
optimizer; ``lambda`` (one per positive sample), ``mu`` (one per class), the scores remembered
during the epoch and the counters are buffers, so ``.to()``, ``state_dict()`` and checkpoints carry
all of it. ``reg.eps`` / ``reg.tau`` are the values the loss uses (the parameters themselves, or in
mode ``"inline"`` their projection).

Per training step: ``loss = task_loss + alpha * reg(scores, idx)`` (the minibatch ``L_B``),
``loss.backward(); opt.step(); reg.after_step_()``. Per epoch: ``reg.end_epoch_()`` projects
``(eps, tau)`` onto C (mode ``"epoch"``) and takes the dual ascent step

.. math::
    \lambda_i \leftarrow \max(0, \lambda_i + \eta_\lambda (\tau_i - u_i)),\qquad
    \mu_j \leftarrow \mu_j + \eta_\mu (\mathrm{mean}_{S^+_j} \tau - 1),

with the scores ``u_i`` recorded during the epoch: no extra pass over the data.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from projections import PROJECTION_METHODS, project_onto_c, soft_project_onto_c

from . import _checks
from . import functional as Fn
from .base import ReparamRegularizer


class FBetaRegularizer(ReparamRegularizer):
    """The F-beta S-measure regularizer, scale-free form (3') of docs/method.md sec. 2,
    one-vs-rest per class.

    Args:
        shape_labels: ``(N,)`` integer shape label ``s_i`` of every training sample (a tensor or
            numpy array of any integer dtype, or a sequence of ints).
        beta: the ``beta`` of F-beta (> 0).
        positive_classes: the shape classes ``j`` with an F-beta term of their own (binary:
            ``(1,)``); the regularizer is the mean of their terms. Each term's negatives are all
            samples of the other classes.
        projection: where ``Pi_C`` is applied: ``"epoch"`` (once per epoch, Algorithm 3),
            ``"step"`` (after every optimizer step), ``"inline"`` (inside the loss:
            ``L(Pi_C(eps, tau))``, exact or soft), ``"none"``.
        projection_method: ``"auto" | "sort" | "linear"`` for the exact projection.
        inline_strength: with ``projection="inline"``, ``0`` uses the exact projection (autograd
            a.e.), ``> 0`` the smooth ``soft_project_onto_c`` with that strength.
        negative_loss: ``"hinge"`` (the LP), ``"squared_hinge"`` or ``"logistic"`` (Remark 3).
        dual_lr_lambda, dual_lr_mu: dual step sizes (paper: 1e-3, 1e-5).
        dual_schedule: ``"constant"`` or ``"inverse_epoch"`` (``eta / e`` in epoch ``e = 1, 2, ..``).
        rho: ``> 0`` switches to the augmented Lagrangian (method of multipliers) for the two
            dualized constraints, with dual steps of size ``rho``; ``0`` (default) is the paper's.
        eps_init, tau_init: initial values (1 is feasible for (3') and O(1), as (3') intends).
        mu_init: initial ``mu``; default ``-beta^2`` (docs/method.md sec. 3b: the optimal ``mu`` on
            separable data; ``0`` starts where the paper's code does, and is slower).
    """

    _constrained_names = ("eps_param", "tau_param")

    def __init__(
        self,
        shape_labels: object,
        *,
        beta: float = 1.0,
        positive_classes: Sequence[int] = (1,),
        projection: str = "epoch",
        projection_method: str = "auto",
        inline_strength: float = 0.0,
        negative_loss: str = "hinge",
        dual_lr_lambda: float = 1e-3,
        dual_lr_mu: float = 1e-5,
        dual_schedule: str = "constant",
        rho: float = 0.0,
        eps_init: float = 1.0,
        tau_init: float = 1.0,
        mu_init: float | None = None,
    ) -> None:
        super().__init__(
            shape_labels, positive_classes=positive_classes, projection=projection,
            inline_strength=inline_strength, dual_lr_lambda=dual_lr_lambda,
            dual_lr_rate=dual_lr_mu, dual_lr_rate_name="dual_lr_mu", dual_schedule=dual_schedule,
            rho=rho,
        )  # fmt: skip
        self.beta = _checks.number("beta", beta, 0, strict=True)
        self.projection_method = _checks.choice(
            "projection_method", projection_method, PROJECTION_METHODS
        )
        self.negative_loss = _checks.choice("negative_loss", negative_loss, Fn.NEGATIVE_LOSSES)
        eps_init = _checks.number("eps_init", eps_init, 0)
        tau_init = _checks.number("tau_init", tau_init)
        mu_init = _checks.number("mu_init", -(self.beta**2) if mu_init is None else mu_init)
        p, n_pos = len(self.classes), self.pos_index.numel()
        self.eps_param = nn.Parameter(torch.full((p,), eps_init))
        self.tau_param = nn.Parameter(torch.full((n_pos,), tau_init))
        self.register_buffer("lam", torch.zeros(n_pos))
        self.register_buffer("mu", torch.full((p,), mu_init))

    @property
    def dual_lr_mu(self) -> float:
        return self._dual_lr_rate

    @property
    def eps(self) -> Tensor:
        """``(P,)``: the ``eps`` the loss uses (in mode ``"inline"``, ``Pi_C`` of ``eps_param``)."""
        return self._effective(0)

    @property
    def tau(self) -> Tensor:
        """``(n,)``: the ``tau`` the loss uses (in mode ``"inline"``, ``Pi_C`` of ``tau_param``)."""
        return self._effective(1)

    # --- the loss -------------------------------------------------------------------------------

    def _loss(self, u: Tensor, idx: Tensor) -> Tensor:
        """``L_B`` (docs/method.md sec. 3), the mean over positive classes."""
        eps, tau = self.constrained_parameters()
        cls = self.class_of.index_select(0, idx)
        batch, n_samples = idx.numel(), self.n_samples
        if self.rho == 0:  # the hot path: one autograd node per class, no batch split
            slots = self.slot.index_select(0, idx).clamp_min_(0)
            terms = [
                Fn.batch_lagrangian(
                    eps.select(0, j), tau, u.select(1, j), self.lam, self.mu.select(0, j),
                    cls == j, slots,
                    beta=self.beta, scale=n_samples / (n_pos * batch), kind=self.negative_loss,
                )
                for j, n_pos in enumerate(self._n_pos_list)
            ]  # fmt: skip
            return terms[0] if len(terms) == 1 else torch.stack(terms).mean()
        terms = []
        for j, n_pos in enumerate(self._n_pos_list):  # augmented Lagrangian (rho > 0)
            pos = cls == j
            slots = self.slot[idx[pos]]
            terms.append(Fn.augmented_minibatch_lagrangian(
                eps[j], tau[slots], self.lam[slots], u[pos, j], self.mu[j], u[~pos, j],
                tau[self.tau_group == j].mean(), beta=self.beta, kind=self.negative_loss,
                rho=self.rho, scale=n_samples / (n_pos * batch),
            ))  # fmt: skip
        return torch.stack(terms).mean()

    def _project(self, eps: Tensor, tau: Tensor, strength: float = 0.0) -> tuple[Tensor, Tensor]:
        one = len(self.classes) == 1  # the plain form is faster than one group of the grouped form
        if strength > 0:
            if one:
                e, t = soft_project_onto_c(eps[0], tau, strength=strength)
                return e.reshape(1), t
            return soft_project_onto_c(eps, tau, strength=strength, groups=self.tau_group)
        if one:
            e, t = project_onto_c(eps[0], tau, method=self.projection_method)
            return e.reshape(1), t
        return project_onto_c(eps, tau, groups=self.tau_group, method=self.projection_method)

    # --- the dual step --------------------------------------------------------------------------

    def _lambda_targets(self) -> tuple[Tensor, Tensor]:
        return self.tau.detach().float(), self.scores[self.pos_index, self.tau_group]

    def _dual_step_(self, eta: float) -> None:
        """``mu_j <- mu_j + eta (mean_{S+_j} tau - 1)`` (free multiplier of ``mean tau = 1``)."""
        self.mu.add_(eta * (self._class_mean(self.tau.detach()) - 1))

    def _class_mean(self, tau: Tensor) -> Tensor:
        sums = torch.zeros_like(self.mu).index_add_(0, self.tau_group, tau.float())
        return sums / self.n_pos

    # --- reporting ------------------------------------------------------------------------------

    def _objective_stats(self) -> dict[str, float | int | list | bool | None]:
        """``eps``, ``mu``; ``certified_fbeta``: the bound of docs/method.md sec. 2 on the F-beta
        of ``u > 0`` over the scored samples (``None`` when ``mean u_pos < 1``: no certificate);
        ``train_fbeta``: their true F-beta; violations of C (``tau_i > eps``) and of
        ``|mean tau - 1|`` (dualized). Per-class lists when there are several classes."""
        eps, tau = self.eps.detach().float(), self.tau.detach().float()
        bounds, fbetas = [], []
        for j in range(len(self.classes)):
            u_pos, u_neg = self._split_scores(j)
            scored = u_pos.numel() > 0
            bounds.append(Fn.certified_fbeta_bound(u_pos, u_neg, self.beta) if scored else None)
            fbetas.append(Fn.fbeta_of_decisions(u_pos, u_neg, self.beta) if scored else None)
        out: dict[str, float | int | list | bool | None] = {
            "eps": float(eps.mean()),
            "mu": float(self.mu.mean()),
            "violation_tau_gt_eps_max": float((tau - eps[self.tau_group]).clamp_min(0).max()),
            "violation_mean_tau_max": float((self._class_mean(tau) - 1).abs().max()),
            "certified_fbeta": _mean_or_none(bounds),
            "train_fbeta": _mean_or_none(fbetas),
        }
        if len(self.classes) > 1:
            out |= {"eps_per_class": eps.tolist(), "mu_per_class": self.mu.tolist(),
                    "certified_fbeta_per_class": bounds, "train_fbeta_per_class": fbetas}  # fmt: skip
        return out

    def extra_repr(self) -> str:
        return (
            f"n={self.n_samples}, positives={self.n_pos.long().tolist()}, "
            f"classes={self.classes}, beta={self.beta}, projection={self.projection!r}, "
            f"negative_loss={self.negative_loss!r}, rho={self.rho}"
        )


def _mean_or_none(xs: list) -> float | None:
    return None if any(x is None for x in xs) else sum(xs) / len(xs)
