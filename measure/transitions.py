"""Measuring transition elements: what switching ω_dev costs on a device (spec §9.5).

A settle-time probe (measurement-notes §4 step 1): from ``frm``, set ``to`` and poll the SM
clock until it reads the target; the time from the call to the settled reading is τ. The energy
counter ticks every ~100 ms and cannot resolve a switch of milliseconds, so ε is taken as the
ready power at the target × τ (no energy beyond static: the device is idle while it settles).
The result is a :class:`frontier.transition.TransitionTable` of the measured pairs and a rule
fitted to them (:func:`frontier.transition.fit_transition_rule`: τ linear in |Δ SM clock|,
|Δ memory clock| and a power-limit change, by non-negative least squares; ε = ready power at
the target × τ) that prices the pairs not measured. A switch the rule cannot price (a knob no
measured pair changes) raises :class:`frontier.transition.TransitionRuleError`: never (0, 0).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

import numpy as np

from frontier.operating_point import OperatingPoint
from frontier.transition import TransitionTable

from .device import Device, restoring
from .protocol import Protocol, measure_ready_power_w


def settle_time_s(device: Device, frm: OperatingPoint, to: OperatingPoint, timeout_s: float = 1.0,
                  poll_s: float = 0.0005, reached: Callable[[], bool] | None = None) -> float:
    """Seconds from setting ``to`` (starting at ``frm``) until the SM clock reads its target
    (``timeout_s`` when it never does, e.g. a clock above what the cap allows while idle).

    ``frm`` is reached from the original settings (a None knob there means "as found").
    ``reached`` (default: the SM clock reads ``to.sm_clock_mhz``; always true when ``to``
    locks no SM clock) says when the new setting shows; ``ecal selftest --write`` passes
    one per knob (the memory clock NVML reports, the power limit read back)."""
    device.restore()
    device.set_operating_point(frm)
    target = to.sm_clock_mhz
    if reached is None:
        def reached() -> bool:
            return target is None or device.clocks_mhz()["sm"] == target
    t0 = device.time_s()
    device.set_operating_point(to)
    while not reached():
        if device.time_s() - t0 > timeout_s:
            break
        device.idle(poll_s)
    return device.time_s() - t0


def measure_transitions(device: Device, omegas: Iterable[OperatingPoint], repeats: int = 3,
                        protocol: Protocol | None = None) -> TransitionTable:
    """A table of measured (τ, ε) for every ordered pair of distinct ω_dev in ``omegas``, and
    the rule fitted to them for every other pair (see the module docstring; its residual is
    ``table.rule.describe()``).

    The device is restored afterwards. ε = ready power at the target × τ (see module doc)."""
    devs = list(dict.fromkeys(o.dev for o in omegas))
    opset = device.operating_set()
    for o in devs:
        opset.validate(o)              # reject before any change
    pairs: dict[tuple[OperatingPoint, OperatingPoint], tuple[float, float]] = {}
    with restoring(device):
        ready = {}
        for o in devs:
            device.restore()
            device.set_operating_point(o)
            ready[o] = measure_ready_power_w(device, protocol or Protocol(ready_windows=1))
        for a, b in itertools.permutations(devs, 2):
            tau = float(np.median([settle_time_s(device, a, b) for _ in range(max(1, repeats))]))
            pairs[(a, b)] = (tau, ready[b] * tau)
    return TransitionTable.fitted(pairs, power_w=ready, device=None,
                                  source=f"measured settle time on {device.name} "
                                         "(ε = ready power × τ; other pairs by the fitted rule)")
