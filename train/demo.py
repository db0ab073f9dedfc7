"""``python -m train.demo``: what a rate objective changes, on data bundled with scikit-learn.

One digit of scikit-learn's 8x8 digits (1,797 images) against the rest, a linear head on the 64
pixels, split 60/20/20 into train / val / test by the seed. Two arms with the same seed, data order,
optimizer (Adam, lr 0.01, batch 64) and epochs:

* **cross-entropy**: the head trained with binary cross-entropy;
* **precision at recall**: the head trained with ``reparam.PrecisionAtRecall`` alone, the best
  precision subject to recall ``>= r`` on the training set (the reparameterized hinge objective,
  method note sec. 8).

Each arm then chooses its decision threshold on val the way a user would: the cut with the best
precision among those keeping recall ``>= r`` there (``rate_functional.threshold_at_recall``, which
``PrecisionAtRecall.calibrate`` runs), and is scored on test at that cut. The table gives test
precision (mean +- sd over the seeds), the range of test recall (val holds about 36 positives of a
digit, so the recall a val cut reaches on test varies), the objective's certified training recall
(the hinge bound of ``u > 0``; cross-entropy has none) and the training seconds per run.

``--out DIR`` (default ``runs/demo``) receives ``demo.json``: the settings and every seed's figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from reparam import PrecisionAtRecall
from reparam.rate_functional import threshold_at_recall

from .files import write_text_atomic

ARMS = ("cross-entropy", "precision at recall")


@dataclass(frozen=True)
class Settings:
    digit: int = 8  # the positive class (the hardest digit for a linear head)
    recall: float = 0.95  # the target r
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    epochs: int = 30
    lr: float = 0.01
    batch_size: int = 64


@dataclass(frozen=True)
class Outcome:
    precision: float  # on test, at the val threshold
    recall: float  # on test, at the val threshold
    certified_recall: float | None  # training recall of u > 0 under the hinge bound
    seconds: float  # training time


def load_digits() -> tuple[Tensor, Tensor]:
    """scikit-learn's bundled 8x8 digits as float pixels in [0, 1] ``(1797, 64)`` and labels."""
    from sklearn.datasets import load_digits as sklearn_digits  # bundled: no download

    x, y = sklearn_digits(return_X_y=True)
    return torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)


def run_arm(arm: str, x: Tensor, y: Tensor, seed: int, s: Settings) -> Outcome:
    """Train one arm on the seed's split and score it on test at its val threshold."""
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(x), generator=g)
    n_train, n_val = int(0.6 * len(x)), int(0.2 * len(x))
    train, val, test = order.split([n_train, n_val, len(x) - n_train - n_val])
    torch.manual_seed(seed)
    head = nn.Linear(x.shape[1], 1)
    params = list(head.parameters())
    reg = None
    if arm == "precision at recall":
        reg = PrecisionAtRecall(y[train], recall=s.recall)
        params += list(reg.parameters())
    opt = torch.optim.Adam(params, lr=s.lr)
    if reg is not None:
        reg.attach(opt)  # reg.after_step_() after every opt.step()
    start = time.perf_counter()
    for _ in reg.epochs(s.epochs) if reg is not None else range(s.epochs):
        for idx in torch.randperm(n_train, generator=g).split(s.batch_size):
            u = head(x[train[idx]]).squeeze(1)
            if reg is None:
                loss = nn.functional.binary_cross_entropy_with_logits(u, y[train[idx]].float())
            else:
                loss = reg(u, idx)  # idx: the samples' positions in the training set
            opt.zero_grad()
            loss.backward()
            opt.step()
    seconds = time.perf_counter() - start
    with torch.no_grad():
        u_val, u_test = head(x[val]).squeeze(1), head(x[test]).squeeze(1)
    pos = y[val] == 1
    cut = threshold_at_recall(u_val[pos], u_val[~pos], s.recall).threshold
    decide, truth = u_test > cut, y[test] == 1
    tp = int((decide & truth).sum())
    certified = None if reg is None else float(reg.stats()["certified_recall"])
    return Outcome(tp / max(int(decide.sum()), 1), tp / int(truth.sum()), certified, seconds)


def _mean_sd(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


def table(results: dict[str, list[Outcome]], s: Settings) -> str:
    """The comparison as a markdown table (one column per arm)."""
    rows = [
        f"| digit {s.digit} against the rest, r = {s.recall}, {len(s.seeds)} seeds | "
        + " | ".join(ARMS)
        + " |",
        "|---|" + "---|" * len(ARMS),
    ]

    def row(name: str, cell) -> None:
        rows.append(f"| {name} | " + " | ".join(cell(results[a]) for a in ARMS) + " |")

    row("test precision at the val threshold", lambda r: _mean_sd([o.precision for o in r]))
    row(
        "test recall there (min - max)",
        lambda r: f"{min(o.recall for o in r):.3f} - {max(o.recall for o in r):.3f}",
    )
    row(
        "certified training recall of u > 0",
        lambda r: (
            "none" if r[0].certified_recall is None else _mean_sd([o.certified_recall for o in r])
        ),
    )
    row("training seconds per run", lambda r: f"{statistics.mean(o.seconds for o in r):.2f}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    d = Settings()
    p = argparse.ArgumentParser(prog="python -m train.demo", description=__doc__.split("\n")[0])
    p.add_argument("--digit", type=int, default=d.digit, help=f"positive digit (default {d.digit})")
    p.add_argument("--recall", type=float, default=d.recall, help=f"target r (default {d.recall})")
    p.add_argument("--seeds", type=int, default=len(d.seeds), help="seeds 0..N-1 (default 5)")
    p.add_argument("--epochs", type=int, default=d.epochs, help=f"(default {d.epochs})")
    p.add_argument("--out", default="runs/demo", help="writes OUT/demo.json (default runs/demo)")
    a = p.parse_args(argv)
    if not 0 <= a.digit <= 9:
        p.error(f"--digit must be 0..9, got {a.digit}")
    if not 0.0 < a.recall < 1.0:
        p.error(f"--recall must be in (0, 1), got {a.recall}")
    if a.seeds < 1 or a.epochs < 1:
        p.error(f"--seeds and --epochs must be >= 1, got {a.seeds} and {a.epochs}")
    s = Settings(a.digit, a.recall, tuple(range(a.seeds)), a.epochs, d.lr, d.batch_size)
    torch.set_num_threads(1)  # a 64-wide linear head: threads only add overhead
    x, labels = load_digits()
    y = (labels == s.digit).long()
    results: dict[str, list[Outcome]] = {arm: [] for arm in ARMS}
    for seed in s.seeds:
        for arm in ARMS:
            results[arm].append(run_arm(arm, x, y, seed, s))
        print(
            f"seed {seed}: test precision "
            + ", ".join(f"{arm} {results[arm][-1].precision:.3f}" for arm in ARMS),
            flush=True,
        )
    print()
    print(table(results, s))
    ce, pr = (results[arm] for arm in ARMS)
    gain = [b.precision - a.precision for a, b in zip(ce, pr, strict=True)]
    print(
        f"\nprecision at recall - cross-entropy: {_mean_sd(gain)} of test precision "
        f"({sum(g > 0 for g in gain)} of {len(gain)} seeds gain)"
    )
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "settings": asdict(s),
        "results": {k: [asdict(o) for o in v] for k, v in results.items()},
    }
    write_text_atomic(json.dumps(record, indent=1) + "\n", out / "demo.json")
    print(f"wrote {out / 'demo.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
