"""Run a plan: execute its DAG on devices, measure it, and hold it against Eq. 23.

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

Per-device prediction: :mod:`execution.predict`. Every number here is simulated when the devices are (``simulated`` in every output). A real
device has no per-task ground truth: its tasks' ``true_energy_j`` is None.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from frontier.deviation import deviation
from frontier.operating_point import OperatingPoint
from frontier.signature import Signature
from measure.device import Device, can_co_run, restoring
from measure.protocol import (
    Protocol,
    close_window,
    measure_ready_power_w,
    relative_se,
    wait_for_tick,
)
from measure.sim import SimulatedGPU
from solvers.calibration import plan_calibration
from solvers.context import in_context_plan
from solvers.model import Problem
from solvers.plan import Plan

from .predict import DevicePrediction, calibrated, chosen_options, predict_devices
from .results import Comparison, DeviceWindow, ExecutionResult, TaskRun
from .work import CallableWork, ExecutionError, TaskWork, WorkTable


@dataclass
class _Runner:
    """Runs one step of the plan on the devices (mutable bookkeeping for one execution)."""

    problem: Problem
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
        if op is None or merged_operating_point(gpu.get_operating_point(), op) == gpu.get_operating_point().dev:
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


def merged_operating_point(cur: OperatingPoint, op: OperatingPoint) -> OperatingPoint:
    """ω_dev that setting ``op`` over ``cur`` results in (unset knobs keep their value)."""
    return OperatingPoint(
        op.sm_clock_mhz if op.sm_clock_mhz is not None else cur.sm_clock_mhz,
        op.mem_clock_mhz if op.mem_clock_mhz is not None else cur.mem_clock_mhz,
        op.power_limit_w if op.power_limit_w is not None else cur.power_limit_w)


def _true(gpu: Device) -> float | None:
    f = getattr(gpu, "true_energy_j", None)
    return float(f()) if callable(f) else None


def _works(problem: Problem, choice: list[int], work: WorkTable) -> list[TaskWork | CallableWork]:
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
        if not can_co_run(devices[d]):
            raise ExecutionError(f"device {d!r} ({devices[d].name}) cannot co-run streams "
                                 "(run_parallel), which its TaskWork co-runs need: give CallableWork "
                                 "(one callable per task) for a real GPU")
    return {d: devices[d] for d in names}


def _measured(name: str, times: Sequence[float], energies: Sequence[float]) -> Signature:
    return Signature.from_runs(name, times, energies, s_w=0.0, meta={"source": "run_plan"})


def _compare(name: str, pred: DevicePrediction, times: Sequence[float], energies: Sequence[float],
             alpha: float, n_tests: int) -> Comparison:
    p = Signature.from_point(name, pred.time_s, pred.energy_j, 0.0, pred.sd_time_s, pred.sd_energy_j)
    m = _measured(name, times, energies)
    dv = deviation(p, m, alpha=alpha, n_tests=n_tests, name=name)
    return Comparison(name, pred.time_s, pred.sd_time_s, pred.energy_j, pred.sd_energy_j,
                      m.time_s, m.sd_time_s, m.energy_j, m.sd_energy_j, len(times), dv)


def run_plan(plan: Plan, problem: Problem, work: WorkTable, *, seed: int = 0,
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
    choice = chosen_options(plan, problem)
    works = _works(problem, choice, work)
    ix = problem.index
    names = list(ix.devices)
    co_runs = sorted({ix.device[i] for i, w in enumerate(works) if isinstance(w, TaskWork)})
    gpus = _open_devices(names, seed, devices, co_runs)
    ops = [problem.tasks[i].options[choice[i]].omega.dev for i in range(ix.n)]
    runner = _Runner(problem, choice, works, gpus, ops)

    with contextlib.ExitStack() as stack:   # never leave a device changed (issue 18)
        for g in gpus.values():
            stack.enter_context(restoring(g))
        measured = Measured(*_measure_steps(runner, names, protocol, warmup_steps))

    simulated = all(getattr(g, "simulated", False) for g in gpus.values())
    kind = next(iter(gpus.values())).name if gpus else "none"
    return execution_result(plan, problem, choice, measured, protocol=protocol,
                            warmup_steps=warmup_steps, alpha=alpha, seed=seed,
                            simulated=simulated, device_kind=kind,
                            task_temps_c=runner.task_temps_c)


@dataclass(frozen=True)
class Measured:
    """What the measured steps of one plan run gave, on any number of devices: each
    device's ready power (W), the task runs and counter windows of every measured step, the
    step energies and makespans, each device's energy and finish per step, and the number
    of measured steps. :func:`execution_result` holds it against the plan."""

    ready_power_w: dict[str, float]
    tasks: list[TaskRun]
    windows: list[DeviceWindow]
    step_energies_j: list[float]
    step_times_s: list[float]
    device_energies_j: dict[str, list[float]]
    device_times_s: dict[str, list[float]]
    n_steps: int


def execution_result(plan: Plan, problem: Problem, choice: list[int], m: Measured, *,
                     protocol: Protocol, warmup_steps: int, alpha: float, seed: int,
                     simulated: bool, device_kind: str,
                     task_temps_c: Mapping[str, list[float]] | None = None,
                     meta: Mapping[str, Any] | None = None) -> ExecutionResult:
    """The :class:`ExecutionResult` of ``plan`` (made for ``problem``, its chosen options
    ``choice``) from what its steps measured: Eq. 23 per device (Bonferroni over the
    devices) and for the step, the switches made against those planned. The one result
    model of every run, simulated (:func:`run_plan`) or over several real GPUs
    (:mod:`execution.multi_gpu`); ``meta`` adds keys to the result's ``meta``."""
    ix = problem.index
    names = list(ix.devices)
    temps = dict(task_temps_c or {})
    # a plan composed with its entry context predicts what it takes there (solvers.context)
    pred_plan, pred_problem = in_context_plan(plan, problem)
    preds = predict_devices(pred_plan, pred_problem)
    # a plan made with a calibration (ecal tune) predicts model + measured offset, σ of both
    cal = plan_calibration(plan)
    step_pred = calibrated(DevicePrediction(pred_plan.makespan_s, pred_plan.sd_makespan_s,
                                            pred_plan.energy_j, pred_plan.sd_energy_j), cal.step)
    preds = {d: calibrated(p, cal.device(d)) for d, p in preds.items()}
    step = _compare("step", step_pred, m.step_times_s, m.step_energies_j, alpha, 1)
    per_dev = tuple(_compare(d, preds[d], m.device_times_s[d], m.device_energies_j[d], alpha,
                             len(names)) for d in names)
    switches = {d: tuple(r.switch_s for r in m.tasks
                         if r.step == 0 and r.device == d and r.switch_s > 0) for d in names}
    tau = ix.switch_tau(choice)
    planned_sw = {d: float(sum(tau[i] for i in ix.dev_seq.get(d, []))) for d in names}
    rse = relative_se(m.step_energies_j)
    planned_tasks = {t.name: {"device": t.device, "start_s": t.start_s, "end_s": t.end_s,
                              "time_s": t.time_s, "energy_j": t.energy_j} for t in pred_plan.tasks}
    deadline = plan.target_deadline_s
    p_meet = plan.p_meets_deadline
    return ExecutionResult(
        plan=plan.problem, method=plan.method, simulated=simulated, device_kind=device_kind,
        seed=int(seed), target_rse=protocol.target_rse, rse_energy=rse,
        converged=rse <= protocol.target_rse, n_steps=m.n_steps, warmup_steps=int(warmup_steps),
        alpha=float(alpha), step=step, devices=per_dev, tasks=tuple(m.tasks),
        windows=tuple(m.windows), switches_s=switches, planned_switch_s=planned_sw,
        meta={"ready_power_w": m.ready_power_w, "protocol": protocol.to_dict(),
              "temperature_c": _device_means(temps, problem),
              "task_temperature_c": {t: float(np.mean(v)) for t, v in temps.items()},
              "step_energies_j": m.step_energies_j, "step_times_s": m.step_times_s,
              "planned_tasks": planned_tasks, "bonferroni_devices": len(names),
              **({} if cal.is_null else {"calibration": cal.to_dict()}),
              "device_time": "finish of the device's last task; energy over the whole step",
              **dict(meta or {})},
        deadline_s=None if deadline is None else float(deadline),
        predicted_p_meets_deadline=None if p_meet is None else float(p_meet))


def _device_means(task_values: Mapping[str, list[float]], problem: Problem) -> dict[str, float]:
    """Mean over every sample of each device's tasks (simulated runs only; else empty)."""
    ix = problem.index
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
    steady = bool(runner.problem.steady_state)

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
            e_b, tail = close_window(gpu, protocol, tick)
            e = (e_b - e_a[d]) - ready_w[d] * tail
            total += e
            dev_e[d].append(e)
            dev_t[d].append(finish.get(d, 0.0))
            ta = true_a[d]
            tr = None if ta is None or true_b is None else true_b - ta
            windows.append(DeviceWindow(k, d, e_a[d], e_b, tail, ready_w[d], e, finish.get(d, 0.0),
                                        mk, tr))
        step_e.append(total)
        step_t.append(mk)
        k += 1
        if k >= protocol.min_windows and relative_se(step_e) <= protocol.target_rse:
            break
    return ready_w, tasks, windows, step_e, step_t, dev_e, dev_t, k


