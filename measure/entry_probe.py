"""Characterize an element at controlled entry temperatures (spec §5, Table 1: the thermal
mechanism's isolating protocol: "measure E after pre-heating to controlled start temperatures
versus after cooldown to baseline").

One *entry run* brings the die to a target temperature, switches to the element's operating
point and measures one run of the element's work in a tick-aligned window
(:func:`measure.protocol.measure_window`): its time, its energy and the temperatures it
entered at and left behind. A cold target (``None``) is the device cooled at ready power
until its reading stops falling (the null context); a warm one is reached by running a
*heater* work at the device's default operating point until the reading gets there (the
protocol's ``context_temp_c`` pre-heat, with a hot work instead of the element itself, whose
own steady temperature may be below the target), then idling down to it if overshot.

The cooldowns are also read as windows of idle (entry, time, power, exit), so that one
probe yields what a first-order thermal model is fitted from
(:func:`frontier.context.fit_thermal`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from frontier.context import ThermalObservation
from frontier.operating_point import OperatingPoint
from frontier.signature import Signature

from .device import Device
from .protocol import (
    Protocol,
    measure_ready_power_w,
    measure_window,
    time_per_invocation_s,
    wait_for_tick,
)

log = logging.getLogger(__name__)

#: Idle chunk while cooling, s (each one is also a thermal observation).
COOL_STEP_S = 2.0
#: Heater batch while heating, s (each one is also a thermal observation).
HEAT_STEP_S = 1.0


@dataclass(frozen=True)
class EntryRun:
    """One measured run of an element: entered at ``entry_c``, took ``time_s`` and
    ``energy_j``, left the die at ``exit_c`` (readings, °C)."""

    entry_c: float
    time_s: float
    energy_j: float
    exit_c: float


def _observed(device: Device, action: Any, obs: list[ThermalObservation] | None,
              protocol: Protocol) -> None:
    """Run ``action()`` inside a tick-aligned window and append it to ``obs`` as a thermal
    observation (temperature before and after, mean power of the window)."""
    t_a, e_a = wait_for_tick(device, protocol.tick_timeout_s, protocol.poll_s)
    th0 = device.temperature_c()
    action()
    t_b, e_b = wait_for_tick(device, protocol.tick_timeout_s, protocol.poll_s)
    if obs is not None and t_b > t_a:
        obs.append(ThermalObservation(float(th0), t_b - t_a, (e_b - e_a) / (t_b - t_a),
                                      float(device.temperature_c())))


def cool_down(device: Device, target_c: float | None, max_s: float = 120.0,
              obs: list[ThermalObservation] | None = None,
              protocol: Protocol = Protocol()) -> float:
    """Idle at ready power until the reading is at most ``target_c`` (None: until it stops
    falling over one step); the seconds spent. Each idle step is appended to ``obs``."""
    t_start = device.time_s()
    while device.time_s() - t_start < max_s:
        th0 = device.temperature_c()
        if target_c is not None and th0 <= target_c:
            break
        _observed(device, lambda: device.idle(COOL_STEP_S), obs, protocol)
        if target_c is None and device.temperature_c() >= th0:
            break
    return device.time_s() - t_start


def heat_up(device: Device, target_c: float, heater: Any, max_s: float = 60.0,
            obs: list[ThermalObservation] | None = None, protocol: Protocol = Protocol()) -> float:
    """Run ``heater`` at the device's own settings (:meth:`~measure.device.Device.restore`:
    no clock lock, its power limit) in batches of about ``HEAT_STEP_S`` until the reading is
    at least ``target_c`` (at most ``max_s``); the seconds spent. Each batch is appended to
    ``obs``."""
    device.restore()
    t_start = device.time_s()
    t1 = time_per_invocation_s(device, heater)
    n = max(1, round(HEAT_STEP_S / t1)) if t1 > 0 else 1
    while device.temperature_c() < target_c and device.time_s() - t_start < max_s:
        _observed(device, lambda: device.run(heater, n), obs, protocol)
    return device.time_s() - t_start


def bring_to(device: Device, target_c: float | None, heater: Any,
             obs: list[ThermalObservation] | None = None) -> None:
    """The die at ``target_c`` (reading, whole °C; None: cooled to the null context)."""
    if target_c is None:
        cool_down(device, None, obs=obs)
        return
    if device.temperature_c() < target_c:
        heat_up(device, target_c, heater, obs=obs)
    cool_down(device, target_c, obs=obs)


def entry_runs(device: Device, work: Any, omega: OperatingPoint, target_c: float | None,
               repeats: int, heater: Any, protocol: Protocol = Protocol(),
               ready_w: float | None = None,
               obs: list[ThermalObservation] | None = None) -> list[EntryRun]:
    """``repeats`` runs of ``work`` at ``omega``, each entered at ``target_c``; each run is
    also a thermal observation appended to ``obs``."""
    if ready_w is None:
        device.set_operating_point(omega)
        ready_w = measure_ready_power_w(device, protocol)
    out = []
    for _ in range(repeats):
        bring_to(device, target_c, heater, obs)
        device.set_operating_point(omega)
        w = measure_window(device, work, 1, protocol, ready_w)
        run = EntryRun(float(w.temp_start_c), w.time_s, w.energy_j, float(w.temp_end_c))
        out.append(run)
        if obs is not None and w.time_s > 0:
            obs.append(ThermalObservation(run.entry_c, w.time_s, w.energy_j / w.time_s, run.exit_c))
    return out


def entry_signature(name: str, runs: Sequence[EntryRun], ready_w: float, omega: OperatingPoint,
                    meta: dict[str, Any] | None = None) -> tuple[float, Signature]:
    """(mean entry temperature, the signature of the runs: variances of the mean)."""
    entry = sum(r.entry_c for r in runs) / len(runs)
    sig = Signature.from_runs(name, [r.time_s for r in runs], [r.energy_j for r in runs],
                              s_w=ready_w, omega=omega,
                              meta={**(meta or {}), "entry_temp_c": entry,
                                    "entry_temps_read_c": [r.entry_c for r in runs],
                                    "runs": len(runs)})
    return entry, sig
