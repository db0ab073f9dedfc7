"""Make ``import torchvision`` (and so timm, smp) work next to a CPU-only torch build.

The registry's torchvision 0.28.0 is a CUDA build: next to the CPU torch 2.13.0 its native
extension ``_C.so`` fails to load, and ``import torchvision`` dies in its meta registrations with
``RuntimeError: operator torchvision::nms does not exist``. The cure, run
before torchvision is imported: try loading ``_C.so`` exactly as torchvision would; only if that
fails, define the schemas of the two operators torchvision registers fake kernels for
(``nms``, ``qnms``) in a ``torch.library`` fragment kept alive here. transforms.v2, models and
box ops then work; the native kernels (nms itself, ``torchvision.io`` decoding) do not -- the
project uses PIL for decoding. Where the extension loads (a matching install) nothing is defined.

Nothing runs on import: the entry points that use torchvision (``python -m train``, the data builders,
the benchmarks, the test suite's ``conftest.py``) call :func:`ensure_torchvision_importable` before
they import torchvision, timm or smp. It is idempotent and costs microseconds after the first call.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import torch

_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_fragment: torch.library.Library | None = None  # must outlive the call: the schemas die with it


def ensure_torchvision_importable(
    load_library: Callable[[str], None] | None = None,
) -> str:
    """Apply the cure once; returns what it did.

    ``"absent"`` (torchvision not installed), ``"imported"`` (too late: already imported, nothing
    to do), ``"defined"`` (the operators exist already), ``"extension"`` (``_C`` loaded: nothing
    else done) or ``"schemas"`` (``_C`` failed; the two schemas were defined).
    """
    global _fragment
    # applied here: the environment's finder that would apply it at torchvision's first import
    # (train/torchvision_hook.py) steps aside, so the lookup below does not come back to it
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "cures_torchvision", False)]
    if "torchvision" in sys.modules:
        return "imported"
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return "absent"
    if _has_op("nms"):
        return "defined"
    load = load_library or torch.ops.load_library
    for so in sorted(Path(next(iter(spec.submodule_search_locations))).glob("_C*.so")):
        try:
            load(str(so))
            return "extension"
        except OSError:
            break
    fragment = torch.library.Library("torchvision", "FRAGMENT")
    for schema in _SCHEMAS:
        fragment.define(schema)
    _fragment = fragment
    return "schemas"


def _has_op(name: str) -> bool:
    try:
        getattr(torch.ops.torchvision, name)
        return True
    except (AttributeError, RuntimeError):
        return False
