"""MkDocs hooks of the documentation site (``mkdocs.yml``: ``hooks``); no network, no imports of ours.

* Pages from files outside ``docs/``: the front page is ``README.md``, the changelog
  ``CHANGELOG.md`` and the benchmarks page ``benchmarks/README.md``, each with its relative links
  rewritten for the site, so each text has one source.
* The API reference: one page per public name, the names read from each package's ``__all__``
  (parsed, not imported), and its section of the navigation, so a new public name gets its page
  without an edit here.
* Section references of the method note: a plain-text "method.md sec. 4", "method note sec. 8" or
  "docs/method.md sec. 3, 3b" (as the docstrings write them) becomes a link to the heading of that
  section, wherever it is (a page of ``docs/method/``), on every page, the generated API pages
  included. The section numbers are read from the headings at build time.
* Docstrings as the API pages show them (``site_docstring``, run on every docstring by the Griffe
  extension ``griffe_extension`` that ``mkdocs.yml`` names): a bare ``>>>`` example becomes a
  highlighted Python code block (not a nested blockquote), and the first line, which the summary
  tables show, holds the whole first sentence (not the first physical line of a wrapped one).
* Inherited members a class has no use for are left off its page (``UNUSED_INHERITED``: the rate
  objectives take no sparse ``tau``).
"""

from __future__ import annotations

import ast
import logging
import posixpath
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# site page -> the repository file it is made from
INCLUDED = {
    "index.md": "README.md",
    "changelog.md": "CHANGELOG.md",
    "benchmarks.md": "benchmarks/README.md",
}
# package -> (its page folder under docs/api/, its title in the navigation)
API = {
    "projections": ("projections", "projections"),
    "reparam": ("reparam", "reparam"),
    "reparam.baselines": ("baselines", "reparam.baselines"),
}
API_NAV_TITLE = "API reference"
# mkdocs.yml's ``filters`` of the python handler (a page that sets its own repeats them)
FILTERS = ["!^_"]
# A base class -> the members its subclasses inherit but do not use, left off their pages (and
# the base's own, if it has one). The rate objectives (``reparam/rate_base.py``) take no
# ``tau_update``: their ``tau`` is dense, stepped by the user's optimizer, so the sparse ``tau``'s
# members of ``ReparamRegularizer`` are not theirs. A name that no longer exists is harmless.
UNUSED_INHERITED = {"RateObjective": ("sparse_tau",)}
_LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")

# The method note: one folder of pages whose headings are numbered sections ("## 3b. Algorithm 3").
METHOD_DIR = "method"
SECTION_HEADING = re.compile(r"^(?:Appendix )?(\d+[a-z]?|[A-Z])\. ")
_NUM = r"\d+[a-z]?\b"
_NUMS = rf"{_NUM}(?:(?:\s*[,-]\s*|\s+and\s+){_NUM})*"
# A reference to sections of the note: "method.md sec. 4", "docs/method.md sec. 3, 3b, 8", "method
# note sec. 1-3b", "method sec. 4 and 13", "docs/method/cost.md sec. 11" (a page of the note named);
# in HTML the path may be a code span ("<code>docs/method.md</code> sec. 11b").
SECTION_REF = re.compile(
    r"(?P<prefix>(?<![\w/.-])(?:<code>)?(?:docs/)?[Mm]ethod(?P<page>/[\w-]+)?(?:\.md)?(?:</code>)?"
    r"(?: note(?:'s)?)?\s+)"
    rf"(?P<head>sec(?:tions?\b|\.)\s*)(?P<nums>{_NUMS})"
)
_SEPARATOR = re.compile(r"(\s*[,-]\s*|\s+and\s+)")
log = logging.getLogger("mkdocs.hooks.sections")


def public_names(package: str) -> list[str]:
    """The names of ``package.__all__``, read from its ``__init__.py`` without importing it."""
    init = ROOT / package.replace(".", "/") / "__init__.py"
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return [ast.literal_eval(e) for e in node.value.elts]
    raise ValueError(f"{init} has no __all__")


def api_pages() -> dict[str, str]:
    """``docs/``-relative path -> markdown of every API page (a package's index and its names)."""
    pages = {"api/index.md": _api_index()}
    for package, (folder, title) in API.items():
        names = public_names(package)
        rows = "\n".join(f"| [`{n}`]({n}.md) | {_kind(package, n)} |" for n in names)
        pages[f"api/{folder}/index.md"] = (
            f"# {title}\n\n::: {package}\n    options:\n      members: false\n"
            f"      show_root_heading: false\n\n## Public names\n\n| name | |\n|---|---|\n{rows}\n"
        )
        unused = _unused_members(package)
        for name in names:
            page = f"::: {package}.{name}\n    options:\n      heading_level: 1\n"
            if unused.get(name):
                hidden = "|".join(re.escape(m) for m in unused[name])
                page += f"      filters: {[*FILTERS, f'!^({hidden})$']}\n"
            pages[f"api/{folder}/{name}.md"] = page
    return pages


def _class_bases(package: str) -> dict[str, list[str]]:
    """Class name -> the names of its bases (the last part of a dotted one), for every class
    defined in ``package``'s folder (parsed, not imported)."""
    bases: dict[str, list[str]] = {}
    for path in sorted((ROOT / package.replace(".", "/")).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
    return bases


def _unused_members(package: str) -> dict[str, tuple[str, ...]]:
    """Class name -> the inherited members its page leaves off (``UNUSED_INHERITED`` of each of
    its bases, transitively, and of itself)."""
    bases = _class_bases(package)
    out: dict[str, tuple[str, ...]] = {}
    for name in bases:
        seen, todo, members = set(), [name], []
        while todo:
            cls = todo.pop()
            if cls in seen:
                continue
            seen.add(cls)
            members += UNUSED_INHERITED.get(cls, ())
            todo += bases.get(cls, [])
        if members:
            out[name] = tuple(dict.fromkeys(members))
    return out


def _api_index() -> str:
    lines = [
        "# API reference",
        "",
        "Generated from the docstrings. The installed library is three packages; their public",
        "names (each package's `__all__`) have a page each. Imports go one way:",
        "`projections` <- `reparam` <- `reparam.baselines`.",
        "",
        "| package | what it holds |",
        "|---|---|",
        "| [`projections`](projections/index.md) | the projection onto C = {(eps, tau) : tau_i <= eps, eps >= 0}: exact and soft |",
        "| [`reparam`](reparam/index.md) | the reparameterized objectives: F-beta, precision at recall, recall at precision, ROC-AUC; the shape head |",
        "| [`reparam.baselines`](baselines/index.md) | the alternatives behind the same protocol: the LP layer, surrogates, Newton losses, Cooper and LibAUC adapters |",
    ]
    return "\n".join(lines) + "\n"


def _kind(package: str, name: str) -> str:
    folder = ROOT / package.replace(".", "/")
    if (folder / f"{name}.py").is_file():
        return "module"
    defined = re.compile(rf"^class {re.escape(name)}\b", re.M)
    if any(defined.search(f.read_text()) for f in folder.rglob("*.py")):
        return "class"  # (ROCAUC is a class, not a constant)
    return "constant" if name.isupper() else "function"


def _rewrite(markdown: str, source: str, page: str) -> str:
    """Relative links of ``source`` (a repository path) made relative to the site page ``page``."""
    src_dir = posixpath.dirname(source)
    page_dir = posixpath.dirname(page)
    reverse = {v: k for k, v in INCLUDED.items()}

    def fix(m: re.Match) -> str:
        target = m.group(2)
        if re.match(r"^[a-z]+:", target) or target.startswith("/"):
            return m.group(0)
        path = posixpath.normpath(posixpath.join(src_dir, target))
        if path in reverse:
            path = reverse[path]
        elif path.startswith("docs/"):
            path = path.removeprefix("docs/")
        else:
            return m.group(0)  # left for the build to report
        rel = posixpath.relpath(path, page_dir or ".")
        return f"{m.group(1)}{rel}{m.group(3) or ''}{m.group(4)}"

    return _LINK.sub(fix, markdown)


def on_config(config):
    """Fill the navigation's API section (a bare ``- API reference: api/index.md`` entry)."""
    nav = config["nav"]
    for i, item in enumerate(nav):
        if isinstance(item, dict) and API_NAV_TITLE in item:
            section = [{"Overview": "api/index.md"}]
            for package, (folder, title) in API.items():
                names = [{n: f"api/{folder}/{n}.md"} for n in public_names(package)]
                section.append({title: [f"api/{folder}/index.md", *names]})
            nav[i] = {API_NAV_TITLE: section}
    return config


def on_files(files, config):
    from mkdocs.structure.files import File

    for page, source in INCLUDED.items():
        text = (ROOT / source).read_text()
        files.append(File.generated(config, page, content=_rewrite(text, source, page)))
    for page, text in api_pages().items():
        files.append(File.generated(config, page, content=text))
    return files


def method_sections(docs: Path = DOCS) -> dict[str, tuple[str, str]]:
    """Section number -> (its page, ``docs/``-relative; the heading's anchor), read from the
    headings of the method note's pages (the anchor as Python-Markdown's toc makes it)."""
    from markdown.extensions.toc import slugify

    found: dict[str, tuple[str, str]] = {}
    for path in sorted((docs / METHOD_DIR).glob("*.md")):
        page = path.relative_to(docs).as_posix()
        fence = False
        for line in path.read_text().splitlines():
            if line.lstrip().startswith(("```", "~~~")):
                fence = not fence
            m = re.match(r"^#{1,6} (.+?)\s*$", line)
            if fence or not m:
                continue
            title = re.sub(r"`([^`]*)`", r"\1", m.group(1))
            number = SECTION_HEADING.match(title)
            if number:
                if number.group(1) in found:
                    raise ValueError(
                        f"section {number.group(1)} twice: {found[number.group(1)][0]}, {page}"
                    )
                found[number.group(1)] = (page, slugify(title, "-"))
    return found


def section_references(text: str) -> list[tuple[str | None, str]]:
    """``(page named or None, section number)`` of every reference to the method note in ``text``."""
    refs = []
    for m in SECTION_REF.finditer(text):
        page = f"{METHOD_DIR}{m.group('page')}.md" if m.group("page") else None
        refs += [(page, n) for n in _SEPARATOR.split(m.group("nums"))[::2]]
    return refs


def _toc_sections(pages) -> dict[str, tuple[object, str]]:
    """Section number -> (its page, its anchor), from the rendered headings of the note's pages."""
    found = {}

    def walk(page, items):
        for item in items:
            m = SECTION_HEADING.match(item.title)
            if m:
                found[m.group(1)] = (page, item.id)
            walk(page, item.children)

    for page in pages:
        if page.file.src_uri.startswith(f"{METHOD_DIR}/"):
            walk(page, page.toc)
    return found


def link_sections(html: str, page, sections: dict) -> str:
    """Each plain-text reference of ``html`` to a section of the method note made a link to its
    heading. Text already inside a link, a heading, a tag or a script stays as it is."""
    from mkdocs.utils import get_relative_url

    skip = [
        m.span() for m in re.finditer(r"<(a|h[1-6]|script|style)\b.*?</\1>|<[^>]*>", html, re.S)
    ]

    def inside(start: int, end: int) -> bool:
        return any(
            a < end and start < b and not html[a:b].startswith(("<code>", "</code>"))
            for a, b in skip
        )

    def href(number: str) -> str:
        target, anchor = sections[number]
        if target is page:
            return f"#{anchor}"
        return f"{get_relative_url(target.url, page.url)}#{anchor}"

    def link(m: re.Match) -> str:
        if inside(*m.span()):
            return m.group(0)
        named = f"{METHOD_DIR}{m.group('page')}.md" if m.group("page") else None
        parts = _SEPARATOR.split(m.group("nums"))
        out = []
        for i, part in enumerate(parts):
            text = m.group("prefix") + m.group("head") + part if i == 0 else part
            if i % 2:
                out.append(part)
            elif part not in sections or (named and sections[part][0].file.src_uri != named):
                log.warning(
                    f"{page.file.src_uri}: no section {part} in the method note: {m.group(0)!r}"
                )
                out.append(text)
            else:
                out.append(f'<a href="{href(part)}">{text}</a>')
        return "".join(out)

    return SECTION_REF.sub(link, html)


# a base class of the library without a page of its own (not in a package's __all__, e.g.
# reparam.rate_base.PointRateObjective) is shown unlinked: left out of the "Bases:" line
_PRIVATE_BASE = re.compile(
    r'<code><span title="(?:projections|reparam)\.[^"]*">[^<]*</span></code>(?:,\s*)?'
)
_BASES = re.compile(r'<p class="doc doc-class-bases">\s*Bases:\s*(.*?)\s*</p>', re.S)


def hide_private_bases(html: str) -> str:
    """The "Bases:" lines of the API pages without the library's internal base classes (and a
    line with nothing left, without itself); public and external bases stay."""

    def fix(m: re.Match) -> str:
        kept = _PRIVATE_BASE.sub("", m.group(1)).strip().rstrip(",").strip()
        return f'<p class="doc doc-class-bases">Bases: {kept}</p>' if kept else ""

    return _BASES.sub(fix, html)


def on_env(env, config, files):
    """Every page rendered: link the method note's section references in each page's HTML."""
    pages = [f.page for f in files.documentation_pages() if f.page is not None]
    sections = _toc_sections(pages)
    for page in pages:
        if page.content:
            page.content = link_sections(page.content, page, sections)
    return env


def on_post_page(output, page, config):
    """The API pages' final HTML (cross-references resolved): internal bases left out."""
    if page.file.src_uri.startswith("api/"):
        return hide_private_bases(output)
    return output


# --- docstrings as the API pages show them ----------------------------------------------------------

# a line that interrupts a paragraph (so it ends the first one): indented, display math, a
# doctest or quote, a fence, a heading, a Google section ("Args:"). (A list or a table does not
# interrupt one in Python-Markdown: a line "+ nu a ..." continues the sentence before it.)
_BLOCK_START = re.compile(r"^(\s|\$\$|>|```|~~~|#|[A-Z][A-Za-z ]*:\s*$)")
# the end of a sentence: ". " (or "! ", "? ") before a capital, a code span or a parenthesis
_SENTENCE_END = re.compile(r"[.!?](?=\s+[A-Z`(\"'])")
# abbreviations whose period ends no sentence ("method note sec. 3", "e.g. ", "Eban et al. ")
_ABBREVIATION = re.compile(r"(?:\b(?:sec|secs|e\.g|i\.e|vs|cf|al|eq|Eq|Fig|resp|approx)|\.\.)$")
# spans a sentence does not end in: code (any number of backticks) and inline math
_SPAN = re.compile(r"(`+).+?\1|\$[^$]+\$|\\\(.+?\\\)")


def _first_sentence_end(text: str) -> int | None:
    """The index just after the first sentence of ``text`` when more follows it, else ``None``."""
    spans = [m.span() for m in _SPAN.finditer(text)]
    for m in _SENTENCE_END.finditer(text):
        end = m.end()
        if any(a < end <= b for a, b in spans) or _ABBREVIATION.search(text[: m.start()]):
            continue
        return end
    return None


def _fence_doctests(lines: list[str]) -> list[str]:
    """Each run of ``>>>`` lines (with their ``...`` continuations and output, up to a blank line)
    that starts a line outside a fence wrapped in a ```` ```pycon ```` fence. An indented run (a
    Google ``Examples:`` section, which the docstring parser already renders as code) is left."""
    out: list[str] = []
    fence = None
    i = 0
    while i < len(lines):
        line = lines[i]
        opener = re.match(r"^\s*(`{3,}|~{3,})", line)
        if fence is None and opener:
            fence = opener.group(1)
        elif fence is not None and line.strip().startswith(fence):
            fence = None
        elif fence is None and line.startswith(">>>"):
            end = i
            while end < len(lines) and lines[end].strip():
                end += 1
            if out and out[-1].strip():
                out.append("")
            out += ["```pycon", *lines[i:end], "```"]
            i = end
            continue
        out.append(line)
        i += 1
    return out


def site_docstring(text: str) -> str:
    """``text`` (a docstring, dedented) as the site renders it, the same in Markdown: bare doctests
    fenced as Python code, and the first paragraph's lines joined, with a line break after its
    first sentence, so that the first line, which mkdocstrings' summaries show, is that sentence
    whole (a paragraph's line breaks are spaces in Markdown: the page reads the same)."""
    lines = _fence_doctests(text.split("\n"))
    end = 1
    while end < len(lines) and lines[end].strip() and not _BLOCK_START.match(lines[end]):
        end += 1
    if lines and lines[0].strip() and not _BLOCK_START.match(lines[0]):
        paragraph = " ".join(line.strip() for line in lines[:end])
        cut = _first_sentence_end(paragraph)
        first = [paragraph] if cut is None else [paragraph[:cut], paragraph[cut:].strip()]
        lines = first + lines[end:]
    return "\n".join(lines)


def griffe_extension():
    """The Griffe extension that ``mkdocs.yml`` loads for mkdocstrings (``docs/hooks.py:
    griffe_extension``): every docstring, as Griffe reads it, becomes its ``site_docstring``
    before it is parsed. (Griffe is imported here: the rest of this file does without it.)"""
    import griffe

    class SiteDocstrings(griffe.Extension):
        def on_instance(self, *, obj, **kwargs) -> None:
            if obj.docstring is not None:
                obj.docstring.value = site_docstring(obj.docstring.value)

    return SiteDocstrings()
