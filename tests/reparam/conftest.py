"""Fixtures of the objective's tests: the default suite's sharded cases, run once."""

from __future__ import annotations

from pathlib import Path

import pytest

from .sharded_processes import run_pool


@pytest.fixture(scope="session")
def sharded_pool(tmp_path_factory) -> Path:
    """The folder of the ``POOLED`` cases' results (``sharded_processes.run_pool``)."""
    return run_pool(tmp_path_factory.mktemp("sharded_pool"))
