"""Part 1 of the comparison (docs/comparison.md): every F-beta and AUC method of the project on
fixed features, against exact references.

A linear head ``u = w.x + b`` on fixed Gaussian features is trained by each method alone (Adam lr
1e-2 on the head and the method's own parameters, batch 20, 200 epochs; 3 seeds = initialization
and batch order; the data of each problem are fixed). Every method gets the same tuning effort:
its main knob on a grid of three values (the dual step sizes, the temperature, the margin, the
infeasibility cost), and the tables show its default and its best grid value per problem (chosen on
the training metric, which is what is compared). References: the LP (3') optimum by HiGHS and its
head; the best linear head found (the best training F1 of any run's direction at its own
F1-optimal threshold, logistic regression's included). Measured per run: the training F1 of
``u > 0`` (and at the run's own F1-optimal threshold), the LP gap (the (3') objective at the best
feasible ``eps`` for the final scores, relative to the optimum), time per epoch, and the stability
over the last 20 epochs (sd of the training F1); for the AUC methods the exact training AUC.
Runs are JSON files under ``--runs`` (written atomically; finished ones are skipped).

``spec``: the problems, the methods and their grids, the budget; ``run``: one run and its record;
``tables``: the references, the tables and the plot; ``__main__``: the command line
(``python -m benchmarks.compare fixed``).
"""
