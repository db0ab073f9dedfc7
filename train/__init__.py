"""The application: config, data-set readers, models, metrics, the training loop, checkpoints, CLI.

Runs from the checkout (``python -m train``); it is not part of the installed library, which is
``projections`` and ``reparam``. Importing it has no side effects.
"""
