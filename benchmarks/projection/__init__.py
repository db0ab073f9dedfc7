"""The projection benchmark (docs/projection.md): exact (sort, linear, tree) and soft Pi_C against
torch.sort, one elementwise pass, a generic QP solver and qpth.

Targets: linear at n = 1e6 <= 0.1 x torch.sort; exact at n = 1e4 >= 1000x faster than the
generic QP solver; batched 64 x 256 >= 100x faster than qpth; one vector at n = 1e6 and
1e7 (float32) in <= 3x the time of one ``torch.minimum(tau, e)`` pass.

``spec``: the soft strength and the budget (sizes, repeats); ``run``: the measurements; ``tables``:
the report and the plot; ``__main__``: the command line (``python -m benchmarks.projection``).
"""
