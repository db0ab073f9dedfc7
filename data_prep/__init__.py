"""Re-runnable, deterministic scripts that turn raw data into training caches."""

from . import torchvision_compat as _torchvision_compat  # noqa: F401  (before any torchvision import)
