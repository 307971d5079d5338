"""Output helpers for the CLI: staged, atomic writes (no partial files on error) and tables."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from frontier.io import atomic_write


class Outputs:
    """Collects a command's output files and writes them only when the command has succeeded.

    Each file is written to a temporary name and renamed into place; if any write fails, the
    files already written by this commit are removed, so a failed command leaves nothing.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[Path, Callable[[str], None]]] = []

    def json(self, path: str | Path, obj: Any) -> None:
        """Stage a JSON document."""
        text = json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n"
        self.text(path, text)

    def text(self, path: str | Path, text: str) -> None:
        """Stage a text file."""

        def write(tmp: str) -> None:
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)

        self._pending.append((Path(path), write))

    def custom(self, path: str | Path, write: Callable[[str], None]) -> None:
        """Stage a file produced by ``write(tmp_path)`` (e.g. a library's own saver)."""
        self._pending.append((Path(path), write))

    def figure(self, path: str | Path, fig: Any) -> None:
        """Stage a matplotlib figure (format from the file suffix)."""
        fmt = Path(path).suffix.lstrip(".") or "png"

        def write(tmp: str) -> None:
            fig.savefig(tmp, format=fmt, dpi=130, bbox_inches="tight")

        self._pending.append((Path(path), write))

    def commit(self) -> list[Path]:
        """Write every staged file atomically; on failure remove what this commit wrote."""
        done: list[Path] = []
        try:
            for path, write in self._pending:
                atomic_write(path, write)
                done.append(path)
        except BaseException:
            for p in done:
                p.unlink(missing_ok=True)
            raise
        self._pending.clear()
        return done


def _json_default(o: Any) -> Any:
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def dump_json(obj: Any, file=sys.stdout) -> None:
    """Print machine-readable output."""
    json.dump(obj, file, indent=2, default=_json_default)
    file.write("\n")
