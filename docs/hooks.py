"""MkDocs hooks of the documentation site (``mkdocs.yml``: ``hooks``); no network, no imports of ours.

* Pages from files outside ``docs/``: the front page is ``README.md``, the changelog
  ``CHANGELOG.md`` and the benchmarks page ``benchmarks/README.md``, each with its relative links
  rewritten for the site, so each text has one source.
* The API reference: one page per public name, the names read from each package's ``__all__``
  (parsed, not imported), and its section of the navigation, so a new public name gets its page
  without an edit here.
"""

from __future__ import annotations

import ast
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
_LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")


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
        for name in names:
            pages[f"api/{folder}/{name}.md"] = (
                f"::: {package}.{name}\n    options:\n      heading_level: 1\n"
            )
    return pages


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
