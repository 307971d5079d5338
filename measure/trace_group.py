"""A trace's kernels grouped into a workload: elements, tasks, edges, launch gaps, collectives.

What :func:`group_trace` makes of a :class:`measure.trace_model.Trace` (docs/workload.md,
"Kernel traces"):

* **Elements**: kernels grouped by identity (name, and ``grid``/``block``/``bytes`` or the
  input shapes when the trace has them), per device; with a minimum duration, a run of
  consecutive kernels of one lane each shorter than it is one task, whose element is the run's
  sequence of identities. An element's time is the mean over its tasks (the kernels' summed
  durations; gaps between the kernels of a run are not counted).
* **Tasks** are listed per lane in start order; a lane is a whole device (``serial``, the
  default: one clock per GPU, as the hardware has) or a stream (``lanes``; a device with one
  stream is one lane named after the device). The workload's ``dag`` shape runs a lane's tasks
  in the order listed, which is stream order.
* **Edges** between lanes of one device: task k on lane A gets an edge from the task of lane B
  that is the latest in B's order to have ended when k starts (end ≤ start), unless A's
  previous task already has that edge (then it is implied). Every edge points forward in time.
* **Collectives** across devices: the k-th call of a collective kind (AllReduce, AllGather,
  ReduceScatter, Broadcast, Reduce, AllToAll: the NCCL kernel's name says which) on each device
  is one call; it cannot finish before every device reached it, so each member gets an edge from
  the task before every other member. This assumes one process group per kind (every device
  that calls AllReduce calls the same ones, in the same order: NCCL requires that order within a
  group); a kind called a different number of times on different devices is not matched, and
  the import says so. Point-to-point kernels (SendRecv) name no peer and are not matched. A
  collective kernel's traced time includes its wait for the slowest device, so its element is
  characterized with that wait in it: the plan is conservative there.
* **Launch gaps**: where a lane waits, after its previous task and every predecessor on its
  device have ended (another device's times are on another clock), for ``min_gap_s`` or longer
  before its next task starts, the GPU was idle waiting for the host.
  The wait becomes a task of its own before that task (its element a ``gap`` of the wait's
  length to two significant digits, whose work ``traced_gap_40us`` idles on the simulator at
  any operating point), so the plan's makespan at the default operating point is the trace's,
  not less. It is modelled as fixed: where a slower kernel would have absorbed the wait (the
  host was ahead), the real step is shorter than planned, so the model errs on the side of the
  deadline. Shorter waits, the time before a lane's first task, and gaps inside a merged run
  are not modelled; the import reports their sum.
* **Roofline class** of a kernel, by name (:func:`classify`). A group takes the class with the
  larger share of its time.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import replace

from frontier.errors import FormatError, InputError
from frontier.files import read_json

from .sim import TRACED_CLASSES, TRACED_GAP, traced_work_name
from .trace_model import (
    MEMORY_CATEGORIES,
    Trace,
    TraceElement,
    TraceKernel,
    TraceTask,
    TraceWorkload,
)

log = logging.getLogger(__name__)

#: How tasks are laid out on a device: one lane per stream, or one per device.
STREAM_MODES = ("lanes", "serial")
#: The default shortest launch gap kept as a task, s. Below ~5 us a gap is the launch
#: pipeline's own spacing between back-to-back kernels of a busy stream; a task for each would
#: double the tasks for little time (the import reports what the shorter ones add up to).
DEFAULT_MIN_GAP_S = 5e-6

_COMPUTE = re.compile(r"gemm|matmul|(?<![a-z])(b|add|addb)?mm(?![a-z])|conv(?!ert)|attention|attn"
                      r"|flash|fmha|cutlass|(?<![a-z])[xhi]?mma(?![a-z])")
_COLLECTIVE = re.compile(r"nccl\w*?(allreduce|allgather|reducescatter|broadcast|alltoall|reduce)",
                         re.IGNORECASE)



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
    convert), attention, attn, flash, fmha, cutlass or mma as a word (xmma, hmma, imma; not the
    "mma" inside "AdamMath") (a GEMM with an elementwise epilogue is a GEMM); memory
    otherwise (elementwise, copy, reduce, norm, softmax and any name not recognised: most
    kernels of a step besides the GEMMs move data).
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
    s = re.sub(r"^\s*void\s+", "", name).replace("(anonymous namespace)", "")
    s = s.split("(")[0].split("<")[0].strip() or s
    s = s.rsplit("::", 1)[-1] or s
    s = re.sub(r"[^A-Za-z0-9_.-]+", "_", s).strip("_.") or "kernel"
    return s[:48]


def _sort_key(v: str) -> tuple[int, int | str]:
    return (0, int(v)) if v.isdigit() else (1, v)


def group_trace(trace: Trace, *, min_duration_s: float = 0.0, device_prefix: str = "gpu",
                streams: str = "serial", classes: Mapping[str, str] | None = None,
                min_gap_s: float | None = DEFAULT_MIN_GAP_S,
                collectives: bool = True) -> TraceWorkload:
    """Group a trace's kernels into elements, tasks and edges (module docstring).

    ``min_duration_s``: consecutive kernels of one lane each shorter than this form one task (0:
    every kernel is a task). ``device_prefix``: device d is named ``{prefix}{d}`` (CPU ops:
    processes numbered in order of appearance). ``streams``: "serial" (default: one lane
    per device, so a plan its one clock can apply) or "lanes" (one per stream: overlap kept,
    each stream planned with its own clock).
    ``classes``: the user's class map (:func:`classify`). ``min_gap_s``: the shortest launch
    gap kept as a task (None: none kept). ``collectives``: match collective calls across
    devices into edges (module docstring)."""
    if streams not in STREAM_MODES:
        raise InputError(f"streams {streams!r}: must be one of {', '.join(STREAM_MODES)}")
    if not (math.isfinite(min_duration_s) and min_duration_s >= 0):
        raise InputError(f"minimum duration {min_duration_s!r} s: must be a finite number >= 0")
    if min_gap_s is not None and not (math.isfinite(min_gap_s) and min_gap_s >= 0):
        raise InputError(f"minimum gap {min_gap_s!r} s: must be a finite number >= 0")
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
    task_kernels: list[list[TraceKernel]] = []
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
            task_kernels.append(u)
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
    calls: list[list[TraceTask]] = []
    if collectives and len(order) > 1:
        calls, unmatched = _collective_calls(tasks, task_kernels, gpu_of_lane)
        for kind, counts in unmatched:
            log.warning("%s: %s is called %s times on the devices; not matched across devices "
                        "(one process group per kind assumed)", trace.file, kind, counts)
        edges += _collective_edges(tasks, calls, edges)
    _check_acyclic(tasks, edges, trace.file)
    gap_elements: list[TraceElement] = []
    n_gaps, gap_s, short_gap_s = 0, 0.0, 0.0
    if min_gap_s is not None:
        tasks, edges, gap_elements, n_gaps, gap_s, short_gap_s = _launch_gaps(
            tasks, edges, min_gap_s, gpu_of_lane, taken)
    starts = [k.start_s for k in ks]
    return TraceWorkload(
        trace.file, tuple(elements) + tuple(gap_elements), tuple(tasks), tuple(edges),
        tuple(lanes), tuple(dev_name[d] for d in order), sum(len(v) for v in streams_of.values()),
        len(ks), sum(1 for k in ks if k.category in MEMORY_CATEGORIES),
        sum(k.duration_s for k in ks), max(k.end_s for k in ks) - min(starts), trace.source,
        n_gaps, gap_s, short_gap_s,
        sum(1 for a, b in edges if gpu_of_lane[_lane_of_task(a)] != gpu_of_lane[_lane_of_task(b)]),
        len(calls))


def _lane_of_task(name: str) -> str:
    """The lane of a task name (``gpu0.s7/12`` → ``gpu0.s7``)."""
    return name.rsplit("/", 1)[0]


def collective_kind(name: str) -> str | None:
    """The collective a kernel runs, by its name (``ncclDevKernel_AllReduce_Sum_bf16_RING_LL`` →
    "allreduce"), or None: not a collective (point-to-point SendRecv included: it names no peer)."""
    low = name.lower()
    if "sendrecv" in low or "nccl" not in low:
        return None
    m = _COLLECTIVE.search(low)
    return m.group(1) if m else None


def _collective_calls(tasks: Sequence[TraceTask], task_kernels: Sequence[Sequence[TraceKernel]],
                      gpu_of_lane: Mapping[str, str]
                      ) -> tuple[list[list[TraceTask]], list[tuple[str, str]]]:
    """The matched calls (each the tasks of one call, one per device) and the kinds not matched
    (kind, "n1/n2/..." calls per device)."""
    per_gpu: dict[str, dict[str, list[TraceTask]]] = {}
    for t, ks in zip(tasks, task_kernels):
        for k in ks:
            kind = collective_kind(k.name)
            if kind is not None:
                per_gpu.setdefault(gpu_of_lane[t.device], {}).setdefault(kind, []).append(t)
    calls: list[list[TraceTask]] = []
    unmatched: list[tuple[str, str]] = []
    kinds = sorted({kind for by_kind in per_gpu.values() for kind in by_kind})
    for kind in kinds:
        seqs = [sorted(by_kind[kind], key=lambda t: (t.start_s, t.end_s))
                for by_kind in per_gpu.values() if kind in by_kind]
        if len(seqs) < 2:
            continue
        if len({len(q) for q in seqs}) > 1:
            unmatched.append((kind, "/".join(str(len(q)) for q in seqs)))
            continue
        calls.extend([list(c) for c in zip(*seqs)])
    return calls, unmatched


def _collective_edges(tasks: Sequence[TraceTask], calls: Sequence[Sequence[TraceTask]],
                      existing: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """For each call, an edge from the task before each member (on its lane) to every other
    member: the call cannot finish on one device before the others have reached it."""
    before: dict[str, str] = {}
    last: dict[str, str] = {}
    for t in tasks:
        if t.device in last:
            before[t.name] = last[t.device]
        last[t.device] = t.name
    seen = set(existing)
    out: list[tuple[str, str]] = []
    for call in calls:
        for a in call:
            p = before.get(a.name)
            if p is None:
                continue
            for b in call:
                if b is a or (p, b.name) in seen:
                    continue
                seen.add((p, b.name))
                out.append((p, b.name))
    return out


def _check_acyclic(tasks: Sequence[TraceTask], edges: Sequence[tuple[str, str]], file: str) -> None:
    """Refuse a graph with a cycle (lane order plus edges): collectives called in a different
    order on different devices make one."""
    succ: dict[str, list[str]] = {t.name: [] for t in tasks}
    indeg = dict.fromkeys(succ, 0)
    last: dict[str, str] = {}
    for t in tasks:
        if t.device in last:
            succ[last[t.device]].append(t.name)
            indeg[t.name] += 1
        last[t.device] = t.name
    for a, b in edges:
        succ[a].append(b)
        indeg[b] += 1
    q = deque(n for n, d in indeg.items() if d == 0)
    done = 0
    while q:
        n = q.popleft()
        done += 1
        for m in succ[n]:
            indeg[m] -= 1
            if indeg[m] == 0:
                q.append(m)
    if done < len(tasks):
        stuck = next(n for n, d in indeg.items() if d > 0)
        raise InputError(f"{file}: the devices call their collectives in different orders (a "
                         f"cycle through {stuck}); import with --no-collectives and add the "
                         "cross-device edges by hand")


def _gap_us(gap_s: float) -> float:
    """A gap's length to two significant digits, us (so equal waits share one element)."""
    return float(f"{gap_s * 1e6:.2g}")


def _us_text(us: float) -> str:
    return f"{us:.3f}".rstrip("0").rstrip(".")


def _launch_gaps(tasks: Sequence[TraceTask], edges: Sequence[tuple[str, str]], min_gap_s: float,
                 gpu_of_lane: Mapping[str, str], taken: set[str]
                 ) -> tuple[list[TraceTask], list[tuple[str, str]], list[TraceElement], int, float,
                            float]:
    """Insert a gap task before each task that waited ``min_gap_s`` or longer after its lane's
    previous task and all its predecessors on the same device ended; those predecessors' edges
    then go to the gap (edges from other devices stay on the task).
    Returns (tasks, edges, the gap elements, gap tasks, their time s, the shorter waits s)."""
    by_name = {t.name: t for t in tasks}
    preds: dict[str, list[str]] = {}
    for a, b in edges:
        # another device's times run on another clock (another host, for another rank's
        # file): only this device's predecessors say how long the lane waited
        if gpu_of_lane[by_name[a].device] == gpu_of_lane[by_name[b].device]:
            preds.setdefault(b, []).append(a)
    out: list[TraceTask] = []
    element_of: dict[tuple[str, float], str] = {}      # (gpu, us) → element name
    n_of: dict[str, int] = {}
    moved: dict[str, str] = {}
    short_s = gap_s = 0.0
    last: dict[str, TraceTask] = {}
    for t in tasks:
        ends = [by_name[a].end_s for a in preds.get(t.name, ())]
        if t.device in last:
            ends.append(last[t.device].end_s)
        last[t.device] = t
        wait = t.start_s - max(ends) if ends else 0.0
        us = _gap_us(wait) if wait > 0 else 0.0
        # half a nanosecond of slack: a trace's times are in (fractions of) microseconds
        if 0 < wait < min_gap_s - 5e-10 or (wait > 0 and us < 0.001):
            short_s += wait
        elif wait > 0:
            gpu = gpu_of_lane[t.device]
            el = element_of.get((gpu, us))
            if el is None:
                base = el = f"{gpu}/gap_{_us_text(us)}us"
                k = 1
                while el in taken:
                    k += 1
                    el = f"{base}.{k}"
                taken.add(el)
                element_of[(gpu, us)] = el
            name = f"{t.name}.gap"
            if name in by_name:
                raise InputError(f"task name {name!r} is taken; cannot name the gap before {t.name}")
            out.append(TraceTask(name, el, t.device, t.start_s - us * 1e-6, t.start_s, 0.0, 0))
            n_of[el] = n_of.get(el, 0) + 1
            moved[t.name] = name
            gap_s += us * 1e-6
        out.append(t)
    elements = [TraceElement(el, gpu, (), TRACED_GAP, us * 1e-6, n_of[el],
                             traced_work_name(TRACED_GAP, us * 1e-6))
                for (gpu, us), el in element_of.items()]
    # an edge this device waited on now ends at the gap (the wait came after it); one from
    # another device stays on the task (a collective call: the host's delay is not the peer's)
    new_edges = [(a, moved.get(b, b) if a in preds.get(b, ()) else b) for a, b in edges]
    return out, new_edges, elements, sum(n_of.values()), gap_s, short_s


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
    """A few lines saying what was read (for ``ecal import torch-trace`` / ``nsys``)."""
    per_gpu: dict[str, int] = {}
    for e in w.elements:
        per_gpu[e.device] = per_gpu.get(e.device, 0) + 1
    n_compute = sum(1 for e in w.elements if e.roofline == "compute")
    n_gap = sum(1 for e in w.elements if e.roofline == TRACED_GAP)
    merged = sum(1 for t in w.tasks if t.kernels > 1)
    lanes = ", ".join(w.lanes[:6]) + (f", ... {len(w.lanes) - 6} more" if len(w.lanes) > 6 else "")
    across = (f"{w.collective_edges} across devices from {w.collectives} collective call(s)"
              if w.collectives else "none across devices (no collective matched)")
    return [
        f"kernels     {w.kernels} ({w.memory_ops} memory copies/fills) on {len(w.gpus)} device(s), "
        f"{w.streams} stream(s)",
        f"elements    {len(w.elements)} ({', '.join(f'{g}: {n}' for g, n in per_gpu.items())}; "
        f"compute {n_compute}, memory {len(w.elements) - n_compute - n_gap}, gaps {n_gap})",
        f"tasks       {len(w.tasks)} on {len(w.lanes)} lane(s): {lanes}"
        + (f"; {merged} of them runs of short kernels" if merged else "")
        + (f"; {w.gap_tasks} launch gaps" if w.gap_tasks else ""),
        f"edges       {len(w.edges) - w.collective_edges} across streams of one device; {across}",
        f"kernel time {w.kernel_time_s * 1e3:.3f} ms summed; launch gaps {w.gap_time_s * 1e3:.3f} "
        f"ms kept, {w.short_gap_time_s * 1e3:.3f} ms in shorter ones not modelled; trace span "
        f"{w.span_s * 1e3:.3f} ms",
    ]


def join_traces(traces: Sequence[Trace]) -> Trace:
    """One trace of several ranks' files (one file per process, as ``torch.profiler`` writes
    them in a distributed job): rank r's device d becomes device ``r`` when every file has one
    device, else ``r.d``. Each file's times stay relative to its own first kernel (clocks of
    different hosts are not comparable); collectives tie the ranks together
    (:func:`group_trace`)."""
    if not traces:
        raise InputError("no trace to join")
    if len(traces) == 1:
        return traces[0]
    if len({t.cpu_ops for t in traces}) > 1:
        raise InputError("cannot join CPU-op traces with kernel traces")
    one = all(len({k.device for k in t.kernels}) == 1 for t in traces)
    kernels: list[TraceKernel] = []
    for r, t in enumerate(traces):
        for k in t.kernels:
            kernels.append(replace(k, index=len(kernels), device=str(r) if one else f"{r}.{k.device}"))
    steps = traces[0].steps if all(t.steps == traces[0].steps for t in traces) else ()
    return Trace(", ".join(t.file for t in traces), tuple(kernels), traces[0].cpu_ops, steps,
                 traces[0].step, traces[0].source)
