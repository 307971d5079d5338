"""A kernel trace as a workload: ``torch.profiler``'s Chrome-trace JSON → elements, tasks, edges.

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
* **Elements**: kernels grouped by identity (name, and ``grid``/``block``/``bytes`` or the
  input shapes when the event has them), per device; with a minimum duration, a run of
  consecutive kernels of one stream each shorter than it is one task, whose element is the
  run's sequence of identities. An element's time is the mean over its tasks (the kernels'
  summed durations; gaps between the kernels of a run are not counted).
* **Tasks** are listed per lane in start order; a lane is a whole device (``serial``, the
  default: one clock per GPU, as the hardware has) or a stream (``lanes``; a device with one
  stream is one lane named after the device). The workload's
  ``dag`` shape runs a lane's tasks in the order listed, which is stream order.
* **Edges** between lanes of one device: task k on lane A gets an edge from the task of lane B
  that is the latest in B's order to have ended when k starts (end ≤ start), unless A's
  previous task already has that edge (then it is implied). Every edge points forward in time,
  so the graph has no cycle. None across devices: a trace states no dependency between devices
  (its flow events link a CPU launch to its kernel); add them to ``shape.edges`` by hand.
* **Roofline class** of a kernel, by name (:func:`classify`): the user's map first, memory
  copies and fills are memory, then compute when the name has ``gemm``/``matmul``/``mm``/
  ``conv``/``attention``/``attn``/``flash``/``fmha``/``cutlass``/``mma``, else memory
  (elementwise, copy, reduce, norm, softmax and every other name). A group takes the class
  with the larger share of its time.

Each element's ``work`` is a traced simulated kernel (:func:`measure.sim.traced_kernel`:
``traced_compute_12.5us``) that ``ecal characterize`` runs on the simulated H200.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frontier.errors import FormatError, InputError
from frontier.files import read_json

from .sim import TRACED_CLASSES, traced_work_name

#: ``cat`` values (lower-cased) read as GPU kernels, and those that are memory operations.
KERNEL_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset")
MEMORY_CATEGORIES = ("gpu_memcpy", "gpu_memset", "memcpy", "memset")
#: ``cat`` values read with ``cpu_ops=True`` (older torch wrote "Operator").
CPU_CATEGORIES = ("cpu_op", "operator")
#: How tasks are laid out on a device: one lane per stream, or one per device.
STREAM_MODES = ("lanes", "serial")
#: The default cost of a switch of operating point in a workload made from a trace (asserted,
#: not measured: ``ecal transitions`` measures it).
DEFAULT_TRANSITIONS: dict[str, Any] = {"constant": {"time_s": 0.002, "energy_j": 0.0}}

_COMPUTE = re.compile(r"gemm|matmul|(?<![a-z])(b|add|addb)?mm(?![a-z])|conv(?!ert)|attention|attn"
                      r"|flash|fmha|cutlass|mma")
_MEMORY = re.compile(r"elementwise|copy|memcpy|memset|reduce|norm|softmax")
#: Identity keys of an event's ``args`` (besides its name), in this order.
_IDENTITY_ARGS = ("grid", "block", "bytes", "Input Dims", "Input dims", "input_shapes")
_STEP = re.compile(r"ProfilerStep#(\d+)")


class TraceError(FormatError):
    """A trace file is malformed: the message names the file, the place in it and the problem."""


@dataclass(frozen=True)
class TraceKernel:
    """One kernel (or CPU op) of a trace: where it ran, when, and what identifies it."""

    index: int                    # position in traceEvents
    name: str
    category: str                 # lower-cased cat
    device: str                   # device id as the trace gives it ("0"; a pid for CPU ops)
    stream: str                   # stream id ("7"; a tid for CPU ops)
    start_s: float                # from the first kernel (or op) read
    duration_s: float
    identity: tuple[tuple[str, str], ...] = ()   # (key, JSON value) beside the name

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s

    def label(self) -> str:
        """The name and what else identifies it: ``ampere_sgemm_64x64_nn grid=[8,8,1] ...``."""
        return " ".join([self.name, *(f"{k}={v}" for k, v in self.identity)])


@dataclass(frozen=True)
class Trace:
    """The kernels read from one trace file (ordered as in the file)."""

    file: str
    kernels: tuple[TraceKernel, ...]
    cpu_ops: bool = False
    steps: tuple[int, ...] = ()   # the profiler steps annotated in the file (ProfilerStep#k)
    step: int | None = None       # the one read, or None: the whole file


@dataclass(frozen=True)
class TraceElement:
    """One element of the workload: a kernel identity (or a run of them) on one device."""

    name: str
    device: str                   # the workload's device name of its GPU (gpu0)
    kernels: tuple[str, ...]      # labels of its kernels, in order (one, or a merged run)
    roofline: str                 # "compute" or "memory"
    duration_s: float             # mean over its tasks
    tasks: int
    work: str                     # the simulated work (traced_compute_12.5us)


@dataclass(frozen=True)
class TraceTask:
    """One task: a kernel, or a run of consecutive short kernels of one stream."""

    name: str
    element: str
    device: str                   # the lane it is listed on (a workload device)
    start_s: float
    end_s: float
    busy_s: float                 # the kernels' summed durations
    kernels: int


@dataclass(frozen=True)
class TraceWorkload:
    """A trace grouped into elements, tasks and edges (:func:`group_trace`)."""

    file: str
    elements: tuple[TraceElement, ...]
    tasks: tuple[TraceTask, ...]
    edges: tuple[tuple[str, str], ...]
    lanes: tuple[str, ...]        # the workload's devices, in order
    gpus: tuple[str, ...]         # the traced devices, named with the prefix
    streams: int                  # (device, stream) pairs in the trace
    kernels: int
    memory_ops: int               # memcpy/memset among the kernels
    kernel_time_s: float          # summed kernel durations
    span_s: float                 # first start to last end

    def to_workload(self, signatures: str, *, name: str | None = None,
                    idle_power_w: float = 75.0,
                    transitions: Mapping[str, Any] | str | None = None) -> dict[str, Any]:
        """The ``ecal.workload/1`` document (``dag`` shape): every element's source is
        ``signatures`` (a path relative to the workload file: the file ``ecal characterize
        -o`` will write) and its ``work`` the traced simulated kernel; ``transitions`` default
        :data:`DEFAULT_TRANSITIONS`."""
        if not (math.isfinite(idle_power_w) and idle_power_w >= 0):
            raise InputError(f"idle power {idle_power_w!r} W: must be a finite number >= 0")
        doc: dict[str, Any] = {"format": "ecal.workload/1"}
        if name:
            doc["name"] = name
        doc["description"] = (f"kernel trace {Path(self.file).name}: {self.kernels} kernels on "
                              f"{len(self.gpus)} device(s), imported by ecal import torch-trace")
        doc["elements"] = {e.name: {"source": signatures, "work": e.work} for e in self.elements}
        doc["shape"] = {"kind": "dag",
                        "tasks": [{"name": t.name, "element": t.element, "device": t.device}
                                  for t in self.tasks],
                        "edges": [[a, b] for a, b in self.edges]}
        doc["idle_power_w"] = float(idle_power_w)
        if transitions is None:
            transitions = DEFAULT_TRANSITIONS
        doc["transitions"] = transitions if isinstance(transitions, str) else dict(transitions)
        return doc


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


# -- roofline class ----------------------------------------------------------------------------

def read_class_map(path: str | os.PathLike) -> dict[str, str]:
    """A class map file: a JSON object ``{"name part": "compute" | "memory"}``."""
    file = str(path)
    doc = read_json(file)
    if not isinstance(doc, dict) or not doc:
        raise FormatError(file, "(top level)", 'must be a non-empty object {"name part": '
                          '"compute" or "memory"}')
    for k, v in doc.items():
        if not k:
            raise FormatError(file, "(key)", "an empty name part matches every kernel")
        if v not in TRACED_CLASSES:
            raise FormatError(file, k, f"must be one of {', '.join(TRACED_CLASSES)}, got "
                              f"{json.dumps(v)[:40]}")
    return dict(doc)


def classify(name: str, category: str = "kernel", overrides: Mapping[str, str] | None = None) -> str:
    """The roofline class of a kernel: "compute" or "memory".

    The first of: ``overrides`` (a part of the name → class, case-insensitive, the longest part
    that matches wins); memory for memory copies and fills (``gpu_memcpy``/``gpu_memset``);
    compute when the name has gemm, matmul, mm (as in aten::mm, bmm, addmm), conv (not
    convert), attention, attn, flash, fmha, cutlass or mma (a GEMM with an elementwise epilogue
    is a GEMM); memory otherwise (elementwise, copy, reduce, norm, softmax and any name not
    recognised: most kernels of a step besides the GEMMs move data).
    """
    low = name.lower()
    for part in sorted(overrides or {}, key=len, reverse=True):
        if part.lower() in low:
            return (overrides or {})[part]
    if category in MEMORY_CATEGORIES:
        return "memory"
    if _COMPUTE.search(low):
        return "compute"
    return "memory"


# -- grouping ----------------------------------------------------------------------------------

def _short(name: str) -> str:
    """A readable element-name part of a kernel name: ``void at::native::foo<4>(int)`` → ``foo``."""
    s = re.sub(r"^\s*void\s+", "", name)
    s = s.split("(")[0].split("<")[0].strip() or s
    s = s.rsplit("::", 1)[-1] or s
    s = re.sub(r"[^A-Za-z0-9_.-]+", "_", s).strip("_.") or "kernel"
    return s[:48]


def _sort_key(v: str) -> tuple[int, int | str]:
    return (0, int(v)) if v.isdigit() else (1, v)


def group_trace(trace: Trace, *, min_duration_s: float = 0.0, device_prefix: str = "gpu",
                streams: str = "serial", classes: Mapping[str, str] | None = None) -> TraceWorkload:
    """Group a trace's kernels into elements, tasks and edges (module docstring).

    ``min_duration_s``: consecutive kernels of one lane each shorter than this form one task (0:
    every kernel is a task). ``device_prefix``: device d is named ``{prefix}{d}`` (CPU ops:
    processes numbered in order of appearance). ``streams``: "serial" (default: one lane
    per device, so a plan its one clock can apply) or "lanes" (one per stream: overlap kept,
    each stream planned with its own clock).
    ``classes``: the user's class map (:func:`classify`)."""
    if streams not in STREAM_MODES:
        raise InputError(f"streams {streams!r}: must be one of {', '.join(STREAM_MODES)}")
    if not (math.isfinite(min_duration_s) and min_duration_s >= 0):
        raise InputError(f"minimum duration {min_duration_s!r} s: must be a finite number >= 0")
    if not re.fullmatch(r"[A-Za-z0-9_.-]*", device_prefix) or "@" in device_prefix:
        raise InputError(f"device prefix {device_prefix!r}: use letters, digits, '_', '-', '.'")
    ks = trace.kernels
    if trace.cpu_ops:
        order = list(dict.fromkeys(k.device for k in ks))
        dev_name = {d: f"{device_prefix}{i}" for i, d in enumerate(order)}
    else:
        order = sorted({k.device for k in ks}, key=_sort_key)
        dev_name = {d: f"{device_prefix}{d}" for d in order}
    pairs: dict[str, set[str]] = {d: set() for d in order}
    for k in ks:
        pairs[k.device].add(k.stream)
    streams_of = {d: sorted(pairs[d], key=_sort_key) for d in order}

    def lane_of(k: TraceKernel) -> str:
        if streams == "serial" or len(streams_of[k.device]) == 1:
            return dev_name[k.device]
        return f"{dev_name[k.device]}.s{k.stream}"

    by_pair: dict[tuple[str, str], list[TraceKernel]] = {}
    for k in ks:
        by_pair.setdefault((k.device, k.stream), []).append(k)
    lanes: dict[str, list[TraceKernel]] = {}       # in device order, then stream order
    gpu_of_lane: dict[str, str] = {}
    for d in order:
        for s in streams_of[d]:
            pk = by_pair[(d, s)]
            lane = lane_of(pk[0])
            lanes.setdefault(lane, []).extend(pk)
            gpu_of_lane[lane] = dev_name[d]
    for lane in lanes:
        lanes[lane].sort(key=lambda k: (k.start_s, k.end_s, k.index))

    # runs of kernels → task units
    units: dict[str, list[list[TraceKernel]]] = {}
    for lane, lk in lanes.items():
        out: list[list[TraceKernel]] = []
        run: list[TraceKernel] = []
        for k in lk:
            if min_duration_s > 0 and k.duration_s < min_duration_s:
                run.append(k)
                continue
            if run:
                out.append(run)
                run = []
            out.append([k])
        if run:
            out.append(run)
        units[lane] = out

    # elements: per GPU, per identity (a kernel's, or a run's sequence of them)
    ident: dict[tuple[str, tuple[tuple[str, tuple[tuple[str, str], ...]], ...]], str] = {}
    members: dict[str, list[list[TraceKernel]]] = {}
    taken: set[str] = set()
    tasks: list[TraceTask] = []
    for lane, us in units.items():
        gpu = gpu_of_lane[lane]
        for i, u in enumerate(us):
            key = (gpu, tuple((k.name, k.identity) for k in u))
            el = ident.get(key)
            if el is None:
                base = f"{gpu}/{_short(u[0].name)}" + (f"+{len(u) - 1}" if len(u) > 1 else "")
                el, n = base, 1
                while el in taken:
                    n += 1
                    el = f"{base}.{n}"
                taken.add(el)
                ident[key] = el
                members[el] = []
            members[el].append(u)
            tasks.append(TraceTask(f"{lane}/{i}", el, lane, u[0].start_s, max(k.end_s for k in u),
                                   sum(k.duration_s for k in u), len(u)))
    elements = []
    for key, el in ident.items():
        runs = members[el]
        by_class = dict.fromkeys(TRACED_CLASSES, 0.0)
        for u in runs:
            for k in u:
                by_class[classify(k.name, k.category, classes)] += k.duration_s
        if len(runs[0]) == 1:
            roof = classify(runs[0][0].name, runs[0][0].category, classes)
        else:
            roof = max(TRACED_CLASSES, key=lambda c: (by_class[c], c == "compute"))
        mean = sum(sum(k.duration_s for k in u) for u in runs) / len(runs)
        elements.append(TraceElement(el, key[0], tuple(k.label() for k in runs[0]), roof, mean,
                                     len(runs), traced_work_name(roof, mean)))

    edges = _cross_lane_edges(tasks, gpu_of_lane) if streams == "lanes" else []
    starts = [k.start_s for k in ks]
    return TraceWorkload(
        trace.file, tuple(elements), tuple(tasks), tuple(edges), tuple(lanes),
        tuple(dev_name[d] for d in order), sum(len(v) for v in streams_of.values()), len(ks),
        sum(1 for k in ks if k.category in MEMORY_CATEGORIES),
        sum(k.duration_s for k in ks), max(k.end_s for k in ks) - min(starts))


def _cross_lane_edges(tasks: Sequence[TraceTask], gpu_of_lane: Mapping[str, str]) -> list[tuple[str, str]]:
    """Edges between lanes of one GPU (module docstring): for each task k and each other lane B
    of its GPU, from the task of B latest in B's order among those ended by k's start, unless
    k's predecessor on its lane already has that edge. Only forward in (start, end, lane,
    position) order, so acyclic."""
    by_lane: dict[str, list[tuple[int, TraceTask]]] = {}
    for t in tasks:
        lane = by_lane.setdefault(t.device, [])
        lane.append((len(lane), t))
    order = {t.name: (t.start_s, t.end_s, t.device, i) for lane in by_lane.values() for i, t in lane}
    edges: list[tuple[str, str]] = []
    for a, seq in by_lane.items():
        others = [b for b in by_lane if b != a and gpu_of_lane[b] == gpu_of_lane[a]]
        for b in others:
            ended = sorted(by_lane[b], key=lambda it: (it[1].end_s, it[0]))
            p, best, last = 0, -1, -1
            for _, k in seq:
                while p < len(ended) and ended[p][1].end_s <= k.start_s:
                    best = max(best, ended[p][0])
                    p += 1
                if best < 0 or best == last:
                    continue
                j = by_lane[b][best][1]
                if order[j.name] < order[k.name]:
                    edges.append((j.name, k.name))
                    last = best
    return edges


def summary_lines(w: TraceWorkload) -> list[str]:
    """A few lines saying what was read (for ``ecal import torch-trace``)."""
    per_gpu: dict[str, int] = {}
    for e in w.elements:
        per_gpu[e.device] = per_gpu.get(e.device, 0) + 1
    n_compute = sum(1 for e in w.elements if e.roofline == "compute")
    merged = sum(1 for t in w.tasks if t.kernels > 1)
    lanes = ", ".join(w.lanes[:6]) + (f", ... {len(w.lanes) - 6} more" if len(w.lanes) > 6 else "")
    return [
        f"kernels     {w.kernels} ({w.memory_ops} memory copies/fills) on {len(w.gpus)} device(s), "
        f"{w.streams} stream(s)",
        f"elements    {len(w.elements)} ({', '.join(f'{g}: {n}' for g, n in per_gpu.items())}; "
        f"compute {n_compute}, memory {len(w.elements) - n_compute})",
        f"tasks       {len(w.tasks)} on {len(w.lanes)} lane(s): {lanes}"
        + (f"; {merged} of them runs of short kernels" if merged else ""),
        f"edges       {len(w.edges)} across streams of one device (none across devices: the "
        "trace states none)",
        f"kernel time {w.kernel_time_s * 1e3:.3f} ms summed; trace span {w.span_s * 1e3:.3f} ms",
    ]

