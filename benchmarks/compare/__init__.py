"""The comparison of docs/comparison.md: every method of the project side by side on the same data,
seeds, budget and tuning effort, in three parts.

* ``fixed`` (a package: ``spec``, ``run``, ``tables``, ``__main__``): a linear head on fixed
  features, against the exact LP optimum;
* ``mnist`` (a package, the same four modules): imbalanced binary MNIST, the LP-layer paper's
  protocol;
* ``smnist`` (one module): the shape term of the S-MNIST trainer.

``python -m benchmarks.compare PART ...`` (``__main__``) runs one part; ``python -m
benchmarks.compare.PART ...`` is the same.
"""
