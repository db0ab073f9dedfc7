"""The installable distribution is the library alone: `projections` and `reparam` on torch + numpy.

Builds the project as a user would (`pip install --no-deps --target DIR .`, from a copy of the
checkout so no `build/` folder appears in it) and inspects what lands in site-packages.
"""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = {"projections", "reparam"}
APPLICATION = {"train", "data_prep", "benchmarks", "tests", "configs", "docs"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src") / "checkout"
    skip = shutil.ignore_patterns(
        ".venv",
        ".git",
        "data",
        "runs",
        "build",
        "site",
        "*.egg-info",
        "__pycache__",
        ".*cache*",
        ".hypothesis",
    )
    shutil.copytree(ROOT, src, ignore=skip)
    target = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--no-compile",
            "--disable-pip-version-check",
            "-q",
            "--target",
            str(target),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return target


def test_only_the_library_packages_are_installed(installed):
    top = {p.name for p in installed.iterdir() if not p.name.endswith(".dist-info")}
    top -= {"__pycache__", "bin"}
    assert top == LIBRARY, f"site-packages holds {sorted(top)}"
    assert not (top & APPLICATION)


def test_core_requirements_are_torch_and_numpy(installed):
    (info,) = installed.glob("fbeta_reparam-*.dist-info")
    meta = email.message_from_string((info / "METADATA").read_text())
    core = [r for r in meta.get_all("Requires-Dist") if "extra ==" not in r]
    names = {r.split(">")[0].split("=")[0].split("<")[0].split(";")[0].strip() for r in core}
    assert names == {"torch", "numpy"}, core
    extras = set(meta.get_all("Provides-Extra"))
    assert {"train", "dev", "soft", "cooper", "lightning", "docs"} <= extras


def test_the_distribution_has_the_library_version(installed):
    """One place: pyproject.toml reads ``reparam.__version__`` (without importing reparam)."""
    import reparam

    (info,) = installed.glob("fbeta_reparam-*.dist-info")
    meta = email.message_from_string((info / "METADATA").read_text())
    assert meta["Version"] == reparam.__version__


def test_the_installed_library_imports_and_runs(installed, tmp_path):
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import torch, projections, reparam, reparam.baselines;"
        "assert projections.__file__.startswith(sys.argv[1]), projections.__file__;"
        "assert reparam.__file__.startswith(sys.argv[1]), reparam.__file__;"
        "assert reparam.baselines.__file__.startswith(sys.argv[1]), reparam.baselines.__file__;"
        "e, t = projections.project_onto_c(torch.tensor(-1.0), torch.tensor([3.0, 0.5, -2.0]));"
        "reg = reparam.FBetaRegularizer(torch.tensor([0, 1, 1, 0]));"
        "loss = reg(torch.randn(2), torch.tensor([0, 2]));"
        "print(e.item(), t.tolist(), bool(torch.isfinite(loss)), "
        "sorted(m for m in ('train', 'data_prep', 'benchmarks', 'torchvision', 'yaml', 'cooper',"
        " 'libauc', 'scipy') if m in sys.modules))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(installed)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["1.0", "[1.0,", "0.5,", "-2.0]", "True", "[]"]


def test_building_leaves_no_untracked_build_folder():
    ignored = (ROOT / ".gitignore").read_text().split()
    assert "build/" in ignored and "dist/" in ignored
