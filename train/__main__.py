"""``python -m train --config configs/<x>.yaml [--regularizer NAME] [--alpha A] [key=value ...]``.

``NAME``: ``none`` (the baseline), ``fbeta``, ``precision_at_recall``, ``recall_at_precision`` or
``roc_auc``; each objective's options are the keys ``regularizer.<NAME>.*`` (e.g.
``regularizer.precision_at_recall.recall=0.8``).

``python -m train --resume RUN_DIR [key=value ...]`` continues a run from its latest readable
checkpoint (its saved config, with the overrides applied, e.g. ``train.epochs=60``; the saved
``train.stop_after_steps`` that stopped it is dropped unless given again). Under
``torchrun --nproc_per_node=K -m train ...`` every process runs this; rank 0 writes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import config as config_mod


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m train",
        description="Train with or without a nondecomposable regularizer on the shape node.",
        epilog="Overrides: dotted keys of the config tree, e.g. train.epochs=5 data.batch_size=64.",
    )
    p.add_argument("--config", help="YAML file (configs/*.yaml)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue this run folder")
    p.add_argument(
        "--regularizer", choices=("none", *config_mod.REGULARIZERS), help="= regularizer.name"
    )
    p.add_argument("--alpha", type=float, help="= regularizer.alpha (weight of the regularizer)")
    p.add_argument("--out", help="= train.out (run folder; must be new or empty)")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    # intermixed: key=value overrides may come before, between and after the options
    a = p.parse_intermixed_args(argv)
    overrides = list(a.overrides)
    for key, value in (
        ("regularizer.name", a.regularizer),
        ("regularizer.alpha", a.alpha),
        ("train.out", a.out),
    ):
        if value is not None:
            overrides.append(f"{key}={value}")
    if (a.config is None) == (a.resume is None):
        p.error("give exactly one of --config (a new run) and --resume RUN_DIR (continue a run)")
    try:
        if a.resume is not None:
            saved = Path(a.resume) / "config.yaml"
            if not saved.is_file():
                raise ValueError(f"--resume {a.resume}: no config.yaml (not a run folder?)")
            if a.out is not None:
                raise ValueError("--out cannot be combined with --resume (the run folder is kept)")
            # train.stop_after_steps stopped the earlier invocation; this one goes on unless told
            cfg = config_mod.load(saved, ["train.stop_after_steps=null", *overrides])
        else:
            cfg = config_mod.load(a.config, overrides)
    except ValueError as e:
        p.error(str(e))
    if a.print_config:
        import yaml

        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
        return 0
    from .loop import run  # heavy imports only when training
    from .nonfinite import NonFiniteLossError

    try:
        run(cfg, resume=a.resume)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (NonFiniteLossError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
