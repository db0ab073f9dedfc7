"""``python -m train --config configs/<x>.yaml [--regularizer {none,fbeta}] [--alpha A] [key=value ...]``."""

from __future__ import annotations

import argparse
import sys

from . import config as config_mod


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m train",
        description="Train with or without the F-beta S-measure regularizer.",
        epilog="Overrides: dotted keys of the config tree, e.g. train.epochs=5 data.batch_size=64.",
    )
    p.add_argument("--config", required=True, help="YAML file (configs/*.yaml)")
    p.add_argument("--regularizer", choices=("none", "fbeta"), help="= regularizer.name")
    p.add_argument("--alpha", type=float, help="= regularizer.alpha (weight of the regularizer)")
    p.add_argument("--out", help="= train.out (run folder; must be new or empty)")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    a = p.parse_args(argv)
    overrides = list(a.overrides)
    for key, value in (("regularizer.name", a.regularizer), ("regularizer.alpha", a.alpha),
                       ("train.out", a.out)):  # fmt: skip
        if value is not None:
            overrides.append(f"{key}={value}")
    try:
        cfg = config_mod.load(a.config, overrides)
    except ValueError as e:
        p.error(str(e))
    if a.print_config:
        import yaml

        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
        return 0
    from .loop import run  # heavy imports only when training

    try:
        run(cfg)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
