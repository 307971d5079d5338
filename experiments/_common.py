"""Shared helpers for the ``experiments/study_*.py`` scripts: where results go, atomic writes,
Markdown/console tables and locating the shared measured data.

Not a library: only the study scripts import it (they add this folder to ``sys.path`` when run
as scripts; the tests import them as ``experiments.study_*``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from frontier.files import write_json_atomic, write_text_atomic  # noqa: F401  (re-exported for the studies)
from measure.replay import shared_data_dir

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as JSON atomically (numpy scalars, operating points... are converted)."""
    return write_json_atomic(path, obj)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table (cells converted with ``str``)."""
    out = ["| " + " | ".join(str(h) for h in headers) + " |",
           "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def rows_table(rows: Sequence[dict[str, Any]], cols: Sequence[str], digits: int = 3) -> str:
    """:func:`markdown_table` of dict rows, columns ``cols``, floats to ``digits`` significant
    digits."""
    def cell(v: Any) -> str:
        return f"{v:.{digits}g}" if isinstance(v, float) else str(v)
    return markdown_table(cols, [[cell(r[k]) for k in cols] for r in rows])


def doc_body(doc: str) -> str:
    """A study script's docstring for its results page: after the first line, up to the
    indented usage lines (``    python experiments/...``)."""
    return doc.split("\n", 1)[1].split("    python")[0].strip()


def console_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A fixed-width plain-text table for the terminal."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def shared_file(relative: str) -> Path | None:
    """``relative`` under the shared data folder (``../shared/data`` or ``$ECAL_SHARED_DATA``),
    or None when it is absent (a user's clone has no ``../shared``)."""
    p = shared_data_dir() / relative
    return p if p.exists() else None


def display_path(p: str | os.PathLike) -> str:
    """A path as the printed text should name it: relative to the repository's parent when
    under it (``shared/data/...``), else as given."""
    p = Path(p).resolve()
    root = Path(__file__).resolve().parents[2]
    try:
        return "../" + str(p.relative_to(root))
    except ValueError:
        return str(p)


def pct(x: float, digits: int = 1) -> str:
    """``x`` (a fraction) as a percentage string."""
    return f"{100.0 * x:.{digits}f} %"
