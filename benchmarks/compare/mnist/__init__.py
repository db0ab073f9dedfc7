"""Part 2 of the comparison (docs/comparison.md): the LP-layer paper's imbalanced binary MNIST
protocol (Meng et al., NeurIPS 2021, Table 1) with every AUC and F1 method of the project, each
trained alone as the loss of one MLP's score.

Data: the four official MNIST files (idx, ``.gz`` or raw) in ``--mnist-dir``, read by
``data_prep.smnist.load_mnist`` (md5 not required: a test passes a stand-in).
Digits 0-4 are the positive class (label 1), 5-9 the negative one. As in the paper, samples are
dropped so that the positive ratio (positives / all) is 91 %, 83 %, 71 % or 50 %: negatives, in the
order of a fixed permutation drawn from ``--data-seed`` (at 50 % MNIST has fewer negatives than
positives, so there positives are dropped instead, likewise). The TEST split is imbalanced the same
way as the training split: ROC-AUC does not depend on the class prior, F1 and accuracy do, so they
are measured at the prior the model was trained at.

Protocol (the same for every method): an MLP 784 -> 256 -> ReLU -> 1 (the score ``u``) on inputs
scaled to [0, 1]; seeds 0, 1, 2 (a seed fixes the initialization and the batch order); Adam, lr
1e-3, on the network and the method's own parameters; batch 128 drawn uniformly (epochs over a
permutation from a ``torch.Generator``; ``end_epoch_()`` at every epoch end; the dataset indices are
positions in the imbalanced training set); 2000 iterations. The one exception is LibAUC's AUC-margin
loss, trained with its own optimizer PESG at LibAUC's documented settings (lr 0.1, epoch_decay 2e-3,
weight_decay 1e-5, momentum 0.9) and, as LibAUC's examples do (epochs 50 and 75 of 100),
``update_regularizer(decay_factor=10)`` at the first epoch ends past 50 % and 75 % of the run (one
call with factor 100 if both fall into one epoch: two calls in a row would divide by zero); its
loss sees ``sigmoid(u)`` and the training set's positive ratio as ``p``.

Measured on the test split: ROC-AUC of ``u`` (exact, Mann-Whitney), F1 and accuracy of ``u > 0``
(for the F-beta regularizer also of ``u > reg.decision_threshold``, its learned F1-optimal
threshold), the share predicted positive, and the seconds per iteration: the median over the run of
the wall time of forward + loss + backward + optimizer step (+ ``after_step_()``), the batch gather
and the epoch ends not included. Each run is its own process with ``torch.set_num_threads(1)``, so
``--jobs 2`` runs two at a time on two cores without them competing for threads; ratios to
cross-entropy are per (ratio, seed) within the same sweep. Every run is a JSON file under ``--runs``
(written atomically; a finished run with the same settings is skipped, so an interrupted sweep
resumes). Writes ``compare_mnist.md`` and ``compare_mnist.png`` to ``--out``.

``spec``: the data, the methods, the seeds and the budget; ``run``: one run and its JSON record;
``tables``: the report and the plot; ``__main__``: the command line
(``python -m benchmarks.compare mnist``).
"""
