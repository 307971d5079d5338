"""File formats: signature files and composition workbooks (JSON, ``ecal.signatures/1`` and
``ecal.workbook/1``; docs/formats.md).

Every file is a JSON object naming its format (``"format": "ecal.signatures/1"``; files
written before that say ``"schema_version": 1`` and are read as before) with a ``"units"``
block. Its top-level shape is declared once, in :mod:`frontier.format_models`. The units are
fixed (SI, as the field names say) and the block documents them; a file declaring other units
is rejected rather than silently misread::

    "units": {"time": "s", "energy": "J", "power": "W"}

**Signature** (one entry of ``signatures``, keyed by name)::

    {"s_w": 80.0,                    # static (ready) power of its device(s), W
     "time_s": 0.0015,               # T, s
     "energy_j": 0.42,               # E, J   -- or "d_j": dynamic energy (E = s_w·T + d_j)
     "sd_time_s": 1e-5,              # standard error of T (of the *estimate*), s
     "sd_energy_j": 0.004,           # standard error of E, J
                                     #   (or var_time_s2 / var_energy_j2, or run_sd_time_s /
                                     #    run_sd_energy_j = per-run spread, divided by sqrt(n))
     "n": 5, "devices": ["gpu0"], "omega": {"sm_clock_mhz": 1410, "sm_count": 105},
     "kappa": "cuBLAS", "theta": "bf16 8192^3", "meta": {...}}

or raw runs, turned into a signature by :meth:`Signature.from_runs`::

    {"s_w": 123.0, "runs": {"times_s": [...], "energies_j": [...]}}  # per-invocation T and E per run

A signature file is ``{"format": "ecal.signatures/1", "units": ..., "signatures": {name: signature}}``.
Both directions use the one codec, :mod:`frontier.codec`: :func:`save_signatures` writes every
field (a composite's per-leaf sensitivities ``composed``/``terms`` and bias bookkeeping
included, so a composite loaded back still shares error with its leaves), and the reader takes
that as well as every hand-written form above.

**Workbook** (``ecal compose`` / ``ecal check``): a signature file plus an optional
``"defaults"`` object (fields merged under every signature, e.g. ``{"s_w": 80, "devices":
["gpu0"]}``) and ``"compositions"``, a list of ``{"name", "expr", "measured"?, "description"?}``.
An expression is a signature name, the name of an earlier composition, or one object:

* ``{"seq": [e, ...]}`` -- back to back on one device (⊗)
* ``{"par": [e, ...], "offsets_s": [...], "sm_total": 108, "max_method": "clark"}`` -- overlap on
  one device (⊕); options optional
* ``{"par_multi": [e, ...]}`` -- at once on disjoint devices (⊕multi)
* ``{"repeat": e, "times": k}`` -- e ⊗ e ⊗ … k times (one shared measurement: σ grows as k),
  in closed form (:func:`frontier.compose.repeat`); k is a JSON integer, 1 <= k <= 10**12
* ``{"on": "gpu1", "expr": e}`` -- e (which may name an earlier composition) with every leaf
  moved to device(s) ``gpu1`` (a string or a list). The moved leaves keep their identity, so
  their estimation error is shared with the original (the same characterization reused on
  another GPU)
* ``{"idle": {"device": "gpu1", "duration_s": 2e-4, "s_w": 80}}`` -- an idle element
* ``{"dag": {"tasks": {name: e}, "deps": [[a, b], ...], "idle_power_w": {...},
  "offsets_s": {...}}}`` -- see :func:`frontier.dag.dag`

``measured`` is ``{"time_s", "energy_j", "sd_time_s", "sd_energy_j", "n"}`` (standard errors, as
for signatures; or ``run_sd_*`` with ``n``) or ``{"runs": {"times_s": [...], "energies_j":
[...]}}``; an optional ``s_w`` (default: the prediction's, capped at E/T) only splits E into s·T+d.

Every problem raises :class:`FormatError` naming the file, the path inside it (e.g.
``signatures.gemm.time_s``) and the problem. Files are UTF-8 (a BOM is accepted); binary files,
NaN/Infinity literals and numbers that overflow a float are refused. A workbook may evaluate at
most ``MAX_EVALUATIONS`` expression nodes nested at most ``MAX_EXPR_DEPTH`` deep: nothing in
it expands without bound (``repeat`` is closed-form, ``on`` re-evaluates each named
composition once per target).
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from .codec import (
    LEAF_FIELDS,
    _got,
    _int,
    _list,
    _num,
    _obj,
    _runs,
    _sd_pair,
    _unknown,
    number_field,  # noqa: F401  (re-exported: callers import it from here)
    signature_from_dict,
    signature_to_dict,
)
from .compose import MAX_REPEAT, par, par_multi, repeat, seq
from .compose import idle as idle_element
from .deviation import DeviationResult, critical_value, deviation
from .errors import EnergyCalculusError, FormatError, InputError, UnknownNameError
from .formats import KINDS, SI_UNITS, check_units, content, validate
from .operating_point import OperatingPoint
from .signature import Signature
from .units import energy_unit, pm, time_unit

#: The ``schema_version`` of signature files and workbooks before ``"format"`` (still read).
SCHEMA_VERSION = 1
#: The units every file of this project is in (one declaration: frontier.formats.SI_UNITS).
UNITS = SI_UNITS


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


def _finite_json(o: Any) -> Any:
    # JSON has no NaN/Infinity: write them as null rather than produce an unreadable file.
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, Mapping):
        return {str(k): _finite_json(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite_json(v) for v in o]
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
    text = json.dumps(_finite_json(json.loads(json.dumps(obj, default=_default))), indent=2,
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


# -- file header ------------------------------------------------------------------------------

#: Kinds whose files a signature reader takes: a workbook may start as a signature file, a
#: signature file is a workbook without compositions, a store export is a signature file with
#: its ``store`` block.
SIGNATURE_KINDS = ("signatures", "workbook", "store-export")


def _kind_of(doc: Any) -> str:
    """Which of :data:`SIGNATURE_KINDS` ``doc`` names (``"workbook"`` for an older file, which
    does not say; ``"signatures"`` for anything else, which :func:`check_format` then refuses)."""
    tag = doc.get("format") if isinstance(doc, Mapping) else None
    if isinstance(tag, str):
        return next((k for k in SIGNATURE_KINDS if tag.startswith(f"ecal.{k}/")), "signatures")
    return "workbook" if isinstance(doc, Mapping) and "schema_version" in doc else "signatures"


def _check_header(file: str, doc: Any) -> dict:
    """``doc``'s identity (current or older form), top-level shape (its kind's model) and
    units checked; returns it without its identity keys."""
    from . import format_models

    kind = _kind_of(doc)
    _, body = content(file, doc, kind)
    check_units(file, body.get("units"))
    model = {"signatures": format_models.SignaturesFile, "workbook": format_models.WorkbookFile,
             "store-export": format_models.StoreExportFile}[kind]
    validate(model, body, file)
    return body


# -- signatures -----------------------------------------------------------------------------------

#: Fields a workbook's ``defaults`` may set under every signature.
_DEFAULT_FIELDS = LEAF_FIELDS - {"name", "runs", "time_s", "energy_j", "d_j"}


def _parse_signatures(file: str, doc: Mapping, key: str = "signatures") -> dict[str, Signature]:
    sigs = _obj(file, key, doc.get(key, {}))
    defaults = _obj(file, "defaults", doc.get("defaults", {}))
    _unknown(file, "defaults", defaults, _DEFAULT_FIELDS)
    out: dict[str, Signature] = {}
    for nm, body in sigs.items():
        merged = {**defaults, **_obj(file, f"{key}.{nm}", body)}
        out[nm] = signature_from_dict(merged, file, f"{key}.{nm}", name=nm)
    return out


def signatures_doc(sigs: Mapping[str, Signature] | Iterable[Signature],
                   extra: Mapping[str, Any] | None = None, kind: str = "signatures",
                   file: str = "<signatures>") -> dict[str, Any]:
    """The JSON document of a signature file (``"format": "ecal.signatures/1"``, or ``kind``
    ``"store-export"``). A mapping's keys are the names. ``extra``: the informational blocks
    its model declares (``meta``, ``description``; a store export's ``store``). Errors name
    ``file``."""
    if isinstance(sigs, Mapping):
        items = list(sigs.items())
    else:
        items = [(s.name, s) for s in sigs]
    seen: set[str] = set()
    for k, s in items:
        if not isinstance(s, Signature):
            raise FormatError(file, f"signatures.{k}", f"is a {type(s).__name__}, not a Signature")
        if k in seen:
            raise FormatError(file, f"signatures.{k}", "two signatures have this name")
        seen.add(k)
    doc = {"format": KINDS[kind].tag, "units": dict(UNITS),
           "signatures": {k: signature_to_dict(s) for k, s in items}}
    for k, v in (extra or {}).items():
        if k in doc:
            raise InputError(f"extra block {k!r} would replace the file's own")
        doc[k] = v
    return doc


def save_signatures(path: str | os.PathLike, sigs: Mapping[str, Signature] | Iterable[Signature],
                    extra: Mapping[str, Any] | None = None, kind: str = "signatures") -> Path:
    """Write :func:`signatures_doc` of ``sigs`` to ``path`` (atomically)."""
    return write_json_atomic(path, signatures_doc(sigs, extra, kind, str(path)))


def load_signatures(path: str | os.PathLike) -> dict[str, Signature]:
    """Read a signature file (or the ``signatures`` of a workbook) into name → Signature."""
    file = str(path)
    doc = _check_header(file, read_json(file))
    if "signatures" not in doc:
        raise FormatError(file, "signatures", "missing")
    return _parse_signatures(file, doc)


# -- expressions ------------------------------------------------------------------------------------

_OPS = {"seq", "par", "par_multi", "repeat", "on", "idle", "dag"}
_OP_OPTIONS = {"seq": {"name"}, "par": {"name", "offsets_s", "sm_total", "max_method"},
               "par_multi": {"name", "max_method"}, "repeat": {"name", "times"},
               "on": {"expr"}, "idle": set(), "dag": {"name"}}


def _moved(sig: Signature, devices: frozenset[str]) -> Signature:
    # Same leaf (same terms/identity of its error), other device: dataclasses.replace keeps
    # every field, including the per-leaf sensitivities.
    return dataclasses.replace(sig, devices=devices)


#: Most expression nodes one workbook may evaluate (``on`` re-evaluates a named composition
#: with its leaves moved; memoized, but a file could still ask for more work than it is long).
MAX_EVALUATIONS = 1_000_000
#: Deepest nesting of expressions.
MAX_EXPR_DEPTH = 100


@dataclass
class _Env:
    file: str
    sigs: Mapping[str, Signature]
    comps: dict[str, Signature] = field(default_factory=dict)
    exprs: dict[str, Any] = field(default_factory=dict)
    # (composition name, devices) -> that composition re-evaluated with its leaves moved.
    moved: dict[tuple[str, frozenset[str]], Signature] = field(default_factory=dict)
    evaluations: int = 0
    depth: int = 0


def _eval(env: _Env, expr: Any, path: str, place: frozenset[str] | None) -> Signature:
    """Evaluate one expression node within the workbook's limits on work and depth."""
    env.evaluations += 1
    if env.evaluations > MAX_EVALUATIONS:
        raise FormatError(env.file, path, f"the workbook expands to more than {MAX_EVALUATIONS} "
                                          "expression evaluations; use repeat for k-fold repeats "
                                          "and name shared sub-expressions once")
    if env.depth >= MAX_EXPR_DEPTH:
        raise FormatError(env.file, path, f"expressions (with the compositions they name) nest "
                                          f"deeper than {MAX_EXPR_DEPTH} levels")
    env.depth += 1
    try:
        return _eval_node(env, expr, path, place)
    finally:
        env.depth -= 1


def _eval_node(env: _Env, expr: Any, path: str, place: frozenset[str] | None) -> Signature:
    f = env.file
    if isinstance(expr, str):
        if expr in env.sigs:
            sig = env.sigs[expr]
            return _moved(sig, place) if place is not None else sig
        if expr in env.comps:
            if place is not None:
                # Re-evaluate the composition's expression with its leaves moved (once per
                # target: without the memo, nested moves re-evaluate exponentially often).
                memo = (expr, place)
                if memo not in env.moved:
                    sig = _eval(env, env.exprs[expr], path, place)
                    # Named like the original (as parse_workbook names it), so names of nested
                    # moves do not grow with every level.
                    env.moved[memo] = dataclasses.replace(sig, name=expr) if sig.composed else sig
                return env.moved[memo]
            return env.comps[expr]
        known = sorted(env.sigs) + sorted(env.comps)
        raise FormatError(f, path, f"unknown element {expr!r} (known: {', '.join(known[:20])}"
                                   f"{', ...' if len(known) > 20 else ''})")
    expr = _obj(f, path, expr)
    ops = [k for k in expr if k in _OPS]
    if len(ops) != 1:
        raise FormatError(f, path, f"must have exactly one operator of {', '.join(sorted(_OPS))}; got keys {sorted(expr)}")
    op = ops[0]
    _unknown(f, path, expr, {op} | _OP_OPTIONS[op])
    p = f"{path}.{op}"
    name = expr.get("name")
    if name is not None and not isinstance(name, str):
        raise FormatError(f, f"{path}.name", f"must be a string, got {_got(name)}")
    try:
        if op in ("seq", "par", "par_multi"):
            kids = [_eval(env, e, f"{p}[{i}]", place) for i, e in enumerate(_list(f, p, expr[op]))]
            if op == "seq":
                return seq(kids, name=name)
            if op == "par_multi":
                return par_multi(kids, name=name, max_method=expr.get("max_method", "dominant"))
            kw: dict[str, Any] = {"max_method": expr.get("max_method", "dominant")}
            if "offsets_s" in expr:
                offs = _list(f, f"{path}.offsets_s", expr["offsets_s"])
                kw["offsets_s"] = [_num(f, f"{path}.offsets_s[{i}]", v) for i, v in enumerate(offs)]
            if "sm_total" in expr:
                kw["sm_total"] = _int(f, f"{path}.sm_total", expr["sm_total"])
            return par(kids, name=name, **kw)
        if op == "repeat":
            if "times" not in expr:
                raise FormatError(f, f"{path}.times", "missing (how many repeats)")
            k = _int(f, f"{path}.times", expr["times"], maximum=MAX_REPEAT, integral_float=False)
            base = _eval(env, expr[op], p, place)
            return repeat(base, k, name=name or f"{base.name}x{k}")   # closed form, no expansion
        if op == "on":
            if "expr" not in expr:
                raise FormatError(f, f"{path}.expr", "missing (the expression to move)")
            devs = expr[op]
            devs = [devs] if isinstance(devs, str) else _list(f, p, devs)
            if not all(isinstance(x, str) and x for x in devs):
                raise FormatError(f, p, f"must be a device name or list of names, got {_got(expr[op])}")
            return _eval(env, expr["expr"], f"{path}.expr", frozenset(devs))
        if op == "idle":
            body = _obj(f, p, expr[op])
            _unknown(f, p, body, ("device", "duration_s", "s_w", "name"))
            for k in ("device", "duration_s", "s_w"):
                if k not in body:
                    raise FormatError(f, f"{p}.{k}", "missing")
            dev = str(body["device"])
            if place is not None and len(place) == 1:
                dev = next(iter(place))   # an idle element moves with the expression around it
            return idle_element(dev, _num(f, f"{p}.duration_s", body["duration_s"]),
                                _num(f, f"{p}.s_w", body["s_w"]), name=body.get("name"))
        return _eval_dag(env, expr, p, place, name)
    except FormatError:
        raise
    except EnergyCalculusError as exc:
        raise FormatError(f, path, str(exc)) from None


def _eval_dag(env: _Env, expr: Mapping, p: str, place, name) -> Signature:
    from .dag import dag

    f = env.file
    body = _obj(f, p, expr["dag"])
    _unknown(f, p, body, ("tasks", "deps", "idle_power_w", "offsets_s"))
    tasks_d = _obj(f, f"{p}.tasks", body.get("tasks"))
    if not tasks_d:
        raise FormatError(f, f"{p}.tasks", "must name at least one task")
    tasks = {k: _eval(env, e, f"{p}.tasks.{k}", place) for k, e in tasks_d.items()}
    deps = []
    for i, edge in enumerate(_list(f, f"{p}.deps", body.get("deps", []), nonempty=False)):
        if not (isinstance(edge, list) and len(edge) == 2 and all(isinstance(x, str) for x in edge)):
            raise FormatError(f, f"{p}.deps[{i}]", f"must be [before, after] task names, got {_got(edge)}")
        deps.append((edge[0], edge[1]))
    idle_w = {k: _num(f, f"{p}.idle_power_w.{k}", v)
              for k, v in _obj(f, f"{p}.idle_power_w", body.get("idle_power_w", {})).items()}
    offs = {k: _num(f, f"{p}.offsets_s.{k}", v)
            for k, v in _obj(f, f"{p}.offsets_s", body.get("offsets_s", {})).items()}
    return dag(tasks, deps, idle_power_w=idle_w or None, offsets_s=offs or None, name=name)


def _measured(file: str, path: str, d: Any, predicted: Signature, name: str) -> Signature:
    d = _obj(file, path, d)
    _unknown(file, path, d, {"time_s", "energy_j", "sd_time_s", "sd_energy_j", "var_time_s2",
                             "var_energy_j2", "run_sd_time_s", "run_sd_energy_j", "n", "runs", "s_w"})
    nm = f"{name} (measured)"
    try:
        if "runs" in d:
            t, e = _runs(file, f"{path}.runs", d["runs"])
            mean_t, mean_e = float(np.mean(t)), float(np.mean(e))
            s = _measured_s(file, path, d, predicted, mean_t, mean_e)
            return Signature.from_runs(nm, t, e, s_w=s, devices=predicted.devices)
        for k in ("time_s", "energy_j"):
            if k not in d:
                raise FormatError(file, f"{path}.{k}", "missing")
        t = _num(file, f"{path}.time_s", d["time_s"])
        e = _num(file, f"{path}.energy_j", d["energy_j"])
        n = _int(file, f"{path}.n", d.get("n", 1))
        s = _measured_s(file, path, d, predicted, t, e)
        return Signature(nm, s_w=s, time_s=t, d_j=max(e - s * t, 0.0),
                         var_time_s2=_sd_pair(file, path, d, "time", "s", n),
                         var_energy_j2=_sd_pair(file, path, d, "energy", "j", n), n=n,
                         devices=predicted.devices, meta={"source": "measured"})
    except FormatError:
        raise
    except EnergyCalculusError as exc:
        raise FormatError(file, path, str(exc)) from None


def _measured_s(file: str, path: str, d: Mapping, predicted: Signature, t: float, e: float) -> float:
    # s only splits E into s·T + d; keep d >= 0 so the measured signature is valid.
    s = _num(file, f"{path}.s_w", d["s_w"]) if "s_w" in d else predicted.s_w
    return min(s, e / t) if t > 0 else s


# -- workbooks ----------------------------------------------------------------------------------------

def _fmt_t(t: float, sd: float | None = None, unit: tuple[float, str] | None = None) -> str:
    scale, name = unit or time_unit([t])
    return f"{pm(t, sd, scale)} {name}"


def _fmt_e(e: float, sd: float | None = None, unit: tuple[float, str] | None = None) -> str:
    scale, name = unit or energy_unit([e])
    return f"{pm(e, sd, scale)} {name}"


@dataclass(frozen=True)
class CompositionEntry:
    """One composition of a workbook: its expression, the predicted composite and, when the
    file has one, the direct measurement of the same composite."""

    name: str
    expr: Any
    predicted: Signature
    measured: Signature | None = None
    description: str | None = None

    def deviation(self, alpha: float = 0.05, bias_aware: bool = False, n_tests: int = 1) -> DeviationResult | None:
        """Eq. 23 of the measurement against the prediction (None without a measurement)."""
        if self.measured is None:
            return None
        return deviation(self.predicted, self.measured, alpha, bias_aware, n_tests, name=self.name)

    def summary(self, alpha: float = 0.05, t_unit: tuple[float, str] | None = None,
                e_unit: tuple[float, str] | None = None) -> str:
        """One line: predicted T and E with σ and the Eq. 13 bias bound (``t_unit``/``e_unit``:
        (scale, name) from :mod:`frontier.units`, so that every line of a table shares them)."""
        p = self.predicted
        b = p.bias_bound_j(critical_value(alpha))
        e_unit = e_unit or energy_unit([p.energy_j, b])
        return (f"{self.name}: T = {_fmt_t(p.time_s, p.sd_time_s, t_unit)}  "
                f"E = {_fmt_e(p.energy_j, p.sd_energy_j, e_unit)}"
                f"  bias bound {_fmt_e(b, None, e_unit)} (c_a={critical_value(alpha):.3g})")

    def to_dict(self, alpha: float = 0.05) -> dict[str, Any]:
        """JSON-ready dict: predicted values, σ, bias bound at c_α, measured values if any."""
        p = self.predicted
        c = critical_value(alpha)
        d: dict[str, Any] = {
            "name": self.name, "expr": self.expr,
            "predicted": {"time_s": p.time_s, "energy_j": p.energy_j, "sd_time_s": p.sd_time_s,
                          "sd_energy_j": p.sd_energy_j, "s_w": p.s_w, "d_j": p.d_j,
                          "bias_bound_j": p.bias_bound_j(c), "c_alpha": c,
                          "devices": sorted(p.devices)},
        }
        if self.description:
            d["description"] = self.description
        if self.measured is not None:
            m = self.measured
            d["measured"] = {"time_s": m.time_s, "energy_j": m.energy_j, "sd_time_s": m.sd_time_s,
                             "sd_energy_j": m.sd_energy_j, "n": m.n}
        return d


@dataclass(frozen=True)
class Workbook:
    """A parsed workbook: its signatures and its compositions, evaluated."""

    file: str
    signatures: Mapping[str, Signature]
    entries: tuple[CompositionEntry, ...]
    description: str | None = None

    def __getitem__(self, name: str) -> CompositionEntry:
        for e in self.entries:
            if e.name == name:
                return e
        raise UnknownNameError(f"{self.file}: no composition named {name!r}")

    def check(self, alpha: float = 0.05, bias_aware: bool = False, n_tests: int = 1) -> list[DeviationResult]:
        """Eq. 23 for every composition that has a measurement, in file order."""
        return [r for e in self.entries
                if (r := e.deviation(alpha, bias_aware, n_tests)) is not None]

    def summary_lines(self, alpha: float = 0.05) -> list[str]:
        """One line per composition (predicted T, E ± σ, bias bound): what ``ecal compose`` prints."""
        c = critical_value(alpha)
        t_unit = time_unit(e.predicted.time_s for e in self.entries)
        e_unit = energy_unit([x for e in self.entries
                              for x in (e.predicted.energy_j, e.predicted.bias_bound_j(c))])
        return [e.summary(alpha, t_unit, e_unit) for e in self.entries]

    def to_dict(self, alpha: float = 0.05, bias_aware: bool = False, n_tests: int = 1) -> dict[str, Any]:
        """JSON-ready dict of every composition (prediction, measurement, deviation)."""
        out = []
        for e in self.entries:
            d = e.to_dict(alpha)
            r = e.deviation(alpha, bias_aware, n_tests)
            if r is not None:
                d["deviation"] = r.to_dict()
            out.append(d)
        return {"file": self.file, "units": dict(UNITS), "compositions": out}


def parse_workbook(doc: Any, file: str = "<workbook>",
                   compositions: Sequence[Mapping[str, Any]] = ()) -> Workbook:
    """Build a :class:`Workbook` from an already-parsed JSON document (``ecal.workbook/1``, a
    signature file, or an older ``schema_version`` 1 file). ``compositions`` (``{name, expr}``
    objects, as in a workbook) are evaluated after the file's own: a signature file, which
    has none, can be composed as it is (``ecal compose --expr``)."""
    doc = _check_header(file, doc)
    sigs = _parse_signatures(file, doc)
    env = _Env(file, sigs)
    entries = []
    own = _list(file, "compositions", doc.get("compositions", []), nonempty=False)
    for i, c in enumerate([*own, *compositions]):
        path = f"compositions[{i}]"
        c = _obj(file, path, c)
        _unknown(file, path, c, ("name", "expr", "measured", "description"))
        nm = c.get("name")
        if not isinstance(nm, str) or not nm:
            raise FormatError(file, f"{path}.name", f"must be a non-empty string, got {_got(nm)}")
        if nm in sigs or nm in env.comps:
            raise FormatError(file, f"{path}.name", f"{nm!r} is already the name of a signature or composition")
        if "expr" not in c:
            raise FormatError(file, f"{path}.expr", "missing")
        pred = _eval(env, c["expr"], f"{path}.expr", None)
        pred = dataclasses.replace(pred, name=nm) if pred.composed else pred
        meas = _measured(file, f"{path}.measured", c["measured"], pred, nm) if "measured" in c else None
        env.comps[nm] = pred
        env.exprs[nm] = c["expr"]
        entries.append(CompositionEntry(nm, c["expr"], pred, meas, c.get("description")))
    desc = doc.get("description")
    return Workbook(file, MappingProxyType(sigs), tuple(entries), desc if isinstance(desc, str) else None)


def load_workbook(path: str | os.PathLike,
                  compositions: Sequence[Mapping[str, Any]] = ()) -> Workbook:
    """Read and evaluate a workbook file (format in the module docstring), with
    ``compositions`` evaluated after its own (see :func:`parse_workbook`)."""
    return parse_workbook(read_json(path), str(path), compositions)
