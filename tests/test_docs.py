"""The documentation states what the code does now, and its site covers the library.

* No history and no word of how the work was organized (issue numbers, "earlier versions", lent
  machines, sessions) in README.md, docs/, benchmarks/ or the library's docstrings: what changed is
  CHANGELOG.md's.
* The README is a front page (150 lines at most); every page of docs/ is in the site's navigation;
  every public name (each package's ``__all__``) has its API page (docs/hooks.py makes them).
* The version is in one place, ``reparam.__version__``, and is the changelog's newest release.
* The guide's code blocks run as written (the README's loop and the segmentation commands:
  tests/test_readme.py; the Lightning example: tests/test_lightning.py).

``mkdocs build --strict`` (CI, .ci/run) checks the links, the anchors and the API references.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
HISTORY = re.compile(
    r"\b[Ii]ssues? ?#?\d+|\b[Tt]his issue\b|\bthe issue's\b|\blent\b|\bsessions?\b|\blease\b"
    r"|\b[Ee]arlier versions?\b|\b[Pp]revious versions?\b|\b(?:[Bb]efore|[Ss]ince) (?:issue|this change)"
    r"|\bno GPU was\b|\bdevice time\b|\bused to (?:be|say|sort|give)\b|\bstudy paused\b|this work had"
)


def _tracked(*roots: str) -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", *roots], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [f for f in out.splitlines() if (ROOT / f).is_file()]


def _docstrings(path: Path) -> str:
    tree = ast.parse(path.read_text())
    nodes = [tree, *ast.walk(tree)]
    return "\n".join(
        ast.get_docstring(n) or ""
        for n in nodes
        if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
    )


def test_docs_state_the_present_not_the_history():
    texts = {}
    for f in _tracked("README.md", "docs", "benchmarks"):
        if f.endswith((".md", ".py")):
            texts[f] = (ROOT / f).read_text()  # benchmarks: comments count too
    for f in _tracked("projections", "reparam"):
        if f.endswith(".py"):
            texts[f] = _docstrings(ROOT / f)
    found = [f"{f}: {m.group(0)!r}" for f, text in texts.items() for m in HISTORY.finditer(text)]
    assert not found, "history belongs in CHANGELOG.md:\n" + "\n".join(found)


STALE = (
    "first version",
    "at revision",
    "not measured here",
    "no measurement yet",
    "next performance work",
)


def test_no_page_speaks_of_an_older_state():
    """Phrases that date a page (a measurement of an older revision, one promised for later):
    what the code does now is measured, or the line goes (its history to CHANGELOG.md)."""
    found = []
    for f in _tracked("README.md", "docs"):
        if f.endswith(".md"):
            text = re.sub(r"\s+", " ", (ROOT / f).read_text()).lower()
            found += [f"{f}: {phrase!r}" for phrase in STALE if phrase in text]
    assert not found, "\n".join(found)


def test_the_readme_is_a_front_page():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _nav_pages() -> set[str]:
    text = (ROOT / "mkdocs.yml").read_text().split("\nnav:", 1)[1]
    return set(re.findall(r":\s*([\w./-]+\.md)\s*$", text, re.M))


def test_every_page_is_in_the_navigation():
    pages = {
        str(p.relative_to(ROOT / "docs"))
        for p in (ROOT / "docs").rglob("*.md")
        if "figures" not in p.parts and "assets" not in p.parts
    }
    nav = _nav_pages()
    assert pages <= nav, f"pages without a place in mkdocs.yml's nav: {sorted(pages - nav)}"
    generated = set(_hooks().INCLUDED) | {"api/index.md"}
    assert nav <= pages | generated, f"nav names missing pages: {sorted(nav - pages - generated)}"


@pytest.mark.parametrize("package", ["projections", "reparam", "reparam.baselines"])
def test_every_public_name_has_an_api_page(package):
    hooks = _hooks()
    module = __import__(package, fromlist=["__all__"])
    folder = hooks.API[package][0]
    pages = hooks.api_pages()
    assert hooks.public_names(package) == list(module.__all__)
    for name in module.__all__:
        assert pages[f"api/{folder}/{name}.md"].startswith(f"::: {package}.{name}\n")
        assert getattr(module, name) is not None
    assert f"api/{folder}/index.md" in pages


def test_the_version_is_in_one_place():
    import reparam

    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^dynamic = \["version"\]', pyproject, re.M)
    assert not re.search(r'^version = "', pyproject, re.M)  # no literal version here
    assert 'version = { attr = "reparam.__version__" }' in pyproject
    assert re.fullmatch(r"\d+\.\d+\.\d+", reparam.__version__)
    changelog = (ROOT / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## (\d+\.\d+\.\d+)", changelog, re.M)
    assert releases and releases[0] == reparam.__version__
    assert changelog.index("## Unreleased") < changelog.index(f"## {releases[0]}")


def _blocks(page: str, after: str) -> list[str]:
    text = (ROOT / "docs" / "guide" / page).read_text().split(after, 1)[1]
    return re.findall(r"```python\n(.*?)```", text.split("\n## ", 1)[0], re.S)


def test_the_alternatives_snippet_builds_them():
    (code,) = _blocks("own-loop.md", "## The alternatives")
    scope = {"s": torch.tensor([0, 1, 1, 0, 1, 0])}
    exec(compile(code, "own-loop.md", "exec"), scope)
    assert type(scope["reg"]).__name__ == "LPFBeta"


def test_the_projection_snippet_runs():
    pytest.importorskip("diffsort")
    (code,) = _blocks("own-loop.md", "## The projection operator alone")
    scope: dict = {}
    exec(compile(code, "own-loop.md", "exec"), scope)
    assert scope["eps_param"].item() == 1.0
    assert scope["tau_param"].tolist() == [1.0, 0.5, -2.0]
