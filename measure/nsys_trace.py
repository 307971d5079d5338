"""Nsight Systems' SQLite export → a :class:`measure.trace_model.Trace`.

``nsys profile --trace=cuda,nvtx -o report python train.py`` then ``nsys export --type sqlite
report.nsys-rep`` writes ``report.sqlite``. What is read (times there are integer nanoseconds):

* **Kernels**: the rows of ``CUPTI_ACTIVITY_KIND_KERNEL`` (name: ``demangledName``, else
  ``shortName``, both ids into ``StringIds``; identity: ``gridX..Z`` and ``blockX..Z``),
  ``CUPTI_ACTIVITY_KIND_MEMCPY`` (``Memcpy HtoD`` and so on by ``copyKind``; identity: ``bytes``)
  and ``CUPTI_ACTIVITY_KIND_MEMSET`` (``Memset``); device ``deviceId``, stream ``streamId``.
* **One step**: ``step=K`` reads the NVTX range whose text is ``ProfilerStep#K`` (what
  ``torch.profiler`` marks) or, with ``nvtx_range=NAME``, the K-th (from 0) range named NAME:
  the kernels launched in it (their ``CUDA_ACTIVITY_KIND_RUNTIME`` call, matched by
  ``correlationId``, started in the range; without one, the kernel started in it).

The file is opened read-only (never written, not even a lock or a journal). Grouping into a
workload is :func:`measure.trace_group.group_trace`'s, as for a ``torch.profiler`` trace.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .trace_model import Trace, TraceError, TraceKernel

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY_TABLE = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET_TABLE = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
NVTX_TABLE = "NVTX_EVENTS"
#: CUPTI's memcpy kinds (CUpti_ActivityMemcpyKind) as the names torch.profiler gives them.
COPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
              8: "DtoD", 9: "HtoH", 10: "PtoP"}
_EXPORT_HINT = ("export the report with `nsys export --type sqlite REPORT.nsys-rep` (recorded "
                "with --trace=cuda)")


@contextmanager
def _open_read_only(file: str) -> Iterator[sqlite3.Connection]:
    if not Path(file).is_file():
        raise FileNotFoundError(2, "no such file", file)
    with open(file, "rb") as f:
        if f.read(16) != b"SQLite format 3\x00":
            raise TraceError(file, "(file)", f"not an SQLite database: {_EXPORT_HINT}")
    # immutable: no lock and no journal, so a read-only or full disk, or another user's file,
    # is read as it is
    con = sqlite3.connect(f"file:{quote(os.path.abspath(file))}?mode=ro&immutable=1", uri=True)
    try:
        yield con
    except sqlite3.DatabaseError as e:
        raise TraceError(file, "(file)", f"cannot be read as an Nsight Systems export: {e}") from None
    finally:
        con.close()


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in con.execute(f"PRAGMA table_info({table})")}


def read_nsys_sqlite(path: str | os.PathLike, *, step: int | None = None,
                     nvtx_range: str | None = None) -> Trace:
    """Read the kernels of an Nsight Systems SQLite export (module docstring). ``step``: only
    the kernels launched in one step's NVTX range; ``nvtx_range``: the name of the ranges
    ``step`` counts (default: ``ProfilerStep#<step>``). Every problem is a one-line
    :class:`TraceError` naming the file."""
    file = str(path)
    if nvtx_range is not None and step is None:
        raise TraceError(file, "(options)", "an NVTX range name needs --step K (which of them)")
    with _open_read_only(file) as con:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if KERNEL_TABLE not in tables and MEMCPY_TABLE not in tables:
            raise TraceError(file, "(tables)", f"no {KERNEL_TABLE} table: no CUDA activity was "
                             f"recorded; {_EXPORT_HINT}")
        strings = dict(con.execute("SELECT id, value FROM StringIds")) if "StringIds" in tables else {}
        rows = list(_kernel_rows(con, tables, strings, file))
        if not rows:
            raise TraceError(file, KERNEL_TABLE, "no kernels, copies or fills: the trace is empty")
        if step is not None:
            lo, hi = _step_range(con, tables, strings, file, step, nvtx_range)
            launch = _launch_times(con, tables)
            rows = [r for r in rows if lo <= launch.get(r[-1], r[4]) <= hi]
            if not rows:
                raise TraceError(file, NVTX_TABLE, f"nothing was launched in step {step}")
    t0 = min(r[4] for r in rows)
    kernels = tuple(TraceKernel(i, name, cat, dev, stream, (start - t0) * 1e-9,
                                max(end - start, 0) * 1e-9, ident)
                    for i, (name, cat, dev, stream, start, end, ident, _corr) in enumerate(rows))
    return Trace(file, kernels, False, (), step, "nsys")


def _kernel_rows(con: sqlite3.Connection, tables: set[str], strings: dict[int, str],
                 file: str) -> Iterator[tuple[str, str, str, str, int, int,
                                              tuple[tuple[str, str], ...], Any]]:
    """(name, category, device, stream, start ns, end ns, identity, correlation id) per row,
    kernels then copies then fills, each in time order."""
    if KERNEL_TABLE in tables:
        cols = _columns(con, KERNEL_TABLE)
        name_col = "demangledName" if "demangledName" in cols else "shortName"
        grid = [c for c in ("gridX", "gridY", "gridZ") if c in cols]
        block = [c for c in ("blockX", "blockY", "blockZ") if c in cols]
        corr = "correlationId" if "correlationId" in cols else "NULL"
        sel = ", ".join(["start", "end", "deviceId", "streamId", name_col, corr, *grid, *block])
        for r in con.execute(f"SELECT {sel} FROM {KERNEL_TABLE} ORDER BY start, end"):
            start, end, dev, stream, nid, c = r[:6]
            _check_times(file, KERNEL_TABLE, start, end)
            name = strings.get(nid) if isinstance(nid, int) else nid
            if not isinstance(name, str) or not name.strip():
                raise TraceError(file, KERNEL_TABLE, f"a kernel at {start} ns has no name "
                                 f"({name_col} {nid!r} is not in StringIds)")
            g, b = r[6:6 + len(grid)], r[6 + len(grid):]
            ident = tuple((k, "[" + ",".join(str(int(x)) for x in v) + "]")
                          for k, v in (("grid", g), ("block", b)) if v)
            yield name.strip(), "kernel", str(dev), str(stream), start, end, ident, c
    for table, cat in ((MEMCPY_TABLE, "gpu_memcpy"), (MEMSET_TABLE, "gpu_memset")):
        if table not in tables:
            continue
        cols = _columns(con, table)
        kind = "copyKind" if "copyKind" in cols else "NULL"
        nbytes = "bytes" if "bytes" in cols else "NULL"
        corr = "correlationId" if "correlationId" in cols else "NULL"
        for start, end, dev, stream, k, n, c in con.execute(
                f"SELECT start, end, deviceId, streamId, {kind}, {nbytes}, {corr} FROM {table} "
                "ORDER BY start, end"):
            _check_times(file, table, start, end)
            name = (f"Memcpy {COPY_KINDS.get(k, 'copy')}" if cat == "gpu_memcpy" else "Memset")
            ident = (("bytes", str(int(n))),) if n is not None else ()
            yield name, cat, str(dev), str(stream), start, end, ident, c


def _check_times(file: str, table: str, start: Any, end: Any) -> None:
    if not isinstance(start, int) or not isinstance(end, int):
        raise TraceError(file, table, f"start/end must be integer nanoseconds, got {start!r}, "
                         f"{end!r}")
    if end < start:
        raise TraceError(file, table, f"a row ends ({end} ns) before it starts ({start} ns)")


def _step_range(con: sqlite3.Connection, tables: set[str], strings: dict[int, str], file: str,
                step: int, nvtx_range: str | None) -> tuple[int, int]:
    if NVTX_TABLE not in tables:
        raise TraceError(file, "(tables)", "no NVTX_EVENTS table: the report has no NVTX ranges "
                         "(record with --trace=cuda,nvtx; torch.profiler's steps, or "
                         "torch.cuda.nvtx.range_push, mark them)")
    cols = _columns(con, NVTX_TABLE)
    text = "text" if "text" in cols else "NULL"
    tid = "textId" if "textId" in cols else "NULL"
    ranges: list[tuple[str, int, int]] = []
    for start, end, t, i in con.execute(f"SELECT start, end, {text}, {tid} FROM {NVTX_TABLE} "
                                        "WHERE end IS NOT NULL ORDER BY start"):
        label = t if isinstance(t, str) else strings.get(i) if isinstance(i, int) else None
        if label is not None:
            ranges.append((label, start, end))
    if nvtx_range is None:
        want = f"ProfilerStep#{step}"
        hit = [(a, b) for label, a, b in ranges if label == want]
        if not hit:
            have = sorted({label for label, _, _ in ranges if label.startswith("ProfilerStep#")})
            raise TraceError(file, NVTX_TABLE, f"no NVTX range {want} (the report's: "
                             f"{', '.join(have[:8]) or 'none'}; --nvtx-range NAME counts ranges "
                             "of your own name)")
        return hit[0]
    named = [(a, b) for label, a, b in ranges if label == nvtx_range]
    if not 0 <= step < len(named):
        raise TraceError(file, NVTX_TABLE, f"NVTX range {nvtx_range!r} #{step}: the report has "
                         f"{len(named)} such range(s), numbered from 0")
    return named[step]


def _launch_times(con: sqlite3.Connection, tables: set[str]) -> dict[Any, int]:
    """correlationId → the start of its CUDA runtime call (the launch), ns."""
    if RUNTIME_TABLE not in tables or "correlationId" not in _columns(con, RUNTIME_TABLE):
        return {}
    return {c: s for s, c in con.execute(f"SELECT start, correlationId FROM {RUNTIME_TABLE}")}
