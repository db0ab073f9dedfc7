"""Shared fixtures: devices (CUDA skipped when absent), hypothesis profiles, reference solvers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

import data_prep.torchvision_compat  # noqa: F401  (before anything imports torchvision)

# CI: derandomized, so a red run is reproducible; locally: random, more examples on demand.
settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=60, deadline=None)
settings.register_profile("thorough", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="no CUDA device on this machine")
    for item in items:
        if "cuda" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip)


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


MNIST_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "mnist"


@pytest.fixture(scope="session")
def digits_smnist(tmp_path_factory) -> Path:
    """A small S-MNIST built from scikit-learn's digits (first 300 per split)."""
    from data_prep import smnist

    out = tmp_path_factory.mktemp("smnist-digits")
    smnist.prepare(out, smnist.Options(source="digits", limit=300), log=lambda *_: None)
    return out


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    if not all((MNIST_DIR / f"{n}.gz").is_file() for n in (
        "train-images-idx3-ubyte", "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte",
    )):  # fmt: skip
        pytest.skip(f"real MNIST not found at {MNIST_DIR}")
    return MNIST_DIR
