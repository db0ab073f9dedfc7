"""Training glue: config, data, models, metrics, the loop, logging, checkpoints."""

import data_prep.torchvision_compat  # noqa: F401  (must run before torchvision/timm/smp)
