"""Adaptive characterization: measure only the grid points that can matter (issue 21).

:func:`characterize_adaptive` measures a coarse clock × power-limit grid, then, round after
round, bounds every unmeasured point of the full grid from its measured neighbours
(:mod:`frontier.bounds`) and measures only points whose bound is still too wide to decide.

**Plans use measured points only.** :meth:`AdaptiveResult.frontier` (and ``save``,
``keyed``) hand planning the measured points; the estimates of predicted points are there on
request (``include_estimates=True``) and decide what is skipped. So every operating point a
plan picks was measured (on the simulator, bit-identical to the same point of a full sweep),
and a skip must bound what it costs a plan: ``plan_tol``, the relative energy a plan from
measured points may pay over the skipped point (default ``rel_tol``). An unmeasured point is
**skipped** when

* ``dominated``: even its best case (every coordinate at its lower bound) is weakly dominated,
  within k·σ of the measurements (in energy at most ``plan_tol``), by a point already
  measured, in the coordinates of the criterion the element will be composed under (``"TE"``:
  (T, E) for ⊗; ``"Tsd"``: (T, s, d) for ⊕multi; ``"Td"``: (T, s, d) and only by a point at
  the same ω_dev, since a ⊕ branch shares its device's ω_dev — spec §7,
  :mod:`frontier.pareto`); or it is the same setting as a measured point (an uncapped point
  at the same SM clock and another power limit, which it does not reach; not for ``"Td"``);
* ``predicted``: its bound is narrower than the tolerance in every such coordinate
  (tolerance = max(k·σ, ``rel_tol``) relative) and, on the uncapped curve, a measured point
  at least as fast (within k·σ in T) is within ``plan_tol`` of its best case in the others, so
  a deadline it would meet costs at most that much more from measured points. (A capped
  row's points are one setting; any measured run of the row stands for them.) An *estimate*
  (bound midpoint, variance covering the bound) is kept for it, flagged ``meta["estimated"]``.

**Resumable.** With ``journal`` (a results file, :mod:`measure.results_log`) every measured
point is appended, flushed and fsync'd, before it is used; a rerun with the same journal reads
those points back instead of measuring them, and since the rounds are deterministic given the
measurements it takes the same decisions (interrupted and resumed equals uninterrupted; on the
simulator bit for bit). A journal of another element, κ set, grid, protocol, device or
adaptive setting, or a full sweep's results file, is refused
(:class:`~measure.results_log.ResultsMismatchError`), and the file is left as it is.

Each measured point stops at its target relative standard error (the protocol repeats windows
until then; :func:`measure.protocol.measure_point` through :func:`measure.sweep.sweep`, so
points are seeded by key as in a full sweep: on the simulator an adaptively measured point is
bit-identical to the same point of a full sweep).

Assumptions (stated in every result's ``meta["assumptions"]``), along the SM clock f, within
one slice (κ, memory clock, SM count):

* T is non-increasing and convex in f; E is convex in f (the U shape of energy versus clock).
  Each measured value is taken as ± k·σ/√2 (σ at least :data:`MIN_RSE_TIME` /
  :data:`MIN_RSE_ENERGY` or ``rse_floor``), so the worst-case interval arithmetic of the
  two-point chords and secants is about as wide as their ± k·σ statistical bounds.
* A power limit that is never reached changes nothing: uncapped points at any limit are
  samples of one curve. A point capped at (f, P) (clock seen below the clock set, or the
  firmware's ``SwPowerCap``) is capped at every higher clock and lower limit; one uncapped at
  (f, P) is uncapped at every lower clock and higher limit. Where neither is known the point
  is undecided, and its row is bisected until the boundary is found.
* Above its clock ceiling a power limit holds the power whatever clock is set, so the capped
  points of one limit are repeated measurements of one point: their mean ± k × its standard
  error from their spread (at least :data:`MIN_PLATEAU_POINTS` of them first). The spread is
  used because a capped clock wanders between points more than one point's windows show.
  As a *dominator* a capped point counts as that plateau at its pessimistic end (mean + k ×
  standard error, or its own run if worse), and dominates nothing before the plateau's spread
  is known: one capped run can look a few % faster and cheaper than its setting is on average.
* Static (ready) power s depends on the set clock only and is non-decreasing and convex in
  it; d = E − s·T follows from the other bounds.

The fastest operating point of every row (:func:`fastest_points`: the top clock at each
power limit, memory clock and SM count) is always measured, whatever the coarse grid, so a
deadline of 1× the fastest stays feasible on the adaptive frontier.

Where measured data break these (noise beyond k·σ, a non-convex stretch, a kink) the point's
value falls outside the bound it had just before it was measured: that is recorded as a
:class:`Violation`. Where the bounds of an unmeasured point contradict each other, the hull of
its nearest measured neighbours, widened by the contradiction (at most 10 %), is used instead,
so one local kink does not make every point near it be measured.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from frontier.bounds import UNBOUNDED, Interval, dominating, merge_close, shape_bound
from frontier.errors import InputError
from frontier.operating_point import OperatingPoint
from frontier.signature import Signature

from .device import Device
from .grid import Grid, parse_grid
from .progress import ProgressCallback, ProgressEvent
from .protocol import Protocol
from .results_log import ResultsLog, ResultsMismatchError, header_form, point_key

Criterion = Literal["TE", "Td", "Tsd"]
CRITERIA = ("TE", "Td", "Tsd")

#: Coordinates whose bounds decide a point, per criterion (smaller is better in each).
COORDS: Mapping[str, tuple[str, ...]] = {"TE": ("time_s", "energy_j"),
                                         "Td": ("time_s", "s_w", "d_j"),
                                         "Tsd": ("time_s", "s_w", "d_j")}

ASSUMPTIONS = (
    "T non-increasing and convex in the effective SM clock; E convex in it",
    "a power limit never reached changes nothing (uncapped points at any limit share one "
    "curve); a point capped at (f, P) is capped at higher clocks and lower limits",
    "above its clock ceiling a power limit holds the power, so the capped points of one limit "
    "are repeated measurements of one point (their spread is their noise)",
    "ready power s depends on the set SM clock only, non-decreasing and convex in it",
    "measured values known to ± k·σ (their standard errors)",
)

#: Floors on the relative σ of T and E: a replayed table or a very steady kernel reports σ ≈ 0,
#: while timing quantization and run-to-run drift are ~1e-4..1e-3.
MIN_RSE_TIME = 5e-4
MIN_RSE_ENERGY = 1e-3
#: Capped points of one power limit needed before their plateau is trusted (their spread).
MIN_PLATEAU_POINTS = 3

SkipReason = Literal["dominated", "predicted", "unresolved"]


class AdaptiveError(InputError):
    """Bad input to adaptive characterization (grid, coarse grid, criterion, tolerances)."""


@dataclass(frozen=True)
class SkippedPoint:
    """A grid point that was not measured, and why.

    ``reason``: ``"dominated"`` (its best case is dominated by ``by`` within k·σ),
    ``"predicted"`` (bounded tighter than the tolerance; ``estimate`` holds the estimate) or
    ``"unresolved"`` (``max_rounds`` ran out first). ``bounds`` maps each coordinate
    (``time_s``, ``energy_j``, ``s_w``, ``d_j``) to its (lo, hi) when skipped.
    """

    omega: OperatingPoint
    kappa: str | None
    reason: SkipReason
    detail: str
    bounds: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    by: str | None = None
    estimate: Signature | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"omega": self.omega.to_dict(), "kappa": self.kappa, "reason": self.reason,
                "detail": self.detail, "by": self.by,
                "bounds": {k: list(v) for k, v in self.bounds.items()}}


@dataclass(frozen=True)
class Violation:
    """A measured value outside the bound the assumptions gave it just before it was measured
    (by more than k·σ): where the data break convexity, monotonicity or the cap model."""

    omega: OperatingPoint
    kappa: str | None
    coordinate: str
    measured: float
    bound: tuple[float, float]

    @property
    def excess_rel(self) -> float:
        """How far outside, relative to the measured value."""
        lo, hi = self.bound
        out = lo - self.measured if self.measured < lo else self.measured - hi
        return out / abs(self.measured) if self.measured else math.inf

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"omega": self.omega.to_dict(), "kappa": self.kappa, "coordinate": self.coordinate,
                "measured": self.measured, "bound": list(self.bound),
                "excess_rel": self.excess_rel}


@dataclass(frozen=True)
class AdaptiveResult:
    """What adaptive characterization measured, what it skipped and why.

    ``signatures``: measured points (grid order); ``skipped``: one :class:`SkippedPoint` per
    grid point (× κ) not measured; ``violations``: where data broke the assumptions;
    ``gpu_s``: device time spent (warm-up, ready-power calibration, windows, cooldowns and
    switches, all included); ``grid``: every (κ, ω) of the full grid.
    """

    element: str
    criterion: str
    signatures: tuple[Signature, ...]
    skipped: tuple[SkippedPoint, ...]
    violations: tuple[Violation, ...]
    grid: tuple[tuple[str | None, OperatingPoint], ...]
    rounds: int
    gpu_s: float
    meta: Mapping[str, Any] = field(default_factory=dict)
    measured_keys: tuple[tuple[str | None, OperatingPoint], ...] = ()

    @property
    def estimates(self) -> tuple[Signature, ...]:
        """Estimated signatures of the ``predicted`` points (``meta["estimated"]`` True)."""
        return tuple(s.estimate for s in self.skipped if s.estimate is not None)

    @property
    def measured_fraction(self) -> float:
        """Measured points / grid points."""
        return len(self.signatures) / len(self.grid) if self.grid else 0.0

    @property
    def simulated(self) -> bool:
        """Whether the device was simulated (or replayed)."""
        return bool(self.meta.get("simulated"))

    def skipped_by_reason(self) -> dict[str, int]:
        """Counts of skipped points per reason."""
        out: dict[str, int] = {}
        for s in self.skipped:
            out[s.reason] = out.get(s.reason, 0) + 1
        return out

    def frontier(self, include_estimates: bool = False, criterion: str | None = None) -> Any:
        """The frontier (``frontier.pareto.pareto_frontier``) of the measured points: what
        planning gets, so every operating point a plan picks was measured. The estimates of
        predicted points (their bound in their variance and ``meta``) are added only on
        request (``include_estimates=True``): they decide what is skipped, and an estimate is
        a bound's midpoint, which can be optimistic by up to the tolerance."""
        from frontier.pareto import pareto_frontier

        pts = list(self.signatures) + (list(self.estimates) if include_estimates else [])
        return pareto_frontier(pts, criterion or self.criterion, name=self.element)

    def keyed(self, include_estimates: bool = False) -> dict[str, Signature]:
        """Signatures keyed ``element@κ@ω`` (as :meth:`measure.characterize.
        CharacterizationResult.keyed`); estimates (``meta["estimated"]``) only on request."""
        out: dict[str, Signature] = {}
        for s in self.signatures + (self.estimates if include_estimates else ()):
            parts = [s.name] + ([s.kappa] if s.kappa else []) + [s.omega.label()]
            out["@".join(parts)] = s
        return out

    def save(self, path: str | os.PathLike, include_estimates: bool = False) -> Path:
        """Write the measured signatures (and the estimates, on request) as a signature file
        (atomic), keyed as in :meth:`keyed`."""
        from frontier.io import save_signatures

        return save_signatures(path, self.keyed(include_estimates))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: measured signatures, every skipped point and its reason."""
        from frontier.io import signature_to_dict

        return {"format": "energy-calculus/adaptive-characterization", "element": self.element,
                "criterion": self.criterion, "simulated": self.simulated,
                "grid_points": len(self.grid), "measured": len(self.signatures),
                "skipped_by_reason": self.skipped_by_reason(), "rounds": self.rounds,
                "gpu_s": self.gpu_s, "meta": dict(self.meta),
                "signatures": [signature_to_dict(s) for s in self.signatures],
                "skipped": [s.to_dict() for s in self.skipped],
                "violations": [v.to_dict() for v in self.violations]}

    def to_table(self) -> str:
        """Printable: a header line, then one line per grid point (measured or skipped, why)."""
        dev = self.meta.get("device", "?")
        counts = ", ".join(f"{n} {r}" for r, n in sorted(self.skipped_by_reason().items()))
        head = [f"{self.element} on {dev}{'  [SIMULATED]' if self.simulated else ''}: "
                f"{len(self.signatures)}/{len(self.grid)} points measured in {self.rounds} "
                f"rounds ({counts or 'none skipped'}), {self.gpu_s:.1f} GPU-s, criterion "
                f"{self.criterion}, {len(self.violations)} assumption violation(s)"]
        by_key = dict(zip(self.measured_keys, self.signatures))
        skip = {(s.kappa, s.omega): s for s in self.skipped}
        lines = []
        for kappa, op in self.grid:
            lab = op.label() + (f" κ={kappa}" if kappa else "")
            if (kappa, op) in by_key:
                s = by_key[(kappa, op)]
                lines.append(f"  measured   {lab:<34} T={s.time_s * 1e3:.4g} ms  E={s.energy_j:.4g} J")
            else:
                sk = skip[(kappa, op)]
                lines.append(f"  {sk.reason:<10} {lab:<34} {sk.detail}")
        return "\n".join(head + lines)


# ---------------------------------------------------------------------------------------------
# internals
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Meas:
    kappa: str | None
    op: OperatingPoint
    sig: Signature
    x_mhz: float          # effective clock (the clock seen while it ran when capped)
    capped: bool


def _slice_key(kappa: str | None, op: OperatingPoint) -> tuple:
    return (kappa, op.mem_clock_mhz, op.sm_count)


def _x_of(sig: Signature, op: OperatingPoint, tol_x: float) -> tuple[float, bool]:
    f = float(op.sm_clock_mhz)  # type: ignore[arg-type]
    seen = [float(c) for c in sig.meta.get("sm_clocks_seen_mhz", []) or []
            if c is not None and math.isfinite(float(c)) and float(c) > 0]
    reasons = set(sig.meta.get("throttle_reasons", []) or [])
    x = float(np.mean(seen)) if seen else f
    # the firmware's own flag, or a clock seen below the clock set
    capped = x < f - tol_x or bool(reasons & {"SwPowerCap", "HwPowerBrakeSlowdown"})
    return (min(x, f) if capped else f), capped


def _rse(vals: list[float]) -> float:
    v = [x for x in vals if math.isfinite(x)]
    return float(np.median(v)) if v else 0.0


class _Planner:
    """Bounds and decisions for one element; holds the measured points."""

    def __init__(self, points: list[tuple[str | None, OperatingPoint]], criterion: str,
                 k_sigma: float, rel_tol: float, rel_tol_time: float, s_rse: float,
                 rse_floor: tuple[float, float] = (0.0, 0.0), plan_tol: float | None = None):
        self.points = points
        self.plan_tol = rel_tol if plan_tol is None else plan_tol
        self.criterion = criterion
        self.k = k_sigma
        self.rel_tol = rel_tol
        self.rel_tol_time = rel_tol_time
        self.s_rse = s_rse
        self.rse_floor = (max(MIN_RSE_TIME, rse_floor[0]), max(MIN_RSE_ENERGY, rse_floor[1]))
        clocks = sorted({float(op.sm_clock_mhz) for _, op in points})  # type: ignore[arg-type]
        self.tol_x = 0.5 * float(np.min(np.diff(clocks)))
        self.meas: dict[tuple[str | None, OperatingPoint], _Meas] = {}
        self._cache: dict[tuple, dict[str, Any]] = {}
        self._dom_cache: tuple[int, list[_Meas], np.ndarray] | None = None

    # -- data ----------------------------------------------------------------------------------
    def add(self, kappa: str | None, op: OperatingPoint, sig: Signature) -> None:
        x, capped = _x_of(sig, op, self.tol_x)
        self.meas[(kappa, op)] = _Meas(kappa, op, sig, x, capped)

    def _slice(self, key: tuple) -> list[_Meas]:
        return self._prep(key)["ms"]

    def _prep(self, key: tuple) -> dict[str, Any]:
        """Per-slice arrays (merged measured intervals), cached until the next measurement."""
        ck = (key, len(self.meas))
        hit = self._cache.get(ck)
        if hit is not None:
            return hit
        ms = [m for m in self.meas.values() if _slice_key(m.kappa, m.op) == key]
        rt = max(self.rse_floor[0], _rse([m.sig.sd_time_s / m.sig.time_s for m in ms
                                          if m.sig.time_s > 0]))
        re = max(self.rse_floor[1], _rse([m.sig.sd_energy_j / m.sig.energy_j for m in ms
                                          if m.sig.energy_j > 0]))
        out: dict[str, Any] = {"ms": ms, "rt": rt, "re": re}
        # the curve over the clock is sampled by the uncapped points only: a capped run
        # dithers around its ceiling, so its mean clock is not a clean abscissa
        free = [m for m in ms if not m.capped]
        out["free"] = free
        if ms:
            xs = np.array([m.x_mhz for m in free])
            for c, rs in (("time_s", rt), ("energy_j", re)):
                v = np.array([getattr(m.sig, c) for m in free])
                sd = np.array([m.sig.sd_time_s if c == "time_s" else m.sig.sd_energy_j
                               for m in free])
                # each value as ± k·σ/√2 (σ at least the median rse: one point's σ can be 0):
                # worst-case interval arithmetic over the two- and three-point chords and
                # secants is then about as wide as their ± k·σ statistical bounds
                half = self.k * np.maximum(sd, rs * np.abs(v)) / math.sqrt(2.0)
                out[c] = merge_close(xs, v - half, v + half, self.tol_x)
                out[c + "/raw"] = (v - half, v + half)
            fs = np.array([float(m.op.sm_clock_mhz) for m in ms])  # type: ignore[arg-type]
            sv = np.array([m.sig.s_w for m in ms])
            half = self.k * self.s_rse * sv
            out["s_w"] = merge_close(fs, sv - half, sv + half, 0.0)
        self._cache = {k: v for k, v in self._cache.items() if k[1] == len(self.meas)}
        self._cache[ck] = out
        return out

    def _rses(self, ms: list[_Meas]) -> tuple[float, float]:
        if not ms:
            return 0.0, 0.0
        p = self._prep(_slice_key(ms[0].kappa, ms[0].op))
        return p["rt"], p["re"]

    def regime(self, kappa: str | None, op: OperatingPoint) -> str:
        """``"free"`` (certainly not power-capped), ``"capped"`` (certainly capped) or
        ``"unknown"``, from monotonicity: a point capped at (f', P') caps every (f ≥ f',
        P ≤ P'); one uncapped at (f', P') leaves every (f ≤ f', P ≥ P') uncapped."""
        if op.power_limit_w is None:
            ms = self._prep(_slice_key(kappa, op))["ms"]
            if not any(m.capped for m in ms):
                return "free"
        ms = self._prep(_slice_key(kappa, op))["ms"]
        f = float(op.sm_clock_mhz)  # type: ignore[arg-type]
        p = op.power_limit_w if op.power_limit_w is not None else math.inf
        capped = free = False
        for m in ms:
            fm = float(m.op.sm_clock_mhz)  # type: ignore[arg-type]
            pm = m.op.power_limit_w if m.op.power_limit_w is not None else math.inf
            if m.capped and fm <= f and pm >= p:
                capped = True
            elif not m.capped and fm >= f and pm <= p:
                free = True
        if capped == free:
            return "unknown"
        return "capped" if capped else "free"

    def _plateau(self, prep: dict[str, Any], op: OperatingPoint) -> dict[str, Interval]:
        """Capped: the firmware holds the power at the limit whatever clock is set above the
        ceiling, so the row's capped points are repeated measurements of one point. Their mean
        ± k × its standard error (from their spread: the capped clock wanders between points
        more than one point's windows show); unbounded with fewer than
        :data:`MIN_PLATEAU_POINTS` of them (their spread is not known yet)."""
        row = [m for m in prep["ms"] if m.capped and m.op.power_limit_w == op.power_limit_w]
        if len(row) < MIN_PLATEAU_POINTS:
            return {"time_s": UNBOUNDED, "energy_j": UNBOUNDED}
        out = {}
        for c, rs in (("time_s", prep["rt"]), ("energy_j", prep["re"])):
            v = np.array([getattr(m.sig, c) for m in row])
            mean = float(np.mean(v))
            se = float(np.std(v, ddof=1) / math.sqrt(v.size))
            half = self.k * max(se, rs * mean)
            out[c] = Interval(mean - half, mean + half).clip_below(0.0)
        return out

    def _curve(self, prep: dict[str, Any], f: float) -> dict[str, Interval]:
        """Not capped: the convex/monotone bounds at set clock f from every uncapped point of
        the slice (at any power limit: a limit never reached changes nothing)."""
        out = {}
        for c, mono in (("time_s", "decreasing"), ("energy_j", None)):
            x, lo, hi = prep[c]
            if x.size < 2:
                out[c] = UNBOUNDED
                continue
            same = np.flatnonzero(np.abs(x - f) < 0.5 * self.tol_x)
            if same.size:
                # this set clock is measured at another power limit it does not reach: the
                # same setting, known as well as that measurement (a contradiction among its
                # neighbours says nothing more about it)
                out[c] = Interval(float(lo[same[0]]), float(hi[same[0]])).clip_below(0.0)
                continue
            b = shape_bound(x, lo, hi, f, convex=True, monotone=mono)  # type: ignore[arg-type]
            if b.empty:
                b = _fallback(x, lo, hi, f, f, b)
            out[c] = b.clip_below(0.0)
        return out

    def bounds(self, kappa: str | None, op: OperatingPoint) -> dict[str, Interval]:
        """Bounds on T, E, s, d of an unmeasured point from the measured ones of its slice."""
        prep = self._prep(_slice_key(kappa, op))
        ms = prep["ms"]
        if len(ms) < 2:
            return {c: UNBOUNDED for c in ("time_s", "energy_j", "s_w", "d_j")}
        f = float(op.sm_clock_mhz)  # type: ignore[arg-type]
        reg = self.regime(kappa, op)
        if reg == "free":
            out = self._curve(prep, f)
        elif reg == "capped":
            out = self._plateau(prep, op)
        else:   # either: the hull of both (unbounded unless both are bounded)
            a, b = self._curve(prep, f), self._plateau(prep, op)
            out = {c: a[c].hull(b[c]) for c in ("time_s", "energy_j")}
        x, lo, hi = prep["s_w"]
        out["s_w"] = (shape_bound(x, lo, hi, f, convex=True, monotone="increasing")
                      if x.size >= 2 else UNBOUNDED).clip_below(0.0)
        t, e, s = out["time_s"], out["energy_j"], out["s_w"]
        if t.bounded and e.bounded and s.bounded and not (t.empty or e.empty or s.empty):
            out["d_j"] = Interval(e.lo - s.hi * t.hi, e.hi - s.lo * t.lo).clip_below(0.0)
        else:
            out["d_j"] = UNBOUNDED
        return out

    def ceiling_unknown(self, kappa: str | None, op: OperatingPoint) -> bool:
        """Whether it is unknown if ``op`` is power-capped while its row's top clock (which
        shows the limit's clock ceiling) has not been measured."""
        return op.power_limit_w is not None and self.regime(kappa, op) == "unknown"

    def gap_of(self, kappa: str | None, op: OperatingPoint) -> tuple:
        """The gap an unmeasured point sits in: uncapped points share the slice's curve (any
        power limit), so one round measures each gap of it once; capped or undecided ones sit
        between the measured set clocks of their own row."""
        key = _slice_key(kappa, op)
        prep = self._prep(key)
        f = float(op.sm_clock_mhz)  # type: ignore[arg-type]
        if self.regime(kappa, op) == "free":
            xs = [m.x_mhz for m in prep["free"]]
            tag: Any = "curve"
        else:
            xs = [float(m.op.sm_clock_mhz) for m in prep["ms"]  # type: ignore[arg-type]
                  if m.op.power_limit_w == op.power_limit_w]
            tag = ("row", op.power_limit_w)
        below = max((x for x in xs if x < f), default=None)
        above = min((x for x in xs if x > f), default=None)
        return (key, tag, below, above)

    def thresholds(self, kappa: str | None, op: OperatingPoint, b: Mapping[str, Interval]
                   ) -> tuple[dict[str, float], dict[str, float]]:
        """(tolerance for ``predicted``, tolerance for ``dominated``) per coordinate, absolute."""
        ms = self._slice(_slice_key(kappa, op))
        rt, re = self._rses(ms)
        tm = b["time_s"].mid if b["time_s"].bounded else math.nan
        em = b["energy_j"].mid if b["energy_j"].bounded else math.nan
        sm = b["s_w"].mid if b["s_w"].bounded else math.nan
        pred = {"time_s": max(self.k * rt, self.rel_tol_time) * tm,
                "energy_j": max(self.k * re, self.rel_tol) * em,
                "d_j": max(self.k * re, self.rel_tol) * em,
                "s_w": max(self.k * self.s_rse, self.rel_tol) * sm}
        # energy: within k·σ, but never more than what a plan may lose (plan_tol): a plan from
        # measured points pays the dominator's energy where the skipped point would do
        de = min(self.k * re, self.plan_tol) * em
        dom = {"time_s": self.k * rt * tm, "energy_j": de, "d_j": de,
               "s_w": self.k * self.s_rse * sm}
        return pred, dom

    def decide(self, kappa: str | None, op: OperatingPoint) -> tuple[str, float, SkippedPoint | None]:
        """("measure", score, None) or ("skip", 0, SkippedPoint) for an unmeasured point."""
        b = self.bounds(kappa, op)
        coords = COORDS[self.criterion]
        bnds = {c: (b[c].lo, b[c].hi) for c in ("time_s", "energy_j", "s_w", "d_j")}
        if any(b[c].empty for c in coords):
            bad = [c for c in coords if b[c].empty]
            return "measure", math.inf, SkippedPoint(op, kappa, "unresolved",
                                                      f"bounds contradict each other in {bad}",
                                                      bnds)
        if any(not b[c].bounded for c in coords) or self.regime(kappa, op) == "unknown":
            # undecided whether it is power-capped: bisect for the boundary (score inf: the
            # middle of the gap wins), unless it can be skipped outright below
            if any(not b[c].bounded for c in coords):
                return "measure", math.inf, None
            unknown = True
        else:
            unknown = False
        pred, dom = self.thresholds(kappa, op, b)
        same = None if unknown else self.same_setting(kappa, op)
        if same is not None:
            by = same.op.label() + (f" κ={same.kappa}" if same.kappa else "")
            return "skip", 0.0, SkippedPoint(op, kappa, "dominated", "the same setting as measured "
                                             f"{by} (its power limit is not reached)", bnds, by=by)
        # dominated: its best case is weakly dominated (within k·σ) by a measured point
        if self._dom_cache is None or self._dom_cache[0] != len(self.meas):
            vals = [(m, self._dominator(m, coords)) for m in self.meas.values()]
            allm = [m for m, v in vals if v is not None]
            self._dom_cache = (len(self.meas), allm,
                               np.array([v for _, v in vals if v is not None]).reshape(
                                   len(allm), len(coords)))
        _, allm, allpts = self._dom_cache
        keep = [i for i, m in enumerate(allm)
                if self.criterion != "Td" or (m.op.dev == op.dev and (m.op.sm_count or 0)
                                              <= (op.sm_count or 0))]
        cands = [allm[i] for i in keep]
        pts = allpts[keep] if cands else allpts[:0]
        corner = [b[c].lo for c in coords]
        if cands:
            i = dominating(corner, pts, [dom[c] for c in coords])
            if i is not None:
                m = cands[i]
                by = m.op.label() + (f" κ={m.kappa}" if m.kappa else "")
                detail = (f"best case ({_fmt(coords, corner)}) dominated within kσ by measured "
                          f"{by} ({_fmt(coords, pts[i])})")
                return "skip", 0.0, SkippedPoint(op, kappa, "dominated", detail, bnds, by=by)
        ratio = max(b[c].width / (2.0 * pred[c]) if pred[c] > 0 else math.inf for c in coords)
        if unknown and ratio > 1.0:
            return "measure", math.inf, None
        if ratio <= 1.0:
            cover = ""
            if self.regime(kappa, op) == "free":
                # plans use measured points only: a point of the curve may go unmeasured only
                # where a measured point at least as fast (within k·σ) is within the tolerance
                # of its best case in the other coordinates, so a deadline it would meet costs
                # at most the tolerance more from measured points (a capped row's points are
                # one setting: any of its measured runs stands for them)
                slack = [dom[c] if c == "time_s" else max(dom[c], self.plan_tol * abs(b[c].mid))
                         for c in coords]
                j = dominating(corner, pts, slack) if cands else None
                if j is None:
                    return "measure", ratio, None
                m = cands[j]
                cover = (f"; within tolerance of measured {m.op.label()}"
                         + (f" κ={m.kappa}" if m.kappa else ""))
            est = self._estimate(kappa, op, b)
            detail = ("bounded within tolerance: " + ", ".join(
                f"{c} ∈ [{b[c].lo:.4g}, {b[c].hi:.4g}]" for c in coords) + cover)
            return "skip", 0.0, SkippedPoint(op, kappa, "predicted", detail, bnds, estimate=est)
        return "measure", ratio, None

    def same_setting(self, kappa: str | None, op: OperatingPoint) -> _Meas | None:
        """A measured uncapped point of the slice at the same SM clock as ``op`` (uncapped
        itself), at another power limit: a limit never reached changes nothing, so ``op`` is
        that setting (not for ``"Td"``: there a power limit is part of the shared ω_dev)."""
        if self.criterion == "Td" or self.regime(kappa, op) != "free":
            return None
        f = float(op.sm_clock_mhz)  # type: ignore[arg-type]
        for m in self._prep(_slice_key(kappa, op))["free"]:
            if abs(float(m.op.sm_clock_mhz) - f) < 0.5 * self.tol_x:  # type: ignore[arg-type]
                return m
        return None

    def _dominator(self, m: _Meas, coords: tuple[str, ...]) -> list[float] | None:
        """The coordinates a measured point dominates others with. Uncapped: its measured
        values. Capped: the pessimistic end (mean + k × its standard error) of its row's
        plateau, not its own run: a capped clock wanders between runs more than one run's
        windows show, so one run can look a few % faster and cheaper than the setting is on
        average, and would wrongly dominate settings that are better (issue 21: copy_2GiB at
        400 W, gemm at 550 W). None (it dominates nothing) until the plateau's spread is
        known (:data:`MIN_PLATEAU_POINTS` capped points in the row)."""
        if not m.capped:
            return [float(getattr(m.sig, c)) for c in coords]
        pl = self._plateau(self._prep(_slice_key(m.kappa, m.op)), m.op)
        t, e = pl["time_s"], pl["energy_j"]
        if not (t.bounded and e.bounded):
            return None
        s_w = float(m.sig.s_w)
        worst = {"time_s": max(t.hi, float(m.sig.time_s)),
                 "energy_j": max(e.hi, float(m.sig.energy_j)), "s_w": s_w,
                 "d_j": max(float(m.sig.d_j), e.hi - s_w * t.lo, 0.0)}
        return [worst[c] for c in coords]

    def _estimate(self, kappa: str | None, op: OperatingPoint, b: Mapping[str, Interval]) -> Signature:
        ms = self._slice(_slice_key(kappa, op))
        rt, re = self._rses(ms)
        t, e = b["time_s"].mid, b["energy_j"].mid
        s = b["s_w"].mid if b["s_w"].bounded else min(ms, key=lambda m: abs(
            float(m.op.sm_clock_mhz) - float(op.sm_clock_mhz))).sig.s_w  # type: ignore[arg-type]
        s = min(s, e / t) if t > 0 else s       # keep d >= 0
        vt = (b["time_s"].width / 2.0) ** 2 / 3.0 + (rt * t) ** 2
        ve = (b["energy_j"].width / 2.0) ** 2 / 3.0 + (re * e) ** 2
        name = ms[0].sig.name
        meta = {"estimated": True, "method": "adaptive bounds (midpoint)",
                "bounds": {c: [b[c].lo, b[c].hi] for c in b}, "assumptions": list(ASSUMPTIONS),
                "simulated": bool(ms[0].sig.meta.get("simulated"))}
        return Signature(name, s_w=s, time_s=t, d_j=max(0.0, e - s * t), var_time_s2=vt,
                         var_energy_j2=ve, omega=op, kappa=kappa, meta=meta)


def _fallback(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, x_lo: float, x_hi: float,
              empty: Interval) -> Interval:
    """Where the data contradict the shape assumption near a point (its bound is empty), the
    hull of the nearest measured neighbours on each side, widened by the contradiction: a
    local non-convexity is taken to be as large as the data show, not unbounded (which would
    make every point near it be measured, one after another)."""
    left = np.flatnonzero(x <= x_lo)
    right = np.flatnonzero(x >= x_hi)
    idx = ([int(left[-1])] if left.size else []) + ([int(right[0])] if right.size else [])
    if len(idx) < 2:
        return UNBOUNDED
    a, b = float(lo[idx].min()), float(hi[idx].max())
    # the widening is limited to 10 % of the value: one mislabelled point (a capped run taken
    # for an uncapped one) can make the contradiction huge, and it is local
    excess = min(empty.lo - empty.hi, 0.1 * max(abs(a), abs(b)))
    return Interval(a - excess, b + excess)


def _fmt(coords: tuple[str, ...], vals: Any) -> str:
    unit = {"time_s": "s", "energy_j": "J", "s_w": "W", "d_j": "J"}
    short = {"time_s": "T", "energy_j": "E", "s_w": "s", "d_j": "d"}
    return ", ".join(f"{short[c]}={float(v):.4g} {unit[c]}" for c, v in zip(coords, vals))


def _even(values: list[float], n: int) -> list[float]:
    """``n`` values evenly spread over ``values`` (sorted), both ends included."""
    if n >= len(values):
        return list(values)
    idx = sorted({int(round(i)) for i in np.linspace(0, len(values) - 1, n)})
    return [values[i] for i in idx]


def fastest_points(ops: Sequence[OperatingPoint]) -> list[OperatingPoint]:
    """The fastest operating point of every row of ``ops``: the top SM clock at each value of
    the other knobs (power limit, memory clock, SM count). T is non-increasing in the clock,
    so these are the points every deadline of 1× the fastest needs; adaptive characterization
    always measures them (a capped row can be fastest too: each limit's own top clock)."""
    top: dict[tuple, OperatingPoint] = {}
    for op in ops:
        key = (op.power_limit_w, op.mem_clock_mhz, op.sm_count)
        best = top.get(key)
        if best is None or float(op.sm_clock_mhz) > float(best.sm_clock_mhz):  # type: ignore[arg-type]
            top[key] = op
    return list(top.values())


def default_coarse(grid: Grid, clocks: int | None = None, limits: int = 3) -> list[OperatingPoint]:
    """Where adaptive characterization starts, inside ``grid``: ``clocks`` SM clocks evenly
    spread (default max(3, ⌈n/10⌉ + 1), both ends included) at the highest power limit, plus
    the top clock at ``limits`` power limits (ends and middle: where each limit's clock
    ceiling shows), for every value of the other knobs."""
    axes = dict(grid.axes)
    fs = sorted(axes["sm_clock_mhz"])
    n = clocks if clocks is not None else max(3, math.ceil(len(fs) / 10) + 1)
    top = dict(axes, sm_clock_mhz=tuple(sorted(_even(fs, n), reverse=True)))
    pts = []
    if "power_limit_w" in axes:
        ps = sorted(axes["power_limit_w"])
        top["power_limit_w"] = (ps[-1],)
        rest = dict(axes, sm_clock_mhz=(fs[-1],),
                    power_limit_w=tuple(sorted(_even(ps, limits), reverse=True)))
        pts = Grid(rest).points()
    return list(dict.fromkeys(Grid(top).points() + pts))


@dataclass(frozen=True)
class AdaptiveOptions:
    """How :func:`characterize_adaptive` refines a grid (see its docstring for each field):
    the full ``grid`` and the ``coarse_grid`` it starts from, the per-point ``target_rse``, the
    ``criterion`` frontier, trust ``k_sigma``, tolerances ``rel_tol`` / ``rel_tol_time`` /
    ``plan_tol``, the ``protocol``, ``max_rounds``, the ready-power ``s_rse`` and the
    ``rse_floor`` of replayed points. The defaults are what ``ecal characterize --adaptive``
    uses."""

    grid: str | Grid | Mapping | None = None
    coarse_grid: str | Grid | Mapping | int | Sequence[OperatingPoint] | None = None
    target_rse: float = 0.01
    criterion: Criterion = "TE"
    k_sigma: float = 2.0
    rel_tol: float | None = None
    rel_tol_time: float | None = None
    protocol: Protocol | None = None
    max_rounds: int = 64
    s_rse: float = 0.005
    rse_floor: float | None = None
    plan_tol: float | None = None


def characterize_adaptive(work: Any, device: Device, options: AdaptiveOptions = AdaptiveOptions(),
                          *, name: str | None = None,
                          progress: ProgressCallback | None = None,
                          journal: str | os.PathLike | None = None) -> AdaptiveResult:
    """Characterize ``work`` (a work, or a mapping κ label → work) on ``device`` over
    ``options.grid``, measuring only the points that can still change the ``criterion``
    frontier by more than the tolerance (module docstring: rules, assumptions). ``name``: the
    element's name (default: the work's); ``progress`` (default: none): a
    :class:`~measure.progress.ProgressEvent` per point measured or read back from the journal
    (``operation="adaptive"``, ``total`` None: how many points it takes is not known ahead).

    The options (:class:`AdaptiveOptions`) — ``grid``: the full candidate grid; it must vary ``sm_clock_mhz`` (≥ 3 clocks; default:
    every SM clock the device supports at its top memory clock). ``coarse_grid``: where to
    start (a grid inside ``grid``, or an int: that many clocks evenly spread; default
    :func:`default_coarse`). ``target_rse``: each point's windows repeat until its E has this
    relative standard error (``protocol``'s other settings are kept). ``k_sigma``: measured
    values are trusted to ± k·σ. ``rel_tol`` / ``rel_tol_time``: the relative tolerance below
    which a bound counts as known (default ``target_rse``: no finer than the points are
    measured). ``s_rse``: relative uncertainty assumed for a ready-power calibration.
    ``rse_floor``: the smallest relative σ of T and E to assume (for replayed single-run
    tables, whose points carry no σ; default :data:`MIN_RSE_TIME` / :data:`MIN_RSE_ENERGY`).
    ``plan_tol``: the relative energy a plan built from the measured points may pay over a
    skipped point (default ``rel_tol``; module docstring): smaller measures more of the
    frontier.

    ``journal``: a results file (:mod:`measure.results_log`, the JSON-lines log of
    ``ecal characterize --results``) every measured point is appended to (flushed and
    fsync'd) as it is measured. Rerun with the same journal after a crash or a kill, and the
    points in it are read back instead of measured: the algorithm is deterministic given its
    measurements, so it takes the same decisions and measures only what is missing
    (``meta["resumed_points"]``, ``meta["measured_points"]``; ``gpu_s`` is this run's). A
    journal written for another element, κ set, grid, protocol, device or adaptive setting
    (criterion, k_sigma, tolerances, coarse grid) is refused
    (:class:`~measure.results_log.ResultsMismatchError`), as is one written by a full sweep.
    """
    from .sweep import sweep

    o = options
    grid, coarse_grid, target_rse, criterion = o.grid, o.coarse_grid, o.target_rse, o.criterion
    k_sigma, rel_tol, rel_tol_time, protocol = o.k_sigma, o.rel_tol, o.rel_tol_time, o.protocol
    max_rounds, s_rse, rse_floor, plan_tol = o.max_rounds, o.s_rse, o.rse_floor, o.plan_tol
    if criterion not in CRITERIA:
        raise AdaptiveError(f"criterion must be one of {CRITERIA}, got {criterion!r}")
    for nm, v in (("target_rse", target_rse), ("k_sigma", k_sigma), ("s_rse", s_rse)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise AdaptiveError(f"{nm} must be a finite number > 0, got {v!r}")
    rel_tol = target_rse if rel_tol is None else rel_tol
    rel_tol_time = rel_tol if rel_tol_time is None else rel_tol_time
    plan_tol = rel_tol if plan_tol is None else plan_tol
    for nm, v in (("rel_tol", rel_tol), ("rel_tol_time", rel_tol_time), ("plan_tol", plan_tol)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise AdaptiveError(f"{nm} must be a finite number >= 0, got {v!r}")
    if not isinstance(max_rounds, int) or max_rounds < 1:
        raise AdaptiveError(f"max_rounds must be an integer >= 1, got {max_rounds!r}")
    if grid is None:
        grid = {"sm_clock_mhz": list(device.operating_set().supported_sm_clocks())}
    g = parse_grid(grid)
    if "sm_clock_mhz" not in g.axes or len(g.axes["sm_clock_mhz"]) < 3:
        raise AdaptiveError("adaptive characterization refines along the SM clock: the grid "
                            f"needs sm_clock_mhz with at least 3 values, got {g.label() or 'none'}")
    g.validate(device.operating_set(), read_only=device.read_only)
    if isinstance(coarse_grid, bool):
        raise AdaptiveError(f"coarse_grid must be a grid, a count or points, got {coarse_grid!r}")
    if coarse_grid is None or isinstance(coarse_grid, int):
        if isinstance(coarse_grid, int) and coarse_grid < 3:
            raise AdaptiveError(f"coarse_grid as a count needs at least 3 clocks, got {coarse_grid}")
        coarse_ops = default_coarse(g, coarse_grid)
    elif isinstance(coarse_grid, (list, tuple)) and all(isinstance(o, OperatingPoint)
                                                       for o in coarse_grid):
        coarse_ops = list(dict.fromkeys(coarse_grid))
    else:
        coarse_ops = parse_grid(coarse_grid).points()  # type: ignore[arg-type]
    if not coarse_ops:
        raise AdaptiveError("coarse_grid has no points")
    full_ops = g.points()
    full_set = set(full_ops)
    outside = [op for op in coarse_ops if op not in full_set]
    if outside:
        raise AdaptiveError(f"coarse grid point {outside[0].label()} is not in the grid {g.label()}")
    # every row's fastest operating point is measured, whatever the coarse grid: a deadline of
    # 1x the fastest must stay feasible on the adaptive frontier
    fastest_ops = fastest_points(full_ops)
    coarse_ops = list(dict.fromkeys(list(coarse_ops) + fastest_ops))
    works = dict(work) if isinstance(work, Mapping) else {None: work}
    if not works:
        raise AdaptiveError("characterize_adaptive: no work given")
    element = name or _name_of(next(iter(works.values())))
    proto = protocol or Protocol()
    from dataclasses import replace

    proto = replace(proto, target_rse=float(target_rse))
    points = [(k, op) for op in full_ops for k in works]
    f_top = max(float(op.sm_clock_mhz) for op in full_ops)  # type: ignore[arg-type]
    f_bottom = min(float(op.sm_clock_mhz) for op in full_ops)  # type: ignore[arg-type]
    if rse_floor is not None and not (math.isfinite(rse_floor) and 0 <= rse_floor < 1):
        raise AdaptiveError(f"rse_floor must be in [0, 1), got {rse_floor!r}")
    floor = (float(rse_floor or 0.0), float(rse_floor or 0.0))
    planner = _Planner(points, criterion, float(k_sigma), float(rel_tol), float(rel_tol_time),
                       float(s_rse), floor, float(plan_tol))
    violations: list[Violation] = []
    settings = {"criterion": criterion, "k_sigma": float(k_sigma), "rel_tol": float(rel_tol),
                "rel_tol_time": float(rel_tol_time), "plan_tol": float(plan_tol),
                "s_rse": float(s_rse),
                "rse_floor": rse_floor, "max_rounds": max_rounds,
                "coarse_points": [o.to_dict() for o in coarse_ops]}
    log = _open_journal(journal, element, list(works), g, proto, device, settings)
    counts = {"measured": 0, "resumed": 0}
    t0 = device.time_s()
    wall0 = time.monotonic()

    def measure(batch: list[tuple[str | None, OperatingPoint]],
                before: Mapping[tuple[str | None, OperatingPoint], Mapping[str, Interval]]) -> None:
        # highest ω_dev first, one sweep call per point (each seeded by its key, as in sweep)
        for kappa, op in sorted(batch, key=lambda kp: (kp[1].dev, str(kp[0])), reverse=True):
            key = point_key(element, kappa, op)
            sig = log.points.get(key) if log is not None else None
            resumed = sig is not None
            if sig is None:
                axes = {k: [v] for k, v in op.to_dict().items() if v is not None}
                res = sweep(device, {kappa: works[kappa]}, element, grid=axes, protocol=proto,
                            progress=None)
                sig = res.signatures[0]
                if log is not None:     # durable before it is used: a kill loses nothing
                    sig = log.add_point(key, sig)
            counts["resumed" if resumed else "measured"] += 1
            planner.add(kappa, op, sig)
            for c, iv in before.get((kappa, op), {}).items():
                v = getattr(sig, c)
                sd = sig.sd_time_s if c == "time_s" else sig.sd_energy_j
                tol = k_sigma * (sd if c in ("time_s", "energy_j", "d_j") else s_rse * v)
                if iv.bounded and not iv.empty and not iv.contains(v, tol):
                    violations.append(Violation(op, kappa, c, float(v), (iv.lo, iv.hi)))
            if progress is not None:
                label = f"{element}{' κ=' + kappa if kappa else ''} @ {op.label()}"
                progress(ProgressEvent(
                    counts["measured"] + counts["resumed"], None, label,
                    time.monotonic() - wall0, measured=not resumed, signature=sig,
                    operation="adaptive",
                    message=f"{label}: {'resumed ' if resumed else ''}"
                            f"T={sig.time_s * 1e3:.4g} ms E={sig.energy_j:.4g} J"))

    try:
        measure([(k, op) for op in coarse_ops for k in works], {})
        rounds = 1
        final: dict[tuple[str | None, OperatingPoint], SkippedPoint] = {}
        while True:
            final = {}
            wanted: dict[tuple, tuple[tuple[float, float, float], tuple[str | None, OperatingPoint]]] = {}
            before: dict[tuple[str | None, OperatingPoint], Mapping[str, Interval]] = {}
            for kappa, op in points:
                if (kappa, op) in planner.meas:
                    continue
                verdict, score, sk = planner.decide(kappa, op)
                if verdict == "skip":
                    final[(kappa, op)] = sk  # type: ignore[assignment]
                    continue
                final[(kappa, op)] = sk or SkippedPoint(
                    op, kappa, "unresolved", f"max_rounds ({max_rounds}) reached before it could be "
                    "decided")
                gap = planner.gap_of(kappa, op)
                if planner.ceiling_unknown(kappa, op):
                    # learn this power limit's clock ceiling first: measure its row's top clock
                    top = op.with_(sm_clock_mhz=f_top)
                    if (kappa, top) not in planner.meas and top in full_set:
                        gap, score, op = ("ceiling", kappa, top.with_(sm_clock_mhz=None)), math.inf, top
                # the widest bound first; among equals (e.g. unbounded), the middle of the gap
                # (bisection), then the highest clock (it shows a power limit's clock ceiling)
                f = float(op.sm_clock_mhz)  # type: ignore[arg-type]
                lo_x = gap[-2] if isinstance(gap[-2], float) else f_bottom
                hi_x = gap[-1] if isinstance(gap[-1], float) else f_top
                mid = -abs(f - 0.5 * (lo_x + hi_x))
                rank = (score, mid, f)
                best = wanted.get(gap)
                if best is None or rank > best[0]:
                    wanted[gap] = (rank, (kappa, op))
            if not wanted or rounds >= max_rounds:
                break
            batch = [v[1] for v in wanted.values()]
            for kp in batch:
                before[kp] = planner.bounds(*kp)
            measure(batch, before)
            rounds += 1
    finally:
        if log is not None:
            log.close()
    keys = tuple(kp for kp in points if kp in planner.meas)
    sigs = tuple(planner.meas[kp].sig for kp in keys)
    skipped = tuple(final[kp] for kp in points if kp not in planner.meas)
    meta = dict(device.describe())
    meta.update(grid=g.to_dict(), coarse_points=[o.to_dict() for o in coarse_ops],
                fastest_points=[o.to_dict() for o in fastest_ops], target_rse=target_rse,
                k_sigma=k_sigma, rel_tol=rel_tol, rel_tol_time=rel_tol_time, plan_tol=plan_tol,
                s_rse=s_rse,
                rse_floor=list(planner.rse_floor),
                assumptions=list(ASSUMPTIONS), protocol=proto.to_dict(),
                wall_s=time.monotonic() - wall0, measured_points=counts["measured"],
                resumed_points=counts["resumed"],
                journal=os.fspath(journal) if journal is not None else None)
    return AdaptiveResult(element, criterion, sigs, skipped, tuple(violations), tuple(points),
                          rounds, device.time_s() - t0, meta, keys)


def _open_journal(journal: str | os.PathLike | None, element: str, kappas: list[str | None],
                  g: Grid, proto: Protocol, device: Device, settings: Mapping[str, Any]
                  ) -> ResultsLog | None:
    """Open (or create) the journal of an adaptive run as its only writer, after checking that
    it belongs to this run: the results-file identity (element, device, protocol:
    :meth:`ResultsLog.check_identity`) plus what a full sweep's resume does not check and an
    adaptive run's decisions depend on (κ labels, the full grid, the adaptive settings)."""
    if journal is None:
        return None
    log = ResultsLog.open(journal, f"adaptive characterization of {element} on {device.name}")
    try:
        header = {"element": element, "kappas": kappas, "grid": g.to_dict(),
                  "protocol": proto.to_dict(), "device": device.describe(),
                  "host": socket.gethostname(), "adaptive": dict(settings)}
        log.check_identity(header, Protocol().to_dict())
        was = log.header
        if was is not None:
            file = os.fspath(journal)
            if "adaptive" not in was:
                raise ResultsMismatchError(file, "adaptive", "absent (a full sweep's results "
                                           "file, not an adaptive journal)", "an adaptive run")
            for f in ("kappas", "grid"):
                if was.get(f) != header_form(header[f]):
                    raise ResultsMismatchError(file, f, was.get(f), header[f])
            now = header_form(header["adaptive"])
            for f in sorted(set(was["adaptive"]) | set(now)):
                if was["adaptive"].get(f) != now.get(f):
                    raise ResultsMismatchError(file, f"adaptive.{f}", was["adaptive"].get(f),
                                               now.get(f))
        log.write_header(header)
    except BaseException:
        log.close()
        raise
    return log


def _name_of(work: Any) -> str:
    n = getattr(work, "name", None) or getattr(work, "__name__", None)
    return str(n) if n else (work if isinstance(work, str) else "element")
