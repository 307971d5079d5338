"""Bounds on what an unmeasured grid point can be, from measured neighbours (pure math).

Adaptive characterization (:mod:`measure.adaptive`) measures a coarse grid first and then asks,
for every point it has not measured, *how far from its neighbours could this point be?* The
answer is an :class:`Interval` per coordinate (T, E, s, d), from shape assumptions on the
function g along one axis (an SM clock, say), given each measured value only as an interval
[lo_i, hi_i] (the measurement ± k·σ):

* **monotone** (non-increasing, e.g. T in clock): for x_a ≤ x ≤ x_b,
  g(x) ≤ min{hi_i : x_i ≤ x} and g(x) ≥ max{lo_i : x_i ≥ x} (and the mirror for
  non-decreasing).
* **convex** (e.g. E, T and static power s in clock):
  - above: g(x) ≤ λ·g(x_a) + (1 − λ)·g(x_b) for any bracketing pair x_a < x < x_b (the chord),
    so g(x) ≤ λ·hi_a + (1 − λ)·hi_b;
  - below: g(x) ≥ the extension of any secant both of whose points lie on one side of x
    (a convex function lies above its secant lines outside their interval):
    for x_i < x_j < x, g(x) ≥ (1 + r)·lo_j − r·hi_i with r = (x − x_j)/(x_j − x_i) ≥ 0, and
    the mirror for points on the right.

A point outside the measured range has no convex upper bound (a convex function can rise
without limit): it is unbounded above unless monotonicity bounds it.

An empty intersection (lo > hi) means the data contradict the assumption (or their noise is
beyond k·σ): callers measure such a point rather than trust the bound.

>>> convex_bound([1, 2, 3, 4], [4, 1, 1, 4], [4, 1, 1, 4], 2.5)   # chord 1, secants -0.5
Interval(lo=-0.5, hi=1.0)
>>> monotone_bound([1, 3], [5, 2], [5, 2], 2, decreasing=True)
Interval(lo=2.0, hi=5.0)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .errors import InputError

Monotone = Literal["increasing", "decreasing"] | None


class BoundsError(InputError):
    """Bad input to a bound (lengths differ, NaN, lo > hi, axis not sorted...)."""


@dataclass(frozen=True)
class Interval:
    """A closed interval [lo, hi] (either end may be infinite; lo > hi means empty)."""

    lo: float
    hi: float

    @property
    def width(self) -> float:
        """hi − lo (inf when unbounded; negative when empty)."""
        return self.hi - self.lo

    @property
    def mid(self) -> float:
        """Midpoint (nan when unbounded)."""
        return 0.5 * (self.lo + self.hi) if self.bounded else math.nan

    @property
    def bounded(self) -> bool:
        """Both ends finite."""
        return math.isfinite(self.lo) and math.isfinite(self.hi)

    @property
    def empty(self) -> bool:
        """lo > hi: the constraints that made it contradict each other."""
        return self.lo > self.hi

    def intersect(self, other: Interval) -> Interval:
        """The intersection (may be empty)."""
        return Interval(max(self.lo, other.lo), min(self.hi, other.hi))

    def hull(self, other: Interval) -> Interval:
        """The smallest interval holding both."""
        return Interval(min(self.lo, other.lo), max(self.hi, other.hi))

    def contains(self, v: float, tol: float = 0.0) -> bool:
        """lo − tol ≤ v ≤ hi + tol."""
        return self.lo - tol <= v <= self.hi + tol

    def clip_below(self, floor: float) -> Interval:
        """Raise lo to ``floor`` (e.g. 0 for a time or an energy)."""
        return Interval(max(self.lo, floor), self.hi)


UNBOUNDED = Interval(-math.inf, math.inf)


def _arrays(xs: Sequence[float], los: Sequence[float], his: Sequence[float]
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = np.asarray(xs, dtype=float)
    lo = np.asarray(los, dtype=float)
    hi = np.asarray(his, dtype=float)
    if not (x.ndim == lo.ndim == hi.ndim == 1) or not (x.size == lo.size == hi.size):
        raise BoundsError(f"bounds: xs, los and his must be 1-D of one length, got "
                          f"{x.shape}, {lo.shape}, {hi.shape}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
        raise BoundsError("bounds: xs, los and his must be finite")
    if np.any(lo > hi):
        i = int(np.argmax(lo > hi))
        raise BoundsError(f"bounds: measured interval {i} has lo {lo[i]:g} > hi {hi[i]:g}")
    if x.size > 1 and np.any(np.diff(x) <= 0):
        raise BoundsError("bounds: xs must be strictly increasing (merge repeated x first: "
                          "merge_close)")
    return x, lo, hi


def monotone_bound(xs: Sequence[float], los: Sequence[float], his: Sequence[float], x: float,
                   *, decreasing: bool) -> Interval:
    """What a monotone g can be at ``x`` given g(x_i) ∈ [lo_i, hi_i] (xs increasing).

    Non-increasing (``decreasing=True``): hi = min of hi_i left of x (x_i ≤ x), lo = max of lo_i
    right of x (x_i ≥ x); an end with no data on its side is unbounded.
    """
    xa, lo, hi = _arrays(xs, los, his)
    left, right = xa <= x, xa >= x
    if decreasing:
        up = float(hi[left].min()) if left.any() else math.inf
        down = float(lo[right].max()) if right.any() else -math.inf
    else:
        up = float(hi[right].min()) if right.any() else math.inf
        down = float(lo[left].max()) if left.any() else -math.inf
    return Interval(down, up)


def convex_bound(xs: Sequence[float], los: Sequence[float], his: Sequence[float],
                 x: float) -> Interval:
    """What a convex g can be at ``x`` given g(x_i) ∈ [lo_i, hi_i] (xs strictly increasing).

    Upper: the lowest chord over the bracketing pairs (none outside the data range: +inf).
    Lower: the highest extension of a secant of two points on one side of x (-inf with fewer
    than two points on either side). At a data point it is that point's interval (intersected
    with the bounds the others give).
    """
    xa, lo, hi = _arrays(xs, los, his)
    up, down = math.inf, -math.inf
    at = np.isclose(xa, x, rtol=0.0, atol=1e-12 * max(1.0, abs(x)))
    if at.any():
        i = int(np.argmax(at))
        up, down = float(hi[i]), float(lo[i])
    left = np.flatnonzero(xa < x)
    right = np.flatnonzero(xa > x)
    if left.size and right.size:
        a, b = left[:, None], right[None, :]
        lam = (xa[b] - x) / (xa[b] - xa[a])
        up = min(up, float(np.min(lam * hi[a] + (1.0 - lam) * hi[b])))
    if left.size >= 2:    # pairs i < j < x: g(x) >= (1 + r) lo_j - r hi_i
        i, j = np.triu_indices(left.size, 1)
        i, j = left[i], left[j]
        r = (x - xa[j]) / (xa[j] - xa[i])
        down = max(down, float(np.max((1.0 + r) * lo[j] - r * hi[i])))
    if right.size >= 2:   # pairs x < i < j: g(x) >= (1 + r) lo_i - r hi_j
        i, j = np.triu_indices(right.size, 1)
        i, j = right[i], right[j]
        r = (xa[i] - x) / (xa[j] - xa[i])
        down = max(down, float(np.max((1.0 + r) * lo[i] - r * hi[j])))
    return Interval(down, up)


def shape_bound(xs: Sequence[float], los: Sequence[float], his: Sequence[float], x: float, *,
                convex: bool = True, monotone: Monotone = None) -> Interval:
    """The intersection of the convex and monotone bounds that apply (may be empty)."""
    if monotone not in (None, "increasing", "decreasing"):
        raise BoundsError(f"monotone must be None, 'increasing' or 'decreasing', got {monotone!r}")
    out = UNBOUNDED
    if convex:
        out = out.intersect(convex_bound(xs, los, his, x))
    if monotone is not None:
        out = out.intersect(monotone_bound(xs, los, his, x, decreasing=monotone == "decreasing"))
    if not convex and monotone is None:
        _arrays(xs, los, his)
    return out


def merge_close(xs: Sequence[float], los: Sequence[float], his: Sequence[float],
                tol: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort by x and merge runs of points closer than ``tol`` into one (mean x, hull of the
    intervals): repeated measurements at one effective clock must not make a secant of two
    almost coincident noisy points, whose extension is meaningless."""
    x = np.asarray(xs, dtype=float)
    lo = np.asarray(los, dtype=float)
    hi = np.asarray(his, dtype=float)
    if not (x.size == lo.size == hi.size):
        raise BoundsError("merge_close: xs, los and his must have one length")
    if tol < 0:
        raise BoundsError(f"merge_close: tol must be >= 0, got {tol:g}")
    order = np.argsort(x, kind="stable")
    x, lo, hi = x[order], lo[order], hi[order]
    mx: list[float] = []
    mlo: list[float] = []
    mhi: list[float] = []
    run: list[int] = []
    for i in range(x.size):
        if run and x[i] - x[run[0]] > tol:
            mx.append(float(np.mean(x[run])))
            mlo.append(float(np.min(lo[run])))
            mhi.append(float(np.max(hi[run])))
            run = []
        run.append(i)
    if run:
        mx.append(float(np.mean(x[run])))
        mlo.append(float(np.min(lo[run])))
        mhi.append(float(np.max(hi[run])))
    return np.array(mx), np.array(mlo), np.array(mhi)


def dominating(corner: Sequence[float], points: np.ndarray, tol: Sequence[float] | np.ndarray
               ) -> int | None:
    """Index of a point that weakly dominates ``corner`` within ``tol`` (every coordinate
    ≤ corner + tol; smaller is better in all), or None. With ``corner`` the best case of an
    unmeasured point (all its lower bounds), such a point means the unmeasured one cannot
    improve the frontier by more than ``tol`` in any coordinate. ``tol``: one value per
    coordinate, or one row per point (shape (n, d): each point's own uncertainty). The best
    such point is the one with the smallest sum of coordinates scaled by tol."""
    c = np.asarray(corner, dtype=float)
    t = np.asarray(tol, dtype=float)
    p = np.asarray(points, dtype=float)
    if p.size == 0:
        return None
    if p.ndim != 2 or p.shape[1] != c.size or t.shape not in ((c.size,), p.shape):
        raise BoundsError(f"dominating: points must be (n, {c.size}), tol of length {c.size} "
                          f"or of the points' shape")
    if np.any(t < 0) or not np.all(np.isfinite(t)):
        raise BoundsError("dominating: tol must be finite and >= 0")
    t = np.broadcast_to(t, p.shape)
    ok = np.all(p <= c + t, axis=1)
    if not ok.any():
        return None
    idx = np.flatnonzero(ok)
    scale = np.where(t[idx] > 0, t[idx], 1.0)
    return int(idx[np.argmin(np.sum(p[idx] / scale, axis=1))])
