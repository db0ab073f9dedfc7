"""How the benchmarks write what they measured: ``mean ± sd`` cells, markdown tables, figures.

``mean_sd`` formats a column of per-seed values (``percent``: fractions, in percent);
``markdown_table`` / ``markdown_row`` write the tables of the ``.md`` reports and
``read_markdown_table`` reads one back (a figure re-drawn from its table: ``--replot``); ``subplots``
and ``save_figure`` make and save a matplotlib figure on the Agg backend (no display needed).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


def mean_and_sd(values: Iterable[float | None], scale: float = 1.0) -> tuple[float, float] | None:
    """Mean and sample sd of the values that are not ``None``, times ``scale`` (``None`` if there
    are none; sd 0 for one)."""
    xs = [v * scale for v in values if v is not None]
    if not xs:
        return None
    return statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


def mean_sd(values: Iterable[float | None], fmt: str = ".3f", scale: float = 1.0) -> str:
    """``"mean ± sd"`` of the values that are not ``None`` (``n/a`` if none; sd 0 for one)."""
    stats = mean_and_sd(values, scale)
    if stats is None:
        return "n/a"
    return f"{stats[0]:{fmt}} ± {stats[1]:{fmt}}"


def percent(values: list[float | None]) -> str:
    """``mean ± sd`` of fractions in percent, two decimals (``n/a`` if there are none)."""
    return mean_sd(values, ".2f", 100.0)


def markdown_row(cells: Sequence[str]) -> str:
    """One row of a markdown table: ``| a | b |``."""
    return "| " + " | ".join(cells) + " |"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A markdown table: the header, the rule ``|---|---|`` and the rows (no trailing newline)."""
    lines = [markdown_row(header), "|" + "---|" * len(header)]
    return "\n".join([*lines, *(markdown_row(r) for r in rows)])


def read_markdown_table(path: Path, index: int = 0) -> list[dict[str, str]]:
    """The rows of the ``index``-th markdown table of ``path`` (as ``markdown_table`` writes one),
    each a dict from the header's names to the row's cells (stripped; ``**bold**`` unmarked)."""
    tables: list[list[list[str]]] = []
    previous = ""
    for line in Path(path).read_text().splitlines():
        if line.startswith("|"):
            if not previous.startswith("|"):
                tables.append([])
            cells = [c.strip().strip("*").strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= {"-"} for c in cells):  # (not the rule |---|)
                tables[-1].append(cells)
        previous = line
    header, *rows = tables[index]
    return [dict(zip(header, row, strict=True)) for row in rows]


def subplots(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """``matplotlib.pyplot.subplots(*args, **kwargs)`` on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def save_figure(
    fig: Any,
    path: Path,
    *,
    dpi: int = 90,
    rect: tuple[float, float, float, float] | None = None,
    crop: bool = False,
) -> None:
    """Lay the figure out (``tight_layout(rect=rect)``; with ``crop``, the saved bounding box is
    cropped to the drawing instead), save it to ``path`` and close it."""
    import matplotlib.pyplot as plt

    if crop:
        fig.savefig(path, dpi=dpi, bbox_inches="tight")
    else:
        fig.tight_layout(rect=rect)
        fig.savefig(path, dpi=dpi)
    plt.close(fig)
