"""No import cycles among the project's modules (issue 32), benchmarks and tests included.

The detector reads the code, runs none of it: every module of every top-level package (a folder
with an ``__init__.py``) is parsed with ``ast``; each ``import`` and ``from ... import`` of a project
module, absolute or relative, at module level or inside a function, is an arrow to the module it
names (``from p import name``: to ``p.name`` if that is a module, else to ``p`` itself). Imports
under ``if TYPE_CHECKING:`` never run and are not arrows. A cycle is a strongly connected component
of that graph with more than one module, or a module that imports itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

Graph = dict[str, dict[str, str]]  # module -> {module it imports: "file:line" of the first import}


def project_modules(root: Path) -> dict[str, Path]:
    """Dotted name -> file of every module of the top-level packages under ``root``."""
    modules = {}
    for init in sorted(root.glob("*/__init__.py")):
        if init.parent.name.startswith("."):
            continue
        for path in sorted(init.parent.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if not all(p.isidentifier() for p in parts):
                continue
            if not all(
                (root.joinpath(*parts[:i]) / "__init__.py").is_file() for i in range(1, len(parts))
            ):
                continue  # a script in a folder that is no package
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: all but those under ``if TYPE_CHECKING:``."""
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If) and _type_checking(node):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return found


def _deepest(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of the dotted ``name`` that is a project module."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in modules:
            return ".".join(parts[:i])
    return None


def _targets(module: str, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> list[str]:
    """The project modules that the import ``node`` in ``module`` names."""
    if isinstance(node, ast.Import):
        return [t for alias in node.names if (t := _deepest(alias.name, modules))]
    if node.level:  # relative: from the package of ``module``, one level up per extra dot
        package = module if modules[module].name == "__init__.py" else module.rpartition(".")[0]
        parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        base = ".".join([*parts, *([node.module] if node.module else [])])
    else:
        base = node.module or ""
    out = []
    for alias in node.names:
        if f"{base}.{alias.name}" in modules:
            out.append(f"{base}.{alias.name}")
        elif t := _deepest(base, modules):
            out.append(t)
    return out


def import_graph(root: Path) -> Graph:
    """Every project module under ``root`` and the project modules it imports."""
    modules = project_modules(root)
    graph: Graph = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, {})
        nodes = sorted(_imports(ast.parse(path.read_text(), str(path))), key=lambda n: n.lineno)
        for node in nodes:
            for target in _targets(module, node, modules):
                edges.setdefault(target, f"{path.relative_to(root)}:{node.lineno}")
    return graph


def _components(graph: Graph) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph`` (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                out.append(sorted(component))
    return out


def _loop(graph: Graph, component: list[str]) -> list[str]:
    """One cycle through the component's first module, shortest first (breadth-first)."""
    start, inside = component[0], set(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return path[::-1]
                if child in inside and child not in previous:
                    previous[child] = node
                    nxt.append(child)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")  # a component always has one


def circles(graph: Graph) -> list[list[str]]:
    """The modules of each strongly connected component that holds a cycle, sorted."""
    return [c for c in _components(graph) if len(c) > 1 or c[0] in graph[c[0]]]


def cycles(graph: Graph) -> list[list[str]]:
    """One import cycle per circle: ``[a, b, c]`` is a -> b -> c -> a, starting at the circle's
    first module in sorted order."""
    return [_loop(graph, c) for c in circles(graph)]


def describe(graph: Graph, cycle: list[str]) -> str:
    """``a (a.py:3) -> b (b.py:7) -> a``: each arrow with the line that imports."""
    steps = [f"{m} ({graph[m][n]})" for m, n in zip(cycle, [*cycle[1:], cycle[0]], strict=True)]
    return " -> ".join([*steps, cycle[0]])


def test_no_import_cycles_among_the_projects_modules():
    graph = import_graph(ROOT)
    assert {"projections", "reparam", "train", "data_prep", "benchmarks", "tests"} <= {
        m.split(".")[0] for m in graph
    }
    assert any(graph[m] for m in graph if m.startswith("benchmarks."))  # relative imports resolve
    found = circles(graph)
    assert not found, "import cycles (a circle's modules: one loop through them):\n" + "\n".join(
        f"{', '.join(c)}: {describe(graph, _loop(graph, c))}" for c in found
    )


STUDY_LAYERS = (
    "spec",
    "run",
    "tables",
    "__main__",
)  # a study package: each imports only those before it


def test_a_study_package_imports_one_way():
    """In every package of benchmarks/ made of ``spec``, ``run``, ``tables`` and ``__main__``: spec
    <- run <- tables <- __main__ (issue 32)."""
    graph = import_graph(ROOT)
    studies = {m.rpartition(".")[0] for m in graph if m.startswith("benchmarks.")}
    studies = {s for s in studies if f"{s}.spec" in graph and f"{s}.__main__" in graph}
    assert {"benchmarks.compare.fixed", "benchmarks.compare.mnist"} <= studies
    backwards = [
        f"{study}.{layer} imports {target} ({line})"
        for study in sorted(studies)
        for i, layer in enumerate(STUDY_LAYERS)
        for target, line in graph.get(f"{study}.{layer}", {}).items()
        if target.rpartition(".")[0] == study and target.rpartition(".")[2] in STUDY_LAYERS[i:]
    ]
    assert not backwards, backwards


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_detector_finds_a_cycle_through_relative_and_lazy_imports(tmp_path):
    root = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/sub/__init__.py": "",
            "pkg/a.py": "from pkg.sub import b\n",
            "pkg/sub/b.py": "def f():\n    from .. import c\n",  # inside a function
            "pkg/c.py": "import pkg.a\n",
            "pkg/d.py": "from . import a\n",  # into the cycle, not part of it
            "other/__init__.py": "from .x import y\n",
            "other/x.py": "import other\n",  # a package and its module: a second cycle
        },
    )
    graph = import_graph(root)
    assert graph["pkg.sub.b"] == {"pkg.c": "pkg/sub/b.py:2"}
    assert cycles(graph) == [["other", "other.x"], ["pkg.a", "pkg.sub.b", "pkg.c"]]
    assert describe(graph, ["pkg.a", "pkg.sub.b", "pkg.c"]) == (
        "pkg.a (pkg/a.py:1) -> pkg.sub.b (pkg/sub/b.py:2) -> pkg.c (pkg/c.py:1) -> pkg.a"
    )


def test_the_detector_ignores_type_checking_imports_and_finds_self_imports(tmp_path):
    root = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from .b import B\n",
            "pkg/b.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from .a import A\nelse:\n    import json\n"
            ),
            "pkg/c.py": "from pkg import c\n",  # c imports itself
        },
    )
    graph = import_graph(root)
    assert graph["pkg.b"] == {}
    assert cycles(graph) == [["pkg.c"]]
