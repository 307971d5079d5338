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
"""

from __future__ import annotations

import math
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from frontier.operating_point import OperatingPoint
from frontier.signature import Signature

from .device import Device, restoring
from .grid import Grid, parse_grid
from .protocol import Protocol, measure_point, measure_ready_power_w
from .results_log import ResultsLog, dev_key, point_key


@dataclass(frozen=True)
class Progress:
    """Where a sweep stands: ``done`` of ``total`` points, ``eta_s`` real seconds left."""

    done: int
    total: int
    label: str
    elapsed_s: float
    eta_s: float
    measured: bool
    signature: Signature | None = None


def print_progress(p: Progress) -> None:
    """Default progress callback: one line per point on stderr."""
    what = "measured" if p.measured else ("resumed" if p.signature is not None else "skipped")
    extra = ""
    if p.signature is not None:
        extra = f"  T={p.signature.time_s * 1e3:.4g} ms  E={p.signature.energy_j:.4g} J"
    eta = f"{p.eta_s:.0f} s" if math.isfinite(p.eta_s) else "?"
    print(f"[{p.done:>{len(str(p.total))}}/{p.total}] {p.label:<40} {what}{extra}  eta {eta}",
          file=sys.stderr, flush=True)


@dataclass(frozen=True)
class SweepResult:
    """Signatures measured (or resumed) in grid order, and the points skipped by early stop."""

    signatures: tuple[Signature, ...]
    skipped: tuple[tuple[str | None, OperatingPoint], ...] = ()
    resumed: int = 0
    measured: int = 0
    meta: Mapping[str, Any] = field(default_factory=dict)


def _kappa_of(work: Any) -> str | None:
    return getattr(work, "kappa", None)


def _group(op: OperatingPoint) -> OperatingPoint:
    return op.with_(sm_clock_mhz=None)


def sweep(device: Device, works: Mapping[str | None, Any], element: str,
          grid: str | Grid | Mapping | None = None, protocol: Protocol = Protocol(),
          results_path: str | None = None, progress: Callable[[Progress], None] | None = print_progress,
          early_stop_k: int | None = None, theta: str | None = None,
          ready_power_w: float | None = None) -> SweepResult:
    """Measure ``element`` for every (ω, κ) in ``grid`` × ``works`` (κ label → work).

    Ready power is calibrated once per ω_dev (and kept in the results file); pass
    ``ready_power_w`` to reuse a calibration when the sweep does not change ω_dev (read-only).

    The grid is validated against the device (and its read-only guard) before anything
    changes; the device is restored afterwards on every exit path.

    With ``results_path`` the sweep is the file's only writer (it holds the file's locks
    throughout, whatever name it is reached by; a second process gets :class:`~measure.locks.LockedError` naming this one's
    PID), refuses a file from another measurement (:class:`~measure.results_log.
    ResultsMismatchError`) and resumes the points the file has. Before each measured point
    (and each ready-power calibration) it calls ``device.seed_point(key)``, so on the
    simulator a point depends only on its key and the seed: interrupted-and-resumed equals
    uninterrupted, bit for bit.
    """
    g = parse_grid(grid)
    opset = device.operating_set()
    g.validate(opset, read_only=device.read_only)
    if ready_power_w is not None and g.changes_device:
        raise ValueError("ready_power_w is for sweeps at one ω_dev; this grid changes clocks or "
                         "power limits, whose ready power is calibrated per ω_dev")
    if early_stop_k is not None and early_stop_k < 1:
        raise ValueError(f"early_stop_k must be >= 1, got {early_stop_k}")
    log = (ResultsLog.open(results_path, f"sweep of {element} on {device.name}")
           if results_path is not None else ResultsLog(None))
    with log:
        header = {"element": element, "kappas": list(works), "grid": g.to_dict(),
                  "protocol": protocol.to_dict(), "device": device.describe(),
                  "host": socket.gethostname()}
        log.check_identity(header, Protocol().to_dict())
        log.write_header(header)
        return _sweep(device, works, element, g, protocol, log, progress, early_stop_k, theta,
                      ready_power_w, results_path)


def _sweep(device: Device, works: Mapping[str | None, Any], element: str, g: Grid,
           protocol: Protocol, log: ResultsLog, progress: Callable[[Progress], None] | None,
           early_stop_k: int | None, theta: str | None, ready_power_w: float | None,
           results_path: str | None) -> SweepResult:
    points = g.points()
    total = len(points) * len(works)
    out: list[Signature] = []
    skipped: list[tuple[str | None, OperatingPoint]] = []
    rises: dict[tuple[str | None, OperatingPoint], tuple[int, float]] = {}
    t_start = time.monotonic()
    n_measured = n_resumed = done = 0
    applied: OperatingPoint | None = None
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
                        if ready_power_w is None:
                            device.seed_point(f"ready {dk}")
                        log.add_ready(op, ready_power_w if ready_power_w is not None
                                      else measure_ready_power_w(device, protocol))
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
    return SweepResult(tuple(out), tuple(skipped), n_resumed, n_measured,
                       {"grid": g.to_dict(), "results_path": results_path,
                        "dropped_partial_line": log.dropped_partial_line, **device.describe()})


def _report(progress, done, total, label, t_start, n_measured, measured, sig) -> None:
    if progress is None:
        return
    elapsed = time.monotonic() - t_start
    eta = elapsed / n_measured * (total - done) if n_measured else math.inf
    progress(Progress(done, total, label, elapsed, eta, measured, sig))
