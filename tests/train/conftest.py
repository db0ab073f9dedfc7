"""Fixtures for the trainer tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """``train.num_threads`` changes the process-wide thread count: restore it after each test."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)
