"""Which docstring examples of the library need an optional peer (pyproject.toml's extras;
``.ci/setup``), shared by the suite's doctest run (``tests/test_doctests.py``) and pytest's own
``--doctest-modules`` collection (the checkout's ``conftest.py``): where the peer cannot be
imported, those examples are skipped, not failed. An example needs a peer when its code names
the peer's adapter (``cooper_...``, ``CooperFBeta``, ``libauc_...``, ``LibAUCMargin``)."""

from __future__ import annotations

import doctest
import importlib

# the word an example's code names an adapter by -> the module the adapter imports
PEERS = {"cooper": "cooper", "libauc": "libauc.losses"}


def needed_peer(test: doctest.DocTest) -> str | None:
    """The peer module that ``test``'s examples import through an adapter (``None``: none)."""
    code = "".join(example.source for example in test.examples).lower()
    return next((module for word, module in PEERS.items() if word in code), None)


def missing_peer(test: doctest.DocTest) -> str | None:
    """The peer that ``test``'s examples need and this environment cannot import (``None``:
    none, or it imports)."""
    peer = needed_peer(test)
    if peer is None:
        return None
    try:
        importlib.import_module(peer)
    except ImportError:
        return peer
    return None
