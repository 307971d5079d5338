"""``ecal selftest --write``: the checks that change a setting, and put it back.

Run only with ``--write`` (the device opened writable): every change goes through the
device's own setter, so on a real GPU each one is journalled before it is made
(:mod:`measure.journal`) and the whole stage runs inside :func:`measure.device.restoring`,
which puts the settings back on exit, on an exception and on SIGINT/SIGTERM/SIGHUP/SIGQUIT; a
process killed outright (SIGKILL) leaves the journal for ``ecal restore``.

* ``power_cap_windows``: an element whose uncapped draw is above a power limit set at
  :data:`CAP_SHARE` of it, run in bursts of :data:`CAP_WINDOWS_S` from rest; each burst's
  average power against the limit. The protocol assumes a capped element draws at most the
  limit over any window it measures; on real hardware the limit is a time average, so short
  bursts may exceed it (issue 30).
* ``switch_latency_sm_clock``, ``switch_latency_mem_clock``, ``switch_latency_power_limit``:
  the time from the setter call until the change shows — the SM or memory clock NVML reports
  (:func:`measure.transitions.settle_time_s`, the probe ``ecal transitions`` uses), and for
  the power limit the time until a capped element's kernels run at their capped speed (the
  limit read back, where no element can show it).
* ``settings_restored``: the operating point after the restore equals the one found.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from frontier.operating_point import OperatingPoint

from .device import Device, DeviceError, restoring
from .protocol import Protocol, time_per_invocation_s, wait_for_tick
from .selftest_check import Check, SelftestWorks, Verdict
from .transitions import settle_time_s

log = logging.getLogger(__name__)

#: Burst lengths of ``power_cap_windows``, s.
CAP_WINDOWS_S = (0.05, 0.2, 1.0, 3.0)
#: Bursts per length (their mean power is reported).
CAP_REPEATS = 2
#: The limit set for ``power_cap_windows``, as a share of the element's uncapped draw.
CAP_SHARE = 0.75
#: A burst averaging more than the limit by this share exceeds it.
CAP_TOLERANCE = 0.03
#: Idle before each burst, s (at least the burst itself): the limit's averaging window forgets
#: the last burst, so each starts from rest, as a capped element does after idle or low power.
CAP_REST_S = 1.0
#: Switch latency verdicts: pass at or below this (under half a counter period, so a switch
#: between two windows is not seen by the counter), warn up to :data:`SWITCH_WARN_S`.
SWITCH_PASS_S = 0.05
SWITCH_WARN_S = 0.5
#: How long a probe waits for a setting to show, s (never shown: fail).
SWITCH_TIMEOUT_S = 2.0
#: Timed chunks of the power-limit probe, s of work each.
CHUNK_S = 0.005
#: Knob probes per knob (the median is kept).
SWITCH_REPEATS = 3

#: The checks this module adds, in order.
WRITE_CHECKS = ("power_cap_windows", "switch_latency_sm_clock", "switch_latency_mem_clock",
                "switch_latency_power_limit", "settings_restored")


@dataclass(frozen=True)
class Burst:
    """One burst of work from rest: its length and average board power."""

    target_s: float
    time_s: float
    power_w: float


def burst_power_w(device: Device, work: Any, n: int, ready_w: float, protocol: Protocol) -> Burst:
    """Run ``work`` ``n`` times between two counter ticks and return the burst's average power.

    The counter's ~100 ms ticks cannot resolve a 50 ms burst by themselves, so the burst sits
    inside a tick-aligned span: the span's energy less the ready power over the idle rest of
    the span, divided by the burst's own time."""
    t_a, e_a = wait_for_tick(device, protocol.tick_timeout_s, protocol.poll_s)
    t0 = device.time_s()
    device.run(work, n)
    t1 = device.time_s()
    t_b, e_b = wait_for_tick(device, protocol.tick_timeout_s, protocol.poll_s)
    busy = t1 - t0
    if busy <= 0:
        raise DeviceError(f"{n} calls of the work took no device time on {device.name}")
    energy = (e_b - e_a) - ready_w * ((t_b - t_a) - busy)
    return Burst(0.0, busy, energy / busy)


def _bursts(device: Device, work: Any, t_inv: float, ready_w: float, protocol: Protocol,
            windows_s: Sequence[float], repeats: int, rest_s: float) -> list[dict[str, Any]]:
    rows = []
    for w in windows_s:
        got = []
        for _ in range(max(1, repeats)):
            device.idle(max(rest_s, w))
            n = max(1, round(w / t_inv))
            got.append(burst_power_w(device, work, n, ready_w, protocol))
        rows.append({"window_s": w, "time_s": statistics.fmean(b.time_s for b in got),
                     "power_w": statistics.fmean(b.power_w for b in got),
                     "powers_w": [b.power_w for b in got]})
    return rows


@dataclass(frozen=True)
class CapSetup:
    """What the cap check found: the element's uncapped draw and time, the limit it set, and
    its time per invocation under that limit (for the power-limit latency probe)."""

    uncapped_w: float
    uncapped_time_s: float
    cap_w: float
    capped_time_s: float


def check_power_cap_windows(device: Device, works: SelftestWorks | None, ready_w: float,
                            protocol: Protocol, windows_s: Sequence[float] = CAP_WINDOWS_S,
                            repeats: int = CAP_REPEATS, share: float = CAP_SHARE,
                            rest_s: float = CAP_REST_S) -> tuple[Check, CapSetup | None]:
    """Cap ``works.a`` at ``share`` of its uncapped draw and hold bursts of each length in
    ``windows_s`` against the limit (module doc). Leaves the limit set (the caller restores)."""
    assumption = ("a power limit holds over every window the protocol measures: a capped "
                  "element's average power is at most the limit")
    if works is None:
        return Check("power_cap_windows", assumption, "skipped",
                     detail="skipped: needs work to run on the GPU (torch for nvml:N)"), None
    a = works.a
    device.seed_point("selftest cap")
    t_u = time_per_invocation_s(device, a)
    p_u = burst_power_w(device, a, max(1, round(1.0 / t_u)), ready_w, protocol).power_w
    lo, hi = device.operating_set().power_limit_range_w
    cap = float(min(hi, max(lo, round(share * p_u))))
    data: dict[str, Any] = {"element": works.a_name, "uncapped_power_w": p_u,
                            "uncapped_time_s": t_u, "power_limit_w": cap,
                            "tolerance": CAP_TOLERANCE}
    if cap >= 0.95 * p_u:
        return Check("power_cap_windows", assumption, "skipped", None, "x",
                     f"skipped: {works.a_name} draws {p_u:.0f} W, and the lowest power limit is "
                     f"{lo:.0f} W: it cannot be capped here", data), None
    device.set_operating_point(OperatingPoint(power_limit_w=cap))
    t_c = time_per_invocation_s(device, a)
    rows = _bursts(device, a, t_c, ready_w, protocol, windows_s, repeats, rest_s)
    for r in rows:
        r["ratio_to_limit"] = r["power_w"] / cap
    data.update(capped_time_s=t_c, windows=rows)
    over = [r for r in rows if r["ratio_to_limit"] > 1 + CAP_TOLERANCE]
    worst = max(r["ratio_to_limit"] for r in rows)
    longest = rows[-1]
    per = ", ".join(f"{_ms(r['window_s'])} {r['power_w']:.0f} W" for r in rows)
    verdict: Verdict
    if not over:
        verdict = "pass"
        detail = (f"limit {cap:.0f} W ({share:.0%} of {p_u:.0f} W uncapped): {per}; held in every "
                  f"window, even {_ms(rows[0]['window_s'])}")
        if getattr(device, "simulated", False):
            detail += " (the simulator holds the limit at every instant)"
    elif longest in over:
        verdict = "fail"
        detail = (f"limit {cap:.0f} W: {per}; even {_ms(longest['window_s'])} bursts average "
                  f"{longest['ratio_to_limit'] - 1:+.1%} over it: the limit does not hold")
    else:
        held = next(r for r in rows if r not in over and all(o["window_s"] < r["window_s"] for o in over))
        verdict = "warn"
        detail = (f"limit {cap:.0f} W: {per}; bursts up to {_ms(over[-1]['window_s'])} average up to "
                  f"{worst - 1:+.0%} over it (a time average, not a ceiling): measure capped "
                  f"points in windows of >= {_ms(held['window_s'])}")
        data["shortest_window_at_limit_s"] = held["window_s"]
    return (Check("power_cap_windows", assumption, verdict, worst, "x", detail, data),
            CapSetup(p_u, t_u, cap, t_c))


def _ms(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s < 1 else f"{s:g} s"


def _latency_verdict(tau: float, timeout_s: float) -> Verdict:
    if tau >= timeout_s:
        return "fail"
    return "pass" if tau <= SWITCH_PASS_S else "warn" if tau <= SWITCH_WARN_S else "fail"


def _latency_check(name: str, what: str, taus: list[float], timeout_s: float,
                   data: dict[str, Any], how: str) -> Check:
    assumption = (f"a {what} change shows within {_ms(SWITCH_PASS_S)} (under half a counter "
                  "period: a switch between windows is not seen by the counter)")
    tau = statistics.median(taus)
    verdict = _latency_verdict(tau, timeout_s)
    detail = f"median of {len(taus)}: {how}"
    if verdict == "fail" and tau >= timeout_s:
        detail += f"; never showed within {timeout_s:g} s"
    elif verdict != "pass":
        detail += "; price switches with measured costs (ecal transitions), not a flat guess"
    data.update(latencies_s=taus, latency_s=tau)
    return Check(name, assumption, verdict, tau, "s", detail, data)


def check_sm_clock_latency(device: Device, repeats: int = SWITCH_REPEATS,
                           timeout_s: float = SWITCH_TIMEOUT_S) -> Check:
    """Setter call to the SM clock NVML reports, locking a mid-range clock from the found state."""
    clocks = device.operating_set().supported_sm_clocks()
    target = clocks[len(clocks) // 2]
    to = OperatingPoint(sm_clock_mhz=target)
    taus = [settle_time_s(device, OperatingPoint(), to, timeout_s) for _ in range(max(1, repeats))]
    return _latency_check("switch_latency_sm_clock", "SM clock lock", taus, timeout_s,
                          {"to_mhz": target}, f"lock {target:g} MHz until the SM clock reads it")


def check_mem_clock_latency(device: Device, repeats: int = SWITCH_REPEATS,
                            timeout_s: float = SWITCH_TIMEOUT_S) -> Check:
    """Setter call to the memory clock NVML reports, locking the lowest memory clock."""
    mems = device.operating_set().mem_clocks_mhz
    name = "switch_latency_mem_clock"
    if len(mems) < 2:
        return Check(name, "a memory clock lock shows quickly", "skipped",
                     detail=f"skipped: one memory clock only ({mems[0]:g} MHz)" if mems else "skipped")
    target = mems[-1]
    to = OperatingPoint(mem_clock_mhz=target)

    def shows() -> bool:
        return device.clocks_mhz()["mem"] == target

    taus = [settle_time_s(device, OperatingPoint(), to, timeout_s, reached=shows)
            for _ in range(max(1, repeats))]
    return _latency_check(name, "memory clock lock", taus, timeout_s, {"to_mhz": target},
                          f"lock {target:g} MHz until the memory clock reads it")


def _enforced_after_s(device: Device, work: Any, setup: CapSetup, timeout_s: float,
                      rest_s: float) -> float:
    """From rest at the found limit: set ``setup.cap_w`` and run ``work`` in chunks of
    :data:`CHUNK_S` until a chunk runs at least halfway from the uncapped to the capped time
    per invocation; seconds from the setter call to the end of that chunk."""
    device.restore()
    device.idle(rest_s)
    per = max(1, round(CHUNK_S / setup.uncapped_time_s))
    mid = 0.5 * (setup.uncapped_time_s + setup.capped_time_s)
    t0 = device.time_s()
    device.set_operating_point(OperatingPoint(power_limit_w=setup.cap_w))
    while True:
        c0 = device.time_s()
        device.run(work, per)
        c1 = device.time_s()
        if (c1 - c0) / per >= mid or c1 - t0 >= timeout_s:
            return c1 - t0


def check_power_limit_latency(device: Device, works: SelftestWorks | None, setup: CapSetup | None,
                              repeats: int = SWITCH_REPEATS, timeout_s: float = SWITCH_TIMEOUT_S,
                              rest_s: float = CAP_REST_S) -> Check:
    """Setter call to the capped element's kernels running at their capped speed; where no
    element slows measurably under the limit, to the limit read back."""
    lo, hi = device.operating_set().power_limit_range_w
    if works is not None and setup is not None and setup.capped_time_s > 1.02 * setup.uncapped_time_s:
        taus = [_enforced_after_s(device, works.a, setup, timeout_s, rest_s)
                for _ in range(max(1, repeats))]
        return _latency_check(
            "switch_latency_power_limit", "power limit", taus, timeout_s,
            {"to_w": setup.cap_w, "shown_by": "kernel_time"},
            f"limit {setup.cap_w:.0f} W until {works.a_name} runs at its capped speed "
            f"({setup.uncapped_time_s * 1e3:.3g} → {setup.capped_time_s * 1e3:.3g} ms per call)")
    target = setup.cap_w if setup is not None else float(round(0.5 * (lo + hi)))
    to = OperatingPoint(power_limit_w=target)

    def shows() -> bool:
        return device.get_operating_point().power_limit_w == target

    taus = [settle_time_s(device, OperatingPoint(), to, timeout_s, reached=shows)
            for _ in range(max(1, repeats))]
    return _latency_check("switch_latency_power_limit", "power limit", taus, timeout_s,
                          {"to_w": target, "shown_by": "limit_read_back"},
                          f"limit {target:.0f} W until it reads back (no capped element shows it)")


def check_restored(found: OperatingPoint, now: OperatingPoint) -> Check:
    """The device-wide settings after the restore against those found before ``--write``."""
    assumption = "every setting --write changed is put back"
    data = {"found": found.dev.to_dict(), "after": now.dev.to_dict()}
    if found.dev == now.dev:
        return Check("settings_restored", assumption, "pass", detail=f"as found: {found.dev.label()}",
                     data=data)
    return Check("settings_restored", assumption, "fail",
                 detail=f"found {found.dev.label()}, now {now.dev.label()}: run `ecal restore`", data=data)


def run_write_checks(device: Device, works: SelftestWorks | None, ready_w: float | None,
                     protocol: Protocol, say: Callable[[str], None] | None = None) -> list[Check]:
    """Every check of :data:`WRITE_CHECKS` on ``device`` (opened writable), inside
    :func:`~measure.device.restoring`: the settings are back when this returns or raises, and
    on a terminating signal. A check whose setter the device refuses fails with the reason
    (e.g. no permission: root or zeusd, docs/zeusd.md) and the others still run."""
    from .protocol import measure_ready_power_w

    def tell(stage: str) -> None:
        if say is not None:
            say(stage)

    found = device.get_operating_point()
    checks: list[Check] = []
    with restoring(device):
        if ready_w is None:
            ready_w = measure_ready_power_w(device, protocol)
        tell("power_cap_windows")
        setup: CapSetup | None = None
        try:
            cap, setup = check_power_cap_windows(device, works, ready_w, protocol)
        except DeviceError as exc:
            cap = Check("power_cap_windows", "a power limit holds over every window", "fail",
                        detail=str(exc))
        checks.append(cap)
        tell("switch_latency")
        probes: list[Callable[[], Check]] = [
            lambda: check_sm_clock_latency(device),
            lambda: check_mem_clock_latency(device),
            lambda: check_power_limit_latency(device, works, setup)]
        for name, probe in zip(WRITE_CHECKS[1:4], probes):
            device.restore()
            try:
                checks.append(probe())
            except DeviceError as exc:
                checks.append(Check(name, "a setting change shows quickly", "fail", detail=str(exc)))
    checks.append(check_restored(found, device.get_operating_point()))
    return checks
