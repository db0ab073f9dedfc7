"""The torchvision import cure (train.torchvision_compat), each case in a fresh interpreter."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

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
        import train.torchvision_compat as c
        status = c.ensure_torchvision_importable()
        import torch, torchvision
        from torchvision.transforms import v2
        import segmentation_models_pytorch as smp
        img = torch.rand(3, 20, 30)
        out = v2.Compose([v2.RandomHorizontalFlip(p=1.0), v2.Resize((10, 15))])(img)
        assert out.shape == (3, 10, 15)
        m = smp.DeepLabV3Plus(encoder_name="resnet18", encoder_weights=None, classes=2).eval()
        assert m(torch.rand(1, 3, 32, 32)).shape == (1, 2, 32, 32)
        print(status, c.ensure_torchvision_importable())
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
        import train.torchvision_compat as c
        print(c.ensure_torchvision_importable(), len(loaded), c._fragment is None, c._has_op("nms"))
        """
    )
    assert out == "extension 1 True False"


def test_absent_torchvision_is_not_an_error():
    out = _run(
        """
        import importlib.util
        real = importlib.util.find_spec
        importlib.util.find_spec = lambda name, *a: None if name == "torchvision" else real(name, *a)
        import train.torchvision_compat as c
        print(c.ensure_torchvision_importable())
        """
    )
    assert out == "absent"


APPLICATION = (
    "train",
    "train.loop",
    "train.data",
    "data_prep",
    "data_prep.smnist",
    "data_prep.cocostuff",
)


def test_importing_the_application_has_no_side_effect():
    """No cure on import (entry points call it explicitly) and no torchvision import either:
    each module imported in turn in one fresh interpreter (``sys.modules`` only grows, so the
    first module that imported torchvision or cured is the first line that says so)."""
    out = _run(
        "import importlib, sys; from train.torchvision_compat import _has_op\n"
        f"for module in {APPLICATION!r}:\n"
        "    importlib.import_module(module)\n"
        "    print(module, 'torchvision' in sys.modules, _has_op('nms'))"
    )
    assert out.splitlines() == [f"{module} False False" for module in APPLICATION]


def test_the_entry_points_apply_the_cure(tmp_path):
    """``python -m train`` on a segmentation config builds an smp model (smp, timm, torchvision)."""
    import train.config as C
    from train.data import segmentation_augment
    from train.models import build_model

    cfg = C.load(ROOT / "configs" / "cocostuff_tiny.yaml", ["model.encoder_weights=null"])
    logits, _ = build_model(cfg.model, (32, 32), 3).eval()(
        torch.zeros(1, 3, 32, 32, dtype=torch.uint8)
    )
    assert logits.shape == (1, 3, 32, 32)
    assert segmentation_augment(cfg.data, (8, 8)) is not None
    out = _run("""
        import pickle, torch
        from train.data import JointAugment
        aug = pickle.loads(pickle.dumps(JointAugment((8, 8), True, None)))
        img, mask = aug.pair(torch.zeros(3, 8, 8, dtype=torch.uint8), torch.zeros(8, 8, dtype=torch.uint8))
        print(tuple(img.shape), tuple(mask.shape))
        """)
    assert out == "(3, 8, 8) (8, 8)"


def test_the_environment_imports_them_as_a_user_types_them(tmp_path):
    """In the project's environment (``.ci/setup`` writes the hook's ``.pth``), a fresh interpreter
    started outside the checkout, with no cure called and nothing on ``PYTHONPATH``, imports
    torchvision, smp, timm and lightning as typed; starting it imports no torch."""
    site = subprocess.run(
        [sys.executable, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not (Path(site) / "fbeta_reparam_torchvision.pth").is_file():
        pytest.skip("not the environment .ci/setup builds (no fbeta_reparam_torchvision.pth)")
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}

    def run(code: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr[-3000:]
        return proc.stdout.strip()

    assert run("import sys; print('torch' in sys.modules)") == "False"
    imports = "import torchvision, segmentation_models_pytorch, timm"
    if importlib.util.find_spec("lightning") is not None:
        imports += ", lightning"
    assert run(f"{imports}; print('ok')") == "ok"
