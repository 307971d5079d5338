"""Measuring transition elements: what switching ω_dev costs on a device (spec §9.5).

A settle-time probe (measurement-notes §4 step 1): from ``frm``, set ``to`` and poll the SM
clock until it reads the target; the time from the call to the settled reading is τ. The energy
counter ticks every ~100 ms and cannot resolve a switch of milliseconds, so ε is taken as the
ready power at the target × τ (no energy beyond static: the device is idle while it settles).
The result is a :class:`frontier.transition.TransitionTable` of measured pairs.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import numpy as np

from frontier.operating_point import OperatingPoint
from frontier.transition import TransitionTable

from .device import Device, restoring
from .protocol import Protocol, measure_ready_power_w


def settle_time_s(device: Device, frm: OperatingPoint, to: OperatingPoint, timeout_s: float = 1.0,
                  poll_s: float = 0.0005) -> float:
    """Seconds from setting ``to`` (starting at ``frm``) until the SM clock reads its target
    (``timeout_s`` when it never does, e.g. a clock above what the cap allows while idle).

    ``frm`` is reached from the original settings (a None knob there means "as found")."""
    device.restore()
    device.set_operating_point(frm)
    t0 = device.time_s()
    device.set_operating_point(to)
    target = to.sm_clock_mhz
    while target is not None and device.clocks_mhz()["sm"] != target:
        if device.time_s() - t0 > timeout_s:
            break
        device.idle(poll_s)
    return device.time_s() - t0


def measure_transitions(device: Device, omegas: Iterable[OperatingPoint], repeats: int = 3,
                        protocol: Protocol | None = None) -> TransitionTable:
    """A table of measured (τ, ε) for every ordered pair of distinct ω_dev in ``omegas``.

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
    return TransitionTable.from_pairs(pairs, device=None,
                                      source=f"measured settle time on {device.name} "
                                             "(ε = ready power × τ)")
