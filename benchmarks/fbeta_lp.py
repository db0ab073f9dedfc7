"""LP reference for the regularizer: exact optima of LPs (3)/(3') (scipy HiGHS), Algorithm 3 on fixed
features, and the convergence table of docs/regularizer.md (run: python -m benchmarks.fbeta_lp)."""

from __future__ import annotations

import numpy as np
from scipy.optimize import linprog

from reparam import DenseTau, EpochEnd, Inline

from ._report import markdown_row, markdown_table


def solve_fbeta_lp(
    a: np.ndarray,
    s: np.ndarray,
    beta: float = 1.0,
    form: str = "scale_free",
    groups: np.ndarray | None = None,
) -> tuple[float, np.ndarray, float]:
    """Optimal value and head ``(w, b)`` of LP (3') (``form="scale_free"``) or (3) (``"paper"``).

    Variables ``x = [w (d), b, eps (G), tau (n), xi (m)]``, ``u = a w + b``, hinge
    ``xi_j >= eps_g(j) + u_j``. (3'): ``min beta^2 eps + (1/n) sum xi``, ``mean tau = 1``; (3):
    ``min beta^2 n eps + sum xi``, ``sum tau = 1``; both with ``tau_i <= eps``, ``tau_i <= u_i``,
    ``eps >= 0``, ``xi >= 0``. ``groups`` (scale-free form; ``-1``: a sample of no group): the
    grouped F-beta of docs/method/grouped.md sec. 12, one head for all groups and the mean over the
    groups with a positive of each group's (3') in its own ``eps_g`` and ``tau``, its negatives
    the group's own.
    """
    g = np.zeros(len(s), np.int64) if groups is None else np.asarray(groups, np.int64)
    if form != "scale_free" and groups is not None:
        raise ValueError("groups: the scale-free form only")
    keep = g >= 0
    present = np.unique(g[keep & (s == 1)])  # the groups with a positive: one problem each
    slot = {int(k): i for i, k in enumerate(present)}
    keep &= np.isin(g, present)
    pos, neg = np.flatnonzero(keep & (s == 1)), np.flatnonzero(keep & (s == 0))
    n, m, d, k = len(pos), len(neg), a.shape[1], len(present)
    gp, gn = np.array([slot[int(x)] for x in g[pos]]), np.array([slot[int(x)] for x in g[neg]])
    n_g = np.bincount(gp, minlength=k).astype(float)
    nv = d + 1 + k + n + m
    iw, ib, ie, it, ix = 0, d, d + 1, d + 1 + k, d + 1 + k + n
    c = np.zeros(nv)
    if form == "scale_free":
        c[ie:it], c[ix:] = beta**2 / k, 1.0 / (k * n_g[gn])
    elif form == "paper":
        c[ie], c[ix:] = beta**2 * n, 1.0
    else:
        raise ValueError(form)
    rows = np.zeros((2 * n + m, nv))
    r = np.arange(n)
    rows[r, it + r], rows[r, ie + gp] = 1, -1  # tau_i - eps_g <= 0
    rows[n + r, it + r], rows[n + r, iw:ib], rows[n + r, ib] = 1, -a[pos], -1  # tau_i <= u_i
    r = np.arange(m)  # eps_g + w.a_j + b - xi_j <= 0
    rows[2 * n + r, ie + gn], rows[2 * n + r, iw:ib] = 1, a[neg]
    rows[2 * n + r, ib], rows[2 * n + r, ix + r] = 1, -1
    eq = np.zeros((k, nv))
    eq[gp, it + np.arange(n)] = 1.0 / n_g[gp] if form == "scale_free" else 1.0
    bounds = [(None, None)] * (d + 1) + [(0, None)] * k + [(None, None)] * n + [(0, None)] * m
    res = linprog(
        c,
        A_ub=rows,
        b_ub=np.zeros(len(rows)),
        A_eq=eq,
        b_eq=np.ones(k),
        bounds=bounds,
        method="highs",
    )
    assert res.status == 0, res.message
    return float(res.fun), res.x[iw:ib], float(res.x[ib])


def gaussian_toy(
    n_pos: int, n_neg: int, dim: int, seed: int, mean: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """Positives ~ N(+mean, I), negatives ~ N(-mean, I) in ``dim`` dimensions (docs/regularizer.md)."""
    rng = np.random.default_rng(seed)
    a = np.concatenate([rng.normal(mean, 1.0, (n_pos, dim)), rng.normal(-mean, 1.0, (n_neg, dim))])
    s = np.concatenate([np.ones(n_pos, np.int64), np.zeros(n_neg, np.int64)])
    return a, s


def train_head(
    a: np.ndarray,
    s: np.ndarray,
    *,
    epochs: int,
    batch_size: int,
    lr: float = 1e-2,
    cosine: bool = False,
    average_from: float | None = None,
    seed: int = 0,
    regularizer: type | None = None,
    **reg_kwargs,
):
    """Algorithm 3 on ``L_B`` alone: a linear head on fixed features ``a``, Adam on (w, b, eps, tau).

    ``regularizer``: the objective's class (default ``FBetaRegularizer``; the rate objectives of
    ``reparam`` take the same loop), built with ``reg_kwargs``.

    ``cosine``: anneal Adam's lr to 0 over the run (per step), so the primal iterate settles.
    ``average_from``: return the average of the head over the epochs after this fraction of the
    run (``torch.optim.swa_utils.AveragedModel``, one snapshot per epoch): the ergodic primal
    iterate of the primal-dual method, which converges where the last iterate cycles.

    Returns ``(head, reg, u)`` with ``u`` the final scores of all samples.
    """
    import torch

    from reparam import FBetaRegularizer, ShapeHead

    torch.manual_seed(seed)
    x = torch.tensor(a, dtype=torch.float32)
    reg = (regularizer or FBetaRegularizer)(torch.as_tensor(s, dtype=torch.int64), **reg_kwargs)
    head = ShapeHead(x.shape[1])
    opt = torch.optim.Adam([*head.parameters(), *reg.parameters()], lr=lr)
    steps = epochs * -(-len(x) // batch_size)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps) if cosine else None
    avg = torch.optim.swa_utils.AveragedModel(head) if average_from is not None else None
    gen = torch.Generator().manual_seed(seed)
    for epoch in range(epochs):
        for idx in torch.randperm(len(x), generator=gen).split(batch_size):
            loss = reg(head(x[idx]), idx)
            opt.zero_grad()
            loss.backward()
            opt.step()
            reg.after_step_()
            if sched is not None:
                sched.step()
        reg.end_epoch_()
        if avg is not None and epoch >= average_from * epochs:
            avg.update_parameters(head)
    if avg is not None:
        head = avg.module
    with torch.no_grad():
        u = head(x)
    return head, reg, u


def head_quality(
    u, s: np.ndarray, beta: float = 1.0, groups: np.ndarray | None = None
) -> tuple[float, float | None]:
    """(F-beta of ``u > 0``, LP (3') objective at the best feasible eps for ``u``, or None);
    with ``groups``, both the mean over the groups with a positive (the objective None when a
    group has no feasible eps)."""
    import torch

    if groups is not None:
        per = [
            head_quality(u[torch.as_tensor(groups == k)], s[groups == k], beta)
            for k in np.unique(groups[(groups >= 0) & (s == 1)])
        ]
        objs = [o for _, o in per]
        obj = None if any(o is None for o in objs) else float(np.mean(objs))
        return float(np.mean([f for f, _ in per])), obj

    from reparam import functional as fn

    s_t = torch.as_tensor(s)
    u_pos, u_neg = u[s_t == 1].double(), u[s_t == 0].double()
    eps = fn.best_feasible_eps(u_pos)
    obj = None if eps is None else float(fn.lp_objective(eps, u_neg, u_pos.numel(), beta))
    return fn.fbeta_of_decisions(u_pos, u_neg, beta), obj


EPOCH, INLINE = dict(schedule=EpochEnd(), tau=DenseTau()), dict(schedule=Inline(), tau=DenseTau())
SETTINGS = {  # name -> train_head arguments (Adam lr 1e-2 throughout; a dense tau)
    "paper preset: epoch, eta 1e-3/1e-5, B 20, 40 ep": dict(
        **EPOCH, dual_lr_lambda=1e-3, dual_lr_mu=1e-5, batch_size=20, epochs=40
    ),
    "paper preset, 400 ep": dict(
        **EPOCH, dual_lr_lambda=1e-3, dual_lr_mu=1e-5, batch_size=20, epochs=400
    ),
    "epoch, eta 0.1, full batch, 200 ep": dict(
        **EPOCH, dual_lr_lambda=0.1, dual_lr_mu=0.1, batch_size=100, epochs=200
    ),
    "documented: inline, eta 0.1, B 20, 200 ep (2-D) / 400 ep (20-D)": dict(
        **INLINE, dual_lr_lambda=0.1, dual_lr_mu=0.1, batch_size=20, epochs=None
    ),
}
CASES = {"2-D, means +-1": (2, 1.0, 200), "20-D, means +-0.2": (20, 0.2, 400)}


HEADER = [
    "case",
    "seed",
    "LP (3') optimum",
    "LP head F1",
    "setting",
    "head F1 (diff)",
    "LP gap",
    "certified F1",
    "time [s]",
]


def main() -> None:
    """Every setting against the exact LP optimum; writes ``--out`` (docs/figures/fbeta_lp.md)."""
    import argparse
    import time

    import torch

    ap = argparse.ArgumentParser(
        description="Algorithm 3 vs the exact LP optimum on fixed features"
    )
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--out", default="docs/figures/fbeta_lp.md")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for case, (dim, mean, epochs) in CASES.items():
        for seed in range(args.seeds):
            a, s = gaussian_toy(40, 60, dim, seed=seed, mean=mean)
            opt, w, b = solve_fbeta_lp(a, s)
            f1_opt, _ = head_quality(torch.tensor(a @ w + b), s)
            for name, cfg in SETTINGS.items():
                cfg = dict(cfg, epochs=cfg["epochs"] or epochs)
                t0 = time.perf_counter()
                _, reg, u = train_head(a, s, seed=seed, **cfg)
                dt = time.perf_counter() - t0
                f1, obj = head_quality(u, s)
                gap = "no feasible eps" if obj is None else f"{100 * (obj - opt) / opt:.1f} %"
                cert = reg.stats()["certified_fbeta"]
                rows.append(
                    [
                        case,
                        str(seed),
                        f"{opt:.3f}",
                        f"{f1_opt:.3f}",
                        name,
                        f"{f1:.3f} ({f1 - f1_opt:+.3f})",
                        gap,
                        "-" if cert is None else f"{cert:.3f}",
                        f"{dt:.1f}",
                    ]
                )
                print(markdown_row(rows[-1]), flush=True)
    from pathlib import Path

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(markdown_table(HEADER, rows) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
