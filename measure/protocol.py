"""The characterization protocol (spec §10, measurement-notes §4): warm-up, null context,
windows sized from a timed trial, tick-aligned energy windows, repetitions until the relative
standard error of E reaches a target.

Tick alignment: the energy counter advances only every ~100 ms, so a naive window is off by up
to one tick of energy at each end. Start the window right after a tick, and at the end wait for
the next tick and subtract ready power × that wait: 0.6 s windows then reach ~0.5–1 % spread.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from frontier.errors import InputError
from frontier.operating_point import OperatingPoint
from frontier.signature import Signature

from .device import Device, DeviceError

WindowKind = Literal["tick_aligned", "naive"]

#: Clock-event reasons that are not part of the operating point (recorded per window).
log = logging.getLogger(__name__)

SLOWDOWN_REASONS = frozenset({"HwSlowdown", "SwThermalSlowdown", "HwThermalSlowdown", "HwPowerBrakeSlowdown"})


@dataclass(frozen=True)
class Protocol:
    """How one operating point is measured.

    ``window``: ``"tick_aligned"`` (default) or ``"naive"``. ``window_s``: target length of a
    measurement window. ``warmup_s``: work run (unmeasured) before the first window.
    ``cooldown_s``: idle gap before each window (the null context); with ``baseline_temp_c``
    the gap instead lasts until the temperature is within ``baseline_tol_c`` of it (at most
    ``cooldown_max_s``). Windows repeat until the relative standard error of E is at most
    ``target_rse`` (at least ``min_windows``, at most ``max_windows``).

    ``context_temp_c``: characterize **in context** instead of at the null context — after
    the warm-up, keep running the work until the die reaches this temperature (at most
    ``preheat_max_s``), e.g. the temperature the device held while a plan ran (what
    :func:`execution.run.run_plan` reports); a tight cap throttles harder on a hot die, which a
    point measured cool does not see.

    ``cap_settle_s``: how long power-capped work must run before the power limit, a time
    average in the firmware, holds it at the limit. On the real H200 capped windows of 0.6 s
    averaged 7 % above the limit and only windows of seconds sat at it
    (``experiments/results/sim_cap_window.md``); ``ecal selftest --write`` measures it for your
    card (``power_cap_windows``). A point that ran power-capped (``SwPowerCap``) for less than
    this, warm-up and windows together, is flagged in its metadata (``cap_window_short``):
    its energy may not be what the same work costs run for longer.
    """

    window: WindowKind = "tick_aligned"
    window_s: float = 0.6
    warmup_s: float = 0.2
    cooldown_s: float = 0.0
    baseline_temp_c: float | None = None
    baseline_tol_c: float = 2.0
    cooldown_max_s: float = 30.0
    target_rse: float = 0.01
    min_windows: int = 3
    max_windows: int = 20
    tick_timeout_s: float = 1.0
    poll_s: float = 0.0
    ready_window_s: float = 1.0
    ready_windows: int = 3
    context_temp_c: float | None = None
    preheat_max_s: float = 30.0
    cap_settle_s: float = 3.0

    def __post_init__(self) -> None:
        if self.window not in ("tick_aligned", "naive"):
            raise InputError(f"Protocol.window must be 'tick_aligned' or 'naive', got {self.window!r}")
        for k in ("window_s", "target_rse", "tick_timeout_s", "ready_window_s"):
            if not getattr(self, k) > 0:
                raise InputError(f"Protocol.{k} must be > 0, got {getattr(self, k)!r}")
        for k in ("warmup_s", "cooldown_s", "cooldown_max_s", "poll_s", "preheat_max_s",
                  "cap_settle_s"):
            if getattr(self, k) < 0:
                raise InputError(f"Protocol.{k} must be >= 0, got {getattr(self, k)!r}")
        if not 1 <= self.min_windows <= self.max_windows:
            raise InputError(f"need 1 <= min_windows ({self.min_windows}) <= max_windows ({self.max_windows})")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (goes into every signature's metadata)."""
        return asdict(self)


#: Zeus/Kareus-style naive protocol: 5 s windows with 5 s cooldown.
NAIVE_5S = Protocol(window="naive", window_s=5.0, cooldown_s=5.0, min_windows=3)


@dataclass(frozen=True)
class Window:
    """One measured window: totals over ``n`` invocations plus what the device reported."""

    n: int
    time_s: float
    energy_j: float
    tail_s: float = 0.0
    temp_start_c: float = float("nan")
    temp_end_c: float = float("nan")
    sm_clock_mhz: float = float("nan")
    throttle_reasons: tuple[str, ...] = field(default=())

    @property
    def time_per_invocation_s(self) -> float:
        """T per invocation, s."""
        return self.time_s / self.n

    @property
    def energy_per_invocation_j(self) -> float:
        """E per invocation, J."""
        return self.energy_j / self.n


def wait_for_tick(device: Device, timeout_s: float = 1.0, poll_s: float = 0.0) -> tuple[float, float]:
    """Poll the energy counter until it changes; return (device time, counter value) then."""
    e0 = device.energy_j()
    t0 = device.time_s()
    while True:
        if poll_s > 0:
            device.idle(poll_s)
        e = device.energy_j()
        t = device.time_s()
        if e != e0:
            return t, e
        if t - t0 > timeout_s:
            raise DeviceError(f"{device.name}: energy counter did not advance within {timeout_s:g} s "
                              "(is the counter supported on this GPU?)")


def close_window(device: Device, protocol: Protocol, tick: bool) -> tuple[float, float]:
    """End a measurement window now: (the counter's reading J, the tail s between now and that
    reading). Tick-aligned (``tick``): wait for the counter's next tick, so the tail is idle
    time at ready power the caller subtracts; else read it at once (no tail)."""
    if not tick:
        return device.energy_j(), 0.0
    t_end = device.time_s()
    t_b, e_b = wait_for_tick(device, protocol.tick_timeout_s, protocol.poll_s)
    return e_b, t_b - t_end


def ready_power_windows_w(device: Device, protocol: Protocol = Protocol()) -> list[float]:
    """The energy counter's slope over each of ``protocol.ready_windows`` tick-aligned idle
    windows, W (what :func:`measure_ready_power_w` averages; ``ecal selftest`` also reads their
    spread)."""
    powers = []
    for _ in range(max(1, protocol.ready_windows)):
        t_a, e_a = wait_for_tick(device, protocol.tick_timeout_s, protocol.poll_s)
        device.idle(protocol.ready_window_s)
        t_b, e_b = wait_for_tick(device, protocol.tick_timeout_s, protocol.poll_s)
        powers.append((e_b - e_a) / (t_b - t_a))
    return powers


def measure_ready_power_w(device: Device, protocol: Protocol = Protocol()) -> float:
    """Ready (static) power at the current operating point: device idle with a context alive,
    counter slope over tick-aligned windows (spec §10.1), W."""
    return float(np.mean(ready_power_windows_w(device, protocol)))


#: Calls of a work that may take zero device time before the timed trial gives up on it (a
#: real GPU's monotonic clock always advances over a thousand launches).
ZERO_TIME_CALLS = 1024


def time_per_invocation_s(device: Device, work: Any, sm_count: int | None = None,
                          min_trial_s: float = 0.02) -> float:
    """A timed trial: run ``work`` 1, 2, 4, ... times until the run lasts ``min_trial_s``.

    Raises :class:`DeviceError` when :data:`ZERO_TIME_CALLS` calls take no device time at all:
    the work does not run on this device (e.g. a Python function on the simulator, whose
    clock only kernels advance), and no window could ever be sized from it."""
    n = 1
    while True:
        t0 = device.time_s()
        device.run(work, n, sm_count=sm_count)
        dt = device.time_s() - t0
        if dt <= 0 and n >= ZERO_TIME_CALLS:
            hint = (": the simulator's clock advances only for simulated kernels; run your own "
                    "code on a GPU (nvml:INDEX) or give a simulated preset"
                    if getattr(device, "simulated", False) else "")
            raise DeviceError(f"{n} calls of the work took no device time on {device.name}; "
                              f"it does not run there{hint}")
        if dt >= min_trial_s or n >= 1 << 20:
            return dt / n
        n *= 2 if dt <= 0 else max(2, min(64, math.ceil(min_trial_s / dt * 1.2)))


def measure_window(device: Device, work: Any, n: int, protocol: Protocol, ready_w: float,
                   sm_count: int | None = None) -> Window:
    """Measure one window of ``n`` back-to-back invocations (naive or tick-aligned).

    Clocks and throttle reasons come from :meth:`~measure.device.Device.run_and_read`, read
    *while the work runs* (after a run the GPU is idle and reports nothing about the work);
    the end temperature is read when the work is done."""
    temp0 = device.temperature_c()
    if protocol.window == "tick_aligned":
        t_a, e_a = wait_for_tick(device, protocol.tick_timeout_s, protocol.poll_s)
    else:
        e_a, t_a = device.energy_j(), device.time_s()
    reading = device.run_and_read(work, n, sm_count=sm_count)
    t_s = device.time_s()
    temp_end = device.temperature_c()
    if protocol.window == "tick_aligned":
        t_b, e_b = wait_for_tick(device, protocol.tick_timeout_s, protocol.poll_s)
        tail = t_b - t_s
        energy = (e_b - e_a) - ready_w * tail
    else:
        e_b = device.energy_j()
        tail = 0.0
        energy = e_b - e_a
    return Window(n=n, time_s=t_s - t_a, energy_j=energy, tail_s=tail, temp_start_c=temp0,
                  temp_end_c=temp_end, sm_clock_mhz=reading.sm_clock_mhz,
                  throttle_reasons=reading.throttle_reasons)


def null_context(device: Device, protocol: Protocol) -> float:
    """Bring the device to the null context before a window; returns the idle time spent, s.

    The null context is the device ready and idle (context alive, no work, not capped) near
    its steady ready temperature at the operating point. A sweep assumes each point starts
    there; the simulator's :meth:`~measure.sim.SimulatedGPU.seed_point` puts it exactly
    there, so a point does not depend on the points measured before it."""
    spent = 0.0
    if protocol.cooldown_s > 0:
        device.idle(protocol.cooldown_s)
        spent += protocol.cooldown_s
    if protocol.baseline_temp_c is not None:
        step = 0.5
        while (device.temperature_c() > protocol.baseline_temp_c + protocol.baseline_tol_c
               and spent < protocol.cooldown_max_s):
            device.idle(step)
            spent += step
    return spent


def preheat(device: Device, work: Any, protocol: Protocol, sm_count: int | None = None) -> float:
    """Run ``work`` until the die reaches ``protocol.context_temp_c`` (at most
    ``protocol.preheat_max_s`` of device time); the seconds spent. A device that is already
    that warm is left as it is."""
    target = protocol.context_temp_c
    if target is None:
        return 0.0
    t0 = device.time_s()
    t1 = time_per_invocation_s(device, work, sm_count)
    batch = max(1, math.ceil(0.25 / t1))         # check the temperature every ~0.25 s
    while device.temperature_c() < target and device.time_s() - t0 < protocol.preheat_max_s:
        device.run(work, batch, sm_count=sm_count)
    return device.time_s() - t0


def relative_se(values: list[float]) -> float:
    """Relative standard error of the mean (inf for fewer than 2 values)."""
    if len(values) < 2:
        return math.inf
    a = np.asarray(values, dtype=float)
    m = float(a.mean())
    return float(a.std(ddof=1) / math.sqrt(a.size) / abs(m)) if m else math.inf


def measure_point(device: Device, work: Any, name: str, protocol: Protocol = Protocol(),
                  ready_w: float | None = None, sm_count: int | None = None,
                  omega: OperatingPoint | None = None, kappa: str | None = None,
                  theta: str | None = None, meta: Mapping[str, Any] | None = None) -> Signature:
    """Characterize ``work`` at the device's current operating point; a measured
    :class:`Signature` (variances of the mean over windows) with the protocol's metadata.

    When the work runs on ``sm_count`` SMs and ``omega`` names that same count, the signature
    records the count the device *grants* (a request is rounded up to the hardware's
    granularity: 66 runs as 72 on Hopper), with the request in ``meta["sm_requested"]``."""
    omega, granted_meta = _granted_omega(device, omega or OperatingPoint(), sm_count)
    start = device.time_s()
    if ready_w is None:
        ready_w = measure_ready_power_w(device, protocol)
    if protocol.warmup_s > 0:
        t1 = time_per_invocation_s(device, work, sm_count)
        device.run(work, max(1, math.ceil(protocol.warmup_s / t1)), sm_count=sm_count)
    if protocol.context_temp_c is not None:
        preheat(device, work, protocol, sm_count)
    t1 = time_per_invocation_s(device, work, sm_count)
    n = max(1, math.ceil(protocol.window_s / t1))
    windows: list[Window] = []
    cooldowns: list[float] = []
    while len(windows) < protocol.max_windows:
        cooldowns.append(null_context(device, protocol))
        windows.append(measure_window(device, work, n, protocol, ready_w, sm_count))
        es = [w.energy_per_invocation_j for w in windows]
        if len(windows) >= protocol.min_windows and relative_se(es) <= protocol.target_rse:
            break
    times = [w.time_per_invocation_s for w in windows]
    energies = [w.energy_per_invocation_j for w in windows]
    reasons = sorted({r for w in windows for r in w.throttle_reasons})
    # the longest stretch the capped work ran before a window ended: the warm-up and every
    # window, back to back when there is no cooldown between them
    ran_s = protocol.warmup_s + (sum(w.time_per_invocation_s * n for w in windows)
                                 if protocol.cooldown_s == 0 and protocol.baseline_temp_c is None
                                 else max(w.time_per_invocation_s * n for w in windows))
    cap_short = "SwPowerCap" in reasons and ran_s < protocol.cap_settle_s
    # Power capping is part of the operating point; thermal or hardware slowdown is not: flag it.
    slow = [i for i, w in enumerate(windows) if set(w.throttle_reasons) & SLOWDOWN_REASONS]
    m = dict(meta or {})
    m.update(granted_meta)
    m.update(device.describe())
    m.update(
        protocol=protocol.window, protocol_settings=protocol.to_dict(),
        invocations_per_window=n, windows=len(windows), ready_power_w=ready_w,
        rse_energy=relative_se(energies), target_rse=protocol.target_rse,
        sm_clocks_seen_mhz=[w.sm_clock_mhz for w in windows],
        temperatures_c=[[w.temp_start_c, w.temp_end_c] for w in windows],
        throttle_reasons=reasons, slowdown_windows=slow, cooldowns_s=cooldowns,
        device_time_s=device.time_s() - start,
        variance="of the mean over windows of per-invocation values",
    )
    if "SwPowerCap" in reasons:
        m.update(capped_run_s=ran_s, cap_window_short=cap_short)
        if cap_short:
            log.info("%s: power-capped for %.2f s, under the cap's settle time %.2f s "
                     "(Protocol.cap_settle_s): flagged cap_window_short", name, ran_s,
                     protocol.cap_settle_s)
    return Signature.from_runs(name, times, energies, s_w=ready_w, omega=omega,
                               kappa=kappa, theta=theta, meta=m)


def _granted_omega(device: Device, omega: OperatingPoint,
                   sm_count: int | None) -> tuple[OperatingPoint, dict[str, Any]]:
    """``omega`` with its ``sm_count`` as granted when the work runs on that allocation."""
    if sm_count is None or omega.sm_count != sm_count:
        return omega, {}
    from .sm_alloc import granted_sm_count

    granted = granted_sm_count(device, int(sm_count))
    if granted == sm_count:
        return omega, {}
    return omega.with_(sm_count=granted), {"sm_requested": int(sm_count)}
