"""pytest's own ``--doctest-modules`` run over the library (``pytest --doctest-modules projections
reparam``): the examples of an adapter to an optional peer (Cooper, LibAUC) are skipped where the
peer is not installed, as the suite's doctest test skips them (``tests/peer_examples.py``)."""

from __future__ import annotations

import pytest

from tests.peer_examples import missing_peer


def pytest_collection_modifyitems(config, items):
    for item in items:
        if isinstance(item, pytest.DoctestItem) and (peer := missing_peer(item.dtest)):
            item.add_marker(pytest.mark.skip(reason=f"the optional peer {peer!r} is not installed"))
