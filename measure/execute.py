"""Hold a plan against execution: run its DAG on devices, measure it, test Eq. 23.

A plan (``solvers.plan.Plan``) is a prediction composed from characterized signatures. This
module runs it: by default one :class:`~measure.sim.SimulatedGPU` per plan device, or the
devices given (a real GPU through :class:`~measure.nvml.NVMLDevice`). Each task runs as the
work it stands for — a :class:`TaskWork` (simulated kernel streams started together through
``run_parallel``, for co-runs at an SM split) or a :class:`CallableWork` (the user's own step,
through ``Device.run``) — at the task's planned ω_dev, in the plan's per-device order and
after its predecessors (cross-device edges included). A steady-state plan
(``problem.steady_state``) runs its steps back to back: each device's switch from its last
task to its first is made, and measured, inside the step. A device waiting for a dependency idles at ready
power, as the plan's idle energy assumes; a change of ω_dev costs the simulator's own switch
latency. Every device holds the step until the makespan (the iteration boundary).

Measurement follows :mod:`measure.protocol`: each device through its own energy counter, the
whole step per window, tick-aligned (wait for a tick before and after, subtract ready power ×
the tail), repeated over steps (training iterations) until the relative standard error of the
step energy reaches ``protocol.target_rse``. Reported: measured T and E (mean ± σ of the mean)
per device and for the step against the plan's prediction, and Eq. 23
(:func:`frontier.deviation.deviation`) with both σ.

Per-device prediction: E_dev = Σ its tasks' E + P_dev·(M − busy − switch time) + its
switches' energy (these sum to ``plan.energy_j``); σ by the plan's delta method restricted
to the device (shared measurements and the makespan's critical path counted as in
``solvers.plan.make_plan``). Per-device T is the end of the device's last task.

Imports ``frontier`` and ``measure`` only: plans and problems are read by their attributes
(``plan.tasks``, ``problem.tasks``, ``problem.index``), never by importing ``solvers``.
Every number here is simulated when the devices are (``simulated`` in every output). A real
device has no per-task ground truth: its tasks' ``true_energy_j`` is None.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from frontier.deviation import DeviationResult, deviation
from frontier.errors import FormatError, InputError
from frontier.io import number_field, read_json, write_json_atomic
from frontier.operating_point import OperatingPoint
from frontier.signature import Signature

from .device import Device, restoring
from .protocol import Protocol, measure_ready_power_w, relative_se, wait_for_tick
from .sim import SimKernel, SimulatedGPU

SIMULATED_NOTE = "SIMULATED H200 (physics model; not a measurement of real hardware)"


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

    work: Any
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

_PIPELINE_TASK = re.compile(r"^s(\d+)/(forward|backward)/(\d+)$")


def pipeline_work(problem: Any, stage_kernels: Mapping[tuple[int, str], SimKernel],
                  send_kernel: SimKernel, sm_total: int = 132,
                  granularity: int = 8) -> dict[str, tuple[TaskWork, ...]]:
    """The work table of a 1F1B problem whose options are compute ⊕ send (``ecal demo``).

    Task ``s{stage}/{forward|backward}/{mb}`` with an option at ``omega.sm_count = k`` runs
    ``stage_kernels[(stage, inst)]`` on the most SMs the device grants beside the send (a
    multiple of ``granularity`` <= ``sm_total − k``; ``ecal.demo.compute_sms``) in parallel
    with ``send_kernel`` on ``k`` SMs. For the demo: ``pipeline_work(problem, demo._stage_kernels(cfg),
    PRESETS["p2p_send"])``.
    """
    out: dict[str, tuple[TaskWork, ...]] = {}
    for t in problem.tasks:
        m = _PIPELINE_TASK.match(t.name)
        if m is None:
            raise ExecutionError(f"task {t.name!r} is not a 1F1B task (s<stage>/<forward|"
                                 "backward>/<microbatch>)")
        key = (int(m.group(1)), m.group(2))
        if key not in stage_kernels:
            raise ExecutionError(f"task {t.name!r}: no kernel for stage {key[0]} {key[1]}")
        works = []
        for j, o in enumerate(t.options):
            k = o.omega.sm_count
            if k is None or not 0 < k < sm_total:
                raise ExecutionError(f"task {t.name!r} option {j} ({o.label}): needs an SM split "
                                     f"0 < sm_count < {sm_total} for the send, got {k!r}")
            compute = (sm_total - k) // max(1, granularity) * max(1, granularity)
            works.append(TaskWork(((stage_kernels[key], compute), (send_kernel, k))))
        out[t.name] = tuple(works)
    return out


# -- work-table files ----------------------------------------------------------------------

#: ``format`` of a work-table file (:func:`save_work`).
WORK_FORMAT = "energy-calculus/work-table"
WORK_VERSION = 1
_KERNEL_FIELDS = tuple(f.name for f in dataclasses.fields(SimKernel))
_KERNEL_FLOATS = ("flops", "bytes", "link_bytes", "compute_eff", "mem_eff", "activity",
                  "overhead_s", "link_bw_bps")
_KERNEL_INTS = ("sm_request", "tiles", "link_sm_sat")
_KERNEL_TEXTS = ("kappa", "theta")


def work_to_dict(work: WorkTable) -> dict[str, Any]:
    """The work-table file format of ``work`` (see :func:`save_work`)."""
    kernels: dict[str, dict[str, Any]] = {}
    tasks: dict[str, list[dict[str, Any]]] = {}
    for name, ws in work.items():
        rows = []
        for w in ws:
            for k, _ in w.streams:
                d = dataclasses.asdict(k)
                if kernels.setdefault(k.name, d) != d:
                    raise ExecutionError(f"work table: two different kernels are named {k.name!r}")
            rows.append({"streams": [{"kernel": k.name, "sm_count": sm} for k, sm in w.streams]})
        tasks[str(name)] = rows
    return {"format": WORK_FORMAT, "version": WORK_VERSION, "simulated": True,
            "kernels": kernels, "tasks": tasks}


def save_work(path: str | os.PathLike, work: WorkTable) -> Path:
    """Write a work table atomically as JSON::

        {"format": "energy-calculus/work-table", "version": 1, "simulated": true,
         "kernels": {"s0_forward": {<every measure.sim.SimKernel field>}, ...},
         "tasks": {"s0/forward/0": [{"streams": [{"kernel": "s0_forward", "sm_count": 116},
                                                  {"kernel": "p2p_send", "sm_count": 16}]},
                                     ...one entry per option, in option order]}}

    ``sm_count`` null: the whole device. Read back with :func:`load_work`."""
    return write_json_atomic(path, work_to_dict(work))


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


def work_from_dict(doc: Any, file: str = "<work table>") -> dict[str, tuple[TaskWork, ...]]:
    """Inverse of :func:`work_to_dict`; strict: every problem is a
    :class:`~frontier.errors.FormatError` naming the file and the field."""
    d = _fields(file, "$", doc, ("format", "version", "simulated", "kernels", "tasks", "description"),
                ("format", "version", "kernels", "tasks"))
    if d["format"] != WORK_FORMAT:
        raise FormatError(file, "format", f"expected {WORK_FORMAT!r}, got {d['format']!r}")
    if d["version"] != WORK_VERSION or isinstance(d["version"], bool):
        raise FormatError(file, "version", f"expected {WORK_VERSION}, got {d['version']!r}")
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


def load_work(path: str | os.PathLike) -> dict[str, tuple[TaskWork, ...]]:
    """Read a work table written by :func:`save_work` (strict; see :func:`work_from_dict`)."""
    return work_from_dict(read_json(path), str(path))


# -- records and results -------------------------------------------------------------------

@dataclass(frozen=True)
class TaskRun:
    """One task in one measured step. Times are virtual seconds from the step's start (the
    same origin on every device); ``switch_s`` the ω_dev settle time paid right before it,
    ``wait_s`` the ready-power idle waiting for predecessors after that; ``true_energy_j``
    the simulator's exact energy of the task's run (ground truth, not a counter reading)."""

    step: int
    name: str
    device: str
    option: int
    label: str
    work: str
    start_s: float
    end_s: float
    switch_s: float
    wait_s: float
    true_energy_j: float | None

    @property
    def time_s(self) -> float:
        """Duration of the co-run, s."""
        return self.end_s - self.start_s


@dataclass(frozen=True)
class DeviceWindow:
    """One device's counter window over one step: ``energy_j = counter_end_j −
    counter_start_j − ready_power_w × tail_s``; ``true_energy_j``: the simulator's exact
    energy over the step (start tick to the makespan), for checking the counter."""

    step: int
    device: str
    counter_start_j: float
    counter_end_j: float
    tail_s: float
    ready_power_w: float
    energy_j: float
    finish_s: float
    makespan_s: float
    true_energy_j: float | None


@dataclass(frozen=True)
class Comparison:
    """Predicted against measured T and E for one device or the step, with Eq. 23."""

    name: str
    predicted_time_s: float
    sd_predicted_time_s: float
    predicted_energy_j: float
    sd_predicted_energy_j: float
    measured_time_s: float
    sd_measured_time_s: float
    measured_energy_j: float
    sd_measured_energy_j: float
    n_steps: int
    deviation: DeviationResult

    @property
    def flagged(self) -> bool:
        """Eq. 23 flags T or E."""
        return self.deviation.flagged

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "deviation"}
        d["deviation"] = self.deviation.to_dict()
        d["flagged"] = self.flagged
        return d


@dataclass(frozen=True)
class ExecutionResult:
    """A plan held against its execution (see the module docstring).

    ``step`` and ``devices`` compare prediction and measurement; ``tasks`` has every task of
    every measured step; ``windows`` every device's counter window; ``switches_s`` the ω_dev
    switches the executor paid (device → list of settle times, one step) against
    ``planned_switch_s`` (what the plan charged per switch on that device, summed).
    """

    plan: str
    method: str
    simulated: bool
    device_kind: str
    seed: int
    target_rse: float
    rse_energy: float
    converged: bool
    n_steps: int
    warmup_steps: int
    alpha: float
    step: Comparison
    devices: tuple[Comparison, ...]
    tasks: tuple[TaskRun, ...] = field(repr=False)
    windows: tuple[DeviceWindow, ...] = field(repr=False)
    switches_s: Mapping[str, tuple[float, ...]] = field(default_factory=dict, repr=False)
    planned_switch_s: Mapping[str, float] = field(default_factory=dict, repr=False)
    meta: Mapping[str, Any] = field(default_factory=dict, repr=False)
    #: the deadline the plan was made to keep (its ``target_deadline_s``; None: not known)
    deadline_s: float | None = None
    #: the plan's own P(makespan ≤ deadline) from its propagated σ (None: not known)
    predicted_p_meets_deadline: float | None = None

    @property
    def flagged(self) -> bool:
        """Eq. 23 flags the step (T or E)."""
        return self.step.flagged

    @property
    def deadline_met(self) -> bool | None:
        """Whether the measured step (mean over the measured steps) meets the plan's deadline
        (within 1 ns per s); None when the plan states none."""
        if self.deadline_s is None:
            return None
        return self.step.measured_time_s <= self.deadline_s * (1.0 + 1e-9)

    @property
    def steps_over_deadline(self) -> int:
        """Measured steps that took longer than the deadline (0 when there is none)."""
        if self.deadline_s is None:
            return 0
        times = self.meta.get("step_times_s", ())
        return sum(1 for t in times if t > self.deadline_s * (1.0 + 1e-9))

    def deadline_line(self) -> str | None:
        """``deadline 1372.40 ms: met, ...`` or ``deadline ... MISSED by X ms (Y %)``."""
        if self.deadline_s is None:
            return None
        D = self.deadline_s
        m, sd = self.step.measured_time_s, self.step.sd_measured_time_s
        diff = m - D
        head = (f"deadline {D * 1e3:.2f} ms: " +
                (f"met, {-diff * 1e3:.2f} ms ({-diff / D:.2%}) to spare" if self.deadline_met
                 else f"MISSED by {diff * 1e3:.2f} ms ({diff / D:+.2%})"))
        n = len(self.meta.get("step_times_s", ())) or self.n_steps
        tail = (f"; measured step {m * 1e3:.2f} ± {sd * 1e3:.2f} ms, {self.steps_over_deadline} of {n} "
                "steps over")
        p = self.predicted_p_meets_deadline
        if p is not None:
            shown = (f"{p:.1f}" if p in (0.0, 1.0) and self.step.sd_predicted_time_s == 0
                     else ">0.9999" if p > 0.99995 else "<0.0001" if p < 0.00005 else f"{p:.4f}")
            tail += f"; the plan's P(makespan <= deadline) {shown}"
        return head + tail

    def problems(self) -> list[str]:
        """What went wrong, one phrase each: a missed deadline, the step's and each device's
        Eq. 23 flags. Empty: the run kept the plan's deadline and its prediction."""
        out = []
        if self.deadline_met is False:
            diff = self.step.measured_time_s - self.deadline_s
            out.append(f"deadline MISSED by {diff * 1e3:.2f} ms ({diff / self.deadline_s:+.2%})")
        for c in (self.step, *self.devices):
            if c.flagged:
                dv = c.deviation
                what = "+".join(s for s, f in (("T", dv.flagged_time), ("E", dv.flagged_energy)) if f)
                out.append(f"{c.name} FLAGGED {what} (Eq. 23)")
        return out

    @property
    def flagged_devices(self) -> tuple[str, ...]:
        """Devices whose own Eq. 23 test flags."""
        return tuple(c.name for c in self.devices if c.flagged)

    def task_means(self) -> dict[str, dict[str, float]]:
        """Per task: measured duration, switch and wait (means over steps), the simulator's true
        energy (mean), and the plan's T and E are in ``meta['planned_tasks']``."""
        acc: dict[str, list[TaskRun]] = {}
        for r in self.tasks:
            acc.setdefault(r.name, []).append(r)
        out = {}
        for n, rs in acc.items():
            te = [r.true_energy_j for r in rs if r.true_energy_j is not None]
            out[n] = {"time_s": float(np.mean([r.time_s for r in rs])),
                      "switch_s": float(np.mean([r.switch_s for r in rs])),
                      "wait_s": float(np.mean([r.wait_s for r in rs])),
                      "true_energy_j": float(np.mean(te)) if te else math.nan}
        return out

    def attribution(self) -> dict[str, dict[str, float]]:
        """Where the energy and time deviations come from, per device and for the step.

        ``tasks_j``: Σ over the device's tasks of (simulator's true co-run energy − planned
        task energy), mean over steps; ``rest_j``: the rest of the deviation (idle, switches,
        counter error) = (measured − predicted E) − ``tasks_j``; ``busy_s``: Σ (measured −
        planned task duration); ``switch_s``: settle time paid − switch time planned. Needs
        the simulator's per-task truth (NaN for ``tasks_j`` without it)."""
        planned = self.meta["planned_tasks"]
        means = self.task_means()
        out = {}
        for c in self.devices:
            names = [n for n, p in planned.items() if p["device"] == c.name]
            tasks_j = sum(means[n]["true_energy_j"] - planned[n]["energy_j"] for n in names)
            busy_s = sum(means[n]["time_s"] - planned[n]["time_s"] for n in names)
            sw = sum(self.switches_s.get(c.name, ())) - self.planned_switch_s.get(c.name, 0.0)
            err = c.measured_energy_j - c.predicted_energy_j
            out[c.name] = {"error_j": err, "tasks_j": tasks_j, "rest_j": err - tasks_j,
                           "busy_s": busy_s, "switch_s": sw,
                           "error_time_s": c.measured_time_s - c.predicted_time_s}
        out["step"] = {k: sum(v[k] for v in out.values()) for k in
                       ("error_j", "tasks_j", "rest_j", "busy_s", "switch_s")}
        out["step"]["error_time_s"] = self.step.measured_time_s - self.step.predicted_time_s
        return out

    def summary(self) -> str:
        """A text table: step and devices, predicted vs measured, Eq. 23 verdicts."""
        tag = "SIMULATED" if self.simulated else "measured"
        head = (f"{self.plan} [{self.method}] run on {len(self.devices)} x {self.device_kind} "
                f"({tag}), {self.n_steps} steps after {self.warmup_steps} warm-up, "
                f"RSE(E) {self.rse_energy:.2%} (target {self.target_rse:.2%}"
                f"{'' if self.converged else ', NOT reached'}), alpha {self.alpha:g}")
        cols = (f"  {'':<10}{'T pred ms':>11}{'T meas ms':>16}{'dT %':>8}"
                f"{'E pred J':>18}{'E meas J':>18}{'dE %':>8}  Eq. 23")
        lines = [head, cols]
        for c in (self.step, *self.devices):
            dv = c.deviation
            verdict = "ok"
            if dv.flagged:
                verdict = "FLAGGED " + "+".join(s for s, f in (("T", dv.flagged_time),
                                                               ("E", dv.flagged_energy)) if f)
            lines.append(
                f"  {c.name:<10}{c.predicted_time_s * 1e3:>11.2f}"
                f"{c.measured_time_s * 1e3:>10.2f}±{c.sd_measured_time_s * 1e3:<5.2f}"
                f"{dv.error_time_pct:>+8.2f}"
                f"{c.predicted_energy_j:>11.2f}±{c.sd_predicted_energy_j:<6.2f}"
                f"{c.measured_energy_j:>11.2f}±{c.sd_measured_energy_j:<6.2f}"
                f"{dv.error_energy_pct:>+8.2f}  {verdict} (zT={dv.z_time:+.1f}, zE={dv.z_energy:+.1f},"
                f" c={dv.c_alpha:.2f})")
        dl = self.deadline_line()
        if dl is not None:
            lines.append(f"  {dl}")
        paid = sum(sum(v) for v in self.switches_s.values())
        planned = sum(self.planned_switch_s.values())
        n_sw = sum(len(v) for v in self.switches_s.values())
        lines.append(f"  switches per step: {n_sw}, settle time paid {paid * 1e3:.2f} ms "
                     f"(plan charged {planned * 1e3:.2f} ms)")
        if self.simulated:
            a = self.attribution()["step"]
            lines.append(f"  step dE {a['error_j']:+.2f} J = tasks (true co-run - planned) "
                         f"{a['tasks_j']:+.2f} J + idle/switch/counter {a['rest_j']:+.2f} J; "
                         f"busy {a['busy_s'] * 1e3:+.2f} ms, switches {a['switch_s'] * 1e3:+.2f} ms")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``schema_version`` ``ecal.execution/1``); says simulated."""
        return {
            "schema_version": "ecal.execution/1",
            "simulated": self.simulated,
            "note": SIMULATED_NOTE if self.simulated else "measured on the devices named",
            "plan": self.plan, "method": self.method, "device_kind": self.device_kind,
            "seed": self.seed, "target_rse": self.target_rse, "rse_energy": self.rse_energy,
            "converged": self.converged, "n_steps": self.n_steps,
            "warmup_steps": self.warmup_steps, "alpha": self.alpha, "flagged": self.flagged,
            "deadline": None if self.deadline_s is None else {
                "deadline_s": self.deadline_s, "met": self.deadline_met,
                "missed_by_s": self.step.measured_time_s - self.deadline_s,
                "steps_over": self.steps_over_deadline,
                "predicted_p_meets_deadline": self.predicted_p_meets_deadline},
            "problems": self.problems(),
            "step": self.step.to_dict(), "devices": [c.to_dict() for c in self.devices],
            "switches_s": {k: list(v) for k, v in self.switches_s.items()},
            "planned_switch_s": dict(self.planned_switch_s),
            "tasks": [dict(vars(r)) for r in self.tasks],
            "windows": [dict(vars(w)) for w in self.windows],
            "meta": dict(self.meta),
        }


# -- prediction per device -----------------------------------------------------------------

@dataclass(frozen=True)
class _Prediction:
    time_s: float
    sd_time_s: float
    energy_j: float
    sd_energy_j: float


def _chosen(plan: Any, problem: Any) -> list[int]:
    """The plan's option per task in problem order, checked against the problem."""
    ix = problem.index
    by_name = {t.name: t for t in plan.tasks}
    if set(by_name) != set(ix.names) or len(plan.tasks) != ix.n:
        extra = sorted(set(by_name) - set(ix.names))[:3]
        missing = sorted(set(ix.names) - set(by_name))[:3]
        raise ExecutionError(f"plan {plan.problem!r} does not match problem {problem.name!r}: "
                             f"tasks only in the plan {extra}, only in the problem {missing}")
    choice = []
    for t in problem.tasks:
        tp = by_name[t.name]
        if tp.device != t.device:
            raise ExecutionError(f"task {t.name!r}: the plan puts it on {tp.device!r}, the problem "
                                 f"on {t.device!r}")
        j = int(tp.option)
        if not 0 <= j < len(t.options):
            raise ExecutionError(f"task {t.name!r}: plan option {j} does not exist (the problem has "
                                 f"{len(t.options)}); was the plan made for another problem?")
        o = t.options[j]
        same = (o.label == tp.label and math.isclose(o.time_s, tp.time_s, rel_tol=1e-9)
                and math.isclose(o.energy_j, tp.energy_j, rel_tol=1e-9))
        if not same:
            raise ExecutionError(f"task {t.name!r}: plan option {j} is {tp.label!r} "
                                 f"(T {tp.time_s:.6g} s, E {tp.energy_j:.6g} J) but the problem's is "
                                 f"{o.label!r} (T {o.time_s:.6g} s, E {o.energy_j:.6g} J); was the "
                                 "plan made for another problem (e.g. a sub-problem)?")
        choice.append(j)
    return choice


def predict_devices(plan: Any, problem: Any) -> dict[str, _Prediction]:
    """Per-device predicted (finish time, energy) with delta-method σ (see module docstring).
    The energies sum to ``plan.energy_j`` (checked)."""
    ix = problem.index
    choice = _chosen(plan, problem)
    start, end, mk = ix.schedule(choice)
    tau = ix.switch_tau(choice)
    n = ix.n
    crit = [False] * n
    # the problem's own critical-path walk and delta method (duck-typed: measure does not
    # import solvers): shared leaves are correlated exactly as in the plan's σ
    for i in ix.critical_chain(start, end, tau):
        crit[i] = True
    # each device's share of the plan's energy, by the problem's own accounting
    energies = ix.device_energies_j(choice, mk)
    out = {}
    for d in ix.devices:
        seq = ix.dev_seq.get(d, [])
        energy = energies[d]
        var_e = problem.plan_terms(choice, crit, devices=[d]).variances()[1]
        if seq:
            last = max(seq, key=lambda i: end[i])
            fin = float(end[last])
            chain = [False] * n
            for i in ix.critical_chain(start, end, tau, last):
                chain[i] = True
            var_t = problem.plan_terms(choice, chain, devices=[]).variances()[0]
        else:
            fin, var_t = 0.0, 0.0
        out[d] = _Prediction(fin, math.sqrt(var_t), float(energy), math.sqrt(var_e))
    total = sum(p.energy_j for p in out.values())
    if not math.isclose(total, plan.energy_j, rel_tol=1e-9, abs_tol=1e-9):
        raise ExecutionError(f"plan {plan.problem!r}: its energy {plan.energy_j:.6g} J is not what "
                             f"the problem gives for its choices ({total:.6g} J); another problem?")
    return out


# -- execution -----------------------------------------------------------------------------

@dataclass
class _Runner:
    """Runs one step of the plan on the devices (mutable bookkeeping for one execution)."""

    problem: Any
    choice: list[int]
    works: list[TaskWork | CallableWork]
    gpus: Mapping[str, Device]
    ops: list[OperatingPoint]
    #: die temperature at the end of each task of the measured steps, per task name, °C.
    #: Simulated devices only: there the reading is free, while on a real GPU an NVML call
    #: between tasks would delay the next launch inside the measured window.
    task_temps_c: dict[str, list[float]] = field(default_factory=dict)

    def first_op(self, d: str) -> OperatingPoint | None:
        seq = self.problem.index.dev_seq.get(d, [])
        return self.ops[seq[0]] if seq else None

    def last_op(self, d: str) -> OperatingPoint | None:
        seq = self.problem.index.dev_seq.get(d, [])
        return self.ops[seq[-1]] if seq else None

    def set_op(self, gpu: Device, op: OperatingPoint | None) -> float:
        """Set ω_dev when it differs from what is in force; the settle time paid (virtual s)."""
        if op is None or _merged(gpu.get_operating_point(), op) == gpu.get_operating_point().dev:
            return 0.0
        t0 = gpu.time_s()
        gpu.set_operating_point(op)
        return gpu.time_s() - t0

    def step(self, k: int, origin: Mapping[str, float]) -> tuple[list[TaskRun], float, dict[str, float]]:
        """Run every task once; returns its records, the makespan and each device's finish."""
        ix = self.problem.index
        end = [0.0] * ix.n
        runs: list[TaskRun] = []
        finish = {d: 0.0 for d in self.gpus}
        for v in ix.order:
            d = ix.device[v]
            gpu = self.gpus[d]
            # Switch right after the device's previous task, then wait: the plan's model
            # (start >= previous end + τ and >= every predecessor's end).
            switch = self.set_op(gpu, self.ops[v])
            ready = max((end[u] for u in ix.preds[v]), default=0.0)
            wait = max(0.0, ready - (gpu.time_s() - origin[d]))
            if wait > 0:
                gpu.idle(wait)
            start = gpu.time_s() - origin[d]
            e0 = _true(gpu)
            w = self.works[v]
            if isinstance(w, CallableWork):
                gpu.run(w.work, 1, w.sm_count)
            else:
                gpu.run_parallel(w.parallel_streams())
            end[v] = gpu.time_s() - origin[d]
            e1 = _true(gpu)
            if k >= 0 and gpu.simulated:
                self.task_temps_c.setdefault(self.problem.tasks[v].name, []).append(
                    float(gpu.temperature_c()))
            finish[d] = end[v]
            t = self.problem.tasks[v]
            runs.append(TaskRun(k, t.name, d, self.choice[v], t.options[self.choice[v]].label,
                                self.works[v].label(), start, end[v], switch, wait,
                                None if e0 is None or e1 is None else e1 - e0))
        return runs, max(end), finish


def _merged(cur: OperatingPoint, op: OperatingPoint) -> OperatingPoint:
    """ω_dev that setting ``op`` over ``cur`` results in (unset knobs keep their value)."""
    return OperatingPoint(
        op.sm_clock_mhz if op.sm_clock_mhz is not None else cur.sm_clock_mhz,
        op.mem_clock_mhz if op.mem_clock_mhz is not None else cur.mem_clock_mhz,
        op.power_limit_w if op.power_limit_w is not None else cur.power_limit_w)


def _true(gpu: Device) -> float | None:
    f = getattr(gpu, "true_energy_j", None)
    return float(f()) if callable(f) else None


def _works(problem: Any, choice: list[int], work: WorkTable) -> list[TaskWork | CallableWork]:
    out = []
    for i, t in enumerate(problem.tasks):
        ws = work.get(t.name) if isinstance(work, Mapping) else None
        if ws is None:
            raise ExecutionError(f"task {t.name!r} has no work: the work table names no kernels "
                                 "for it")
        ws = tuple(ws)
        if len(ws) != len(t.options):
            raise ExecutionError(f"task {t.name!r}: the work table has {len(ws)} entries for its "
                                 f"{len(t.options)} options")
        w = ws[choice[i]]
        if not isinstance(w, (TaskWork, CallableWork)):
            raise ExecutionError(f"task {t.name!r} option {choice[i]} has no work (got {w!r})")
        out.append(w)
    return out


def simulated_devices(names: Sequence[str], seed: int = 0) -> dict[str, Device]:
    """One simulated H200 per plan device, as :func:`run_plan` opens them by default: each
    device's noise a function of the seed and its name."""
    out: dict[str, Device] = {}
    for d in names:
        gpu = SimulatedGPU(seed=seed)
        gpu.seed_point(f"run_plan/{d}")
        out[d] = gpu
    return out


def _open_devices(names: Sequence[str], seed: int, devices: Mapping[str, Device] | None,
                  co_runs: Sequence[str] = ()) -> dict[str, Device]:
    """One simulated H200 per plan device, or the ``devices`` given; the devices in
    ``co_runs`` (those with a :class:`TaskWork` to run) must co-run streams."""
    if devices is None:
        return simulated_devices(names, seed)
    missing = [d for d in names if d not in devices]
    if missing:
        raise ExecutionError(f"no device given for plan device(s) {missing}")
    for d in co_runs:
        if not callable(getattr(devices[d], "run_parallel", None)):
            raise ExecutionError(f"device {d!r} ({devices[d].name}) cannot co-run streams "
                                 "(run_parallel), which its TaskWork co-runs need: give CallableWork "
                                 "(one callable per task) for a real GPU")
    return {d: devices[d] for d in names}


def _measured(name: str, times: Sequence[float], energies: Sequence[float]) -> Signature:
    return Signature.from_runs(name, times, energies, s_w=0.0, meta={"source": "run_plan"})


def _compare(name: str, pred: _Prediction, times: Sequence[float], energies: Sequence[float],
             alpha: float, n_tests: int) -> Comparison:
    p = Signature.from_point(name, pred.time_s, pred.energy_j, 0.0, pred.sd_time_s, pred.sd_energy_j)
    m = _measured(name, times, energies)
    dv = deviation(p, m, alpha=alpha, n_tests=n_tests, name=name)
    return Comparison(name, pred.time_s, pred.sd_time_s, pred.energy_j, pred.sd_energy_j,
                      m.time_s, m.sd_time_s, m.energy_j, m.sd_energy_j, len(times), dv)


def run_plan(plan: Any, problem: Any, work: WorkTable, *, seed: int = 0,
             protocol: Protocol = Protocol(), warmup_steps: int = 1, alpha: float = 0.05,
             devices: Mapping[str, Device] | None = None) -> ExecutionResult:
    """Execute ``plan`` (made for ``problem``) step after step and hold it against Eq. 23.

    ``work`` maps each task name to one :class:`TaskWork` per option (see
    :func:`pipeline_work`). ``devices`` defaults to one ``SimulatedGPU(seed)`` per plan
    device (its noise reseeded from the device name). ``protocol`` gives the repetition rule
    (``target_rse`` on the step energy, ``min_windows``/``max_windows`` steps), the window
    kind and the ready-power windows. Per-device tests use a Bonferroni correction over the
    devices; the step test uses ``alpha`` alone.

    Raises :class:`ExecutionError` when the plan does not match the problem or a task has no
    work.
    """
    if warmup_steps < 0:
        raise ExecutionError(f"warmup_steps must be >= 0, got {warmup_steps!r}")
    choice = _chosen(plan, problem)
    works = _works(problem, choice, work)
    preds = predict_devices(plan, problem)
    ix = problem.index
    names = list(ix.devices)
    co_runs = sorted({ix.device[i] for i, w in enumerate(works) if isinstance(w, TaskWork)})
    gpus = _open_devices(names, seed, devices, co_runs)
    ops = [problem.tasks[i].options[choice[i]].omega.dev for i in range(ix.n)]
    runner = _Runner(problem, choice, works, gpus, ops)

    with contextlib.ExitStack() as stack:   # never leave a device changed (issue 18)
        for g in gpus.values():
            stack.enter_context(restoring(g))
        ready_w, tasks, windows, step_e, step_t, dev_e, dev_t, k = _measure_steps(
            runner, names, protocol, warmup_steps)

    step_pred = _Prediction(plan.makespan_s, plan.sd_makespan_s, plan.energy_j, plan.sd_energy_j)
    step = _compare("step", step_pred, step_t, step_e, alpha, 1)
    per_dev = tuple(_compare(d, preds[d], dev_t[d], dev_e[d], alpha, len(names)) for d in names)
    switches = {d: tuple(r.switch_s for r in tasks if r.step == 0 and r.device == d and r.switch_s > 0)
                for d in names}
    tau = ix.switch_tau(choice)
    planned_sw = {d: float(sum(tau[i] for i in ix.dev_seq.get(d, []))) for d in names}
    simulated = all(getattr(g, "simulated", False) for g in gpus.values())
    kind = next(iter(gpus.values())).name if gpus else "none"
    rse = relative_se(step_e)
    planned_tasks = {t.name: {"device": t.device, "start_s": t.start_s, "end_s": t.end_s,
                              "time_s": t.time_s, "energy_j": t.energy_j} for t in plan.tasks}
    deadline = getattr(plan, "target_deadline_s", getattr(plan, "deadline_s", None))
    p_meet = getattr(plan, "p_meets_deadline", None)
    return ExecutionResult(
        plan=plan.problem, method=plan.method, simulated=simulated, device_kind=kind, seed=int(seed),
        target_rse=protocol.target_rse, rse_energy=rse, converged=rse <= protocol.target_rse,
        n_steps=k, warmup_steps=int(warmup_steps), alpha=float(alpha), step=step, devices=per_dev,
        tasks=tuple(tasks), windows=tuple(windows), switches_s=switches, planned_switch_s=planned_sw,
        meta={"ready_power_w": ready_w, "protocol": protocol.to_dict(),
              "temperature_c": _device_means(runner.task_temps_c, ix),
              "task_temperature_c": {t: float(np.mean(v)) for t, v in runner.task_temps_c.items()},
              "step_energies_j": step_e, "step_times_s": step_t, "planned_tasks": planned_tasks,
              "bonferroni_devices": len(names),
              "device_time": "finish of the device's last task; energy over the whole step"},
        deadline_s=None if deadline is None else float(deadline),
        predicted_p_meets_deadline=None if p_meet is None else float(p_meet))


def _device_means(task_values: Mapping[str, list[float]], ix: Any) -> dict[str, float]:
    """Mean over every sample of each device's tasks (simulated runs only; else empty)."""
    by_dev: dict[str, list[float]] = {}
    for name, vals in task_values.items():
        by_dev.setdefault(ix.device[ix.pos[name]], []).extend(vals)
    return {d: float(np.mean(v)) for d, v in by_dev.items() if v}


def _measure_steps(runner: _Runner, names: list[str], protocol: Protocol, warmup_steps: int) -> tuple:
    """Ready power, warm-up, then measured steps until the target RSE (see :func:`run_plan`)."""
    gpus = runner.gpus
    # Ready power at the ω each device ends a step in (the tail is idle there).
    ready_w = {}
    for d, gpu in gpus.items():
        runner.set_op(gpu, runner.last_op(d))
        ready_w[d] = measure_ready_power_w(gpu, protocol)
    tick = protocol.window == "tick_aligned"

    # A steady-state plan charges each device's switch from its last task back to its first
    # (the step repeats): that switch is made inside the window, as the step's first. Any
    # other plan charges no switch before a device's first task: it is made outside.
    steady = bool(getattr(runner.problem, "steady_state", False))

    def start_window() -> tuple[dict[str, float], dict[str, float], dict[str, float | None]]:
        origin, e_start, t_start = {}, {}, {}
        for d, gpu in gpus.items():
            if not steady:
                runner.set_op(gpu, runner.first_op(d))
            if tick:
                origin[d], e_start[d] = wait_for_tick(gpu, protocol.tick_timeout_s, protocol.poll_s)
            else:
                e_start[d], origin[d] = gpu.energy_j(), gpu.time_s()
            t_start[d] = _true(gpu)
        return origin, e_start, t_start

    for _ in range(warmup_steps):     # unmeasured steps: the devices warm up as in training
        origin = {}
        for d, g in gpus.items():
            if not steady:
                runner.set_op(g, runner.first_op(d))
            origin[d] = g.time_s()
        _, mk, _ = runner.step(-1, origin)
        for d, g in gpus.items():
            left = mk - (g.time_s() - origin[d])
            if left > 0:
                g.idle(left)

    tasks: list[TaskRun] = []
    windows: list[DeviceWindow] = []
    step_e: list[float] = []
    step_t: list[float] = []
    dev_e: dict[str, list[float]] = {d: [] for d in names}
    dev_t: dict[str, list[float]] = {d: [] for d in names}
    k = 0
    while k < protocol.max_windows:
        origin, e_a, true_a = start_window()
        runs, mk, finish = runner.step(k, origin)
        tasks += runs
        total = 0.0
        for d, gpu in gpus.items():
            left = mk - (gpu.time_s() - origin[d])
            if left > 0:
                gpu.idle(left)          # hold the step to the makespan at ready power
            true_b = _true(gpu)
            t_end = gpu.time_s()
            if tick:
                t_b, e_b = wait_for_tick(gpu, protocol.tick_timeout_s, protocol.poll_s)
                tail = t_b - t_end
            else:
                e_b, tail = gpu.energy_j(), 0.0
            e = (e_b - e_a[d]) - ready_w[d] * tail
            total += e
            dev_e[d].append(e)
            dev_t[d].append(finish.get(d, 0.0))
            tr = None if true_a[d] is None or true_b is None else true_b - true_a[d]
            windows.append(DeviceWindow(k, d, e_a[d], e_b, tail, ready_w[d], e, finish.get(d, 0.0),
                                        mk, tr))
        step_e.append(total)
        step_t.append(mk)
        k += 1
        if k >= protocol.min_windows and relative_se(step_e) <= protocol.target_rse:
            break
    return ready_w, tasks, windows, step_e, step_t, dev_e, dev_t, k


# -- savings against baselines -------------------------------------------------------------

@dataclass(frozen=True)
class Savings:
    """1 − E_plan/E_baseline, predicted (from the plans) and measured (from the runs), with σ
    propagated from both sides as independent estimates (first order)."""

    baseline: str
    predicted: float
    sd_predicted: float
    measured: float
    sd_measured: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return dict(vars(self))


def _ratio_savings(e_p: float, s_p: float, e_b: float, s_b: float) -> tuple[float, float]:
    r = e_p / e_b
    return 1.0 - r, r * math.sqrt((s_p / e_p) ** 2 + (s_b / e_b) ** 2)


def savings(plan_run: ExecutionResult, baseline_run: ExecutionResult, name: str) -> Savings:
    """Savings of ``plan_run`` against ``baseline_run``."""
    p, b = plan_run.step, baseline_run.step
    pr, spr = _ratio_savings(p.predicted_energy_j, p.sd_predicted_energy_j,
                             b.predicted_energy_j, b.sd_predicted_energy_j)
    ms, sms = _ratio_savings(p.measured_energy_j, p.sd_measured_energy_j,
                             b.measured_energy_j, b.sd_measured_energy_j)
    return Savings(name, pr, spr, ms, sms)


@dataclass(frozen=True)
class PlanComparison:
    """A plan and its baselines, each run and measured, with measured savings."""

    plan: ExecutionResult
    baselines: Mapping[str, ExecutionResult]
    savings: tuple[Savings, ...]

    def summary(self) -> str:
        """The plan's and baselines' tables, then the savings."""
        tag = "SIMULATED" if self.plan.simulated else "measured"
        parts = ["plan:", self.plan.summary()]
        for n, r in self.baselines.items():
            parts += [f"baseline {n}:", r.summary()]
        parts.append(f"savings ({tag}; σ from both sides):")
        for s in self.savings:
            parts.append(f"  vs {s.baseline:<16} predicted {s.predicted:+.2%} ± {s.sd_predicted:.2%}"
                         f"   measured {s.measured:+.2%} ± {s.sd_measured:.2%}")
        return "\n".join(parts)

    def problems(self) -> list[str]:
        """The plan's :meth:`ExecutionResult.problems` (what ``ecal run``'s exit status is
        about: the plan run is what is checked)."""
        return list(self.plan.problems())

    def notes(self) -> list[str]:
        """Each baseline's Eq. 23 flags: its own prediction deviates (reported, not the plan's
        problem; a baseline's deadline is not the plan's promise)."""
        return [f"baseline {n}: {x}" for n, r in self.baselines.items()
                for x in r.problems() if "FLAGGED" in x]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"simulated": self.plan.simulated, "plan": self.plan.to_dict(),
                "baselines": {n: r.to_dict() for n, r in self.baselines.items()},
                "savings": [s.to_dict() for s in self.savings], "problems": self.problems(),
                "notes": self.notes()}


def run_with_baselines(plan: tuple[Any, Any, WorkTable],
                       baselines: Mapping[str, tuple[Any, Any, WorkTable]],
                       **kwargs: Any) -> PlanComparison:
    """Run a plan and its baselines, each given as ``(plan, problem, work)``, with the same
    keyword arguments as :func:`run_plan`; measured savings against each baseline."""
    main = run_plan(*plan, **kwargs)
    runs = {n: run_plan(*b, **kwargs) for n, b in baselines.items()}
    return PlanComparison(main, runs, tuple(savings(main, r, n) for n, r in runs.items()))
