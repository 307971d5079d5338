"""Plans composed with the entry context: the thermal mechanism in the planner (issue 29).

A plan's tasks are characterized alone, at the null context (entered cold). Run, each task
enters its device at the temperature the tasks and bubbles before it left behind
(:mod:`frontier.context`), and a task characterized at two or more entry temperatures
(:class:`~frontier.context.ContextualSignature`) takes the time and energy of that entry.
:func:`evaluate_in_context` composes a plan's choices that way, along every device:

- each device with a :class:`~frontier.context.ThermalMechanism` walks its tasks in order;
  a gap (bubble, switch latency) cools the die at the device's idle power, a task heats it
  with its own energy over its own duration, and the device idles from its last task to the
  makespan;
- a task whose chosen option has a contextual signature is shifted by what its entry
  temperature changes: ΔT = T(Θ) − T(Θ_ref) and ΔE likewise, Θ_ref the temperature the
  option's own signature was measured at (:attr:`PlanContext.reference_c`; else its coolest
  characterized entry, the protocol's null context), added to the option as planned (so a
  composite option, a stage with its send, keeps its other parts), the shift's error in its
  σ; every other task is composed at the null context, and the evaluation says which;
- the schedule moves with the shifted durations, so the walk repeats until no entry
  temperature moves by more than ``tol_c`` (a few rounds: the shifts are small);
- the first task's entry is ``"periodic"`` (steps run back to back, as a long job runs
  them: the fixed point where a step leaves the die as it found it; the RC update is affine in
  the entry, so it is solved, not iterated), ``"cold"`` (the device's idle steady state) or a
  given temperature, °C.

The null context stays the default: with no mechanism, or no contextual signature among the
chosen options, the evaluation is the plan itself. :func:`context_record` is what a plan
records (``meta["context"]``: per task its entry temperature or ``None`` for null, and its
shift), and :func:`shifted_problem` rebuilds from that record the problem the plan's
prediction comes from, so ``ecal run`` predicts what the planner kept the deadline with.

Example: two tasks on one device; the second one is slower when it enters warm.

>>> from frontier.context import ContextualSignature, ThermalMechanism
>>> from frontier.signature import Signature
>>> from solvers.model import Problem
>>> hot = ContextualSignature("b", {40.0: Signature("b", 100.0, 1.0, 100.0),
...                                 60.0: Signature("b", 100.0, 1.1, 110.0)})
>>> p = Problem.build([("a", "gpu0", [(1.0, 300.0)]), ("b", "gpu0", [(1.0, 100.0)])],
...                   idle_power_w={"gpu0": 100.0})
>>> ctx = PlanContext({"gpu0": ThermalMechanism(30.0, 0.1, 1.0)}, {"b": {0: hot}}, entry=40.0)
>>> ev = evaluate_in_context(p, [0, 0], ctx)
>>> round(ev.entry_temps_c["b"], 2), ev.entry_temps_c["a"] is None
(52.64, True)
>>> round(ev.makespan_s, 4)
2.0632
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from frontier.context import ContextualSignature, ThermalMechanism
from frontier.errors import InputError
from frontier.signature import Term

from .model import LeafTerms, Option, Problem, Task

#: The first task's entry on each device: steps back to back, the idle steady state, or °C.
ENTRIES = ("periodic", "cold")
#: Entry temperatures closer than this (°C) between two walks end the iteration.
TOL_C = 1e-6
#: At most this many walks (the shifts are small: two to four are typical).
MAX_WALKS = 50


@dataclass(frozen=True)
class PlanContext:
    """What composing a plan with its entry context needs.

    Parameters
    ----------
    mechanisms : device name -> its thermal model (devices without one stay at null).
    tasks : task name -> {option index -> the contextual signature of that option}.
    entry : ``"periodic"``, ``"cold"`` or an entry temperature in °C (see the module docstring).
    source : where the characterization came from (a file name), for the record.
    reference_c : task name -> {option index -> the temperature its option was characterized
        at, °C}: the shift is T(Θ) − T(Θ_ref). A characterization that runs its element back
        to back warms the die as it measures (its windows' temperatures say how much), so its
        signature is of that temperature, not of the cold entry. Options without one are
        taken at their contextual signature's coolest entry (the null context).
    """

    mechanisms: Mapping[str, ThermalMechanism]
    tasks: Mapping[str, Mapping[int, ContextualSignature]]
    entry: str | float = "periodic"
    source: str = ""
    reference_c: Mapping[str, Mapping[int, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.entry, str):
            if self.entry not in ENTRIES:
                raise InputError(f"context entry {self.entry!r}: expected periodic, cold or a "
                                 "temperature in °C")
        elif not math.isfinite(float(self.entry)):
            raise InputError(f"context entry temperature {self.entry!r} °C is not finite")


#: One characterized point behind a shift: (coefficient, var T s², var d J², static power W).
Leaf = tuple[float, float, float, float]


@dataclass(frozen=True)
class ContextEvaluation:
    """A plan's choices composed with their entry context (:func:`evaluate_in_context`).

    ``problem`` is the problem with each shifted task's chosen option moved to its entry
    temperature (every other option as it was); ``entry_temps_c`` holds each task's entry
    temperature (°C), ``None`` where the task was composed at the null context; ``shifts``
    each shifted task's (ΔT s, ΔE J); ``device_entry_c`` each device's first entry;
    ``makespan_s`` the makespan in context; ``walks`` how many walks it took."""

    problem: Problem
    choice: tuple[int, ...]
    entry_temps_c: Mapping[str, float | None]
    shifts: Mapping[str, tuple[float, float]]
    device_entry_c: Mapping[str, float]
    makespan_s: float
    walks: int
    entry: str | float = "periodic"
    mechanisms: Mapping[str, ThermalMechanism] = field(default_factory=dict)
    leaves: Mapping[str, Mapping[str, Leaf]] = field(default_factory=dict)

    @property
    def in_context(self) -> list[str]:
        """The tasks composed with their entry temperature."""
        return [t for t, v in self.entry_temps_c.items() if v is not None]


def _shift(cs: ContextualSignature, entry_c: float,
           ref_c: float | None = None) -> tuple[float, float, dict[str, Leaf]]:
    """(ΔT s, ΔE J, leaves) of ``cs`` entered at ``entry_c`` against its entry at ``ref_c``
    (None: its null, coolest, entry). The shift is Σ_k a_k·p_k over the characterized points
    p_k (a_k: the weight at the entry less the weight at the reference), so its error is
    theirs: one leaf per point, keyed by element and temperature, so that tasks sharing a
    point are correlated in a plan's σ as its other shared measurements are."""
    a = cs.weights(entry_c)
    for t, w in cs.weights(ref_c).items():
        a[t] = a.get(t, 0.0) - w
    dt = de = 0.0
    leaves: dict[str, Leaf] = {}
    for t, c in a.items():
        if c == 0.0:
            continue
        p = cs.by_entry_c[t]
        dt += c * p.time_s
        de += c * p.energy_j
        leaves[f"context:{cs.name}@{t:g}C"] = (c, p.var_time_s2, p.var_d_j2, p.s_w)
    return dt, de, leaves


def shifted_option(o: Option, dt_s: float, de_j: float, task: str = "",
                   leaves: Mapping[str, Leaf] | None = None) -> Option:
    """``o`` taking ``dt_s`` longer and ``de_j`` more energy (its static power unchanged, so
    the dynamic energy takes the rest), its σ widened by the shift's ``leaves`` (:func:`_shift`).
    InputError when the time would not stay positive."""
    t = o.time_s + dt_s
    if not t > 0:
        raise InputError(f"task {task!r}: its entry context shortens it by {-dt_s:.6g} s, more "
                         f"than its {o.time_s:.6g} s; the contextual signature is not of this option")
    d = o.d_j + de_j - o.s_w * dt_s
    if d < 0:
        raise InputError(f"task {task!r}: its entry context changes its energy by {de_j:+.6g} J, "
                         f"less than its static power draws over {dt_s:+.6g} s; the contextual "
                         "signature is not of this option")
    if not leaves:
        return dataclasses.replace(o, time_s=t, d_j=d)
    terms = dict(o.leaf_terms)
    for key, (c, var_t, var_d, s_w) in leaves.items():
        terms[key] = Term(float(var_t), float(var_d), c, c * s_w, c)
    base = o.leaf_terms
    return dataclasses.replace(o, time_s=t, d_j=d,
                               terms=LeafTerms(terms, base.extra_var_time_s2, base.extra_var_energy_j2))


def shifted_problem(problem: Problem, choice: Sequence[int], shifts: Mapping[str, tuple[float, float]],
                    leaves: Mapping[str, Mapping[str, Leaf]] | None = None) -> Problem:
    """``problem`` with each task of ``shifts`` taking its chosen option shifted by (ΔT, ΔE),
    with that task's ``leaves`` (its shift's error)."""
    if not shifts:
        return problem
    pos = problem.index.pos
    unknown = sorted(set(shifts) - set(pos))
    if unknown:
        raise InputError(f"{problem.name}: context shifts for unknown tasks {unknown[:3]}")
    tasks = list(problem.tasks)
    for name, (dt, de) in shifts.items():
        i = pos[name]
        t = tasks[i]
        opts = list(t.options)
        opts[choice[i]] = shifted_option(opts[choice[i]], dt, de, name, (leaves or {}).get(name))
        tasks[i] = Task(t.name, t.device, tuple(opts))
    return problem.with_(tasks=tuple(tasks))


def _walk(seq: Sequence[int], start: Sequence[float], end: Sequence[float], energy: Sequence[float],
          mk: float, mech: ThermalMechanism, idle_w: float, entry_c: float) -> tuple[list[float], float]:
    """Entry temperature of each task of ``seq`` (in order) and the temperature at ``mk``."""
    temp, t, out = float(entry_c), 0.0, []
    for i in seq:
        if start[i] > t:
            temp = mech.idle_temp_c(temp, start[i] - t, idle_w)
        out.append(temp)
        temp = mech.exit_temp_c(temp, end[i] - start[i], energy[i])
        t = max(t, end[i])
    if mk > t:
        temp = mech.idle_temp_c(temp, mk - t, idle_w)
    return out, temp


def _first_entry(ctx: PlanContext, mech: ThermalMechanism, idle_w: float, from_zero_c: float,
                 mk: float) -> float:
    """The device's first entry temperature: given, the idle steady state, or the periodic
    fixed point. A walk over [0, mk] is affine in its entry, slope exp(−mk/τ), so the fixed
    point of exit = entry is solved from the walk entered at 0 °C (``from_zero_c``, its exit)."""
    if not isinstance(ctx.entry, str):
        return float(ctx.entry)
    cold = mech.steady_temp_c(idle_w)
    if ctx.entry == "cold" or mk <= 0:
        return cold
    return from_zero_c / (1.0 - math.exp(-mk / mech.tau_s))


def evaluate_in_context(problem: Problem, choice: Sequence[int], ctx: PlanContext, *,
                        tol_c: float = TOL_C, max_walks: int = MAX_WALKS) -> ContextEvaluation:
    """``choice`` on ``problem`` composed with its entry context (module docstring)."""
    ix = problem.index
    choice = tuple(int(c) for c in choice)
    unknown = sorted(set(ctx.tasks) - set(ix.pos))
    if unknown:
        raise InputError(f"{problem.name}: context for unknown tasks {unknown[:3]}")
    base_dur = np.asarray(ix.durations(choice), dtype=float)
    base_e = np.array([problem.tasks[i].options[choice[i]].energy_j for i in range(ix.n)])
    tau = ix.switch_tau(choice)
    contextual = {ix.pos[t]: opts[choice[ix.pos[t]]] for t, opts in ctx.tasks.items()
                  if choice[ix.pos[t]] in opts}
    refs = {i: ctx.reference_c.get(ix.names[i], {}).get(choice[i]) for i in contextual}
    mechs = {d: m for d, m in ctx.mechanisms.items() if d in ix.dev_seq}
    dt = np.zeros(ix.n)
    de = np.zeros(ix.n)
    leaves: dict[int, dict[str, Leaf]] = {}
    temps: dict[int, float] = {}
    entries: dict[str, float] = {}
    walks = 0
    mk = 0.0
    while walks < max_walks:
        walks += 1
        start, end = ix.earliest(base_dur + dt, tau)
        mk = max(end) if ix.n else 0.0
        energy = (base_e + de).tolist()
        new: dict[int, float] = {}
        for d, mech in mechs.items():
            seq = ix.dev_seq[d]
            idle = ix.power[d]

            from_zero_c = _walk(seq, start, end, energy, mk, mech, idle, 0.0)[1]
            entries[d] = _first_entry(ctx, mech, idle, from_zero_c, mk)
            for i, t in zip(seq, _walk(seq, start, end, energy, mk, mech, idle, entries[d])[0]):
                new[i] = t
        moved = max((abs(new[i] - temps.get(i, math.inf)) for i in new), default=0.0)
        temps = new
        for i, cs in contextual.items():
            if i in temps:
                dt[i], de[i], leaves[i] = _shift(cs, temps[i], refs[i])
                shifted_option(problem.tasks[i].options[choice[i]], dt[i], de[i], ix.names[i])  # checks
        if moved <= tol_c:
            break
    start, end = ix.earliest(base_dur + dt, tau)
    mk = max(end) if ix.n else 0.0
    shifts = {ix.names[i]: (float(dt[i]), float(de[i])) for i in contextual if i in temps}
    task_leaves = {ix.names[i]: leaves[i] for i in contextual if i in temps}
    entry_temps: dict[str, float | None] = {
        ix.names[i]: (float(temps[i]) if i in contextual and i in temps else None) for i in range(ix.n)}
    return ContextEvaluation(shifted_problem(problem, choice, shifts, task_leaves), choice, entry_temps,
                             shifts, entries, float(mk), walks, ctx.entry, mechs, task_leaves)


def context_record(ev: ContextEvaluation, plan: Any, source: str = "") -> dict[str, Any]:
    """What a plan records in ``meta["context"]``: the mechanism per device and its first
    entry, per task its entry temperature (``None``: composed at the null context) and shift,
    and the plan's makespan and energy in context (``plan``: the same choices evaluated on
    ``ev.problem``, :func:`solvers.plan.make_plan`)."""
    return {"mechanism": "thermal", "entry": ev.entry, "source": source,
            "devices": {d: {"ambient_c": m.ambient_c, "r_th_c_per_w": m.r_th_c_per_w,
                            "tau_s": m.tau_s, "entry_c": ev.device_entry_c.get(d)}
                        for d, m in ev.mechanisms.items()},
            "tasks": {t: ({"entry_temp_c": v, "time_s": ev.shifts[t][0], "energy_j": ev.shifts[t][1],
                           "leaves": {k: list(x) for k, x in ev.leaves.get(t, {}).items()}}
                          if v is not None else None) for t, v in ev.entry_temps_c.items()},
            "in_context": len(ev.in_context), "at_null": len(ev.entry_temps_c) - len(ev.in_context),
            "makespan_s": plan.makespan_s, "sd_makespan_s": plan.sd_makespan_s,
            "energy_j": plan.energy_j, "sd_energy_j": plan.sd_energy_j}


def _plan_choice(plan: Any, problem: Problem) -> list[int]:
    """The plan's option index of each of ``problem``'s tasks, in problem order."""
    by_name = plan.choice
    return [by_name[t.name] for t in problem.tasks]


def with_context(plan: Any, problem: Problem, ctx: PlanContext) -> Any:
    """``plan`` (made for ``problem`` at the null context) recording its composition with its
    entry context in ``meta["context"]`` (:func:`context_record`). Its tasks, energy, bound and
    gap stay those of the problem its method solved; the record holds the makespan and energy
    the plan takes in context, which :func:`solvers.confidence.keep_deadline` holds against
    the deadline and ``ecal run`` predicts."""
    from .plan import make_plan

    choice = _plan_choice(plan, problem)
    ev = evaluate_in_context(problem, choice, ctx)
    cplan = make_plan(ev.problem, ev.choice, max(plan.deadline_s, ev.makespan_s), method=plan.method,
                      lower_bound_j=0.0, wall_s=0.0)
    return dataclasses.replace(plan, meta={**plan.meta, "context": context_record(ev, cplan, ctx.source)})


def in_context_plan(plan: Any, problem: Problem) -> tuple[Any, Problem]:
    """The plan a plan's ``meta["context"]`` says it takes in context, and the shifted problem
    it is evaluated on (``(plan, problem)`` unchanged when it has no context): what ``ecal
    run`` predicts a context-composed plan from."""
    rec = plan.context
    if rec is None:
        return plan, problem
    from .plan import make_plan

    choice = _plan_choice(plan, problem)
    shifted = shifted_problem(problem, choice, record_shifts(rec), record_leaves(rec))
    start, end, mk = shifted.index.schedule(choice)
    cplan = make_plan(shifted, choice, max(plan.deadline_s, float(mk)), method=plan.method,
                      lower_bound_j=0.0, wall_s=0.0, meta=plan.meta)
    return dataclasses.replace(cplan, deadline_s=plan.deadline_s, problem=plan.problem), shifted


def record_shifts(record: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
    """The (ΔT s, ΔE J) per task of a plan's ``meta["context"]`` (:func:`context_record`)."""
    return {k: v[0] for k, v in _record_tasks(record).items()}


def record_leaves(record: Mapping[str, Any]) -> dict[str, dict[str, Leaf]]:
    """The shift's leaves per task of a plan's ``meta["context"]`` (:func:`context_record`)."""
    return {k: v[1] for k, v in _record_tasks(record).items()}


def _record_tasks(record: Mapping[str, Any]) -> dict[str, tuple[tuple[float, float], dict[str, Leaf]]]:
    tasks = record.get("tasks") or {}
    out = {}
    for name, v in tasks.items():
        if v is None:
            continue
        where = f"meta.context.tasks.{name}"
        try:
            dt, de = float(v["time_s"]), float(v["energy_j"])
            leaves = {str(k): (float(a), float(vt), float(vd), float(sw))
                      for k, (a, vt, vd, sw) in (v.get("leaves") or {}).items()}
        except (KeyError, TypeError, ValueError, AttributeError):
            raise InputError(f"{where}: expected time_s, energy_j and leaves {{key: [a, var_t, var_d, "
                             f"s_w]}}, got {v!r}") from None
        vals = [dt, de, *(x for lf in leaves.values() for x in lf)]
        if not all(math.isfinite(x) for x in vals) or any(lf[1] < 0 or lf[2] < 0 for lf in leaves.values()):
            raise InputError(f"{where}: shifts must be finite and variances >= 0, got {v!r}")
        out[str(name)] = ((dt, de), leaves)
    return out


__all__ = ["PlanContext", "ContextEvaluation", "evaluate_in_context", "shifted_option",
           "shifted_problem", "context_record", "record_shifts", "record_leaves", "with_context",
           "in_context_plan",
           "ENTRIES"]
