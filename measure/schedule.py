"""The schedule file format: per-device operating points a training loop applies (``schedule.json``).

Plain data only (no ``solvers``): :func:`schedule_to_dict` writes it from entries and
:func:`read_schedule` reads one rank's part (what :meth:`measure.PlanApplier.from_schedule`
uses) after checking the whole file against its model,
:class:`frontier.format_models.ScheduleFile` (``ecal schema schedule``).
``execution.schedule.stage_schedule`` turns a solved plan into it.

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

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from frontier.errors import FormatError
from frontier.files import read_json
from frontier.formats import KINDS, content, validate
from frontier.operating_point import OperatingPoint

#: ``format`` of the schedule files this code writes (:data:`frontier.formats.KINDS`).
SCHEDULE_FORMAT = KINDS["schedule"].tag
#: The per-task knobs an entry may set (absent: leave as is).
KNOBS = ("sm_clock_mhz", "mem_clock_mhz", "power_limit_w", "sm_count")


@dataclass(frozen=True)
class ScheduleEntry:
    """One task of a device's schedule: its name, planned start and end (s from the step's
    start) and the knobs to set before it (``sm_clock_mhz``, ``power_limit_w``, ...)."""

    task: str
    start_s: float
    end_s: float
    knobs: Mapping[str, float | int]

    def to_dict(self) -> dict[str, Any]:
        """The entry as the file holds it."""
        return {"task": self.task, "start_s": self.start_s, "end_s": self.end_s, **self.knobs}


@dataclass(frozen=True)
class DeviceInfo:
    """What a schedule says about one device: its ready power (W, or None when not recorded)
    and its changes of ω_dev per iteration."""

    ready_power_w: float | None
    switches_per_iteration: int


def schedule_to_dict(devices: Mapping[str, Sequence[ScheduleEntry]], *, problem: str,
                     deadline_s: float | None, makespan_s: float | None, energy_j: float | None,
                     simulated: bool = False, confidence: Mapping[str, Any] | None = None,
                     steady_state: bool | None = None,
                     device_info: Mapping[str, DeviceInfo] | None = None,
                     ranks: Sequence[str] | None = None) -> dict[str, Any]:
    """The schedule file of ``devices`` (device → its entries in execution order).

    ``confidence`` (``confidence``, ``solved_deadline_s``, ``p_meets_deadline``),
    ``steady_state``, ``device_info`` and ``ranks`` are written when given.
    """
    out: dict[str, Any] = {"format": SCHEDULE_FORMAT, "problem": problem,
                           "deadline_s": deadline_s, "makespan_s": makespan_s,
                           "energy_j": energy_j, "simulated": simulated}
    if confidence is not None:
        out.update(confidence)
    if steady_state is not None:
        out["steady_state"] = bool(steady_state)
    if device_info is not None:
        out["device_info"] = {d: {"ready_power_w": i.ready_power_w,
                                  "switches_per_iteration": i.switches_per_iteration}
                              for d, i in device_info.items()}
    if ranks is not None:
        out["ranks"] = [str(r) for r in ranks]
    out["devices"] = {d: [e.to_dict() for e in es] for d, es in devices.items()}
    return out


@dataclass(frozen=True)
class RankSchedule:
    """One rank's part of an ``ecal.schedule/1`` file: its device name, its tasks in execution
    order with their operating points, and what the file says about the device."""

    device: str
    tasks: tuple[str, ...]
    omegas: Mapping[str, OperatingPoint]
    ready_power_w: float | None = None
    switches_per_iteration: int | None = None
    steady_state: bool = False


def read_schedule(path: str | os.PathLike, rank: int | str) -> RankSchedule:
    """Read rank ``rank``'s tasks from an ``ecal.schedule/1`` file.

    ``rank`` is an integer rank or a device name. An integer maps through the file's
    ``"ranks"`` list (device of rank 0, 1, ...) when present; else to the device
    ``stage{rank}`` when there is one, else to the ``rank``-th device in file order. The
    optional keys (``steady_state``, ``ranks``, ``device_info``) may be absent. The whole file
    is checked against :class:`frontier.format_models.ScheduleFile` (unknown keys refused, knobs
    positive numbers); errors are :class:`frontier.errors.FormatError` naming the file and the
    field.
    """
    from frontier.format_models import ScheduleFile

    p = str(path)
    _, body = content(p, read_json(path), "schedule")
    doc = validate(ScheduleFile, body, p)
    devices = doc.devices
    names = list(devices)
    if isinstance(rank, str):
        dev = rank
    elif doc.ranks is not None:
        if not 0 <= int(rank) < len(doc.ranks):
            raise FormatError(p, "ranks", f"rank {rank} out of range: the file lists "
                                          f"{len(doc.ranks)} rank(s)")
        dev = doc.ranks[int(rank)]
    elif f"stage{int(rank)}" in devices:
        dev = f"stage{int(rank)}"
    elif 0 <= int(rank) < len(names):
        dev = names[int(rank)]
    else:
        raise FormatError(p, "devices", f"rank {rank} out of range: {len(names)} device(s)")
    if dev not in devices:
        raise FormatError(p, "devices", f"no device {dev!r}; devices: {names}")
    omegas: dict[str, OperatingPoint] = {}
    for i, e in enumerate(devices[dev]):
        if e.task in omegas:
            raise FormatError(p, f"devices.{dev}[{i}].task", f"task {e.task!r} appears twice")
        knobs = {k: getattr(e, k) for k in KNOBS if getattr(e, k) is not None}
        if "sm_count" in knobs:
            knobs["sm_count"] = int(knobs["sm_count"])
        omegas[e.task] = OperatingPoint(**knobs)
    mine = (doc.device_info or {}).get(dev)
    if mine is None:
        return RankSchedule(dev, tuple(omegas), omegas, steady_state=doc.steady_state)
    return RankSchedule(dev, tuple(omegas), omegas, mine.ready_power_w,
                        mine.switches_per_iteration, doc.steady_state)
