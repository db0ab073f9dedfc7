"""The torchvision import cure (data_prep.torchvision_compat), each case in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_cure_makes_torchvision_timm_and_smp_importable():
    out = _run(
        """
        import data_prep.torchvision_compat as c
        import torch, torchvision
        from torchvision.transforms import v2
        import segmentation_models_pytorch as smp
        img = torch.rand(3, 20, 30)
        out = v2.Compose([v2.RandomHorizontalFlip(p=1.0), v2.Resize((10, 15))])(img)
        assert out.shape == (3, 10, 15)
        m = smp.DeepLabV3Plus(encoder_name="resnet18", encoder_weights=None, classes=2).eval()
        assert m(torch.rand(1, 3, 32, 32)).shape == (1, 2, 32, 32)
        print(c.STATUS, c.ensure_torchvision_importable())
        """
    )
    status, again = out.split()
    assert status in {"schemas", "extension"} and again == "imported"


def test_does_nothing_where_the_extension_loads():
    """Simulate a matching install: loading _C succeeds, so no schema may be defined."""
    out = _run(
        """
        import torch
        loaded = []
        torch.ops.load_library = loaded.append  # pretend torchvision's _C loads fine
        import data_prep.torchvision_compat as c
        print(c.STATUS, len(loaded), c._fragment is None, c._has_op("nms"))
        """
    )
    assert out == "extension 1 True False"


def test_absent_torchvision_is_not_an_error():
    out = _run(
        """
        import importlib.util
        real = importlib.util.find_spec
        importlib.util.find_spec = lambda name, *a: None if name == "torchvision" else real(name, *a)
        import data_prep.torchvision_compat as c
        print(c.STATUS)
        """
    )
    assert out == "absent"


@pytest.mark.parametrize("package", ["train", "data_prep"])
def test_packages_apply_the_cure_on_import(package):
    out = _run(f"import {package}, torchvision; print('ok')")
    assert out == "ok"
