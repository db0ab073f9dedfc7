"""The examples in the library's docstrings (the API reference shows them) run as written: every
module of ``projections`` and ``reparam`` through ``doctest``, as ``pytest --doctest-modules
projections reparam`` would, inside the suite's own command."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import projections
import reparam


def _modules() -> list[str]:
    names = []
    for package in (projections, reparam):
        names.append(package.__name__)
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", _modules())
def test_the_examples_run(name):
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, name):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"


def test_the_reference_has_examples():
    """At least 39 docstrings of the library carry examples that run (the API reference's pages
    show them): the public classes and the projections', F-beta's and the rates' functions."""
    finder = doctest.DocTestFinder()
    with_examples = [
        test
        for name in _modules()
        for test in finder.find(importlib.import_module(name), name)
        if test.examples
    ]
    assert len(with_examples) >= 39, len(with_examples)
