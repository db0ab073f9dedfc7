"""The house rules of the repository, checked on the tracked files.

* Self-contained: nothing outside ``tests/`` and ``.ci/`` points at files a user does not have
  (``../shared``), and the method note that docstrings cite (the pages of ``docs/method/``) exists
  with the cited sections.
* One-way imports: the library (``projections`` <- ``reparam`` <- ``reparam.baselines``) imports no
  application package and nothing but torch and numpy from outside (optional peers lazily); ``train`` never imports ``data_prep`` or ``benchmarks``
  (it meets the builders only through the cache formats in ``train.caches``). No circles:
  ``tests/test_import_cycles.py``.
* Findable studies: every benchmark study has its command in ``benchmarks/README.md``.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = {"projections", "reparam", "reparam.baselines", "train", "data_prep", "benchmarks", "tests"}
ALLOWED = {  # package -> the packages of ours it may import
    "projections": set(),
    "reparam": {"projections"},
    "reparam.baselines": {"projections", "reparam"},
    "train": {"projections", "reparam", "reparam.baselines"},
    "data_prep": {"train"},  # the cache readers and file utilities
    "benchmarks": {"projections", "reparam", "reparam.baselines", "train", "data_prep"},
}
NESTED = ("reparam.baselines",)  # a package of ours inside another: a layer of its own
LIBRARY_THIRD_PARTY = {"torch", "numpy"}  # plus optional peers imported lazily (extras)
OPTIONAL = {"diffsort", "torchsort", "cooper", "libauc"}


def _tracked() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [f for f in out.splitlines() if (ROOT / f).is_file()]


def _imports(path: Path) -> list[tuple[str, bool]]:
    """``(top-level module, at module level)`` for every absolute import of ``path``."""
    tree = ast.parse(path.read_text())
    top_level = {id(n) for n in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(_package(n), id(node) in top_level) for n in names]
    return found


def _package(module: str) -> str:
    """The layer of a dotted module name: a ``NESTED`` package or the top-level name."""
    return next(
        (p for p in NESTED if module == p or module.startswith(p + ".")), module.split(".")[0]
    )


def _files(package: str) -> list[Path]:
    """The package's modules, without those of a package nested in it."""
    root = ROOT / package.replace(".", "/")
    inner = [
        ROOT / p.replace(".", "/") for p in NESTED if p != package and p.startswith(package + ".")
    ]
    return [f for f in sorted(root.rglob("*.py")) if not any(f.is_relative_to(i) for i in inner)]


def test_nothing_outside_tests_and_ci_points_outside_the_repository():
    offenders = []
    for f in _tracked():
        if f.startswith(("tests/", ".ci/")) or f.endswith((".png",)):
            continue
        text = (ROOT / f).read_text(errors="replace")
        if "../shared" in text or re.search(r"shared/(spec|papers|data|ENVIRONMENT|STYLE)", text):
            offenders.append(f)
    assert not offenders, f"these files name ../shared, which users do not have: {offenders}"


def test_citations_of_the_method_note_resolve():
    note = "\n".join(p.read_text() for p in sorted((ROOT / "docs" / "method").glob("*.md")))
    sections = set(re.findall(r"^##? (\d+[a-z]?)\. ", note, re.M))
    assert {"1", "2", "3", "3b", "4", "5", "6", "7"} <= sections
    assert re.search(r"^##? Appendix A\.", note, re.M)
    cited = set()
    for f in _tracked():
        if f.endswith((".py", ".md", ".yaml")):
            text = (ROOT / f).read_text()
            cited |= set(re.findall(r"method\.md(?:\))? sec(?:tions?|\.)? (\d+[a-z]?)", text))
            stale = "spec" + " sec"  # (spelled apart, so this file does not match itself)
            assert stale not in text.lower(), f"{f} cites a spec users do not have"
    assert cited and cited <= sections, f"cited but missing: {sorted(cited - sections)}"


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_go_one_way(package):
    bad = []
    for path in _files(package):
        for name, _ in _imports(path):
            if name in OURS and name != package and name not in ALLOWED[package]:
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not bad, bad


@pytest.mark.parametrize("package", ["projections", "reparam", "reparam.baselines"])
def test_the_library_needs_only_torch_and_numpy(package):
    stdlib = set(sys.stdlib_module_names)
    bad = []
    for path in _files(package):
        for name, module_level in _imports(path):
            if (
                name in stdlib
                or name in OURS
                or name in LIBRARY_THIRD_PARTY
                or name == "__future__"
            ):
                continue
            if name in OPTIONAL and not module_level:
                continue  # an optional peer, imported lazily where it is used
            bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not bad, bad


def test_no_module_outgrows_one_responsibility():
    big = [
        f"{f} ({n} lines)"
        for f in _tracked()
        if f.endswith(".py")
        and not f.startswith("tests/")
        and (n := len((ROOT / f).read_text().splitlines())) > 600
    ]
    assert not big, big


def test_no_class_of_the_libraries_outgrows_300_lines():
    """A class of ``reparam`` or ``projections`` past 300 lines holds several concepts: split it
    into child modules (``reg.layout``, ``reg.schedule``, ``reg.sparse_tau``, the monitor)."""
    big = []
    for f in _tracked():
        if f.endswith(".py") and f.split("/")[0] in ("reparam", "projections"):
            for node in ast.walk(ast.parse((ROOT / f).read_text())):
                if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno >= 300:
                    big.append(f"{f}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not big, big


def test_the_training_loop_reads_top_to_bottom_in_80_lines():
    tree = ast.parse((ROOT / "train" / "loop.py").read_text())
    (loop,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_train"]
    assert loop.end_lineno - loop.lineno + 1 <= 80


def test_benchmark_scripts_stay_short():
    """benchmarks/ on one harness: every script 300 lines or fewer, no function over 60."""
    long = []
    for f in _tracked():
        if f.startswith("benchmarks/") and f.endswith(".py"):
            text = (ROOT / f).read_text()
            if len(text.splitlines()) > 300:
                long.append(f"{f}: {len(text.splitlines())} lines")
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    if (n := node.end_lineno - node.lineno + 1) > 60:
                        long.append(f"{f}: {node.name} {n} lines")
    assert not long, long


def test_every_benchmark_study_has_a_row_in_the_benchmarks_readme():
    """A study is a module of benchmarks/ that defines ``main`` and runs it as ``__main__`` (an
    alias only imports it); benchmarks/README.md gives each one's command."""
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    missing = []
    for f in _tracked():
        if not (f.startswith("benchmarks/") and f.endswith(".py")):
            continue
        tree = ast.parse((ROOT / f).read_text())
        defines_main = any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)
        if not (defines_main and "__main__" in ast.unparse(tree.body[-1])):
            continue
        name = f.removesuffix(".py").removesuffix("/__main__").replace("/", ".")
        package, _, last = name.rpartition(".")
        pattern = rf"python -m ({re.escape(name)}|{re.escape(package)} {re.escape(last)})(?![\w.])"
        if not re.search(pattern, readme):
            missing.append(name)
    assert not missing, f"studies without a row in benchmarks/README.md: {missing}"


def test_fbeta_takes_about_a_dozen_options():
    """Options without a measured reason were removed: shape_labels and at most 12 options."""
    import inspect

    from reparam import FBetaRegularizer

    # 12 options and the data (shape_labels; groups, issue 30): the options' count is the point
    data = {"shape_labels", "groups", "shard"}  # shard: which block of the samples these are
    assert len(set(inspect.signature(FBetaRegularizer).parameters) - data) <= 12


def test_the_compiled_forks_are_asked_in_one_module():
    """Where the library's eager and compiled forms differ it asks ``reparam.compiling``'s named
    predicates, and nowhere else asks ``torch.compiler.is_compiling()``."""
    asked = [
        f
        for f in _tracked()
        if f.endswith(".py")
        and f.split("/")[0] in ("reparam", "projections")
        and f != "reparam/compiling.py"
        and "is_compiling(" in (ROOT / f).read_text()
    ]
    assert not asked, asked
