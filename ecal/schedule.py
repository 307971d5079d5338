"""Per-device operating-point schedules that a training loop can read (``schedule.json``).

Format (``"format": "ecal.schedule/1"``)::

    {"format": "ecal.schedule/1", "deadline_s": 0.61, "makespan_s": 0.6,
     "steady_state": true,
     "ranks": ["stage0", "stage1"],
     "device_info": {"stage0": {"ready_power_w": 122.2, "switches_per_iteration": 2}, ...},
     "devices": {"stage0": [{"task": "s0/forward/0", "start_s": 0.0, "end_s": 0.031,
                             "sm_clock_mhz": 1620, "power_limit_w": 700, "sm_count": 16}, ...]}}

Entries per device are in execution order. A training loop sets the device's clocks/limit
(e.g. with :class:`measure.PlanApplier` or ``nvmlDeviceSetGpuLockedClocks``) before the task
whose values differ from the previous entry's; ``sm_count`` is the per-element knob (SMs for
the communication kernel in the demo, applied with green contexts). Keys absent from an entry
mean "leave as is".

Optional top-level keys (readers must accept their absence):

- ``steady_state``: the plan is for a step that repeats, so the switch from each device's last
  entry back to its first (iteration k → k + 1) was planned and paid;
- ``ranks``: the device of rank 0, 1, … (pipeline rank r runs ``stage{r}``);
- ``device_info``: per device, ``ready_power_w`` (the ready power measured with the elements'
  signatures at the device's top operating point, or null) and ``switches_per_iteration``
  (changes of ω_dev in one iteration, the wrap-around included when ``steady_state``).
- ``confidence``, ``solved_deadline_s``, ``p_meets_deadline``: the plan keeps ``deadline_s``
  at this confidence (:mod:`solvers.confidence`): its method solved the tightened
  ``solved_deadline_s`` and the plan's P(makespan ≤ deadline_s) is ``p_meets_deadline``.

Task names of pipeline schedules are ``s{stage}/{forward|backward}/{microbatch}`` and, for
interleaved 1F1B, ``s{stage}v{chunk}/{forward|backward}/{microbatch}`` (see
:mod:`solvers.pipeline`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

SCHEDULE_FORMAT = "ecal.schedule/1"


def stage_schedule(plan: Any, problem: Any = None, simulated: bool = False, *,
                   ranks: Sequence[str] | None = None,
                   ready_power_w: Mapping[str, float | None] | None = None) -> dict[str, Any]:
    """The plan as per-device lists of (task, start, end, knobs), in execution order.

    ``problem`` (the solved :class:`solvers.model.Problem`) supplies the full operating point
    of each chosen option, whether the plan is steady-state and the switches per iteration
    (``device_info``); without it only the SM clock recorded in the plan is given.
    ``ranks`` (device of rank 0, 1, …) and ``ready_power_w`` (per device) are written when
    given.
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
    out: dict[str, Any] = {"format": SCHEDULE_FORMAT, "problem": plan.problem,
                           "deadline_s": getattr(plan, "target_deadline_s", plan.deadline_s),
                           "makespan_s": plan.makespan_s,
                           "energy_j": plan.energy_j, "simulated": simulated}
    conf = plan.meta.get("confidence") if isinstance(getattr(plan, "meta", None), Mapping) else None
    if isinstance(conf, Mapping):
        out["confidence"] = conf.get("confidence")
        out["solved_deadline_s"] = plan.deadline_s
        out["p_meets_deadline"] = conf.get("p_meets_deadline")
    if problem is not None:
        out["steady_state"] = bool(problem.steady_state)
        counts = switches_per_iteration(plan, problem)
        if counts is not None:
            ready = dict(ready_power_w or {})
            out["device_info"] = {d: {"ready_power_w": _float_or_none(ready.get(d)),
                                      "switches_per_iteration": int(counts.get(d, 0))}
                                  for d in devices}
    if ranks is not None:
        out["ranks"] = [str(r) for r in ranks]
    out["devices"] = devices
    return out


def _float_or_none(v: Any) -> float | None:
    return None if v is None else float(v)


def switches_per_iteration(plan: Any, problem: Any) -> dict[str, int] | None:
    """Changes of ω_dev per device in one iteration of ``plan`` on ``problem``
    (``problem.index.switch_counts``: the last → first wrap included when the problem is
    steady-state). None when the plan's tasks are not the problem's."""
    choice_by_name = {t.name: t.option for t in plan.tasks}
    ix = problem.index
    if set(choice_by_name) != set(ix.names):
        return None
    choice = [choice_by_name[n] for n in ix.names]
    return {str(d): int(c) for d, c in ix.switch_counts(choice).items()}
