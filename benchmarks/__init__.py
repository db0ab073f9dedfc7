"""Benchmark scripts: each prints a table of ratios measured in one run and writes a plot."""
