"""Sweeps over ω × κ grids with progress, a resumable results file and an optional early stop.

Order: for each operating point of the grid (SM clock varying fastest, as given — scan it
downwards), each implementation κ is measured. With ``early_stop_k`` the scan of falling SM
clocks stops for a κ (and the other knobs) once its energy has risen k times in a row
(Perseus: past that, lower clocks are Pareto-inefficient).

Resume is faithful: the results file (:mod:`measure.results_log`) keeps each point losslessly,
one sweep at a time writes it (:meth:`~measure.results_log.ResultsLog.open`: a lock on the
real path's ``.lock`` and an ``flock`` on the file itself, so symlinks and hard links do not
let a second writer in; a file that is not a results file is refused, unchanged), a file from another GPU, seed,
protocol or element is refused, and ``device.seed_point(key)`` before each measured point
makes a simulated point depend on its key and the seed only.

Ready power is re-measured during long sweeps (:mod:`measure.ready_drift`: every
``ReadyRecheck.every_s`` of device time at an ω_dev, also when a resumed sweep finds its file's
value that old); the spread of the readings is carried as σ_s in the signatures and a drift beyond
tolerance is flagged (``meta["ready_drift"]``).
"""

from __future__ import annotations

import json
import logging
import math
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from frontier.errors import InputError
from frontier.operating_point import OperatingPoint
from frontier.signature import Signature

from .device import Device, restoring
from .grid import Grid, parse_grid
from .progress import ProgressCallback, ProgressEvent, eta_s
from .protocol import Protocol, measure_point, measure_ready_power_w
from .ready_drift import ReadyRecheck, drifts
from .results_log import DEVICE_IDENTITY, ResultsLog, dev_key, point_key
from .sm_alloc import granted_sm_count

_logger = logging.getLogger(__name__)


#: A sweep's progress event (the library's one progress type, :mod:`measure.progress`).
Progress = ProgressEvent


@dataclass(frozen=True)
class SweepResult:
    """Signatures measured (or resumed) in grid order, and the points skipped by early stop."""

    signatures: tuple[Signature, ...]
    skipped: tuple[tuple[str | None, OperatingPoint], ...] = ()
    resumed: int = 0
    measured: int = 0
    meta: Mapping[str, Any] = field(default_factory=dict)


class ReadyPowerCache:
    """Ready-power calibrations of one campaign, reused across its elements.

    Ready (static) power belongs to the device at an ω_dev, not to the element measured there,
    so a campaign of several elements needs it once per (device, ω_dev): calibrating it again
    for every element was most of a small campaign's device time. Keys are the device's
    identity (``describe()``: name, UUID, driver and the simulator's seed, as a results file
    checks them), the ω_dev and the ready-power protocol settings (``ready_window_s``,
    ``ready_windows``), so values measured another way are never mixed in.

    Pass one cache to every :func:`sweep` / :func:`~measure.characterize.characterize` of the
    campaign. A sweep with a results file seeds the cache with the values its file holds (a
    resumed campaign calibrates nothing it calibrated before) and records every value it uses
    in its file (``"source": "campaign"`` when reused), so each file stays self-contained.

    On the simulator, reuse changes no signature: a calibration depends only on the seed and
    the ω_dev (see :meth:`~measure.sim.SimulatedGPU.seed_point`). On a real GPU the reused value
    is the one measured earlier in the campaign; the protocol's null context (cooldown, baseline
    temperature) is what keeps the device near the state it was calibrated in.

    A mutable record (not a value object): ``calibrations`` (values measured), ``reuses``
    (values served to a sweep that would otherwise have calibrated), ``calibration_time_s``
    (device time spent calibrating).
    """

    def __init__(self) -> None:
        self._w: dict[tuple, float] = {}
        self._t: dict[tuple, float] = {}       # device time of each value's reading
        self.calibrations = 0
        self.reuses = 0
        self.calibration_time_s = 0.0

    @staticmethod
    def key(device: Device, omega: OperatingPoint, protocol: Protocol) -> tuple:
        """The cache key of ``omega``'s ω_dev on ``device`` under ``protocol``."""
        d = device.describe()
        ident = tuple(str(d.get(f)) for f in DEVICE_IDENTITY)
        return ident, dev_key(omega), float(protocol.ready_window_s), int(protocol.ready_windows)

    def get(self, device: Device, omega: OperatingPoint, protocol: Protocol) -> float | None:
        """The cached ready power at ``omega``'s ω_dev, W (None when not calibrated yet)."""
        return self._w.get(self.key(device, omega, protocol))

    def calibrate(self, device: Device, omega: OperatingPoint, protocol: Protocol) -> tuple[float, bool]:
        """The ready power at ``omega``'s ω_dev (which must be applied): the cached value, or a
        new calibration (``device.seed_point("ready <ω_dev>")`` first, so a simulated value
        depends on the seed and ω_dev only). Returns (W, whether it was reused)."""
        k = self.key(device, omega, protocol)
        if k in self._w:
            self.reuses += 1
            return self._w[k], True
        device.seed_point(f"ready {dev_key(omega)}")
        t0 = device.time_s()
        w = float(measure_ready_power_w(device, protocol))
        self.calibration_time_s += device.time_s() - t0
        self.calibrations += 1
        self._w[k] = w
        self._t[k] = device.time_s()
        return w, False

    def age_s(self, device: Device, omega: OperatingPoint, protocol: Protocol) -> float:
        """Device time since the held value was read, s (inf for a value seeded from a file
        or not held: it was read at another time)."""
        t = self._t.get(self.key(device, omega, protocol))
        return math.inf if t is None else device.time_s() - t

    def update(self, device: Device, omega: OperatingPoint, protocol: Protocol, power_w: float) -> None:
        """Hold a value re-measured now (a sweep's recheck) for the rest of the campaign."""
        k = self.key(device, omega, protocol)
        self._w[k] = float(power_w)
        self._t[k] = device.time_s()

    def seed(self, device: Device, omega: OperatingPoint, protocol: Protocol, power_w: float,
             age_s: float = math.inf) -> None:
        """Take a value calibrated earlier (e.g. read from a results file, ``age_s`` ago; inf:
        unknown) unless one is held."""
        k = self.key(device, omega, protocol)
        if k not in self._w:
            self._w[k] = float(power_w)
            if math.isfinite(age_s):
                self._t[k] = device.time_s() - age_s

    def values(self) -> dict[str, dict[str, float]]:
        """JSON-ready: device UUID (or name) → ω_dev label → ready power, W."""
        out: dict[str, dict[str, float]] = {}
        for (ident, dk, _, _), w in self._w.items():
            dev = ident[1] if ident[1] != "None" else ident[0]
            out.setdefault(dev, {})[_dev_label(dk)] = w
        return out

    def __len__(self) -> int:
        return len(self._w)


def _dev_label(dk: str) -> str:
    """The label of an ω_dev from its results-file key (:func:`~measure.results_log.dev_key`)."""
    return OperatingPoint.from_dict(json.loads(dk)).label()


def _kappa_of(work: Any) -> str | None:
    return getattr(work, "kappa", None)


def _group(op: OperatingPoint) -> OperatingPoint:
    return op.with_(sm_clock_mhz=None)


def sweep(device: Device, works: Mapping[str | None, Any], element: str,
          grid: str | Grid | Mapping | None = None, protocol: Protocol = Protocol(),
          results_path: str | None = None, progress: ProgressCallback | None = None,
          early_stop_k: int | None = None, theta: str | None = None,
          ready_power_w: float | None = None,
          ready_cache: ReadyPowerCache | None = None,
          ready_recheck: ReadyRecheck | None = None) -> SweepResult:
    """Measure ``element`` for every (ω, κ) in ``grid`` × ``works`` (κ label → work).

    Ready power is calibrated once per ω_dev (and kept in the results file); pass
    ``ready_power_w`` to reuse a calibration when the sweep does not change ω_dev (read-only),
    or ``ready_cache`` (a :class:`ReadyPowerCache` shared by a campaign's sweeps) to calibrate
    each (device, ω_dev) once across elements. ``meta["ready_power_w"]`` of the result maps
    the label of each ω_dev measured to the ready power used there, W (the last reading).

    ``ready_recheck`` (default :class:`~measure.ready_drift.ReadyRecheck`: every 600 s of
    device time, 2 % tolerance) re-measures ready power at an ω_dev during the sweep (not
    when ``ready_power_w`` is given); each point uses the latest reading. With readings that
    differ at an ω_dev its points carry σ_s (``var_s_w2``, the readings' standard
    deviation) and ``meta["ready_drift"]`` maps its label to the readings, σ_s, spread and
    ``flagged`` (a spread beyond tolerance, also logged as a warning).

    The grid is validated against the device (and its read-only guard) before anything
    changes; the device is restored afterwards on every exit path.

    With ``results_path`` the sweep is the file's only writer (it holds the file's locks
    throughout, whatever name it is reached by; a second process gets :class:`~measure.locks.LockedError` naming this one's
    PID), refuses a file from another measurement (:class:`~measure.results_log.
    ResultsMismatchError`) and resumes the points the file has. Before each measured point
    (and each ready-power calibration) it calls ``device.seed_point(key)``, so on the
    simulator a point depends only on its key and the seed: interrupted-and-resumed equals
    uninterrupted, bit for bit.

    ``progress`` (default: none) gets one :class:`~measure.progress.ProgressEvent` per point
    (``operation="sweep"``): measured, resumed from the file, or skipped by early stop.
    """
    g = parse_grid(grid)
    opset = device.operating_set()
    g.validate(opset, read_only=device.read_only)
    g, sm_granted = _as_granted(device, g)
    if ready_power_w is not None and g.changes_device:
        raise InputError("ready_power_w is for sweeps at one ω_dev; this grid changes clocks or "
                         "power limits, whose ready power is calibrated per ω_dev")
    if early_stop_k is not None and early_stop_k < 1:
        raise InputError(f"early_stop_k must be >= 1, got {early_stop_k}")
    log = (ResultsLog.open(results_path, f"sweep of {element} on {device.name}")
           if results_path is not None else ResultsLog(None))
    with log:
        header = {"element": element, "kappas": list(works), "grid": g.to_dict(),
                  "protocol": protocol.to_dict(), "device": device.describe(),
                  "host": socket.gethostname()}
        if sm_granted:
            header["sm_granted"] = {str(k): v for k, v in sm_granted.items()}
        log.check_identity(header, Protocol().to_dict())
        log.write_header(header)
        res = _sweep(device, works, element, g, protocol, log, progress, early_stop_k, theta,
                     ready_power_w, results_path, ready_cache,
                     ready_recheck if ready_recheck is not None else ReadyRecheck())
    if sm_granted:
        res = replace(res, meta={**res.meta, "sm_granted": {str(k): v for k, v in sm_granted.items()}})
    return res


def _as_granted(device: Device, g: Grid) -> tuple[Grid, dict[int, int]]:
    """``g`` in the SM counts ``device`` grants (a request is rounded up to the hardware's
    granularity); says once, as a warning, which requests run as which counts."""
    g2, changed = g.granted(lambda n: granted_sm_count(device, n))
    if changed:
        pairs = ", ".join(f"{r} as {n}" for r, n in changed.items())
        _logger.warning("%s grants SMs in steps of %d: sm_count %s; the signatures record the "
                    "granted counts", device.name, device.operating_set().sm_granularity, pairs)
    return g2, changed


def _sweep(device: Device, works: Mapping[str | None, Any], element: str, g: Grid,
           protocol: Protocol, log: ResultsLog, progress: ProgressCallback | None,
           early_stop_k: int | None, theta: str | None, ready_power_w: float | None,
           results_path: str | None, cache: ReadyPowerCache | None,
           recheck: ReadyRecheck) -> SweepResult:
    points = g.points()
    total = len(points) * len(works)
    out: list[Signature] = []
    skipped: list[tuple[str | None, OperatingPoint]] = []
    rises: dict[tuple[str | None, OperatingPoint], tuple[int, float]] = {}
    t_start = time.monotonic()
    n_measured = n_resumed = done = 0
    applied: OperatingPoint | None = None
    read_at: dict[str, float] = {}      # ω_dev key -> device time of its last reading (this run)
    if cache is not None and ((log.header or {}).get("device") or {}).get("uuid"):
        # a resumed file's calibrations serve the rest of the campaign (only from a file that
        # records which GPU it is: check_identity has matched that with this device)
        for dk, w in log.ready_w.items():
            try:
                omega = OperatingPoint.from_dict(json.loads(dk))
            except (TypeError, ValueError):
                continue        # not a key this module writes: the file's own points keep it
            cache.seed(device, omega, protocol, w, _file_age_s(log, dk))
    with restoring(device):
        for op in points:
            for kappa, work in works.items():
                done += 1
                gkey = (kappa, _group(op))
                label = f"{element}{'/' + kappa if kappa else ''} @ {op.label()}"
                k = point_key(element, kappa, op)
                if early_stop_k is not None and rises.get(gkey, (0, 0.0))[0] >= early_stop_k:
                    skipped.append((kappa, op))
                    _report(progress, done, total, label, t_start, n_measured, False, None)
                    continue
                sig = log.points.get(k)
                measured = sig is None
                if measured:
                    if op.dev != OperatingPoint() and op.dev != applied:
                        device.set_operating_point(op.dev)
                        applied = op.dev
                    dk = dev_key(op)
                    if dk not in log.ready_w:
                        source = None
                        if ready_power_w is not None:
                            w = ready_power_w
                        elif cache is not None:
                            age = cache.age_s(device, op, protocol)
                            w, reused = cache.calibrate(device, op, protocol)
                            source = "campaign" if reused else None
                            if reused and recheck.every_s is not None:
                                read_at[dk] = device.time_s() - age     # when it was read
                        else:
                            device.seed_point(f"ready {dk}")
                            w = measure_ready_power_w(device, protocol)
                        if source is None:
                            read_at[dk] = device.time_s()
                        log.add_ready(op, w, source=source)
                    if dk not in read_at and dk in log.ready_unix_s:
                        read_at[dk] = device.time_s() - _file_age_s(log, dk)   # read by a run before
                    if (ready_power_w is None and recheck.every_s is not None
                            and device.time_s() - read_at.get(dk, -math.inf) >= recheck.every_s):
                        # the value in force was read long ago (in this run or one before)
                        device.seed_point(f"ready {dk}")
                        w = measure_ready_power_w(device, protocol)
                        read_at[dk] = device.time_s()
                        log.add_ready(op, w, source="recheck")
                        if cache is not None:
                            cache.update(device, op, protocol, w)
                    device.seed_point(k)
                    sig = measure_point(device, work, element, protocol, ready_w=log.ready_w[dk],
                                        sm_count=op.sm_count, omega=op,
                                        kappa=kappa if kappa is not None else _kappa_of(work),
                                        theta=theta or getattr(work, "theta", None),
                                        meta={"grid": g.label()})
                    sig = log.add_point(k, sig)
                    n_measured += 1
                else:
                    n_resumed += 1
                out.append(sig)
                if early_stop_k is not None and op.sm_clock_mhz is not None:
                    count, last = rises.get(gkey, (0, math.inf))
                    rises[gkey] = (count + 1 if sig.energy_j > last else 0, sig.energy_j)
                _report(progress, done, total, label, t_start, n_measured, measured, sig)
    used = {_dev_label(dev_key(p)): log.ready_w[dev_key(p)] for p in points
            if dev_key(p) in log.ready_w}
    out, drift = _carry_drift(out, log, recheck, f"{element} on {device.name}")
    meta: dict[str, Any] = {"grid": g.to_dict(), "results_path": results_path, "ready_power_w": used,
                            "dropped_partial_line": log.dropped_partial_line, **device.describe()}
    if drift:
        meta["ready_drift"] = drift
    return SweepResult(tuple(out), tuple(skipped), n_resumed, n_measured, meta)


def _file_age_s(log: ResultsLog, dk: str) -> float:
    """How long ago the results file's value in force at ``dk`` was read, s (wall clock; inf
    when the file does not say)."""
    when = log.ready_unix_s.get(dk)
    return math.inf if when is None else max(0.0, time.time() - when)


def _carry_drift(sigs: list[Signature], log: ResultsLog, recheck: ReadyRecheck,
                 where: str) -> tuple[list[Signature], dict[str, Any]]:
    """``sigs`` with σ_s (``var_s_w2``) at every ω_dev whose readings differ, and the
    ``ready_drift`` meta (label → :meth:`~measure.ready_drift.ReadyDrift.to_dict`); a flagged
    drift is logged as a warning."""
    found = drifts(log.ready_history, {k: _dev_label(k) for k in log.ready_history}, recheck.tolerance)
    for d in found.values():
        if d.flagged:
            _logger.warning("%s", d.message(where))
    var = {k: d.sigma_s_w ** 2 for k, d in found.items() if d.sigma_s_w > 0}
    if var:
        sigs = [s.with_(var_s_w2=var[dev_key(s.omega)]) if dev_key(s.omega) in var else s
                for s in sigs]
    return sigs, {d.label: d.to_dict() for d in found.values()}


def _report(progress: ProgressCallback | None, done: int, total: int, label: str,
            t_start: float, n_measured: int, measured: bool, sig: Signature | None) -> None:
    if progress is None:
        return
    elapsed = time.monotonic() - t_start
    progress(ProgressEvent(done, total, label, elapsed, eta_s(elapsed, n_measured, total - done),
                           measured, sig, operation="sweep"))
