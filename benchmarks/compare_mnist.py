"""Alias: ``python -m benchmarks.compare_mnist`` = ``python -m benchmarks.compare mnist``."""

from benchmarks.compare.mnist.__main__ import main

if __name__ == "__main__":
    raise SystemExit(main())
