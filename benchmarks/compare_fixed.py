"""Alias: ``python -m benchmarks.compare_fixed`` = ``python -m benchmarks.compare fixed``."""

from benchmarks.compare.fixed.__main__ import main

if __name__ == "__main__":
    raise SystemExit(main())
