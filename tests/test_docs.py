"""The documentation states what the code does now, and its site covers the library.

* No history and no word of how the work was organized (issue numbers, "earlier versions", lent
  machines, sessions) in README.md, docs/, benchmarks/ or the library's docstrings: what changed is
  CHANGELOG.md's.
* The README is a front page (150 lines at most); every page of docs/ is in the site's navigation;
  every public name (each package's ``__all__``) has its API page (docs/hooks.py makes them).
* The version is in one place, ``reparam.__version__``, and is the changelog's newest release.
* The guide's code blocks run as written (the README's loop and the segmentation commands:
  tests/test_readme.py; the Lightning example: tests/test_lightning.py; every other ```python
  block: tests/test_doc_snippets.py).
* Every page renders as written: no code line is wider than its block shows on a 1280-px screen,
  and every list is a list (nested at 4 spaces, a blank line above it).

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


# --- every page renders as written ----------------------------------------------------------------

# A code block of the site shows this many characters of a line: 686 px of 13.6-px monospace
# (8.18 px a character) in a 1280-px browser window with its scrollbar; past it a line is cut.
CODE_WIDTH = 83
# a code block inside a list item is one level of the list's margin narrower
LIST_MARGIN = 3
FENCE = re.compile(r"^( *)(`{3,}|~{3,})")
LIST_ITEM = re.compile(r"^( *)(?:[-*+]|\d+\.)(?: +|$)")


def _pages() -> list[Path]:
    """README.md and the site's pages, less the generated tables (docs/figures) and assets."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p for p in pages if not {"figures", "assets"} & set(p.relative_to(ROOT).parts)]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _scan(text: str):
    """Yield ``(kind, line number, line, depth)`` for every line of a Markdown page: kind is
    ``"code"`` inside a fenced or an indented code block (the line less the block's indentation),
    ``"text"`` elsewhere; depth is 1 inside a list item, 0 outside a list."""
    fence = None  # (indentation, marker) of the open fence
    in_list = in_code = False
    blank = True
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is not None:
            closing = m and m.group(2)[0] == fence[1][0] and len(m.group(2)) >= len(fence[1])
            if closing and not line.strip().strip(fence[1][0]):
                fence = None
                continue
            yield "code", number, line[min(fence[0], _indent(line)) :], int(in_list)
            continue
        if not line.strip():
            blank = True
            yield "text", number, line, int(in_list)
            continue
        indent = _indent(line)
        code_indent = 8 if in_list else 4
        if indent >= code_indent and (blank or in_code):
            in_code = True
            yield "code", number, line[code_indent:], int(in_list)
            blank = False
            continue
        in_code = False
        if LIST_ITEM.match(line) and indent < code_indent:
            in_list = True
        elif blank and indent < 4:
            in_list = False  # a paragraph, heading, table or fence after a blank line ends a list
        if m:
            fence = (indent, m.group(2))
        blank = False
        yield "text", number, line, int(in_list)


def _wide_code_lines(path: Path) -> list[str]:
    found = []
    for kind, number, line, depth in _scan(path.read_text()):
        width = CODE_WIDTH - LIST_MARGIN * depth
        if kind == "code" and len(line.rstrip()) > width:
            found.append(f"{path.relative_to(ROOT)}:{number}: {len(line.rstrip())} > {width}")
    return found


def _misrendered_list_lines(path: Path) -> list[str]:
    """Lines that Python-Markdown does not render as the list they look like: it nests a list, or
    keeps a paragraph in a list item, only at 4 spaces a level (an item or a paragraph under a list
    item indented by 1-3 spaces leaves the list), and it starts a list only after a blank line (an
    item right below a paragraph line is part of the paragraph)."""
    found = []
    in_list = blank = False
    block_is_list = False  # the lines since the last blank line start with a list item
    previous = ""
    for kind, number, line, depth in _scan(path.read_text()):
        if kind == "text" and line.strip():
            indent, item = _indent(line), LIST_ITEM.match(line)
            if blank:
                block_is_list = bool(item)
            if in_list and (item or blank) and indent % 4 and not FENCE.match(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: indented by {indent}")
            elif item and not blank and not block_is_list and not previous.startswith("#"):
                found.append(f"{path.relative_to(ROOT)}:{number}: no blank line above the list")
            previous = line
        if kind == "text":
            blank = not line.strip()
        in_list = bool(depth)
    return found


PAGES = _pages()


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_no_code_line_is_wider_than_its_block(page):
    """A code line longer than the block shows is cut off on a 1280-px screen: commands go over
    lines with ` \\`, Python breaks inside brackets, a long comment goes above its line."""
    assert not _wide_code_lines(page), "\n".join(_wide_code_lines(page))


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_lists_render_as_lists(page):
    """Nested lists at 4 spaces a level, a blank line above every list."""
    assert not _misrendered_list_lines(page), "\n".join(_misrendered_list_lines(page))


def test_api_signatures_wrap_at_the_code_width():
    """mkdocstrings-python breaks a signature longer than its ``line_length`` over lines with ruff
    (in the docs extra), so the API pages' signatures fit their code blocks too."""
    assert re.search(rf"^\s+line_length: {CODE_WIDTH}\b", (ROOT / "mkdocs.yml").read_text(), re.M)
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"ruff' in re.search(r"^docs = \[(.*?)\]", pyproject, re.S | re.M).group(1)


# --- pages of a readable length; section references that resolve ---------------------------------

MAX_WORDS = 6000  # words of a page (``wc -w``); a longer one is split by topic


def test_no_page_is_longer_than_max_words():
    """Every page under docs/ (less the generated tables and assets) and every API page the hooks
    generate holds at most ``MAX_WORDS`` words."""
    docs = ROOT / "docs"
    texts = {
        str(p.relative_to(ROOT)): p.read_text()
        for p in docs.rglob("*.md")
        if not {"figures", "assets"} & set(p.relative_to(docs).parts)
    }
    texts |= {f"docs/{page} (generated)": text for page, text in _hooks().api_pages().items()}
    long = {page: n for page, text in texts.items() if (n := len(text.split())) > MAX_WORDS}
    assert not long, f"pages over {MAX_WORDS} words (split them by topic): {long}"


def _texts_citing_the_note() -> dict[str, str]:
    """The tracked sources, configs and pages, and the pages of docs/ (tracked or not)."""
    files = {f for f in _tracked() if f.endswith((".py", ".md", ".yaml", ".yml"))}
    files |= {str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")}
    return {f: (ROOT / f).read_text() for f in sorted(files) if (ROOT / f).is_file()}


def test_section_references_resolve():
    """Docstrings, comments and pages cite the method note as "method.md sec. 4", "method note
    sec. 8" or "docs/method/cost.md sec. 11": every cited section is a heading of one page of
    docs/method/ (of the page named, when one is), and a link to a section's heading names the
    section it points at. The site turns the plain-text references into links (docs/hooks.py)."""
    pytest.importorskip("markdown")
    hooks = _hooks()
    sections = hooks.method_sections()
    assert {"1", "2", "3", "3b", "4", "5", "6", "7", "8", "11", "11b", "12", "13"} <= set(sections)
    anchors = {(page, anchor): number for number, (page, anchor) in sections.items()}
    wrong, cited = [], 0
    for f, text in _texts_citing_the_note().items():
        for page, number in hooks.section_references(text):
            cited += 1
            if number not in sections or page not in (None, sections[number][0]):
                wrong.append(f"{f}: {page or 'method.md'} sec. {number}: no such section")
        if not f.endswith(".md"):
            continue
        link = re.compile(r"\[([^\]]*)\]\(([^)\s#]*method/[\w-]+\.md)#([^)\s]+)\)")
        for m in link.finditer(text):
            target = Path(f).parent.joinpath(m.group(2)).as_posix()
            page = re.sub(r"^(\.\./)*", "", target.replace("docs/", "", 1))
            number = anchors.get((page, m.group(3)))
            if number is None:
                continue  # not a section heading: the build checks the anchor
            said = re.search(r"(\d+[a-z]?)\s*$", m.group(1))
            if said and said.group(1) != number:
                wrong.append(f"{f}: {m.group(0)!r} points at sec. {number}")
    assert cited, "no reference found: the pattern no longer matches what the sources write"
    assert not wrong, "\n".join(wrong)


def test_the_site_links_the_plain_section_references():
    """The hook's rewrite of a page's HTML: each plain-text reference becomes a link to the
    section's heading; text already in a link, a tag or a heading stays as it is."""
    pytest.importorskip("mkdocs")
    hooks = _hooks()

    class Page:  # what the hook reads of a page
        def __init__(self, src_uri: str, url: str):
            self.file = type("File", (), {"src_uri": src_uri})()
            self.url = url

    here, lp = Page("api/x.md", "api/x/"), Page("method/lp.md", "method/lp/")
    sections = {"2": (lp, "2-the-lp"), "3": (lp, "3-partial")}
    html = (
        "<h2>sec. 2</h2><p>See docs/method.md sec. 2 and 3, <code>docs/method.md</code> sec. 3 "
        '(method note sec. 2); <a href="#x">method sec. 3</a> <img alt="method.md sec. 2"></p>'
    )
    out = hooks.link_sections(html, here, sections)
    assert '<a href="../../method/lp/#2-the-lp">docs/method.md sec. 2</a> and ' in out
    assert '<a href="../../method/lp/#3-partial">3</a>' in out
    assert '<a href="../../method/lp/#3-partial"><code>docs/method.md</code> sec. 3</a>' in out
    assert '(<a href="../../method/lp/#2-the-lp">method note sec. 2</a>)' in out
    assert '<a href="#x">method sec. 3</a>' in out and 'alt="method.md sec. 2"' in out
    assert out.startswith("<h2>sec. 2</h2>")
    assert hooks.link_sections("<p>method.md sec. 2</p>", lp, sections) == (
        '<p><a href="#2-the-lp">method.md sec. 2</a></p>'
    )


def test_the_api_pages_hide_internal_base_classes():
    """A class whose base is internal (no API page) shows no "Bases:" line for it; public bases
    (linked) and external ones (torch's ``Module``) stay."""
    hide = _hooks().hide_private_bases
    internal = (
        '<code><span title="reparam.rate_base.PointRateObjective">PointRateObjective</span></code>'
    )
    public = '<code><a href="../ReparamRegularizer/">ReparamRegularizer</a></code>'
    external = '<code><span title="torch.nn.Module">Module</span></code>'
    line = '<p class="doc doc-class-bases">\n  Bases: {}</p>'
    assert hide(line.format(internal)) == ""
    assert hide(line.format(f"{internal}, {public}")) == (
        f'<p class="doc doc-class-bases">Bases: {public}</p>'
    )
    assert hide(line.format(external)) == f'<p class="doc doc-class-bases">Bases: {external}</p>'
