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
from typing import TYPE_CHECKING, Any

from frontier.errors import FormatError, InputError
from frontier.files import read_json, write_json_atomic
from frontier.formats import KINDS, content, validate
from measure.sim import SimKernel

if TYPE_CHECKING:
    from .format_models import Kernel


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

    work: Callable[[], object] | SimKernel | Sequence[SimKernel]
    name: str = ""
    sm_count: int | None = None

    def __post_init__(self) -> None:
        # a sequence of simulated kernels (run in order) is work too, as ecal characterize
        # and Device.run take it
        kernels = (isinstance(self.work, Sequence) and not isinstance(self.work, str)
                   and bool(self.work) and all(isinstance(k, SimKernel) for k in self.work))
        if not (callable(self.work) or isinstance(self.work, SimKernel) or kernels):
            what = f"a list of {len(self.work)}" if isinstance(self.work, Sequence) else repr(self.work)[:80]
            raise ExecutionError(f"CallableWork: {what} is neither callable nor a kernel (or a list "
                                 "of kernels)")
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


def _kernel(file: str, path: str, name: str, k: Kernel) -> SimKernel:
    """The :class:`SimKernel` of ``kernels.NAME`` (shape checked by the model)."""
    if k.name != name:
        raise FormatError(file, f"{path}.name", f"is {k.name!r}, not the key {name!r}")
    try:   # only the fields the file sets: SimKernel keeps its own defaults
        return SimKernel(**k.model_dump(exclude_unset=True))
    except (TypeError, ValueError) as exc:   # e.g. a kernel that does no work
        raise FormatError(file, path, str(exc)) from None


def work_table_from_dict(doc: Any, file: str = "<work table>") -> dict[str, tuple[TaskWork, ...]]:
    """Inverse of :func:`work_table_to_dict`; strict: every problem is a
    :class:`~frontier.errors.FormatError` naming the file and the field. Reads the current
    ``ecal.work/1`` form and the older ``energy-calculus/work-table`` one. The shape is
    :class:`execution.format_models.WorkFile`; checked here: what it means (a kernel keyed by
    its name, doing work; a stream naming a kernel of the table)."""
    from .format_models import WorkFile

    _, body = content(file, doc, "work")
    m = validate(WorkFile, body, file)
    kernels = {n: _kernel(file, f"kernels.{n}", n, k) for n, k in m.kernels.items()}
    out: dict[str, tuple[TaskWork, ...]] = {}
    for t, rows in m.tasks.items():
        works = []
        for j, row in enumerate(rows):
            for i, st in enumerate(row.streams):
                if st.kernel not in kernels:
                    raise FormatError(file, f"tasks.{t}[{j}].streams[{i}].kernel",
                                      f"no kernel {st.kernel!r} in 'kernels'")
            works.append(TaskWork(tuple((kernels[st.kernel], st.sm_count) for st in row.streams)))
        out[t] = tuple(works)
    return out


def load_work_table(path: str | os.PathLike) -> dict[str, tuple[TaskWork, ...]]:
    """Read a work table written by :func:`save_work_table` (strict; see
    :func:`work_table_from_dict`). Not :func:`measure.load_work`, which resolves one work
    spec (a preset or ``module:attribute``)."""
    return work_table_from_dict(read_json(path), str(path))

