"""What a kernel trace becomes, whatever wrote it: kernels, a trace, elements, tasks, a workload.

The readers (:mod:`measure.torch_trace` for ``torch.profiler``'s Chrome trace,
:mod:`measure.nsys_trace` for Nsight Systems' SQLite export) make a :class:`Trace`;
:func:`measure.trace_group.group_trace` makes a :class:`TraceWorkload` of it, which writes the
``ecal.workload/1`` document (:meth:`TraceWorkload.to_workload`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frontier.errors import FormatError, InputError


class TraceError(FormatError):
    """A trace file is malformed: the message names the file, the place in it and the problem."""


MEMORY_CATEGORIES = ("gpu_memcpy", "gpu_memset", "memcpy", "memset")
#: The default cost of a switch of operating point in a workload made from a trace (asserted,
#: not measured: ``ecal transitions`` measures it).
DEFAULT_TRANSITIONS: dict[str, Any] = {"constant": {"time_s": 0.002, "energy_j": 0.0}}


@dataclass(frozen=True)
class TraceKernel:
    """One kernel (or CPU op) of a trace: where it ran, when, and what identifies it."""

    index: int                    # position in the file (traceEvents, or the table's row order)
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
    """The kernels read from one trace file, or from one file per rank joined
    (:func:`measure.trace_group.join_traces`), ordered as in the file(s)."""

    file: str                     # the file, or the files joined by ", "
    kernels: tuple[TraceKernel, ...]
    cpu_ops: bool = False
    steps: tuple[int, ...] = ()   # the profiler steps annotated in the file (ProfilerStep#k)
    step: int | None = None       # the one read, or None: the whole file
    source: str = "torch-trace"   # what wrote it, as ``ecal import`` names the kind


@dataclass(frozen=True)
class TraceElement:
    """One element of the workload: a kernel identity (or a run of them) on one device."""

    name: str
    device: str                   # the workload's device name of its GPU (gpu0)
    kernels: tuple[str, ...]      # labels of its kernels, in order (one, or a merged run)
    roofline: str                 # "compute", "memory", or "gap" (a launch gap: the GPU idle)
    duration_s: float             # mean over its tasks
    tasks: int
    work: str                     # the simulated work (traced_compute_12.5us)


@dataclass(frozen=True)
class TraceTask:
    """One task: a kernel, a run of consecutive short kernels of one stream, or a launch gap
    (``kernels`` 0: the lane idle, waiting for the host, before its next task)."""

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
    source: str = "torch-trace"
    gap_tasks: int = 0            # launch gaps kept as tasks
    gap_time_s: float = 0.0       # their summed time
    short_gap_time_s: float = 0.0  # gaps shorter than the minimum, not modelled
    collective_edges: int = 0     # edges across devices from matched collectives
    collectives: int = 0          # matched collective calls (one per call, over its devices)

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
                              f"{len(self.gpus)} device(s), imported by ecal import {self.source}")
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
