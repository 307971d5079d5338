"""Per-device operating-point schedules that a training loop can read (``schedule.json``).

Format (``"format": "ecal.schedule/1"``)::

    {"format": "ecal.schedule/1", "deadline_s": 0.61, "makespan_s": 0.6,
     "devices": {"stage0": [{"task": "s0/forward/0", "start_s": 0.0, "end_s": 0.031,
                             "sm_clock_mhz": 1620, "power_limit_w": 700, "sm_count": 16}, ...]}}

Entries per device are in execution order. A training loop sets the device's clocks/limit
(e.g. with :class:`measure.PlanApplier` or ``nvmlDeviceSetGpuLockedClocks``) before the task
whose values differ from the previous entry's; ``sm_count`` is the per-element knob (SMs for
the communication kernel in the demo, applied with green contexts). Keys absent from an entry
mean "leave as is".
"""

from __future__ import annotations

from typing import Any

SCHEDULE_FORMAT = "ecal.schedule/1"


def stage_schedule(plan: Any, problem: Any = None, simulated: bool = False) -> dict[str, Any]:
    """The plan as per-device lists of (task, start, end, knobs), in execution order.

    ``problem`` (the solved :class:`solvers.model.Problem`) supplies the full operating point
    of each chosen option; without it only the SM clock recorded in the plan is given.
    """
    opts = {t.name: t.options for t in problem.tasks} if problem is not None else {}
    devices: dict[str, list[dict[str, Any]]] = {}
    for t in sorted(plan.tasks, key=lambda t: (t.device, t.start_s)):
        entry: dict[str, Any] = {"task": t.name, "start_s": t.start_s, "end_s": t.end_s}
        if t.name in opts:
            entry.update({k: v for k, v in opts[t.name][t.option].omega.to_dict().items() if v is not None})
        elif t.sm_clock_mhz is not None:
            entry["sm_clock_mhz"] = t.sm_clock_mhz
        devices.setdefault(t.device, []).append(entry)
    return {"format": SCHEDULE_FORMAT, "problem": plan.problem, "deadline_s": plan.deadline_s,
            "makespan_s": plan.makespan_s, "energy_j": plan.energy_j, "simulated": simulated,
            "devices": devices}
