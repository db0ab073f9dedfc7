"""The torchvision import cure applied by itself, for every interpreter of the project's ``.venv``.

``.ci/setup`` writes ``fbeta_reparam_torchvision.pth`` into the environment's ``site-packages``; its
one line loads this file (by its path: the application is not an installed package) and calls
:func:`install` when the interpreter starts. That puts a
finder first on ``sys.meta_path`` which does nothing until ``torchvision`` is first imported (by a
user's ``import torchvision``, ``import segmentation_models_pytorch``, ``import timm`` or ``import
lightning``); then it applies ``train.torchvision_compat.ensure_torchvision_importable`` once,
removes itself and lets the import go on as usual. Python's own import machinery offers no hook that
runs before a given package's first import, hence this finder (an object with ``find_spec`` on
``sys.meta_path``, the documented extension point; not a subclass of ``importlib.abc.MetaPathFinder``,
whose import costs every interpreter 11 ms). Starting the interpreter imports nothing else (no
torch).
"""

from __future__ import annotations

import sys


class CureBeforeTorchvision:
    """Applies the cure when ``torchvision`` is first looked up, then steps aside (as it does
    when the cure is applied by hand: ``ensure_torchvision_importable`` removes every finder marked
    ``cures_torchvision``)."""

    cures_torchvision = True

    def find_spec(self, fullname: str, path=None, target=None) -> None:
        if fullname != "torchvision":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # once; and the cure's own find_spec does not come back here
        _compat().ensure_torchvision_importable()
        return None  # the usual finders import it


def _compat():
    """``train.torchvision_compat``: imported, or loaded from beside this file (an interpreter
    started outside the checkout cannot import ``train``)."""
    try:
        from train import torchvision_compat
    except ImportError:
        import importlib.util
        from pathlib import Path

        path = Path(__file__).with_name("torchvision_compat.py")
        spec = importlib.util.spec_from_file_location("_fbeta_reparam_torchvision_compat", path)
        torchvision_compat = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = torchvision_compat  # kept alive: its fragment holds the schemas
        spec.loader.exec_module(torchvision_compat)
    return torchvision_compat


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once per interpreter)."""
    if not any(getattr(f, "cures_torchvision", False) for f in sys.meta_path):
        sys.meta_path.insert(0, CureBeforeTorchvision())
