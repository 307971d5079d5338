"""Localize what a run of a 1F1B compute ∥ send plan deviates in, and measure it jointly.

:func:`localize` traces an execution (:class:`~execution.results.ExecutionResult`) to the
switch settle times paid against planned, each chosen co-run against its option (the
runtime-context test of spec §4.1) and the ready power in the pipeline bubbles;
:func:`characterize_jointly` then measures the deviating compute ∥ send pairs together (an
interaction table). ``ecal demo`` closes its loop with these; everything runs on the
simulated H200.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from frontier.deviation import DeviationResult
from frontier.errors import InputError
from frontier.insensitivity import ContextTest, runtime_test
from frontier.interaction import InteractionTable
from frontier.operating_point import OperatingPoint
from frontier.signature import Signature
from measure.device import restoring
from measure.joint import JointPair, characterize_pairs
from measure.protocol import Protocol, measure_ready_power_w
from measure.sim import PRESETS, SimKernel, SimulatedGPU
from solvers.model import Problem
from solvers.plan import Plan

from .pipeline import SM_TOTAL, compute_sms
from .predict import chosen_options
from .results import ExecutionResult, TaskRun


@dataclass(frozen=True)
class Round:
    """One plan of the loop: the problem it was made for, the plan, and its execution."""

    name: str
    problem: Problem
    plan: Plan
    execution: ExecutionResult

    @property
    def flagged(self) -> bool:
        """Eq. 23 flags the step (T or E)."""
        return bool(self.execution.flagged)


@dataclass(frozen=True)
class TaskCheck:
    """One chosen (task kind, option) of a plan held against its per-task windows (all
    microbatches and measured steps; the simulator's per-task truth): the runtime-context
    test of its compute ∥ send (``frontier.insensitivity.ContextTest``)."""

    kind: str
    element: str
    option: int
    label: str
    n_runs: int
    test: ContextTest

    @property
    def deviation(self) -> DeviationResult:
        """The Eq. 23 part of the test (errors, z, noise band)."""
        return self.test.deviation

    @property
    def flagged(self) -> bool:
        """The co-run deviates beyond its noise band plus its Eq. 13 allowance (T or E)."""
        return not self.test.insensitive

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"kind": self.kind, "element": self.element, "option": self.option,
                "label": self.label, "n_runs": self.n_runs, "flagged": self.flagged,
                "test": self.test.to_dict()}


@dataclass(frozen=True)
class Localization:
    """What a flagged execution is traced to: switch settle times paid against planned (per
    device: switches, paid s, planned s), each chosen co-run against its option (Eq. 23,
    Bonferroni over them), and the bubble power (per device: the idle power the problem
    charged, the time-weighted ready power at the ω_dev in force during the measured waits,
    and the mean idle time per step)."""

    switches: Mapping[str, tuple[int, float, float]]
    tasks: tuple[TaskCheck, ...]
    idle: Mapping[str, tuple[float, float, float]]

    @property
    def flagged_tasks(self) -> tuple[TaskCheck, ...]:
        """The co-runs whose measurement deviates beyond σ."""
        return tuple(t for t in self.tasks if t.flagged)

    @property
    def flagged_elements(self) -> tuple[str, ...]:
        """Compute elements whose co-run with the send deviates (the pairs to measure jointly)."""
        return tuple(sorted({t.element for t in self.flagged_tasks}))

    @property
    def switch_paid_s(self) -> float:
        """Settle time paid per step, all devices."""
        return sum(v[1] for v in self.switches.values())

    @property
    def switch_planned_s(self) -> float:
        """Settle time the plan charged per step, all devices."""
        return sum(v[2] for v in self.switches.values())

    @property
    def n_switches(self) -> int:
        """Switches per step, all devices."""
        return sum(v[0] for v in self.switches.values())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"switches": {d: {"n": n, "paid_s": a, "planned_s": b} for d, (n, a, b) in self.switches.items()},
                "tasks": [t.to_dict() for t in self.tasks],
                "flagged_elements": list(self.flagged_elements),
                "idle": {d: {"charged_w": a, "bubble_w": b, "idle_s": c} for d, (a, b, c) in self.idle.items()}}


def measure_ready_powers(omegas: Sequence[OperatingPoint], seed: int) -> dict[OperatingPoint, float]:
    """Ready power at each ω_dev on a simulated H200 (tick-aligned, one window each): what a
    GPU waiting in a pipeline bubble draws at the ω_dev in force."""
    dev = SimulatedGPU(seed=seed)
    out = {}
    with restoring(dev):
        for o in omegas:
            dev.set_operating_point(o)
            out[o.dev] = measure_ready_power_w(dev, Protocol(ready_windows=1))
    return out


def localize(rnd: Round, sigs: Mapping[str, Sequence[Signature]], ready_w: Mapping[OperatingPoint, float],
             alpha: float = 0.05) -> Localization:
    """Trace a round's execution to switches, co-runs and bubbles (see :class:`Localization`).

    Each chosen (task kind, option) is the runtime-context test of spec §4.1
    (``frontier.insensitivity.runtime_test``): its co-runs measured in the plan's execution (the
    simulator's per-task windows, every microbatch and step) against compute ⊕ send of the
    elements characterized alone, judged against the noise band plus the Eq. 13 allowance."""
    ex, problem = rnd.execution, rnd.problem
    switches = {d: (len(v), float(sum(v)), float(ex.planned_switch_s.get(d, 0.0)))
                for d, v in ex.switches_s.items()}
    groups: dict[tuple[str, int], list[TaskRun]] = {}
    for r in ex.tasks:
        groups.setdefault((r.name.rsplit("/", 1)[0], r.option), []).append(r)
    opts = {t.name.rsplit("/", 1)[0]: t.options for t in problem.tasks}
    comm = {(s.omega.dev, s.omega.sm_count): s for s in sigs["p2p_send"]}
    checks = []
    for (kind, j), runs in sorted(groups.items()):
        o = opts[kind][j]
        stage, inst = kind.split("/")
        element = f"{stage}_{inst}"
        if o.omega.sm_count is None:
            raise InputError(f"localize: {kind} option {o.label} has no SM count (a split task)")
        k = int(o.omega.sm_count)
        compute = next(c for c in sigs[element]
                       if c.omega.dev == o.omega.dev and c.omega.sm_count == compute_sms(k))
        energies = [r.true_energy_j for r in runs]
        if any(e is None for e in energies):
            raise InputError(f"localize: {kind} has runs without per-task energy (the simulator "
                             "measures it; a real device's step window does not)")
        meas = Signature.from_runs(kind, [r.time_s for r in runs],
                                   [float(e) for e in energies if e is not None], s_w=o.s_w)
        test = runtime_test(compute, comm[(o.omega.dev, k)], meas, alpha=alpha, n_tests=len(groups),
                            sm_total=SM_TOTAL, name=f"{kind} {o.label}")
        checks.append(TaskCheck(kind, element, j, o.label, len(runs), test))
    ops = {t.name: t.options for t in problem.tasks}
    idle = {}
    for d in ex.switches_s:
        w_s = e_j = 0.0
        for r in ex.tasks:
            if r.device == d and r.wait_s > 0:
                w_s += r.wait_s
                e_j += r.wait_s * ready_w[ops[r.name][r.option].omega.dev]
        for w in ex.windows:
            if w.device != d:
                continue
            last = max((r for r in ex.tasks if r.device == d and r.step == w.step), key=lambda r: r.end_s)
            tail = w.makespan_s - w.finish_s
            w_s += tail
            e_j += tail * ready_w[ops[last.name][last.option].omega.dev]
        n = max(ex.n_steps, 1)
        charged = float(problem.index.power[d])
        idle[d] = (charged, e_j / w_s if w_s > 0 else charged, w_s / n)
    return Localization(switches, tuple(checks), idle)


def planned_bubble_power(plan: Plan, problem: Problem, ready_w: Mapping[OperatingPoint, float]) -> dict[str, float]:
    """Per device: the time-weighted ready power over the plan's own idle intervals (a wait
    before a task is spent at that task's ω_dev, after its switch; the tail at the last
    task's) — what its bubbles cost at the measured ready powers. A device without idle time
    keeps the problem's idle power."""
    ix = problem.index
    choice = chosen_options(plan, problem)
    start, end, mk = ix.schedule(choice)
    tau = ix.switch_tau(choice)
    out = {}
    for d in ix.devices:
        seq = ix.dev_seq.get(d, [])
        w_s = e_j = 0.0
        prev_end = 0.0
        for i in seq:
            gap = max(float(start[i]) - prev_end - float(tau[i]), 0.0)
            w_s += gap
            e_j += gap * ready_w[problem.tasks[i].options[choice[i]].omega.dev]
            prev_end = float(end[i])
        if seq:
            tail = max(mk - prev_end, 0.0)
            w_s += tail
            e_j += tail * ready_w[problem.tasks[seq[-1]].options[choice[seq[-1]]].omega.dev]
        out[d] = e_j / w_s if w_s > 0 else float(ix.power[d])
    return out


def characterize_jointly(kernels: Mapping[str, SimKernel],
                         points: Mapping[str, Sequence[tuple[OperatingPoint, int]]], *, seed: int = 0,
                         context_temp_c: Mapping[str, float] | None = None) -> InteractionTable:
    """The interaction table of each element ∥ p2p_send at the given (ω_dev, send SMs k),
    ``kernels`` giving each element's kernel (e.g. ``s0_forward``; :func:`stage_kernels`),
    measured together on a simulated H200 seeded ``seed``
    (``measure.joint.characterize_pairs``) with the
    protocol the elements were characterized with — in context when ``context_temp_c`` gives
    an element the die temperature its device held in the run (pre-heated to it: a tight
    power cap throttles harder on a hot die)."""
    desc = "stage compute || p2p send, simulated H200 (SIMULATED)"
    table = InteractionTable(description=desc)
    send = PRESETS["p2p_send"]
    dev = SimulatedGPU(seed=seed)
    for e, pts in points.items():
        for omega, k in pts:
            grid = ",".join(f"{knob}={v:g}" for knob, v in omega.dev.to_dict().items() if v is not None)
            pair = JointPair(e, kernels[e], "p2p_send", send, ((compute_sms(k), k),))
            temp = (context_temp_c or {}).get(e)
            proto = Protocol(context_temp_c=temp)
            table = table.merged(characterize_pairs(dev, [pair], grid, proto, progress=None))
    return table
