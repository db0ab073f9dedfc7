"""Shared fixtures: devices (CUDA skipped when absent), hypothesis profiles, reference solvers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

from train.torchvision_compat import ensure_torchvision_importable

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

ensure_torchvision_importable()  # before any test module imports torchvision, timm or smp

if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest-xdist's workers share the cores: one thread
    torch.set_num_threads(1)  # each (two workers of two threads on two cores spin on each other)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="no CUDA device on this machine")
    for item in items:
        if "cuda" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip)


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture
def fresh_dynamo():
    """The test compiles from dynamo's initial state and leaves none behind: its compiled code,
    guards and records of the sizes each frame saw are process-wide, so without a reset what a
    test compiles would depend on the tests that ran before it in the process. Modules that
    compile use it with ``pytestmark = pytest.mark.usefixtures("fresh_dynamo")``."""
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


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
    if not all(
        (MNIST_DIR / f"{n}.gz").is_file()
        for n in (
            "train-images-idx3-ubyte",
            "train-labels-idx1-ubyte",
            "t10k-images-idx3-ubyte",
            "t10k-labels-idx1-ubyte",
        )
    ):
        pytest.skip(f"real MNIST not found at {MNIST_DIR}")
    return MNIST_DIR


# --- COCO-Stuff (data_prep/cocostuff_synthetic.py): a tiny official-format tree and caches built from it ---

COCO_CACHE_SIZE = (24, 32)  # (H, W) of the session caches below; meta["image_size"] says so too


@pytest.fixture(scope="session")
def coco_root(tmp_path_factory) -> Path:
    """A tiny COCO-Stuff 2017 in the official layout: 12 train and 6 val images (see data_prep.cocostuff_synthetic)."""
    from data_prep.cocostuff_synthetic import write_synthetic_cocostuff

    return write_synthetic_cocostuff(tmp_path_factory.mktemp("coco-stuff"), n_train=12, n_val=6)


def _coco_cache(tmp_path_factory, root: Path, name: str, **options) -> Path:
    from data_prep import cocostuff

    out = tmp_path_factory.mktemp(name)
    opts = cocostuff.Options(out=out, root=root, size=COCO_CACHE_SIZE, workers=0, **options)
    return cocostuff.prepare(opts, log=lambda *_: None)


@pytest.fixture(scope="session")
def coco_cache_stuff(tmp_path_factory, coco_root) -> Path:
    """``data_prep.cocostuff`` cache, setup ``stuff`` (92 classes, all-class shape labels, t = 0.05)."""
    return _coco_cache(tmp_path_factory, coco_root, "coco-cache-stuff", setup="stuff")


@pytest.fixture(scope="session")
def coco_cache_sky(tmp_path_factory, coco_root) -> Path:
    """``data_prep.cocostuff`` cache of the sky task (2 classes; images with sky only)."""
    return _coco_cache(
        tmp_path_factory, coco_root, "coco-cache-sky", setup="stuff", only="sky-other"
    )


@pytest.fixture(scope="session")
def coco_cache_stuffthing(tmp_path_factory, coco_root) -> Path:
    """``data_prep.cocostuff`` cache, setup ``stuffthing`` (171 classes, from the PNG maps)."""
    return _coco_cache(tmp_path_factory, coco_root, "coco-cache-stuffthing", setup="stuffthing")
