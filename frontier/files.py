"""Files on disk, safely: the strict JSON and CSV readers every format's reader starts from, and
atomic writes that never leave a half-written file or follow another user's link.

Reading: :func:`read_json` refuses NaN/Infinity literals, numbers that overflow a float,
duplicate keys, nesting deeper than :data:`MAX_JSON_DEPTH` and binary files, naming the file
and the place; :func:`read_csv` / :func:`csv_number` do the same for CSV rows. Writing:
:func:`atomic_write` writes a temporary file in the target's folder, fsyncs it and renames it
over the target (so a crash leaves the old file or the new one), after
:func:`check_own_path` has refused paths through links or folders another user could swap.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import math
import os
import stat
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import EnergyCalculusError, FormatError
from .operating_point import OperatingPoint

# -- JSON files ---------------------------------------------------------------------------------

def _default(o: Any) -> Any:
    if isinstance(o, Mapping):
        return dict(o)
    if isinstance(o, (set, frozenset, tuple)):
        return sorted(o) if isinstance(o, (set, frozenset)) else list(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, OperatingPoint):
        return o.to_dict()
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return o.to_dict() if hasattr(o, "to_dict") else dataclasses.asdict(o)
    raise TypeError(f"cannot write a {type(o).__name__} to JSON")


def finite_json(o: Any) -> Any:
    """``o`` (parsed-JSON-like: dicts, lists, scalars) with every NaN/inf float as ``None``: JSON
    has no NaN/Infinity, and a file holding them is one no strict reader takes back."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, Mapping):
        return {str(k): finite_json(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [finite_json(v) for v in o]
    return o


def file_mode() -> int:
    """Permissions of a newly created regular file under the current umask (e.g. 0o644)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def fsync_dir(folder: str | os.PathLike) -> None:
    """Make renames and new files in ``folder`` durable. Best effort: some systems cannot open
    a folder or refuse to fsync one, and a rename is atomic either way."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class UnsafePathError(EnergyCalculusError):
    """Writing a path would follow a symlink another user owns, or write through a symlink
    into a file another user owns (see :func:`check_own_path`). One line naming the path;
    ``path`` (as given) and ``problem`` (the rest of the line)."""

    def __init__(self, path: str, problem: str):
        self.path, self.problem = str(path), problem
        super().__init__(f"{path}: {problem}")


#: Most symlinks followed while resolving one path (as the kernel's ELOOP limit).
_MAX_LINKS = 40


def check_own_path(path: str | os.PathLike, *, through_last: bool = True) -> str:
    """The real path a write to ``path`` lands on, after checking that no one else chose it.

    The path is resolved one component at a time. Every symlink met on the way must be owned
    by the caller (effective uid) or by root (system links such as ``/var/run``): a link
    another user owns may have been planted to send the caller's (e.g. root's) output into a
    file of the planter's choice, so it is refused. With ``through_last`` (a writer that opens
    the path and writes into the file it names: ``-o`` through a link, a results log), a final
    symlink is followed and, when its target exists, the target must be owned by the caller
    too. Without it (a writer that renames a temp file onto ``path``, which replaces a final
    link as a directory entry and never writes through it) the final component is not
    followed. Raises :class:`UnsafePathError` naming ``path``; a missing component ends the
    walk (what is created there is created by the caller)."""
    me = os.geteuid() if hasattr(os, "geteuid") else None
    given = os.fspath(path)
    full = given if os.path.isabs(given) else os.path.join(os.getcwd(), given)
    todo = list(reversed(Path(full).parts))        # ".." kept: resolved against real folders
    cur, hops, via_link = "", 0, False        # via_link: the last component was a link
    while todo:
        part = todo.pop()
        if not cur:
            cur = part                 # the root ("/")
            continue
        if part in ("", "."):
            continue
        if part == "..":
            cur = os.path.dirname(cur) or cur
            continue
        nxt = os.path.join(cur, part)
        final = not todo
        try:
            st = os.lstat(nxt)
        except OSError:
            return os.path.join(nxt, *reversed(todo))     # the rest does not exist yet
        if not stat.S_ISLNK(st.st_mode) or (final and not through_last):
            cur = nxt
            continue
        if me is not None and st.st_uid not in (me, 0):
            raise UnsafePathError(given, f"{nxt} is a symlink owned by another user (uid "
                                         f"{st.st_uid}); refusing to write through it (remove "
                                         "it, or give the path it points to)")
        hops += 1
        if hops > _MAX_LINKS:
            raise UnsafePathError(given, "too many levels of symlinks")
        via_link = via_link or final   # within a final link's target it stays set
        target = os.readlink(nxt)
        if os.path.isabs(target):
            cur = ""                   # restart at the root the target names
        todo.extend(reversed(Path(target).parts))
    if through_last and via_link and me is not None:
        try:
            st = os.stat(cur)
        except OSError:
            return cur
        if st.st_uid != me:
            raise UnsafePathError(given, f"is a symlink to {cur}, a file owned by another user "
                                         f"(uid {st.st_uid}); refusing to write through it")
    return cur


def _naming(exc: OSError, path: str | os.PathLike) -> OSError:
    """``exc`` restated about ``path`` when it names no file or the temp file of ``path``
    (a full disk during a write names none; mkstemp and the rename name the temp): the
    one-line error then names the file the user asked for. An error that names another file
    (a folder that could not be created) is kept as it is."""
    p = Path(path)
    names = [n for n in (exc.filename, exc.filename2) if n is not None]
    temp = f".{p.name}.tmp."
    if not names or any(os.path.basename(os.fspath(n)).startswith(temp) for n in names):
        return OSError(exc.errno, exc.strerror or str(exc), os.fspath(path))
    return exc


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """Create ``path`` atomically: ``write(tmp)`` fills a temp file in the same folder (with the
    same suffix, so writers that infer a format from it work), which is fsynced and renamed into
    place; a reader never sees a partial file and a failure leaves the old one untouched.

    The rename replaces ``path`` as a directory entry: a symlink there is replaced by the new
    file, never written through. A folder on the way that is a symlink another user owns is
    refused (:func:`check_own_path`). An :class:`OSError` (a full disk, a read-only file
    system, permission denied) names ``path``, never the temp file."""
    p = Path(path)
    check_own_path(p, through_last=False)
    tmp = ""
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.tmp.", suffix=p.suffix, dir=p.parent)
        os.close(fd)
        os.chmod(tmp, file_mode())   # mkstemp makes 0600; give the file the usual permissions
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException as exc:
        if tmp and os.path.lexists(tmp):
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if isinstance(exc, OSError):
            named = _naming(exc, p)
            if named is not exc:
                raise named from exc
        raise
    return p


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (see :func:`atomic_write`)."""

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)

    return atomic_write(path, write)


def write_json_atomic(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as JSON to ``path`` atomically (see :func:`atomic_write`); numpy values,
    operating points and anything with ``to_dict`` are converted, NaN/inf are refused."""
    text = json.dumps(finite_json(json.loads(json.dumps(obj, default=_default))), indent=2,
                      allow_nan=False) + "\n"
    return write_text_atomic(path, text)


#: Largest |integer| a JSON number field may hold: beyond it float() overflows to inf.
_FLOAT_MAX = float(np.finfo(float).max)
#: Deepest nesting of a JSON document (beyond it the parser and the evaluator would recurse
#: past Python's stack).
MAX_JSON_DEPTH = 200


class _BadNumber:
    """A JSON number this reader refuses (NaN/Infinity literal, or one that overflows a float);
    kept as a placeholder while parsing so the error can name the field it sits in."""

    def __init__(self, text: str, why: str):
        self.text, self.why = text, why


def _parse_int(text: str) -> Any:
    # Digit count first: int() of a huge literal is slow (and limited to 4300 digits).
    if len(text.lstrip("-")) > 309:
        return _BadNumber(text, "overflows a 64-bit float")
    v = int(text)
    return v if abs(v) <= _FLOAT_MAX else _BadNumber(text, "overflows a 64-bit float")


def _parse_float(text: str) -> Any:
    v = float(text)
    return v if math.isfinite(v) else _BadNumber(text, "overflows a 64-bit float")


def _parse_constant(text: str) -> Any:
    return _BadNumber(text, "is not a number JSON allows (NaN/Infinity)")


def _check_numbers(file: str, doc: Any) -> None:
    """Raise FormatError at the first refused number, naming its path; also bound the depth."""
    stack: list[tuple[Any, str, int]] = [(doc, "", 0)]
    while stack:
        v, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise FormatError(file, path or "(top level)", f"nested deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(v, _BadNumber):
            shown = v.text if len(v.text) <= 24 else f"{v.text[:12]}...({len(v.text)} characters)"
            raise FormatError(file, path or "(top level)", f"number {shown} {v.why}")
        if isinstance(v, dict):
            items = [(f"{path}.{k}" if path else str(k), x) for k, x in v.items()]
        elif isinstance(v, list):
            items = [(f"{path}[{i}]", x) for i, x in enumerate(v)]
        else:
            continue
        stack.extend((x, p, depth + 1) for p, x in reversed(items))


def read_text(path: str | os.PathLike, what: str = "text") -> str:
    """A file's text, UTF-8 with or without a BOM. A missing/unreadable file, a binary file or
    one that is not UTF-8 is a one-line :class:`FormatError` naming it."""
    p = str(path)
    try:
        with open(p, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise FormatError(p, "(file)", f"cannot read: {exc.strerror or exc}") from None
    if b"\x00" in raw:
        raise FormatError(p, "(file)", f"is a binary file (NUL byte at offset {raw.index(0)}), "
                                       f"not {what}")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise FormatError(p, "(file)", f"not UTF-8 {what} ({exc.reason} at byte {exc.start}, "
                                       f"line {line})") from None


class _DuplicateKey(Exception):
    """A JSON object names one key twice (args[0]: the key)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k[:80])
        out[k] = v
    return out


def read_json(path: str | os.PathLike) -> Any:
    """Parse a JSON file; errors are :class:`FormatError`: invalid JSON names line and column,
    a NaN/Infinity literal or a number that overflows a float names its field; a UTF-8 BOM is
    accepted; binary or non-UTF-8 files are refused; a key given twice in one object is
    refused (naming the key), never silently overwritten."""
    p = str(path)
    text = read_text(p, "JSON text")
    try:
        doc = json.loads(text, parse_int=_parse_int, parse_float=_parse_float,
                         parse_constant=_parse_constant, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise FormatError(p, str(exc.args[0]), "given twice in one object (the later one "
                                               "would silently win)") from None
    except json.JSONDecodeError as exc:
        raise FormatError(p, f"line {exc.lineno} column {exc.colno}", f"invalid JSON: {exc.msg}") from None
    except RecursionError:
        raise FormatError(p, "(file)", f"JSON nested too deeply (limit {MAX_JSON_DEPTH})") from None
    _check_numbers(p, doc)
    return doc


# -- CSV files ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class CsvRow:
    """One data row of a CSV file: its (first) line number and its cells by column name."""

    line: int
    cells: Mapping[str, str]

    def __getitem__(self, col: str) -> str:
        return self.cells[col]


def read_csv(path: str | os.PathLike, required: Iterable[str]) -> tuple[list[str], list[CsvRow]]:
    """(header, rows) of a CSV file with a header line. Accepts a UTF-8 BOM; a binary or
    non-UTF-8 file, a malformed line, a repeated or missing column, or a row with more cells
    than the header is a :class:`FormatError` naming the file and line."""
    file = str(path)
    text = read_text(file, "CSV text")
    rd = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [c.strip() for c in next(rd, [])]
        dup = sorted({c for c in header if header.count(c) > 1 and c})
        if dup:
            raise FormatError(file, "header", f"column {dup[0]!r} appears more than once")
        missing = [c for c in required if c not in header]
        if missing:
            raise FormatError(file, "header", f"missing column(s) {missing}")
        rows = []
        start = rd.line_num + 1
        for cells in rd:
            if cells and any(c.strip() for c in cells):
                if len(cells) > len(header):
                    raise FormatError(file, f"line {start}", f"{len(cells)} cells but the header "
                                                             f"has {len(header)} columns")
                rows.append(CsvRow(start, dict(zip(header, cells))))
            start = rd.line_num + 1
    except csv.Error as exc:
        raise FormatError(file, f"line {rd.line_num}", f"malformed CSV: {exc}") from None
    return header, rows


def csv_number(file: str, row: CsvRow, col: str, minimum: float | None = 0.0,
               strict: bool = True) -> float:
    """The finite number in ``row[col]``; must be > ``minimum`` (``strict``) or >= it. Errors
    name the file, line and column."""
    text = row.cells.get(col)
    try:
        v = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise FormatError(file, f"line {row.line}, column {col}", f"not a number: {text!r}") from None
    if not math.isfinite(v):
        raise FormatError(file, f"line {row.line}, column {col}", f"must be a finite number, got {text!r}")
    if minimum is not None and (v <= minimum if strict else v < minimum):
        rel = ">" if strict else ">="
        raise FormatError(file, f"line {row.line}, column {col}", f"must be {rel} {minimum:g}, got {text!r}")
    return v


def check_unique_rows(file: str, keyed: Iterable[tuple[CsvRow, Any, str]], what: str = "key") -> None:
    """Refuse two rows with one key. ``keyed`` holds (row, key, key as text) triples; the
    error names both lines, the key, and whether the rows are identical or conflict."""
    seen: dict[Any, CsvRow] = {}
    for row, key, label in keyed:
        first = seen.setdefault(key, row)
        if first is not row:
            same = "identical" if dict(first.cells) == dict(row.cells) else "with other values"
            raise FormatError(file, f"line {row.line}",
                              f"duplicate row: {label} is already at line {first.line} ({same}); "
                              f"give one row per {what}")


