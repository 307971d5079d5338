"""Work tables: what each task of a plan runs, and the work-table file format.

A :class:`TaskWork` is simulated kernel streams started together on a device (a co-run at an
SM split); a :class:`CallableWork` is the user's own step (or a kernel) run through
``Device.run``. A work table maps each task name to one work per option of the task.
:func:`save_work_table` / :func:`load_work_table` write and read the ``ecal.work/1`` file
(older ``energy-calculus/work-table`` files still read).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frontier.errors import FormatError, InputError
from frontier.formats import KINDS, check_format
from frontier.io import number_field, read_json, write_json_atomic
from measure.sim import SimKernel


class ExecutionError(InputError):
    """A plan cannot be executed: it does not match its problem, or a task has no work."""


# -- what a task runs ----------------------------------------------------------------------

@dataclass(frozen=True)
class TaskWork:
    """What one task runs: kernel streams started together on its device (a co-run).

    ``streams`` holds ``(kernel, sm_count)`` pairs; ``sm_count`` None means the whole device.
    Each stream runs its kernel once; the task ends when the last stream ends.

    >>> from measure.sim import preset
    >>> w = TaskWork(((preset("stage_forward"), 116), (preset("p2p_send"), 16)))
    >>> w.label()
    'stage_forward@116SM || p2p_send@16SM'
    """

    streams: tuple[tuple[SimKernel, int | None], ...]

    def __post_init__(self) -> None:
        try:
            streams = tuple((k, sm) for k, sm in self.streams)
        except (TypeError, ValueError):
            raise ExecutionError(f"TaskWork.streams must be (kernel, sm_count) pairs, "
                                 f"got {self.streams!r}") from None
        if not streams:
            raise ExecutionError("TaskWork needs at least one stream")
        for k, sm in streams:
            if not isinstance(k, SimKernel):
                raise ExecutionError(f"TaskWork: {k!r} is not a SimKernel")
            if sm is not None and (not isinstance(sm, int) or isinstance(sm, bool) or sm < 1):
                raise ExecutionError(f"TaskWork: kernel {k.name!r} sm_count must be a positive "
                                     f"int or None, got {sm!r}")
        object.__setattr__(self, "streams", streams)

    def label(self) -> str:
        """``kernel@nSM || kernel@nSM``."""
        return " || ".join(f"{k.name}@{'all' if sm is None else sm}SM" for k, sm in self.streams)

    def parallel_streams(self) -> list[tuple[SimKernel, int, int | None]]:
        """The ``(kernel, n, sm_count)`` list :meth:`SimulatedGPU.run_parallel` takes."""
        return [(k, 1, sm) for k, sm in self.streams]


@dataclass(frozen=True)
class CallableWork:
    """What one task runs on any device: ``work`` (a zero-argument callable — the step a
    ``module:factory`` returns — or a simulated kernel), called once per step through
    :meth:`measure.device.Device.run` (which synchronizes), on ``sm_count`` SMs when given.

    This is how a plan runs on a real GPU (``ecal run PLAN --workload W --device nvml:N``):
    every option of a task runs the same code; the executor sets the option's ω first.

    >>> from measure.sim import preset
    >>> CallableWork(preset("stage_forward"), "fwd").label()
    'fwd'
    """

    work: Callable[[], object] | SimKernel
    name: str = ""
    sm_count: int | None = None

    def __post_init__(self) -> None:
        if not (callable(self.work) or isinstance(self.work, SimKernel)):
            raise ExecutionError(f"CallableWork: {self.work!r} is neither callable nor a kernel")
        if self.sm_count is not None and (not isinstance(self.sm_count, int)
                                          or isinstance(self.sm_count, bool) or self.sm_count < 1):
            raise ExecutionError(f"CallableWork {self.name!r}: sm_count must be a positive int "
                                 f"or None, got {self.sm_count!r}")

    def label(self) -> str:
        """The work's name (its element)."""
        return self.name or str(getattr(self.work, "name", None) or getattr(self.work, "__name__", "work"))


#: Task name → one :class:`TaskWork` (or :class:`CallableWork`) per option of that task
#: (aligned with the option list).
WorkTable = Mapping[str, Sequence[TaskWork | CallableWork]]

# -- work-table files ----------------------------------------------------------------------

_KERNEL_FIELDS = tuple(f.name for f in dataclasses.fields(SimKernel))
_KERNEL_FLOATS = ("flops", "bytes", "link_bytes", "compute_eff", "mem_eff", "activity",
                  "overhead_s", "link_bw_bps")
_KERNEL_INTS = ("sm_request", "tiles", "link_sm_sat")
_KERNEL_TEXTS = ("kappa", "theta")


def work_table_to_dict(work: WorkTable) -> dict[str, Any]:
    """The work-table file form of ``work`` (see :func:`save_work_table`)."""
    kernels: dict[str, dict[str, Any]] = {}
    tasks: dict[str, list[dict[str, Any]]] = {}
    for name, ws in work.items():
        rows = []
        for w in ws:
            if isinstance(w, CallableWork):
                raise ExecutionError(f"work table: {name!r} runs your own code, which a work "
                                     "table (simulated kernels) cannot hold")
            for k, _ in w.streams:
                d = dataclasses.asdict(k)
                if kernels.setdefault(k.name, d) != d:
                    raise ExecutionError(f"work table: two different kernels are named {k.name!r}")
            rows.append({"streams": [{"kernel": k.name, "sm_count": sm} for k, sm in w.streams]})
        tasks[str(name)] = rows
    return {"format": KINDS["work"].tag, "simulated": True,
            "kernels": kernels, "tasks": tasks}


def save_work_table(path: str | os.PathLike, work: WorkTable) -> Path:
    """Write a work table atomically as JSON::

        {"format": "ecal.work/1", "simulated": true,
         "kernels": {"s0_forward": {<every measure.sim.SimKernel field>}, ...},
         "tasks": {"s0/forward/0": [{"streams": [{"kernel": "s0_forward", "sm_count": 116},
                                                  {"kernel": "p2p_send", "sm_count": 16}]},
                                     ...one entry per option, in option order]}}

    ``sm_count`` null: the whole device. Read back with :func:`load_work_table`."""
    return write_json_atomic(path, work_table_to_dict(work))


def _fields(file: str, path: str, v: Any, allowed: Sequence[str], required: Sequence[str] = ()
            ) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise FormatError(file, path, f"must be an object, got {type(v).__name__}")
    extra = sorted(set(v) - set(allowed))
    if extra:
        raise FormatError(file, f"{path}.{extra[0]}", f"unknown field (allowed: {', '.join(allowed)})")
    for k in required:
        if k not in v:
            raise FormatError(file, f"{path}.{k}", "missing")
    return v


def _int_or_none(file: str, path: str, v: Any, minimum: int = 1) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise FormatError(file, path, f"must be an integer >= {minimum} or null, got {v!r}")
    return v


def _kernel_from(file: str, path: str, name: str, v: Any) -> SimKernel:
    d = _fields(file, path, v, _KERNEL_FIELDS, ("name",))
    if d["name"] != name:
        raise FormatError(file, f"{path}.name", f"is {d['name']!r}, not the key {name!r}")
    kw: dict[str, Any] = {"name": name}
    for k in _KERNEL_FLOATS:
        if k in d:
            kw[k] = number_field(file, f"{path}.{k}", d[k])
    for k in _KERNEL_INTS:
        if k in d:
            kw[k] = _int_or_none(file, f"{path}.{k}", d[k])
    for k in _KERNEL_TEXTS:
        if k in d and d[k] is not None and not isinstance(d[k], str):
            raise FormatError(file, f"{path}.{k}", f"must be text or null, got {d[k]!r}")
        if k in d:
            kw[k] = d[k]
    if kw.get("link_sm_sat", 1) is None:
        raise FormatError(file, f"{path}.link_sm_sat", "must be an integer >= 1")
    try:
        return SimKernel(**kw)
    except (TypeError, ValueError) as exc:
        raise FormatError(file, path, str(exc)) from None


def work_table_from_dict(doc: Any, file: str = "<work table>") -> dict[str, tuple[TaskWork, ...]]:
    """Inverse of :func:`work_table_to_dict`; strict: every problem is a
    :class:`~frontier.errors.FormatError` naming the file and the field. Reads the current
    ``ecal.work/1`` form and the older ``energy-calculus/work-table`` one."""
    check_format(file, doc, "work")
    d = _fields(file, "$", doc, ("format", "version", "simulated", "kernels", "tasks", "description"),
                ("format", "kernels", "tasks"))
    if not isinstance(d["kernels"], Mapping) or not d["kernels"]:
        raise FormatError(file, "kernels", "must be a non-empty object keyed by kernel name")
    kernels = {str(n): _kernel_from(file, f"kernels.{n}", str(n), v) for n, v in d["kernels"].items()}
    if not isinstance(d["tasks"], Mapping) or not d["tasks"]:
        raise FormatError(file, "tasks", "must be a non-empty object keyed by task name")
    out: dict[str, tuple[TaskWork, ...]] = {}
    for t, rows in d["tasks"].items():
        if not isinstance(rows, list) or not rows:
            raise FormatError(file, f"tasks.{t}", "must be a non-empty list (one entry per option)")
        works = []
        for j, row in enumerate(rows):
            where = f"tasks.{t}[{j}]"
            r = _fields(file, where, row, ("streams",), ("streams",))
            if not isinstance(r["streams"], list) or not r["streams"]:
                raise FormatError(file, f"{where}.streams", "must be a non-empty list")
            streams = []
            for i, st in enumerate(r["streams"]):
                sw = _fields(file, f"{where}.streams[{i}]", st, ("kernel", "sm_count"), ("kernel",))
                if sw["kernel"] not in kernels:
                    raise FormatError(file, f"{where}.streams[{i}].kernel",
                                      f"no kernel {sw['kernel']!r} in 'kernels'")
                streams.append((kernels[sw["kernel"]],
                                _int_or_none(file, f"{where}.streams[{i}].sm_count", sw.get("sm_count"))))
            works.append(TaskWork(tuple(streams)))
        out[str(t)] = tuple(works)
    return out


def load_work_table(path: str | os.PathLike) -> dict[str, tuple[TaskWork, ...]]:
    """Read a work table written by :func:`save_work_table` (strict; see
    :func:`work_table_from_dict`). Not :func:`measure.load_work`, which resolves one work
    spec (a preset or ``module:attribute``)."""
    return work_table_from_dict(read_json(path), str(path))

