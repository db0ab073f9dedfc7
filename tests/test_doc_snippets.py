"""Every ```python block of README.md and the site's pages runs as written.

Each block runs here in a fresh namespace (one thread, in a scratch folder, seconds), unless a test
that needs more than that runs it (``ELSEWHERE``: the README's loop, the Lightning example, the
sharded loop under torchrun, ...) or the page marks it ``<!-- not run: reason -->`` on the line
above it (it needs processes, a trained run or data on disk). A new block is run here by default.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^( *)(`{3,}|~{3,})\s*(\w*)")
NOT_RUN = re.compile(r"^\s*<!-- not run: (.+?) -->\s*$")
SECONDS = 10.0  # each block here takes about a second or less; this bounds a slow one

# (page, section heading, k-th python block of that section): the test that runs it
ELSEWHERE = {
    ("README.md", "Use the regularizer in your own training loop", 1): (
        "tests/test_readme.py::test_regularizer_snippet_runs"
    ),
    ("docs/guide/own-loop.md", "The loop", 1): (
        "tests/test_readme.py::test_the_guide_runs_the_readme_loop"
    ),
    (
        "docs/guide/own-loop.md",
        "Rate objectives: precision at recall, recall at precision, ROC-AUC",
        1,
    ): ("tests/test_readme.py::test_rate_objective_snippet_builds_each_objective"),
    (
        "docs/guide/own-loop.md",
        "Rate objectives: precision at recall, recall at precision, ROC-AUC",
        2,
    ): ("tests/test_readme.py::test_rate_objective_snippet_builds_each_objective"),
    ("docs/guide/own-loop.md", "The alternatives, behind the same protocol", 1): (
        "tests/test_docs.py::test_the_alternatives_snippet_builds_them"
    ),
    ("docs/guide/own-loop.md", "The projection operator alone", 1): (
        "tests/test_docs.py::test_the_projection_snippet_runs"
    ),
    ("docs/guide/lightning.md", "PyTorch Lightning", 1): (
        "tests/test_lightning.py::test_lightning_guide_example_trains_and_restores_the_state"
    ),
    ("docs/guide/sharded.md", "In your own loop", 1): (
        "tests/reparam/test_sharded.py::test_the_guide_example_runs"
    ),
}
# optional packages (pyproject.toml's extras) by a name a block's code uses
OPTIONAL = {"cooper_": "cooper", "libauc": "libauc", "diffsort": "diffsort"}


def _pages() -> list[Path]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p for p in pages if not {"figures", "assets"} & set(p.relative_to(ROOT).parts)]


def _python_blocks(path: Path):
    """Yield ``(section, k, line number, code, reason it is not run or None)`` for each ```python
    block of a page (a block in a list item less its indentation)."""
    section, k, fence, code, previous = "", 0, None, [], ""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        m = FENCE.match(line)
        if fence is not None:
            if m and m.group(2).startswith(fence[1]) and not line.strip().strip(fence[1][0]):
                if fence[2] == "python":
                    k += 1
                    reason = NOT_RUN.match(fence[3])
                    yield section, k, fence[4], "\n".join(code) + "\n", reason and reason.group(1)
                fence, code = None, []
            else:
                code.append(line[min(fence[0], len(line) - len(line.lstrip(" "))) :])
            continue
        if m:
            fence = (len(m.group(1)), m.group(2), m.group(3), previous, number)
        elif line.startswith("#"):
            section, k = line.lstrip("#").strip(), 0
        if line.strip():
            previous = line


def _blocks() -> list[tuple[str, str, int, int, str, str | None]]:
    return [
        (str(page.relative_to(ROOT)), *block) for page in _pages() for block in _python_blocks(page)
    ]


BLOCKS = _blocks()
HERE = [b for b in BLOCKS if b[:3] not in ELSEWHERE]


@pytest.mark.parametrize(
    "page,section,k,line,code,reason", HERE, ids=[f"{b[0]}:{b[3]}" for b in HERE]
)
def test_the_block_runs_as_written(page, section, k, line, code, reason, tmp_path, monkeypatch):
    if reason:
        pytest.skip(f"not run: {reason}")
    for name, package in OPTIONAL.items():
        if name in code:
            pytest.importorskip(package, reason=f"{package} is an optional extra")
    monkeypatch.chdir(tmp_path)  # what a block writes goes to a scratch folder
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    start = time.perf_counter()
    try:
        exec(compile(code, f"{page}:{line}", "exec"), {"__name__": "__doc_snippet__"})
    finally:
        torch.set_num_threads(threads)
    assert time.perf_counter() - start < SECONDS


def test_every_block_run_elsewhere_is_there():
    """Each entry of ELSEWHERE names a block that exists and a test that exists."""
    keys = {b[:3] for b in BLOCKS}
    for key, test in ELSEWHERE.items():
        assert key in keys, f"no python block {key}: update ELSEWHERE"
        path, name = test.split("::")
        assert f"def {name}(" in (ROOT / path).read_text(), f"{test} does not exist"


def test_few_blocks_are_not_run():
    """Blocks the suite does not run are the exception, each with its reason."""
    skipped = [f"{b[0]}:{b[3]}: {b[5]}" for b in BLOCKS if b[5]]
    assert len(skipped) <= len(BLOCKS) // 4, "\n".join(skipped)
