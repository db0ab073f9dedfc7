r"""``FBetaRegularizer``: Algorithm 3 of the paper (docs/method.md sec. 3b) as an ``nn.Module``.

State (docs/method.md sec. 3): ``eps`` (one per positive shape class) and ``tau`` (one per positive training
sample, indexed by dataset index) are ``nn.Parameter``s stepped by the user's optimizer;
``lambda`` (one per positive sample), ``mu`` (one per class), the scores remembered during the
epoch and the counters are buffers, so ``.to()``, ``state_dict()`` and checkpoints carry all of it.
Floating state stays float32 whatever dtype the module is moved to.

Per training step: ``loss = task_loss + alpha * reg(scores, idx)`` (the minibatch ``L_B``, docs/method.md sec. 3),
``loss.backward(); opt.step(); reg.after_step_()``. Per epoch: ``reg.end_epoch_()`` projects
``(eps, tau)`` onto C (mode ``"epoch"``) and takes the dual ascent step

.. math::
    \lambda_i \leftarrow \max(0, \lambda_i + \eta_\lambda (\tau_i - u_i)),\qquad
    \mu_j \leftarrow \mu_j + \eta_\mu (\mathrm{mean}_{S^+_j} \tau - 1),

with the scores ``u_i`` recorded during the epoch: no extra pass over the data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from projections import PROJECTION_METHODS, project_onto_c, soft_project_onto_c

from . import functional as Fn

PROJECTION_MODES = ("epoch", "step", "inline", "none")
DUAL_SCHEDULES = ("constant", "inverse_epoch")


class FBetaRegularizer(nn.Module):
    """The F-beta S-measure regularizer, scale-free form (3') of docs/method.md sec. 2, one-vs-rest per class.

    Args:
        shape_labels: int64 ``(N,)``, the shape label ``s_i`` of every training sample.
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
        mu_init: initial ``mu``; default ``-beta^2``. (3') is positively homogeneous except for
            ``mean tau = 1``, so its optimal value is ``f*(c) = c f*`` for ``mean tau = c`` and the
            optimal multiplier is ``mu* = -f*``; feasibility forces ``eps >= 1``, so
            ``f* >= beta^2`` and ``-beta^2`` is the value of ``mu*`` on separable data. ``0`` starts
            where the paper's code does (slower: ``mu`` must travel to ``-f*``, docs/regularizer.md).
    """

    def __init__(
        self,
        shape_labels: Tensor,
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
        super().__init__()
        labels = _check_labels(shape_labels)
        classes = tuple(int(c) for c in positive_classes)
        _check_options(
            beta=beta, classes=classes, projection=projection, method=projection_method,
            inline_strength=inline_strength, negative_loss=negative_loss,
            dual_lr_lambda=dual_lr_lambda, dual_lr_mu=dual_lr_mu, dual_schedule=dual_schedule,
            rho=rho, eps_init=eps_init, tau_init=tau_init,
            mu_init=-(beta**2) if mu_init is None else mu_init,
        )  # fmt: skip
        n_total = labels.numel()
        slot = torch.full((n_total,), -1, dtype=torch.int64)
        class_of = torch.full((n_total,), -1, dtype=torch.int64)
        pos_index, group, counts = [], [], []
        for j, c in enumerate(classes):
            idx = (labels == c).nonzero()[:, 0]
            n_neg = n_total - idx.numel()
            if idx.numel() == 0 or n_neg == 0:
                raise ValueError(
                    f"shape_labels must contain positives and negatives for every positive class: "
                    f"class {c} has {idx.numel()} positive and {n_neg} negative samples "
                    f"(labels present: {sorted(set(labels.tolist()))})"
                )
            slot[idx] = sum(counts) + torch.arange(idx.numel())
            class_of[idx] = j
            pos_index.append(idx)
            group.append(torch.full((idx.numel(),), j, dtype=torch.int64))
            counts.append(idx.numel())

        self.beta, self.classes, self.projection = float(beta), classes, projection
        self.projection_method, self.inline_strength = projection_method, float(inline_strength)
        self.negative_loss, self.rho = negative_loss, float(rho)
        self.dual_lr_lambda, self.dual_lr_mu = float(dual_lr_lambda), float(dual_lr_mu)
        self.dual_schedule = dual_schedule
        n_pos = sum(counts)
        p = len(classes)
        self.eps = nn.Parameter(torch.full((p,), float(eps_init)))
        self.tau = nn.Parameter(torch.full((n_pos,), float(tau_init)))
        self.register_buffer("shape_labels", labels.clone())
        self.register_buffer("slot", slot)  # dataset index -> position in tau, or -1
        self.register_buffer("class_of", class_of)  # dataset index -> positive class j, or -1
        self.register_buffer("pos_index", torch.cat(pos_index))  # position in tau -> dataset index
        self.register_buffer("tau_group", torch.cat(group))  # position in tau -> class j
        self.register_buffer("n_pos", torch.tensor(counts, dtype=torch.float32))
        self._n_pos_list = [float(c) for c in counts]  # fixed by shape_labels; no sync per step
        self.register_buffer("lam", torch.zeros(n_pos))
        self.register_buffer("mu", torch.full((p,), -(beta**2) if mu_init is None else mu_init))
        self.register_buffer("scores", torch.zeros(n_total, p))  # remembered u, one column/class
        self.register_buffer("seen_ever", torch.zeros(n_total, dtype=torch.bool))
        self.register_buffer("epoch", torch.zeros((), dtype=torch.int64))  # epochs completed
        self.register_buffer("projections", torch.zeros((), dtype=torch.int64))
        self.register_buffer("projections_epoch", torch.zeros((), dtype=torch.int64))
        self.register_buffer("projections_last_epoch", torch.zeros((), dtype=torch.int64))

    # --- the loss -------------------------------------------------------------------------------

    def forward(self, scores: Tensor, idx: Tensor) -> Tensor:
        """``L_B`` (docs/method.md sec. 3), the mean over positive classes; remembers the batch's scores.

        Args:
            scores: shape-head outputs, ``(B,)`` (one positive class) or ``(B, K)``: column ``c``
                is the one-vs-rest score of shape class ``c`` (``K = 1`` also for one class).
            idx: int64 ``(B,)`` dataset indices of the batch's samples.
        """
        u, idx = self._check_batch(scores, idx)
        batch = idx.numel()
        if batch == 0:  # nothing to estimate; keep a graph so backward() still works
            return (self.eps * 0.0).sum() + (u * 0.0).sum()
        with torch.no_grad():  # explicit index ops: ~3x cheaper than Python indexing per call
            self.scores.index_copy_(0, idx, u.detach())
            self.seen_ever.index_fill_(0, idx, True)
        eps, tau = self.constrained_parameters()
        cls = self.class_of.index_select(0, idx)
        n_samples = self.shape_labels.numel()
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

    def constrained_parameters(self) -> tuple[Tensor, Tensor]:
        """``(eps, tau)`` as the loss sees them: ``Pi_C`` of the parameters in mode ``"inline"``."""
        if self.projection != "inline":
            return self.eps, self.tau
        if self.inline_strength > 0:
            if len(self.classes) == 1:
                e, t = soft_project_onto_c(self.eps[0], self.tau, strength=self.inline_strength)
                return e.reshape(1), t
            return soft_project_onto_c(
                self.eps, self.tau, strength=self.inline_strength, groups=self.tau_group
            )
        return self._project(self.eps, self.tau)

    def _project(self, eps: Tensor, tau: Tensor) -> tuple[Tensor, Tensor]:
        if len(self.classes) == 1:  # the plain form is faster than one group of the grouped form
            e, t = project_onto_c(eps[0], tau, method=self.projection_method)
            return e.reshape(1), t
        return project_onto_c(eps, tau, groups=self.tau_group, method=self.projection_method)

    # --- the schedule ------------------------------------------------------------------------------

    @torch.no_grad()
    def project_(self) -> None:
        """``(eps, tau) <- Pi_C(eps, tau)`` in place (docs/method.md sec. 4), counted."""
        e, t = self._project(self.eps.detach(), self.tau.detach())
        self.eps.copy_(e)
        self.tau.copy_(t)
        self.projections += 1
        self.projections_epoch += 1

    @torch.no_grad()
    def after_step_(self) -> None:
        """Call after every optimizer step: projects in mode ``"step"``."""
        if self.projection == "step":
            self.project_()

    @torch.no_grad()
    def end_epoch_(self) -> None:
        """End of epoch ``e``: projection (mode ``"epoch"``), then dual ascent (docs/method.md sec. 3b).

        ``lambda_i <- max(0, lambda_i + eta_l (tau_i - u_i))`` for every positive whose score was
        ever recorded (``u_i`` = its latest recorded score), ``mu_j <- mu_j + eta_m (mean tau - 1)``.
        ``eta = dual_lr`` (``"constant"``), ``dual_lr / e`` (``"inverse_epoch"``) or ``rho``
        (augmented Lagrangian). In mode ``"inline"`` the dual step uses ``Pi_C(eps, tau)``.
        """
        if self.projection == "epoch":
            self.project_()
        e = int(self.epoch) + 1
        eta_l, eta_m = self.dual_step_sizes(e)
        _, tau = self.constrained_parameters()
        tau = tau.detach()
        u = self.scores[self.pos_index, self.tau_group]
        have = self.seen_ever[self.pos_index]
        self.lam.copy_(torch.where(have, (self.lam + eta_l * (tau - u)).clamp_min(0), self.lam))
        self.mu.add_(eta_m * (self._class_mean(tau) - 1))
        self.epoch += 1
        self.projections_last_epoch.copy_(self.projections_epoch)
        self.projections_epoch.zero_()

    @torch.no_grad()
    def merge_scores_(self, written: Tensor, all_reduce: Callable[[Tensor], object]) -> None:
        """Make the remembered scores equal across data-parallel processes, before ``end_epoch_``.

        Each process remembers the scores of the samples it saw. ``written``: bool ``(N,)``, the
        samples this process scored since the last merge; ``all_reduce``: an in-place sum over the
        processes (``torch.distributed.all_reduce``; the identity in one process). Every sample
        takes the mean of the scores written for it (a sample seen by two processes in one epoch,
        as ``DistributedSampler``'s padding does, gets the mean of both); samples no process wrote
        keep their value (equal everywhere already); ``seen_ever`` becomes the OR over processes.
        One collective call on an ``(N, P + 2)`` buffer.
        """
        if written.shape != self.seen_ever.shape or written.dtype != torch.bool:
            raise ValueError(
                f"written must be a bool tensor of shape {tuple(self.seen_ever.shape)}, "
                f"got {_describe(written)}"
            )
        w = written.to(self.scores.device, self.scores.dtype).unsqueeze(1)
        buf = torch.cat([self.scores * w, w, self.seen_ever.to(w.dtype).unsqueeze(1)], 1)
        all_reduce(buf)
        total, count, seen = buf[:, :-2], buf[:, -2:-1], buf[:, -1]
        self.scores.copy_(torch.where(count > 0, total / count.clamp_min(1), self.scores))
        self.seen_ever.copy_(seen > 0)

    def dual_step_sizes(self, epoch: int) -> tuple[float, float]:
        """``(eta_lambda, eta_mu)`` for epoch ``epoch`` (1-based)."""
        if self.rho > 0:
            return self.rho, self.rho
        if self.dual_schedule == "inverse_epoch":
            return self.dual_lr_lambda / epoch, self.dual_lr_mu / epoch
        return self.dual_lr_lambda, self.dual_lr_mu

    def _class_mean(self, tau: Tensor) -> Tensor:
        sums = torch.zeros_like(self.mu).index_add_(0, self.tau_group, tau.float())
        return sums / self.n_pos

    # --- reporting ----------------------------------------------------------------------------------

    @torch.no_grad()
    def stats(self) -> dict[str, float | int | list | None]:
        """Numbers to log (floats; means over positive classes, per-class lists when there are several).

        ``certified_fbeta``: the bound of docs/method.md sec. 2 on the training F-beta of ``u > 0`` from the
        remembered scores (``None`` until every sample has a score, or when ``mean u_pos < 1``).
        ``train_fbeta``: the F-beta of ``u > 0`` on those scores. Violations: ``tau_i > eps``
        (constraint set C), ``tau_i > u_i`` (dualized), ``|mean tau - 1|`` (dualized).
        """
        eps, tau = (x.detach().float() for x in self.constrained_parameters())
        u = self.scores[self.pos_index, self.tau_group]
        have = self.seen_ever[self.pos_index]
        over_eps = (tau - eps[self.tau_group]).clamp_min(0)
        over_u = (tau - u).clamp_min(0)[have]
        bounds, fbetas = [], []
        complete = bool(self.seen_ever.all())
        for j, c in enumerate(self.classes):
            pos = self.shape_labels == c
            u_pos, u_neg = self.scores[pos, j], self.scores[~pos, j]
            bounds.append(Fn.certified_fbeta_bound(u_pos, u_neg, self.beta) if complete else None)
            fbetas.append(Fn.fbeta_of_decisions(u_pos, u_neg, self.beta) if complete else None)
        out: dict[str, float | int | list | None] = {
            "epoch": int(self.epoch),
            "eps": float(eps.mean()),
            "mu": float(self.mu.mean()),
            "lambda_mean": float(self.lam.mean()),
            "lambda_max": float(self.lam.max()),
            "tau_mean": float(tau.mean()),
            "violation_tau_gt_eps_max": float(over_eps.max()),
            "violation_tau_gt_u_mean": float(over_u.mean()) if over_u.numel() else 0.0,
            "violation_tau_gt_u_max": float(over_u.max()) if over_u.numel() else 0.0,
            "violation_mean_tau_max": float((self._class_mean(tau) - 1).abs().max()),
            "certified_fbeta": _mean_or_none(bounds),
            "train_fbeta": _mean_or_none(fbetas),
            "projections": int(self.projections),
            "projections_last_epoch": int(self.projections_last_epoch),
            "seen_fraction": float(self.seen_ever.float().mean()),
        }
        if len(self.classes) > 1:
            out |= {"eps_per_class": eps.tolist(), "mu_per_class": self.mu.tolist(),
                    "certified_fbeta_per_class": bounds, "train_fbeta_per_class": fbetas}  # fmt: skip
        return out

    def extra_repr(self) -> str:
        return (
            f"n={self.shape_labels.numel()}, positives={self.n_pos.long().tolist()}, "
            f"classes={self.classes}, beta={self.beta}, projection={self.projection!r}, "
            f"negative_loss={self.negative_loss!r}, rho={self.rho}"
        )

    def _apply(self, fn, recurse=True):  # keep the regularizer's floating state in float32
        super()._apply(fn, recurse)
        for p in self._parameters.values():
            if p is not None and p.is_floating_point() and p.dtype != torch.float32:
                p.data = p.data.float()
        for name, b in self._buffers.items():
            if b is not None and b.is_floating_point() and b.dtype != torch.float32:
                self._buffers[name] = b.float()
        return self

    # --- validation ---------------------------------------------------------------------------------

    def _check_batch(self, scores: object, idx: object) -> tuple[Tensor, Tensor]:
        if not isinstance(scores, Tensor) or not scores.is_floating_point():
            raise ValueError(f"scores must be a floating-point tensor, got {_describe(scores)}")
        if not isinstance(idx, Tensor) or idx.dtype != torch.int64 or idx.dim() != 1:
            raise ValueError(f"idx must be an int64 tensor of shape (B,), got {_describe(idx)}")
        batch, p = idx.numel(), len(self.classes)
        if scores.dim() == 1 and p == 1:
            u = scores.unsqueeze(-1)
        elif scores.dim() == 2 and scores.shape[1] == 1 and p == 1:
            u = scores
        elif scores.dim() == 2 and scores.shape[1] > max(self.classes):
            u = scores[:, list(self.classes)]
        else:
            expected = "(B,) or (B, 1), or " if p == 1 else ""
            raise ValueError(
                f"scores must have shape {expected}(B, K) with K > {max(self.classes)} "
                f"(one column per shape class), got {tuple(scores.shape)}"
            )
        if u.shape[0] != batch:
            raise ValueError(
                f"scores and idx must have the same batch size, got {u.shape[0]} and {batch}"
            )
        # one reduction instead of an elementwise test: a NaN/inf anywhere makes the sum non-finite
        if (
            batch
            and not bool(torch.isfinite(u.detach().sum()))
            and not bool(torch.isfinite(u.detach()).all())
        ):
            raise ValueError("scores must be finite, got NaN or inf (check the network's outputs)")
        n_total = self.shape_labels.numel()
        if batch:
            lo, hi = (int(v) for v in idx.aminmax())
            if lo < 0 or hi >= n_total:
                raise ValueError(
                    f"idx must hold dataset indices in [0, {n_total}), got values in [{lo}, {hi}]"
                )
        return u.float(), idx.to(self.shape_labels.device)


class ShapeHead(nn.Module):
    """The paper's "extra node": ``u = w . pool(a) + b`` from any representation ``a``.

    ``a`` of shape ``(B, C)`` or a feature map ``(B, C, ...)`` (globally average-pooled). Returns
    ``(B,)`` for ``num_scores = 1``, else ``(B, num_scores)``.
    """

    def __init__(self, in_features: int, num_scores: int = 1) -> None:
        super().__init__()
        if in_features < 1 or num_scores < 1:
            raise ValueError(
                f"in_features and num_scores must be >= 1, got {in_features} and {num_scores}"
            )
        self.num_scores = num_scores
        self.linear = nn.Linear(in_features, num_scores)

    def forward(self, features: Tensor) -> Tensor:
        if features.dim() > 2:
            features = features.flatten(2).mean(-1)
        if features.dim() != 2 or features.shape[1] != self.linear.in_features:
            raise ValueError(
                f"features must have shape (B, {self.linear.in_features}) or "
                f"(B, {self.linear.in_features}, ...), got {tuple(features.shape)}"
            )
        out = self.linear(features)
        return out.squeeze(-1) if self.num_scores == 1 else out


# --- helpers -------------------------------------------------------------------------------------------


def _check_labels(shape_labels: object) -> Tensor:
    if not isinstance(shape_labels, Tensor) or shape_labels.dtype != torch.int64:
        raise ValueError(f"shape_labels must be an int64 tensor, got {_describe(shape_labels)}")
    if shape_labels.dim() != 1 or shape_labels.numel() == 0:
        raise ValueError(
            f"shape_labels must have shape (N,) with N > 0, got {tuple(shape_labels.shape)}"
        )
    return shape_labels.detach().cpu()


def _check_options(**o) -> None:
    def bad(name: str, expected: str) -> ValueError:
        return ValueError(f"{name} must be {expected}, got {o[name]!r}")

    def number(name: str, lo: float, strict: bool = False) -> None:
        x = o[name]
        ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
        if not ok or x < lo or (strict and x == lo):
            raise bad(name, f"a finite number {'>' if strict else '>='} {lo}")

    number("beta", 0, strict=True)
    for name in ("inline_strength", "dual_lr_lambda", "dual_lr_mu", "rho", "eps_init"):
        number(name, 0)
    number("tau_init", -math.inf)
    number("mu_init", -math.inf)
    if not o["classes"] or len(set(o["classes"])) != len(o["classes"]):
        raise ValueError(f"positive_classes must be distinct class ids, got {o['classes']!r}")
    if min(o["classes"]) < 0:
        raise ValueError(f"positive_classes must be >= 0, got {o['classes']!r}")
    choices = {
        "projection": PROJECTION_MODES,
        "method": PROJECTION_METHODS,
        "negative_loss": Fn.NEGATIVE_LOSSES,
        "dual_schedule": DUAL_SCHEDULES,
    }
    for name, allowed in choices.items():
        if o[name] not in allowed:
            shown = "projection_method" if name == "method" else name
            raise ValueError(f"{shown} must be one of {allowed}, got {o[name]!r}")


def _describe(x: object) -> str:
    if isinstance(x, Tensor):
        return f"tensor of dtype {x.dtype} and shape {tuple(x.shape)}"
    return type(x).__name__


def _mean_or_none(xs: list) -> float | None:
    return None if any(x is None for x in xs) else sum(xs) / len(xs)
