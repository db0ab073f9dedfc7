"""F-beta's figures and its diagnosis (method note sec. 2, 10): what ``FBetaRegularizer.stats()``
reports from the remembered scores (the certified bound, the true F-beta, the F-beta at the learned
threshold, the violations) and, after each epoch's dual step, why the regularizer may be doing
nothing (``stats()["inert"]``). Reports over the regularizer's state: they write none of it but the
diagnosis's reference point (``inert_ref``). ``reg`` is an ``FBetaRegularizer``.
"""

from __future__ import annotations

import torch

from . import _checks
from . import functional as Fn
from .base import ReparamRegularizer
from .options import PAPER


def calibrate(reg: ReparamRegularizer, scores: object, labels: object) -> torch.Tensor:
    """``FBetaRegularizer.calibrate``: per positive class ``c_k`` (column ``k`` of ``scores``),
    ``functional.best_fbeta_threshold`` of its positives' and the other samples' scores."""
    if reg.grouped:
        raise ValueError(
            "calibrate: the objective has groups (one problem per (class, group)), and scores and "
            "labels carry no groups; call reparam.functional.best_fbeta_threshold per group"
        )
    u, y = _checks.held_out(scores, labels, len(reg.classes), reg.classes)
    cuts = [
        Fn.best_fbeta_threshold(u[y == c, k], u[y != c, k], reg.beta)[0]
        for k, c in enumerate(reg.classes)
    ]
    return torch.tensor(cuts, dtype=reg.decision_threshold.dtype)


def figures(reg: ReparamRegularizer) -> dict[str, float | int | list | bool | None]:
    """``eps``, ``mu``; ``certified_fbeta``: the bound of method note sec. 2 on the F-beta
    of ``u > 0`` over the scored samples (``None`` when ``mean u_pos < 1``: no certificate);
    ``train_fbeta``: their true F-beta; violations of C (``tau_i > eps``) and of
    ``|mean tau - 1|`` (dualized). Per-class lists when there are several classes."""
    eps, tau = reg.eps.detach().float(), reg.tau.detach().float()
    lay, comm = reg.layout, reg.layout.problem_comm
    figures = {}  # problem -> (bound, F-beta, F-beta at the threshold), None where not scored
    for k in lay.problems_here():
        u_pos, u_neg = reg._split_scores(k)
        scored = comm.total(u_pos.numel()) > 0
        t = float(reg.decision_threshold[k])
        figures[k] = (
            (
                Fn.certified_fbeta_bound(u_pos, u_neg, reg.beta, comm),
                Fn.fbeta_of_decisions(u_pos, u_neg, reg.beta, comm),
                Fn.fbeta_of_decisions(u_pos - t, u_neg - t, reg.beta, comm),
            )
            if scored
            else (None, None, None)
        )
    if lay.owned_here:  # each problem's from its owner
        figures = _from_owners(figures, lay)
    bounds, fbetas, at_threshold = (
        [figures[k][i] for k in range(reg.n_problems)] for i in range(3)
    )
    out: dict[str, float | int | list | bool | None] = {
        "eps": float(eps.mean()),
        "mu": float(reg.mu.mean()),
        "violation_tau_gt_eps_max": float(reg._max((tau - reg.layout.per_row(eps)).clamp_min(0))),
        "violation_mean_tau_max": float((reg._class_mean(tau) - 1).abs().max()),
        "certified_fbeta": _mean_or_none(bounds),
        "train_fbeta": _mean_or_none(fbetas),
        "decision_threshold": float(reg.decision_threshold.mean()),
        "train_fbeta_at_threshold": _mean_or_none(at_threshold),
        "inert": getattr(reg, "inert", None),
    }
    if reg.grouped:  # the mean over the scored problems; one without a certificate counts 0
        scored = [k for k, f in enumerate(fbetas) if f is not None]
        out |= {
            "certified_fbeta": _mean_of([bounds[k] or 0.0 for k in scored]),
            "train_fbeta": _mean_of([fbetas[k] for k in scored]),
            "train_fbeta_at_threshold": _mean_of([at_threshold[k] for k in scored]),
            "certified_fraction": _mean_of([float(bounds[k] is not None) for k in scored]),
            "problems_scored": len(scored),
        }
    elif len(reg.classes) > 1:
        out |= {
            "eps_per_class": eps.tolist(),
            "mu_per_class": reg.mu.tolist(),
            "certified_fbeta_per_class": bounds,
            "train_fbeta_per_class": fbetas,
        }
    return out


def inert_reasons(reg: ReparamRegularizer) -> str | None:
    """After the epoch's dual step: why the regularizer may be doing nothing (``stats()["inert"]``,
    ``None`` when nothing looks wrong; docs/segmentation.md has the CamVid measurements).

    * the node decides one way for every scored training sample: the positives are not pulled
      above 0 (``lambda`` ~0: the paper's ``lambda_init=0`` with its dual step 1e-3 per epoch);
    * ``eps`` and ``tau`` moved by < 1e-3 in the epoch while ``tau_i <= u_i`` is violated: the
      optimizer barely steps them (their gradients carry ``alpha``: with SGD the step is
      ``lr * alpha``);
    * ``mean tau`` is off 1 by > 0.01 and ``mu`` moved by < 1e-4: ``dual_lr_mu`` is too small
      to enforce the equality (the paper's 1e-5);
    * no certified bound: the positives' mean capped score is below 1."""
    eps, tau = reg.eps.detach().float(), reg.tau.detach().float()
    p = reg.n_problems
    one = torch.ones_like(eps[:1])
    moments = torch.cat([reg._mean(tau).view(1), reg._mean(tau.square()).sqrt().view(1), one])
    now = torch.cat([eps, reg.mu.float(), moments.nan_to_num()])  # no positive: mean NaN
    prev = reg.inert_ref.clone() if float(reg.inert_ref[-1]) == 1 else None
    reg.inert_ref.copy_(now)
    stats = reg._objective_stats()
    reasons = []
    # per class; per group, all of a class's groups together (one line, not one per group)
    for j, cls in enumerate(reg.classes):
        parts = [reg._split_scores(k) for k in range(p) if reg.layout.problem_class_list[k] == j]
        u = torch.cat([x for pair in parts for x in pair])
        above, at_or_below = reg._any(u > 0), reg._any(u <= 0)
        if above != at_or_below:  # some scored sample, all on one side
            side = "above" if above else "at or below"
            reasons.append(
                f"the scores of every scored training sample are {side} 0 (class "
                f"{cls}: u in [{float(reg._min(u)):.3g}, {float(reg._max(u)):.3g}], lambda "
                f"mean {float(reg._mean(reg.lam)):.3g}): the positives are not pulled above "
                f"the margin. {_remedies(reg)}"
            )
    if prev is not None:
        delta = (now - prev).abs()
        moved = max(float(delta[:p].max()), float(delta[2 * p :].max()))  # eps, tau moments
        target_tau, target_u = reg._lambda_targets()
        seen = reg._seen_positives()
        over = (target_tau - target_u).clamp_min(0)[seen]
        violated = float(reg._mean(over)) if reg._any(seen) else 0
        if moved < 1e-3 and violated > 1e-3:
            reasons.append(
                f"eps and tau moved by < 1e-3 in the last epoch ({moved:.2g}) although tau_i <= "
                f"u_i is violated by {violated:.3g} on average: their gradients are scaled by "
                f"alpha, so with SGD their step is lr * alpha; train them with Adam (as the "
                f"paper) or raise their lr (optim.regularizer_lr)"
            )
        off = float((reg._class_mean(tau) - 1).abs().max())
        if off > 0.01 and float(delta[p : 2 * p].max()) < 1e-4:
            reasons.append(
                f"mean tau is {off:.3g} away from 1 and mu moved by < 1e-4: dual_lr_mu="
                f"{reg.dual_lr_mu:g} is too small to enforce mean tau = 1 (the defaults: 0.1)"
            )
    if reg._any(reg.seen_ever) and stats["certified_fbeta"] is None:
        reasons.append(
            "no certified F-beta bound (the positives' mean score capped at eps is below 1): "
            "the positives are not above the margin yet"
        )
    return "; ".join(reasons) or None


def _remedies(reg: ReparamRegularizer) -> str:
    """What to change when the scores sit on one side of 0: only the remedies not already in
    effect (a run on the library defaults is not told to use them)."""
    out = []
    if reg.cap_scores and float(reg._min(reg.lam)) >= reg.beta**2 - 1e-6:
        out.append("raise dual_lr_lambda (lambda grows by it per epoch)")
    else:
        out.append(
            f"start lambda at beta^2 with capped scores (lambda_init={reg.beta**2:g}, "
            f"cap_scores=True) or raise dual_lr_lambda"
        )
    paper = (PAPER["dual_lr_lambda"], PAPER["dual_lr_mu"], PAPER["cap_scores"])
    if (reg.dual_lr_lambda, reg.dual_lr_mu, reg.cap_scores) == paper:
        out.append("use the library defaults (FBetaRegularizer(labels), not .paper(labels))")
    return "Remedies: " + "; ".join(out)


def _from_owners(figures: dict, lay) -> dict:
    """Sharded with groups: every problem's figures, each computed by its owner (``None``: NaN on
    the way)."""
    nan = float("nan")
    table = torch.full((lay.n_problems, 3), nan, dtype=torch.float64)
    for k, values in figures.items():
        table[k] = torch.tensor([nan if v is None else v for v in values], dtype=torch.float64)
    rows = lay.replicate(table).tolist()
    return {k: tuple(None if v != v else v for v in row) for k, row in enumerate(rows)}


def _mean_of(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _mean_or_none(xs: list) -> float | None:
    return None if any(x is None for x in xs) else sum(xs) / len(xs)
