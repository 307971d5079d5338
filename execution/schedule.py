"""A solved plan as a schedule file (:mod:`measure.schedule`): per device, each task's planned
start and end and the operating point to set before it, in execution order."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from measure.schedule import DeviceInfo, ScheduleEntry, schedule_to_dict
from solvers.model import Problem
from solvers.plan import Plan


def stage_schedule(plan: Plan, problem: Problem | None = None, simulated: bool = False, *,
                   ranks: Sequence[str] | None = None,
                   ready_power_w: Mapping[str, float | None] | None = None) -> dict[str, Any]:
    """The plan as per-device lists of (task, start, end, knobs), in execution order: the
    ``ecal.schedule/1`` document (:func:`measure.schedule.schedule_to_dict`).

    ``problem`` (the solved problem) supplies the full operating point of each chosen option,
    whether the plan is steady-state and the switches per iteration (``device_info``); without
    it only the SM clock recorded in the plan is given. ``ranks`` (device of rank 0, 1, …) and
    ``ready_power_w`` (per device) are written when given.
    """
    opts = {t.name: t.options for t in problem.tasks} if problem is not None else {}
    devices: dict[str, list[ScheduleEntry]] = {}
    for t in sorted(plan.tasks, key=lambda t: (t.device, t.start_s)):
        knobs: dict[str, float | int] = {}
        if t.name in opts:
            knobs = {k: v for k, v in opts[t.name][t.option].omega.to_dict().items()
                     if v is not None}
        elif t.sm_clock_mhz is not None:
            knobs = {"sm_clock_mhz": t.sm_clock_mhz}
        devices.setdefault(t.device, []).append(ScheduleEntry(t.name, t.start_s, t.end_s, knobs))
    conf = plan.meta.get("confidence") if isinstance(plan.meta, Mapping) else None
    confidence = None
    if isinstance(conf, Mapping):
        confidence = {"confidence": conf.get("confidence"), "solved_deadline_s": plan.deadline_s,
                      "p_meets_deadline": conf.get("p_meets_deadline")}
    info = None
    if problem is not None:
        counts = switches_per_iteration(plan, problem)
        if counts is not None:
            ready = dict(ready_power_w or {})
            info = {d: DeviceInfo(_float_or_none(ready.get(d)), int(counts.get(d, 0)))
                    for d in devices}
    return schedule_to_dict(
        devices, problem=plan.problem, deadline_s=plan.target_deadline_s,
        makespan_s=plan.makespan_s, energy_j=plan.energy_j, simulated=simulated,
        confidence=confidence, steady_state=None if problem is None else problem.steady_state,
        device_info=info, ranks=ranks)


def _float_or_none(v: Any) -> float | None:
    return None if v is None else float(v)


def switches_per_iteration(plan: Plan, problem: Problem) -> dict[str, int] | None:
    """Changes of ω_dev per device in one iteration of ``plan`` on ``problem``
    (``problem.index.switch_counts``: the last → first wrap included when the problem is
    steady-state). None when the plan's tasks are not the problem's."""
    choice_by_name = {t.name: t.option for t in plan.tasks}
    ix = problem.index
    if set(choice_by_name) != set(ix.names):
        return None
    choice = [choice_by_name[n] for n in ix.names]
    return {str(d): int(c) for d, c in ix.switch_counts(choice).items()}
