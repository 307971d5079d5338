"""What running a plan recorded: per-task runs, per-device counter windows, predicted against
measured T and E (:class:`Comparison`, Eq. 23), and the whole :class:`ExecutionResult` with
its text summary and its ``ecal.execution/1`` file form (written by
:meth:`ExecutionResult.to_dict`, read back by :func:`execution_from_dict`)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from frontier.deviation import DeviationResult
from frontier.errors import FormatError
from frontier.files import read_json
from frontier.formats import KINDS, content, validate

if TYPE_CHECKING:
    from .format_models import ComparisonModel, Deviation

SIMULATED_NOTE = "SIMULATED H200 (physics model; not a measurement of real hardware)"


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
        if self.deadline_met is False and self.deadline_s is not None:
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
        lines = [head]
        cal = self.meta.get("calibration")
        if isinstance(cal, Mapping):
            st = cal.get("step", {})
            lines.append(f"  predictions: the model plus the plan's calibration (offsets measured on "
                         f"{cal.get('runs')} run(s) by ecal tune: T {st.get('time_s', 0.0) * 1e3:+.2f} ms, "
                         f"E {st.get('energy_j', 0.0):+.2f} J)")
        lines.append(cols)
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
        """JSON-ready dict (``"format": "ecal.execution/1"``); says simulated."""
        return {
            "format": KINDS["execution"].tag,
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


# -- reading an execution file -------------------------------------------------------------
# The shape is execution.format_models.ExecutionFile; what is checked here is what it means.

def _deviation(d: Deviation) -> DeviationResult:
    kw = d.model_dump(exclude={"flagged"})
    # the writer writes an infinite z or % as null; its sign is the error's
    for k, err in (("z_time", "error_time_s"), ("z_energy", "error_energy_j"),
                   ("error_time_pct", "error_time_s"), ("error_energy_pct", "error_energy_j")):
        if kw[k] is None:
            kw[k] = math.copysign(math.inf, kw[err])
    return DeviationResult(**kw)


def _comparison(c: ComparisonModel) -> Comparison:
    kw = c.model_dump(exclude={"deviation", "flagged"})
    return Comparison(**kw, deviation=_deviation(c.deviation))


def execution_from_dict(doc: Any, file: str = "<execution>", path: str = "") -> ExecutionResult:
    """Inverse of :meth:`ExecutionResult.to_dict` (``ecal.execution/1``, or its older
    ``schema_version`` form); every fault is a one-line :class:`FormatError` naming ``file``
    and the field (under ``path`` when the execution is embedded, as in a run file)."""
    from .format_models import ExecutionFile

    try:
        _, body = content(file, doc, "execution")
    except FormatError as e:
        if not path:
            raise
        raise FormatError(file, path if e.path == "(top level)" else f"{path}.{e.path}",
                          e.problem) from None
    m = validate(ExecutionFile, body, file, prefix=path)
    at = f"{path}." if path else ""
    names = [c.name for c in m.devices]
    for i, n in enumerate(names):
        if n in names[:i]:
            raise FormatError(file, f"{at}devices[{i}].name", f"device {n!r} is listed twice")
    used: list[tuple[str, str]] = [(f"tasks[{i}]", t.device) for i, t in enumerate(m.tasks)]
    used += [(f"windows[{i}]", w.device) for i, w in enumerate(m.windows)]
    for where, d in used:
        if d not in names:
            raise FormatError(file, f"{at}{where}.device", f"no device {d!r} in 'devices'")
    dl = m.deadline
    return ExecutionResult(
        plan=m.plan, method=m.method, simulated=m.simulated, device_kind=m.device_kind,
        seed=m.seed, target_rse=m.target_rse, rse_energy=math.inf if m.rse_energy is None else m.rse_energy,
        converged=m.converged,
        n_steps=m.n_steps, warmup_steps=m.warmup_steps, alpha=m.alpha,
        step=_comparison(m.step), devices=tuple(_comparison(c) for c in m.devices),
        tasks=tuple(TaskRun(**t.model_dump()) for t in m.tasks),
        windows=tuple(DeviceWindow(**w.model_dump()) for w in m.windows),
        switches_s={k: tuple(v) for k, v in m.switches_s.items()},
        planned_switch_s=dict(m.planned_switch_s), meta=dict(m.meta),
        deadline_s=None if dl is None else dl.deadline_s,
        predicted_p_meets_deadline=None if dl is None else dl.predicted_p_meets_deadline)


def load_execution(path: str | os.PathLike) -> ExecutionResult:
    """Read an execution file (``ecal run --no-baselines -o``; see
    :func:`execution_from_dict`)."""
    return execution_from_dict(read_json(path), os.fspath(path))
