"""``torch.profiler``'s Chrome-trace JSON → a :class:`measure.trace_model.Trace`.

``prof.export_chrome_trace(path)`` writes ``{"traceEvents": [...]}`` (a bare list of events is
read too). Complete events (``"ph": "X"``) carry ``name``, ``ts`` and ``dur`` in microseconds,
``pid``/``tid``, ``cat`` and ``args``. What is read (docs/workload.md, "Kernel traces"):

* **Kernels**: events of ``cat`` "kernel" (compute kernels) and "gpu_memcpy"/"gpu_memset"
  (memory copies and fills, always of the memory class); the device is ``args.device`` (else
  ``pid``), the stream ``args.stream`` (else ``tid``). With ``cpu_ops=True`` the ``cpu_op``
  events are read instead (a CPU-only ``torch.profiler`` run has no kernels): the outermost op
  of each thread (``aten::matmul``, not the ``aten::mm`` inside it), each process a device, each
  thread a stream.
* **One step**: a trace recorded with ``prof.step()`` marks each step (``ProfilerStep#k``);
  ``step=k`` keeps the kernels launched in step k (matched to their launch through
  ``args.correlation``) or, for CPU ops, the ops started in it. Without it the whole file is
  read as one step.

Grouping into a workload is :mod:`measure.trace_group`'s (re-exported here, as are the trace's
value types); each element's ``work`` is a traced simulated kernel
(:func:`measure.sim.traced_kernel`: ``traced_compute_12.5us``) that ``ecal characterize`` runs on
the simulated H200.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from typing import Any

from frontier.files import read_json

from .trace_group import (  # noqa: F401  (re-exported: the public names of kernel traces)
    DEFAULT_MIN_GAP_S,
    STREAM_MODES,
    classify,
    collective_kind,
    group_trace,
    join_traces,
    read_class_map,
    summary_lines,
)
from .trace_model import (  # noqa: F401
    DEFAULT_TRANSITIONS,
    MEMORY_CATEGORIES,
    Trace,
    TraceElement,
    TraceError,
    TraceKernel,
    TraceTask,
    TraceWorkload,
)

#: ``cat`` values (lower-cased) read as GPU kernels.
KERNEL_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset")
#: ``cat`` values read with ``cpu_ops=True`` (older torch wrote "Operator").
CPU_CATEGORIES = ("cpu_op", "operator")
#: Identity keys of an event's ``args`` (besides its name), in this order.
_IDENTITY_ARGS = ("grid", "block", "bytes", "Input Dims", "Input dims", "input_shapes")
_STEP = re.compile(r"ProfilerStep#(\d+)")


# -- reading ---------------------------------------------------------------------------------

def read_torch_trace(path: str | os.PathLike, *, cpu_ops: bool = False,
                     step: int | None = None) -> Trace:
    """Read a ``torch.profiler`` Chrome trace (strict JSON; see the module docstring).
    ``step``: only profiler step ``step`` (the ``ProfilerStep#k`` annotation ``prof.step()``
    makes): the kernels launched, or the CPU ops started, within it. Every problem is a
    one-line :class:`TraceError` naming the file and the event."""
    file = str(path)
    return parse_torch_trace(read_json(file), file, cpu_ops=cpu_ops, step=step)


def _number(file: str, where: str, v: Any, what: str, minimum: float | None = None) -> float:
    if v is None:
        raise TraceError(file, where, f"missing ({what})")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TraceError(file, where, f"must be a number ({what}), got {json.dumps(v)[:40]}")
    x = float(v)
    if not math.isfinite(x):
        raise TraceError(file, where, f"must be a finite number ({what}), got {x}")
    if minimum is not None and x < minimum:
        raise TraceError(file, where, f"must be >= {minimum:g} ({what}), got {v}")
    return x


def _id(v: Any) -> str | None:
    """A device or stream id as text: 7 → "7", "stream 7" → "7", None → None."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, int):
        return str(v)
    s = str(v).strip()
    m = re.fullmatch(r"(?:stream|gpu|device|cuda)?\s*:?\s*(\d+)\s*", s, re.IGNORECASE)
    return m.group(1) if m else (re.sub(r"[^A-Za-z0-9_-]+", "_", s).strip("_") or None)


def parse_torch_trace(doc: Any, file: str = "<trace>", *, cpu_ops: bool = False,
                      step: int | None = None) -> Trace:
    """:func:`read_torch_trace` of an already parsed document."""
    if isinstance(doc, dict):
        if "traceEvents" not in doc:
            raise TraceError(file, "(top level)", "no traceEvents: not a Chrome trace "
                             "(torch.profiler's export_chrome_trace writes one)")
        events, base = doc["traceEvents"], "traceEvents"
    elif isinstance(doc, list):
        events, base = doc, "(events)"
    else:
        raise TraceError(file, "(top level)", "must be a Chrome trace: an object with traceEvents "
                         f"or a list of events, got {type(doc).__name__}")
    if not isinstance(events, list):
        raise TraceError(file, base, f"must be a list of events, got {type(events).__name__}")
    if not events:
        raise TraceError(file, base, "no events: the trace is empty")
    wanted = CPU_CATEGORIES if cpu_ops else KERNEL_CATEGORIES
    rows: list[tuple[int, str, str, str, str, float, float, tuple[tuple[str, str], ...]]] = []
    seen_cats: dict[str, int] = {}
    steps: dict[int, tuple[float, float]] = {}    # ProfilerStep#k → its CPU interval, us
    launches: dict[Any, float] = {}               # correlation id → launch time, us
    corr_of: dict[int, Any] = {}                  # row index → its kernel's correlation id
    for i, ev in enumerate(events):
        where = f"{base}[{i}]"
        if not isinstance(ev, dict):
            raise TraceError(file, where, f"must be an event (an object), got {type(ev).__name__}")
        if ev.get("ph") != "X":
            continue
        cat = str(ev.get("cat", "")).lower()
        seen_cats[cat] = seen_cats.get(cat, 0) + 1
        if cat not in wanted:
            nm = ev.get("name")
            m = _STEP.fullmatch(nm) if isinstance(nm, str) and not cat.startswith("gpu") else None
            if m:
                a = _number(file, f"{where}.ts", ev.get("ts"), "the start, us")
                steps[int(m.group(1))] = (a, a + _number(file, f"{where}.dur", ev.get("dur"),
                                                         "the duration, us", minimum=0.0))
            elif cat in ("cuda_runtime", "cuda_driver") and isinstance(ev.get("args"), dict):
                c, t = ev["args"].get("correlation"), ev.get("ts")
                if c is not None and isinstance(t, (int, float)) and not isinstance(t, bool):
                    launches[c] = float(t)
            continue
        name = ev.get("name")
        if not isinstance(name, str) or not name.strip():
            raise TraceError(file, f"{where}.name", "missing (a kernel needs a non-empty name)")
        ts = _number(file, f"{where}.ts", ev.get("ts"), "the start, us")
        dur = _number(file, f"{where}.dur", ev.get("dur"), "the duration, us", minimum=0.0)
        args = ev.get("args") or {}
        if not isinstance(args, dict):
            raise TraceError(file, f"{where}.args", f"must be an object, got {type(args).__name__}")
        device = _id(ev.get("pid")) if cpu_ops else _id(args.get("device", ev.get("pid")))
        stream = _id(ev.get("tid")) if cpu_ops else _id(args.get("stream", ev.get("tid")))
        if device is None:
            raise TraceError(file, where, "no device (args.device or pid)")
        if stream is None:
            raise TraceError(file, where, "no stream (args.stream or tid)")
        ident = tuple((k, json.dumps(args[k], separators=(",", ":"), sort_keys=True))
                      for k in _IDENTITY_ARGS if args.get(k) not in (None, [], ""))
        if args.get("correlation") is not None:
            corr_of[i] = args["correlation"]
        rows.append((i, name.strip(), cat, device, stream, ts, dur * 1e-6, ident))
    if not rows:
        if cpu_ops:
            raise TraceError(file, base, f"no CPU ops (cat {'/'.join(CPU_CATEGORIES)}) among "
                             f"{len(events)} events")
        hint = (f"; it has {seen_cats.get('cpu_op', 0)} cpu_op events: a CPU-only trace, which "
                "--cpu-ops reads") if seen_cats.get("cpu_op") else ""
        raise TraceError(file, base, f"no GPU kernels (cat {', '.join(KERNEL_CATEGORIES[:3])}) "
                         f"among {len(events)} events{hint}")
    if step is not None:
        if step not in steps:
            have = ", ".join(f"#{k}" for k in sorted(steps)) or "none"
            raise TraceError(file, base, f"no ProfilerStep#{step} (the trace's profiler steps: "
                             f"{have}; they are there when the loop calls prof.step())")
        lo, hi = steps[step]
        # a kernel belongs to the step its launch was in (it may run after the step's CPU
        # side ended); without a launch on record, to the step it started in
        rows = [r for r in rows if lo <= launches.get(corr_of.get(r[0]), r[5]) <= hi]
        if not rows:
            raise TraceError(file, base, f"nothing {'ran' if cpu_ops else 'was launched'} in "
                             f"ProfilerStep#{step}")
    # starts from the first one read: torch writes microseconds since the epoch, which in
    # seconds would keep only ~0.2 us of precision
    t0 = min(r[5] for r in rows)
    out = [TraceKernel(i, n, c, d, st, (ts - t0) * 1e-6, dur, ident)
           for i, n, c, d, st, ts, dur, ident in rows]
    if cpu_ops:
        out = _outermost(out)
    return Trace(file, tuple(out), cpu_ops, tuple(sorted(steps)), step)


def _outermost(ops: Sequence[TraceKernel]) -> list[TraceKernel]:
    """The ops not inside another op of the same thread (``aten::matmul``, not its ``aten::mm``)."""
    keep: list[TraceKernel] = []
    by_thread: dict[tuple[str, str], list[TraceKernel]] = {}
    for k in ops:
        by_thread.setdefault((k.device, k.stream), []).append(k)
    for ks in by_thread.values():
        last: TraceKernel | None = None
        for k in sorted(ks, key=lambda k: (k.start_s, -k.duration_s, k.index)):
            if last is not None and k.start_s >= last.start_s and k.end_s <= last.end_s:
                continue
            keep.append(k)
            last = k
    return sorted(keep, key=lambda k: k.index)
