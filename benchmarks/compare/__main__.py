"""The comparisons of docs/comparison.md (parts 1-3) and docs/rates.md (part 4): one entry point.

    python -m benchmarks.compare fixed  [--jobs 2] [--table-only] ...   # part 1, fixed features
    python -m benchmarks.compare mnist  --mnist-dir DIR [--jobs 2] ...  # part 2, imbalanced MNIST
    python -m benchmarks.compare smnist --mnist-dir DIR [--jobs 2] ...  # part 3, S-MNIST subgroups
    python -m benchmarks.compare rates  [--mnist-dir DIR] [--jobs 2] ... # part 4, rate targets

Each part is resumable (finished runs are JSON files and are skipped) and takes ``--jobs``; the
options after the part's name are its own (``python -m benchmarks.compare fixed --help``).
"""

from __future__ import annotations

import sys

PARTS = {  # part -> the module of its command line
    "fixed": "benchmarks.compare.fixed.__main__",
    "mnist": "benchmarks.compare.mnist.__main__",
    "smnist": "benchmarks.compare.smnist",
    "rates": "benchmarks.compare.rates.__main__",
}


def main(argv: list[str] | None = None) -> int:
    import importlib

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if not argv or argv[0] not in PARTS:
        print(__doc__, file=sys.stderr)
        got = argv[0] if argv else "nothing"
        print(
            f"error: the first argument must be one of {tuple(PARTS)}, got {got!r}", file=sys.stderr
        )
        return 2
    module = importlib.import_module(PARTS[argv[0]])
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
