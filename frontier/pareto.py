"""Operating frontiers (spec §9) and their composition (spec §9.2, solver-notes §5).

A :class:`Frontier` is a set of signatures of one element (or composite) at different
operating points ω and implementations κ, pruned to the points that can matter:

``"TE"``  undominated in (T, E). Safe before ⊗ (sequence) only.
``"Td"``  undominated in (T, d) *within each (devices, ω_dev) group* — and in SM count when the
          points carry different SM allocations. Safe before ⊕: a branch off the critical path
          pays only its dynamic energy d, branches overlapped on one device share its ω_dev,
          and their SM allocations must fit together (spec §7, Property 5.6 caveat; §9.2).
``"Tsd"`` undominated in (T, s, d). Safe before ⊕multi, where every device pays its own static
          power s over the whole makespan and ω_dev is free per device.

(T, E) pruning before ⊕ is *wrong*: with s = 20 W and a long branch e₁ = (T=5 s, d=100 J),
a = (T=1, E=100) dominates b = (T=2, E=101) in (T, E), yet e₁⊕b = 261 J < e₁⊕a = 280 J.

Composition (:func:`compose_seq`, :func:`compose_par`, :func:`compose_par_multi`) works on numpy
arrays of (T, E, s, d) first and builds real composite signatures with
:func:`~frontier.compose.seq` / :func:`~frontier.compose.par` / :func:`~frontier.compose.par_multi`
only for the surviving points, so every composite point carries propagated variances.

Ties (points equal in every pruning coordinate) keep one point: the first in input order.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

import numpy as np

from .codec import _jsonable, signature_from_dict, signature_to_dict
from .compose import par, par_multi, seq
from .errors import CompositionError, EnergyCalculusError
from .formats import KINDS, check_units, content, validate
from .operating_point import OperatingPoint
from .signature import Signature
from .units import pm

Criterion = Literal["TE", "Td", "Tsd"]
CRITERIA: tuple[str, ...] = ("TE", "Td", "Tsd")

#: Refuse a single composition step that would form more candidate combinations than this
#: (memory guard); pass ``max_points`` to thin intermediate frontiers instead.
MAX_CANDIDATES = 20_000_000

#: The ``format`` of frontier files before ``ecal.frontier/1`` (still read).
FRONTIER_FORMAT = "energy-calculus/frontier"
FRONTIER_VERSION = 1
_UNITS = MappingProxyType({"time": "s", "energy": "J", "power": "W"})  # as in frontier/io.py


class PruningWarning(UserWarning):
    """A frontier pruned with a criterion that is not safe for the operator it is fed to."""


# ---------------------------------------------------------------------------------------------
# Labels
# ---------------------------------------------------------------------------------------------

def point_label(sig: Signature) -> str:
    """Short label of a frontier point: ``κ @ ω`` for a measured point, the per-part choices
    for a composite built by this module (``meta['choice']``)."""
    choice = sig.meta.get("choice")
    if choice:
        return " + ".join(str(c) for c in choice)
    lab = sig.omega.label()
    if sig.kappa:
        return sig.kappa if lab == "default" else f"{sig.kappa} @ {lab}"
    return lab


# ---------------------------------------------------------------------------------------------
# The Frontier object
# ---------------------------------------------------------------------------------------------

def _fmt_pm(v: float, sd: float, scale: float, digits: int = 4) -> str:
    return pm(v, sd, scale, digits)


@dataclass(frozen=True)
class Frontier:
    """Pareto-pruned signatures of one element or composite, sorted by time (then energy).

    ``criterion`` says which pruning produced it and so which operator it is safe to feed:
    ``"TE"`` → ⊗, ``"Td"`` → ⊕ (and ⊗, ⊕multi), ``"Tsd"`` → ⊕multi (and ⊗). ``meta`` records
    how it was made (thinning, warnings...).

    >>> a = Signature("k", s_w=100, time_s=1.0, d_j=50, omega=OperatingPoint(sm_clock_mhz=1980))
    >>> b = Signature("k", s_w=90, time_s=1.5, d_j=10, omega=OperatingPoint(sm_clock_mhz=1200))
    >>> f = pareto_frontier([a, b]); len(f), f.fastest is a, f.cheapest is b
    (2, True, True)
    >>> f.energy_at(1.2) is a, f.energy_at(0.5)
    (True, None)
    """

    points: tuple[Signature, ...]
    name: str = "frontier"
    criterion: Criterion = "TE"
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        pts = tuple(self.points)
        if not pts:
            raise EnergyCalculusError(f"frontier {self.name!r} has no points")
        for p in pts:
            if not isinstance(p, Signature):
                raise EnergyCalculusError(
                    f"frontier {self.name!r}: points must be Signature objects, got {type(p).__name__}")
        if self.criterion not in CRITERIA:
            raise EnergyCalculusError(
                f"frontier {self.name!r}: criterion must be one of {CRITERIA}, got {self.criterion!r}")
        pts = tuple(sorted(pts, key=lambda p: (p.time_s, p.energy_j)))
        object.__setattr__(self, "points", pts)
        object.__setattr__(self, "name", str(self.name))
        object.__setattr__(self, "meta", MappingProxyType(dict(self.meta)))
        t = np.array([p.time_s for p in pts], dtype=float)
        e = np.array([p.energy_j for p in pts], dtype=float)
        t.flags.writeable = False
        e.flags.writeable = False
        object.__setattr__(self, "_t", t)
        object.__setattr__(self, "_e", e)

    # -- views --------------------------------------------------------------------------------
    @property
    def times_s(self) -> np.ndarray:
        """T of every point, s (read-only array, ascending)."""
        return self._t  # type: ignore[attr-defined]

    @property
    def energies_j(self) -> np.ndarray:
        """E of every point, J (read-only array, same order as :attr:`times_s`)."""
        return self._e  # type: ignore[attr-defined]

    def __len__(self) -> int:
        return len(self.points)

    def __iter__(self) -> Iterator[Signature]:
        return iter(self.points)

    def __getitem__(self, i: int) -> Signature:
        return self.points[i]

    @property
    def fastest(self) -> Signature:
        """The point with the smallest T (the cheaper one on ties)."""
        return self.points[0]

    @property
    def cheapest(self) -> Signature:
        """The point with the smallest E (the faster one on ties)."""
        return self.points[int(np.argmin(self.energies_j))]

    def energy_at(self, deadline_s: float) -> Signature | None:
        """The cheapest point with T ≤ ``deadline_s`` (faster on ties), or ``None`` if none fits."""
        ok = self.times_s <= float(deadline_s)
        if not ok.any():
            return None
        e = np.where(ok, self.energies_j, np.inf)
        return self.points[int(np.argmin(e))]

    # -- text ----------------------------------------------------------------------------------
    def to_table(self, time_unit: str = "ms") -> str:
        """A fixed-width table: index, T ± σ, E ± σ, average power, ω/κ label."""
        scale = {"s": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6}[time_unit]
        rows = [(str(i), _fmt_pm(p.time_s, p.sd_time_s, scale), _fmt_pm(p.energy_j, p.sd_energy_j, 1.0),
                 f"{p.power_w:.4g}", point_label(p)) for i, p in enumerate(self.points)]
        head = ("#", f"T ({time_unit})", "E (J)", "P (W)", "operating point")
        w = [max(len(r[k]) for r in [head, *rows]) for k in range(5)]
        lines = [f"{self.name}  [{len(self)} points, criterion {self.criterion}]"]
        for note in self.meta.get("warnings", ()):
            lines.append(f"warning: {note}")
        if self.meta.get("thinned"):
            lines.append(f"note: ε-thinned; energies within x{self.meta.get('energy_bound_factor', float('nan')):.6g} "
                         "of the exact frontier at every deadline")
        fmt = lambda r: "  ".join(  # noqa: E731
            (c.rjust(w[k]) if k < 4 else c) for k, c in enumerate(r))
        lines.append(fmt(head))
        lines.extend(fmt(r) for r in rows)
        return "\n".join(lines)

    # -- files ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``"format": "ecal.frontier/1"``, SI ``units`` block as in
        :mod:`frontier.io`); points carry every signature field."""
        return {
            "format": KINDS["frontier"].tag,
            "units": dict(_UNITS),
            "name": self.name,
            "criterion": self.criterion,
            "meta": _jsonable(dict(self.meta)),
            "points": [signature_to_dict(p) for p in self.points],
        }

    @classmethod
    def from_dict(cls, d: Any, file: str = "<dict>") -> Frontier:
        """Inverse of :meth:`to_dict` (also reads the older ``energy-calculus/frontier`` form
        and a frontier with no ``format``); errors name ``file`` and the path inside it."""
        from .format_models import FrontierFile

        _, body = content(file, d, "frontier", required=False)
        check_units(file, body.get("units"))
        m = validate(FrontierFile, body, file)
        sigs = tuple(signature_from_dict(p, file, f"points[{i}]") for i, p in enumerate(m.points))
        return cls(points=sigs, name=m.name, criterion=m.criterion, meta=dict(m.meta or {}))


# ---------------------------------------------------------------------------------------------
# Pruning
# ---------------------------------------------------------------------------------------------

def nondominated(*cols: np.ndarray, block: int = 512) -> np.ndarray:
    """Indices of the points not weakly dominated by another (≤ in every column), keeping the
    first of exact ties, in lexicographic order of ``cols`` (first column primary): the one
    dominance pruning of frontiers and of the solvers' partial plans.

    2 columns: sort + sweep, O(n log n). More: blockwise numpy against the kept set.

    >>> nondominated(np.array([2.0, 1.0, 3.0, 1.0]), np.array([5.0, 9.0, 4.0, 9.0])).tolist()
    [1, 0, 2]
    """
    n = len(cols[0])
    if n == 0:
        return np.zeros(0, dtype=np.intp)
    order = np.lexsort(tuple(np.asarray(c, dtype=float) for c in cols[::-1]))
    if len(cols) == 1:
        return order[:1]
    if len(cols) == 2:
        y = np.asarray(cols[1], dtype=float)[order]
        keep = np.empty(n, dtype=bool)
        keep[0] = True
        keep[1:] = y[1:] < np.minimum.accumulate(y)[:-1]
        return order[keep]
    # In lexicographic order every weak dominator of a point comes before it (an exact tie
    # also comes before it and is then the one kept). Dominance is transitive, so checking
    # against the kept points of earlier blocks plus all earlier points of the block suffices.
    x = np.stack([np.asarray(c, dtype=float)[order] for c in cols[1:]], axis=1)
    kept_rows: list[np.ndarray] = []
    kept_x = np.zeros((0, x.shape[1]))
    for b0 in range(0, n, block):
        xb = x[b0:b0 + block]
        m = len(xb)
        dom = np.zeros(m, dtype=bool)
        if len(kept_x):
            for k0 in range(0, len(kept_x), 4096):
                kx = kept_x[k0:k0 + 4096]
                dom |= np.all(kx[None, :, :] <= xb[:, None, :], axis=2).any(axis=1)
        within = np.all(xb[None, :, :] <= xb[:, None, :], axis=2)  # [i, j]: x_j <= x_i
        within &= np.tri(m, m, -1, dtype=bool)
        dom |= within.any(axis=1)
        rows = np.flatnonzero(~dom) + b0
        kept_rows.append(rows)
        kept_x = np.concatenate([kept_x, x[rows]])
    return order[np.concatenate(kept_rows)]


def _as_sigs(x: Frontier | Iterable[Signature], what: str) -> list[Signature]:
    sigs = list(x.points) if isinstance(x, Frontier) else list(x)
    if not sigs:
        raise EnergyCalculusError(f"{what}: no signatures given")
    for s in sigs:
        if not isinstance(s, Signature):
            raise EnergyCalculusError(f"{what}: expected Signature objects, got {type(s).__name__}")
    return sigs


def _group_key(s: Signature) -> tuple:
    return (s.devices, s.omega.dev)


def _prune_idx(sigs: Sequence[Signature], criterion: str) -> np.ndarray:
    """Indices of ``sigs`` kept by ``criterion``, in time order."""
    t = np.array([s.time_s for s in sigs])
    if criterion == "TE":
        idx = nondominated(t, np.array([s.energy_j for s in sigs]))
    elif criterion == "Tsd":
        idx = nondominated(t, np.array([s.s_w for s in sigs]), np.array([s.d_j for s in sigs]))
    elif criterion == "Td":
        groups: dict[tuple, list[int]] = {}
        for i, s in enumerate(sigs):
            groups.setdefault(_group_key(s), []).append(i)
        parts = []
        for members in groups.values():
            m = np.array(members)
            sw = np.array([sigs[i].s_w for i in members])
            dj = np.array([sigs[i].d_j for i in members])
            sm = np.array([sigs[i].omega.sm_count or 0 for i in members], dtype=float)
            # s is the device's static power at this ω_dev, normally one value per group;
            # if measured values differ, s joins the coordinates so pruning stays safe. The SM
            # allocation joins them when it varies: fewer SMs can be what makes a ⊕ fit
            # (Σ sm_count ≤ N_SM), the "few SMs for communication" effect.
            cols = [t[m], dj]
            if not np.all(sw == sw[0]):
                cols.append(sw)
            if not np.all(sm == sm[0]):
                cols.append(sm)
            parts.append(m[nondominated(*cols)])
        idx = np.concatenate(parts)
    else:
        raise EnergyCalculusError(f"criterion must be one of {CRITERIA}, got {criterion!r}")
    return idx[np.lexsort((np.array([sigs[i].energy_j for i in idx]), t[idx]))]


def pareto_frontier(sigs: Frontier | Iterable[Signature], criterion: Criterion = "TE",
                    name: str | None = None) -> Frontier:
    """The operating frontier of a set of signatures (spec §9.1), pruned for ``criterion``.

    ``"TE"``: undominated in (T, E) — safe before ⊗ only. ``"Td"``: undominated in (T, d)
    within each (devices, ω_dev) group (plus s and SM count where those vary in a group) —
    safe before ⊕. ``"Tsd"``: undominated in (T, s, d) — safe before ⊕multi. See the module
    docstring for why.

    >>> s = 20.0
    >>> a = Signature("x", s_w=s, time_s=1.0, d_j=80.0)     # E = 100 J
    >>> b = Signature("x", s_w=s, time_s=2.0, d_j=61.0)     # E = 101 J
    >>> len(pareto_frontier([a, b], "TE")), len(pareto_frontier([a, b], "Td"))
    (1, 2)
    """
    pts = _as_sigs(sigs, "pareto_frontier")
    if name is None:
        names = {p.name for p in pts}
        name = names.pop() if len(names) == 1 else (sigs.name if isinstance(sigs, Frontier) else "frontier")
    idx = _prune_idx(pts, criterion)
    meta = dict(sigs.meta) if isinstance(sigs, Frontier) else {}
    return Frontier(tuple(pts[i] for i in idx), name=name, criterion=criterion, meta=meta)


def achievable_set(sigs: Frontier | Iterable[Signature]) -> tuple[np.ndarray, np.ndarray]:
    """The achievable set 𝒜 as arrays (T in s, E in J), in input order."""
    pts = _as_sigs(sigs, "achievable_set")
    return (np.array([p.time_s for p in pts], dtype=float),
            np.array([p.energy_j for p in pts], dtype=float))


# ---------------------------------------------------------------------------------------------
# ε-thinning
# ---------------------------------------------------------------------------------------------

def _thin_idx(t: np.ndarray, e: np.ndarray, eps: float) -> np.ndarray:
    """On a (T, E) staircase sorted by T (E strictly decreasing), keep the fastest point, the
    cheapest point, and every point whose energy is below the last kept energy / (1+eps).

    Every dropped point p then has a kept q with T_q ≤ T_p and E_q ≤ (1+eps)·E_p, so at any
    deadline the thinned frontier costs at most (1+eps)× the original."""
    n = len(t)
    if n <= 2:
        return np.arange(n)
    keep = [0]
    last = float(e[0])
    factor = 1.0 + eps
    for i, ei in enumerate(e.tolist()):
        if i and last > factor * ei:
            keep.append(i)
            last = ei
    if keep[-1] != n - 1:
        keep.append(n - 1)
    return np.array(keep, dtype=np.intp)


def _thin_to(t: np.ndarray, e: np.ndarray, max_points: int) -> tuple[np.ndarray, float]:
    """Thin a sorted staircase to at most ``max_points`` with the smallest ε found by bisection."""
    if max_points < 2:
        raise EnergyCalculusError(f"max_points must be >= 2, got {max_points}")
    if len(t) <= max_points:
        return np.arange(len(t)), 0.0
    lo, hi = 0.0, 1e-6
    while len(_thin_idx(t, e, hi)) > max_points:
        lo, hi = hi, hi * 4.0
        if hi > 1e12:
            break
    for _ in range(40):
        mid = math.sqrt(lo * hi) if lo > 0 else hi / 4.0
        if len(_thin_idx(t, e, mid)) > max_points:
            lo = mid
        else:
            hi = mid
        if lo > 0 and hi / lo < 1.0 + 1e-3:
            break
    return _thin_idx(t, e, hi), hi


def thin(frontier: Frontier, eps: float, name: str | None = None) -> Frontier:
    """ε-thinning of a (T, E) frontier: a subset such that for every deadline D the thinned
    frontier's cheapest feasible energy is ≤ (1+eps) × the original's (and the same points
    are feasible: the fastest point is always kept). The cheapest point is kept too.

    >>> pts = [Signature("k", s_w=0, time_s=t, d_j=e) for t, e in [(1, 100), (2, 99.5), (3, 50)]]
    >>> [p.time_s for p in thin(pareto_frontier(pts), 0.01)]
    [1.0, 3.0]
    """
    if not isinstance(frontier, Frontier):
        frontier = pareto_frontier(frontier, "TE")
    if frontier.criterion != "TE":
        raise EnergyCalculusError(
            f"thin: frontier {frontier.name!r} is pruned for {frontier.criterion!r}; ε-thinning "
            "bounds energy at each deadline, which only a (T, E) frontier is about — thin the "
            "(T, E) frontier, or compose first")
    eps = float(eps)
    if not math.isfinite(eps) or eps < 0:
        raise EnergyCalculusError(f"thin: eps must be finite and >= 0, got {eps!r}")
    keep = _thin_idx(frontier.times_s, frontier.energies_j, eps)
    meta = dict(frontier.meta)
    meta["thinned"] = True
    meta["energy_bound_factor"] = float(meta.get("energy_bound_factor", 1.0)) * (1.0 + eps)
    return Frontier(tuple(frontier.points[i] for i in keep), name=name or frontier.name,
                    criterion="TE", meta=meta)


# ---------------------------------------------------------------------------------------------
# Composition helpers
# ---------------------------------------------------------------------------------------------

def _check_pairs(n: int, what: str) -> None:
    if n > MAX_CANDIDATES:
        raise CompositionError(
            f"{what}: one composition step would form {n:,} candidate combinations "
            f"(limit {MAX_CANDIDATES:,}); pass max_points=... to ε-thin intermediate frontiers, "
            "or thin the inputs")


def _fname(f: Any) -> str:
    if isinstance(f, Frontier):
        return f.name
    f = list(f)
    return f[0].name if f and isinstance(f[0], Signature) else "?"


def _frontier_name(frontiers: Sequence[Any], op: str, name: str | None) -> str:
    if name:
        return name
    names = [_fname(f) for f in frontiers]
    if len(names) > 4:
        names = names[:2] + [f"... {len(names) - 3} more ..."] + names[-1:]
    return f"{op}(" + ", ".join(names) + ")"


def _with_choice(sig: Signature, parts: Sequence[Signature], **extra: Any) -> Signature:
    """Attach per-part labels (for tables and plots) without touching the propagated terms."""
    meta = dict(sig.meta)
    meta["choice"] = [point_label(p) for p in parts]
    meta.update(extra)
    return replace(sig, meta=meta)


class _Thinning:
    """Records ε-thinning applied while composing, for the result's name and meta."""

    def __init__(self, max_points: int | None):
        if max_points is not None and int(max_points) < 2:
            raise EnergyCalculusError(f"max_points must be >= 2, got {max_points}")
        self.max_points = None if max_points is None else int(max_points)
        self.eps: list[float] = []

    def cap(self, t: np.ndarray, e: np.ndarray) -> np.ndarray:
        """Indices to keep of a sorted (T, E) staircase."""
        if self.max_points is None or len(t) <= self.max_points:
            return np.arange(len(t))
        keep, eps = _thin_to(t, e, self.max_points)
        self.eps.append(eps)
        return keep

    def finish(self, name: str, meta: dict[str, Any]) -> str:
        if not self.eps:
            return name
        factor = float(np.prod([1.0 + x for x in self.eps]))
        meta.update(thinned=True, thinning_eps=self.eps, energy_bound_factor=factor,
                    max_points=self.max_points)
        return f"{name} [ε-thinned to ≤{self.max_points} points: E ≤ x{factor:.4g} optimal]"


_WHY_OFF_PATH = "a branch off the critical path pays only d; spec §7"


def _warn_criterion(f: Any, op: str, need: tuple[str, ...], meta: dict[str, Any],
                    why: str = _WHY_OFF_PATH) -> None:
    if isinstance(f, Frontier) and f.criterion not in need:
        msg = (f"{op}: input frontier {f.name!r} was pruned in {f.criterion}, which can drop points "
               f"that win under {op} ({why}); "
               f"prune with criterion {need[0]!r} or pass the achievable set")
        meta.setdefault("warnings", []).append(msg)
        warnings.warn(msg, PruningWarning, stacklevel=3)


def _single_devices(sigs: Iterable[Signature], op: str) -> frozenset[str]:
    devsets = {s.devices for s in sigs}
    if len(devsets) != 1:
        raise CompositionError(
            f"{op}: points run on different device sets {sorted(sorted(d) for d in devsets)}; "
            f"{op} composes elements on the same device(s)")
    return devsets.pop()


# ---------------------------------------------------------------------------------------------
# ⊗ : Minkowski sum (+ DP over ω_dev states with transitions)
# ---------------------------------------------------------------------------------------------

def compose_seq(*frontiers: Frontier | Iterable[Signature], transitions: Any = None,
                initial_dev: OperatingPoint | None = None, name: str | None = None,
                max_points: int | None = None) -> Frontier:
    """Frontier of e₁ ⊗ e₂ ⊗ … (spec §9.2): Minkowski sum of the frontiers, (T, E)-pruned.

    With a :class:`~frontier.transition.TransitionTable` it is the DP over ω_dev states of spec
    §9.2: one frontier per ω_dev of the last element; between consecutive elements whose ω_dev
    differ, a transition element (τ, ε) is inserted (its energy is max(ε, s·τ): the device
    keeps drawing static power while it switches). The solver may therefore keep one ω_dev to
    avoid paying for switches. ``initial_dev`` is the ω_dev the device holds before the first
    element (a switch from it is charged too); ``None`` means free.

    Inputs are frontiers or plain lists of signatures (achievable sets); each is pruned safely
    first ((T, E) without transitions, (T, E) within each ω_dev with them — so pass achievable
    sets or ``"Td"`` frontiers when using transitions; a ``"TE"`` frontier already dropped the
    per-ω_dev points). ``max_points`` caps every intermediate frontier by ε-thinning; the result
    then says so in its name and ``meta['energy_bound_factor']``.

    Returns a ``"TE"`` frontier of composite signatures (``seq`` of the chosen points and
    transition elements; variances propagated).
    """
    if not frontiers:
        raise CompositionError("compose_seq needs at least one frontier")
    frontiers = tuple(f if isinstance(f, Frontier) else list(f) for f in frontiers)
    elems = [_as_sigs(f, f"compose_seq: input {i}") for i, f in enumerate(frontiers)]
    devices = _single_devices([s for el in elems for s in el], "compose_seq")
    out_name = _frontier_name(frontiers, "seq", name)
    thinning = _Thinning(max_points)
    meta: dict[str, Any] = {"op": "seq", "parts": [_fname(f) for f in frontiers]}

    if transitions is None:
        pts = [[el[i] for i in _prune_idx(el, "TE")] for el in elems]
        t = np.array([p.time_s for p in pts[0]])
        e = np.array([p.energy_j for p in pts[0]])
        path = np.arange(len(t))[:, None]
        keep = thinning.cap(t, e)
        t, e, path = t[keep], e[keep], path[keep]
        for k in range(1, len(pts)):
            tb = np.array([p.time_s for p in pts[k]])
            eb = np.array([p.energy_j for p in pts[k]])
            _check_pairs(len(t) * len(tb), "compose_seq")
            ct = (t[:, None] + tb[None, :]).ravel()
            ce = (e[:, None] + eb[None, :]).ravel()
            ia, ib = np.divmod(np.arange(ct.size), len(tb))
            idx = nondominated(ct, ce)
            idx = idx[thinning.cap(ct[idx], ce[idx])]
            t, e = ct[idx], ce[idx]
            path = np.concatenate([path[ia[idx]], ib[idx, None]], axis=1)
        out = []
        for row in path:
            parts = [pts[k][j] for k, j in enumerate(row)]
            out.append(_with_choice(seq(*parts), parts) if len(parts) > 1 else parts[0])
        return Frontier(tuple(out), name=thinning.finish(out_name, meta), criterion="TE", meta=meta)

    # ---- DP over ω_dev states (spec §9.2) ----
    if not (callable(getattr(transitions, "cost", None)) and callable(getattr(transitions, "element", None))):
        raise CompositionError(
            f"compose_seq: transitions must be a TransitionTable (cost/element), got {type(transitions).__name__}")
    for f in frontiers:
        if isinstance(f, Frontier):
            _warn_criterion(f, "⊗ with transitions (compose_seq)", ("Td",), meta,
                            "a point dominated at another ω_dev can win once switching costs")
    # Per element: ω_dev state -> its points, pruned in (T, E) within the state (plus s when it
    # varies: the outgoing switch costs max(ε, s·τ)).
    groups: list[list[tuple[OperatingPoint, list[Signature]]]] = []
    for el in elems:
        g: dict[OperatingPoint, list[Signature]] = {}
        for p in el:
            g.setdefault(p.omega.dev, []).append(p)
        pruned = []
        for w in sorted(g):
            members = g[w]
            tt, ee, ss = _arrays_tes(members)
            idx = _prune_tes(tt, ee, ss)
            pruned.append((w, [members[i] for i in idx]))
        groups.append(pruned)

    # state -> (T, E, s_last, state-index path [n, k], point-index path [n, k])
    states: list[tuple[np.ndarray, ...]] = []
    for wi, (w, ps) in enumerate(groups[0]):
        t, e, s = _arrays_tes(ps)
        if initial_dev is not None:
            tau, eps = transitions.cost(initial_dev, w)
            if tau or eps:
                t = t + tau
                e = e + np.maximum(eps, s * tau)
        idx = _prune_tes(t, e, s)
        idx = idx[thinning.cap(t[idx], e[idx])]
        states.append((t[idx], e[idx], s[idx], np.full((len(idx), 1), wi), idx[:, None]))
    for k in range(1, len(groups)):
        prev_keys = [w for w, _ in groups[k - 1]]
        all_st = np.concatenate([st[3] for st in states])
        all_pt = np.concatenate([st[4] for st in states])
        offsets = np.cumsum([0] + [len(st[0]) for st in states])
        new_states = []
        for wi, (w, ps) in enumerate(groups[k]):
            tb, eb, sb = _arrays_tes(ps)
            ct, ce, cs, cprev, cpt = [], [], [], [], []
            for pi, wp in enumerate(prev_keys):
                t, e, s = states[pi][0], states[pi][1], states[pi][2]
                if len(t) == 0:
                    continue
                tau, eps = transitions.cost(wp, w)
                add_e = np.maximum(eps, s * tau) if (tau or eps) else np.zeros(len(t))
                _check_pairs(len(t) * len(tb), "compose_seq")
                rows, cols = np.divmod(np.arange(len(t) * len(tb)), len(tb))
                ct.append(t[rows] + float(tau) + tb[cols])
                ce.append(e[rows] + add_e[rows] + eb[cols])
                cs.append(sb[cols])
                cprev.append(offsets[pi] + rows)
                cpt.append(cols)
            ct, ce, cs = np.concatenate(ct), np.concatenate(ce), np.concatenate(cs)
            cprev, cpt = np.concatenate(cprev), np.concatenate(cpt)
            idx = _prune_tes(ct, ce, cs)
            idx = idx[thinning.cap(ct[idx], ce[idx])]
            new_states.append((
                ct[idx], ce[idx], cs[idx],
                np.concatenate([all_st[cprev[idx]], np.full((len(idx), 1), wi)], axis=1),
                np.concatenate([all_pt[cprev[idx]], cpt[idx, None]], axis=1),
            ))
        states = new_states

    ft = np.concatenate([st[0] for st in states])
    fe = np.concatenate([st[1] for st in states])
    fst = np.concatenate([st[3] for st in states])
    fpt = np.concatenate([st[4] for st in states])
    idx = nondominated(ft, fe)
    idx = idx[thinning.cap(ft[idx], fe[idx])]
    out = []
    for j in idx:
        parts: list[Signature] = []
        chosen: list[Signature] = []
        prev_w: OperatingPoint | None = initial_dev
        prev_s: float | None = None
        for k in range(len(groups)):
            w, ps = groups[k][int(fst[j, k])]
            p = ps[int(fpt[j, k])]
            if prev_w is not None:
                tau, eps = transitions.cost(prev_w, w)
                if tau or eps:
                    s_sw = p.s_w if prev_s is None else prev_s
                    parts.append(transitions.element(prev_w, w, devices, s_sw))
            parts.append(p)
            chosen.append(p)
            prev_w, prev_s = w, p.s_w
        c = seq(*parts) if len(parts) > 1 else parts[0]
        if len(parts) > 1:
            c = _with_choice(c, chosen, switches=len(parts) - len(chosen))
        out.append(c)
    if callable(getattr(transitions, "to_dict", None)):
        meta["transitions"] = transitions.to_dict()
    return Frontier(tuple(out), name=thinning.finish(out_name, meta), criterion="TE", meta=meta)


def _arrays_tes(ps: Sequence[Signature]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (np.array([p.time_s for p in ps], dtype=float), np.array([p.energy_j for p in ps], dtype=float),
            np.array([p.s_w for p in ps], dtype=float))


def _prune_tes(t: np.ndarray, e: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Undominated in (T, E), or (T, E, s) when s varies; sorted by (T, E)."""
    if len(t) == 0:
        return np.zeros(0, dtype=np.intp)
    idx = nondominated(t, e) if np.all(s == s[0]) else nondominated(t, e, s)
    return idx[np.lexsort((e[idx], t[idx]))]


# ---------------------------------------------------------------------------------------------
# ⊕ : shared ω_dev, joint SM feasibility
# ---------------------------------------------------------------------------------------------

def compose_par(*frontiers: Frontier | Iterable[Signature], sm_total: int | None = None,
                name: str | None = None, max_points: int | None = None) -> Frontier:
    """Frontier of e₁ ⊕ e₂ ⊕ … on one device (spec §9.2).

    Only points with equal ω_dev combine (the branches share the device's clocks and cap);
    their SM allocations must fit: Σ sm_count ≤ ``sm_total`` (from the argument, else from any
    point's ``meta['sm_total']``; a point with no ``sm_count`` counts as 0 SMs). Per ω_dev,
    branches are combined one at a time keeping partial combinations undominated in
    (max T, Σd, ΣSM) — exact when s is one value per (device, ω_dev); then E = s·max T + Σd,
    the union over ω_dev is (T, E)-pruned.

    Inputs should be achievable sets or ``"Td"`` frontiers: a ``"TE"`` frontier may have
    dropped the point that wins off the critical path (spec §7); a :class:`PruningWarning` says
    so. ``max_points`` ε-thins the result (reported in name and meta).
    """
    if not frontiers:
        raise CompositionError("compose_par needs at least one frontier")
    frontiers = tuple(f if isinstance(f, Frontier) else list(f) for f in frontiers)
    meta: dict[str, Any] = {"op": "par"}
    for f in frontiers:
        _warn_criterion(f, "⊕ (compose_par)", ("Td",), meta)
    elems = [_as_sigs(f, f"compose_par: input {i}") for i, f in enumerate(frontiers)]
    _single_devices([s for el in elems for s in el], "compose_par")
    if sm_total is None:
        sm_total = next((int(p.meta["sm_total"]) for el in elems for p in el if "sm_total" in p.meta), None)
    pts = [[el[i] for i in _prune_idx(el, "Td")] for el in elems]
    out_name = _frontier_name(frontiers, "par", name)
    thinning = _Thinning(max_points)

    common = set.intersection(*({p.omega.dev for p in el} for el in pts))
    res_t, res_e, res_parts = [], [], []
    for w in sorted(common):
        br = [[p for p in el if p.omega.dev == w] for el in pts]
        arr = []
        for ps in br:
            arr.append((np.array([p.time_s for p in ps]), np.array([p.d_j for p in ps]),
                        np.array([p.s_w for p in ps]),
                        np.array([p.omega.sm_count or 0 for p in ps], dtype=float)))
        t, d, s, sm = arr[0]
        path = np.arange(len(t))[:, None]
        if sm_total is not None:
            ok = sm <= sm_total
            t, d, s, sm, path = t[ok], d[ok], s[ok], sm[ok], path[ok]
        for b in range(1, len(arr)):
            tb, db, sb, smb = arr[b]
            _check_pairs(len(t) * len(tb), "compose_par")
            ia, ib = np.divmod(np.arange(len(t) * len(tb)), len(tb))
            ct = np.maximum(t[ia], tb[ib])
            cs = np.where(tb[ib] > t[ia], sb[ib], s[ia])  # s of the dominant (first longest) branch
            cd = d[ia] + db[ib]
            csm = sm[ia] + smb[ib]
            ok = np.ones(ct.size, dtype=bool) if sm_total is None else csm <= sm_total
            ia, ib, ct, cs, cd, csm = ia[ok], ib[ok], ct[ok], cs[ok], cd[ok], csm[ok]
            cols = [ct, cd]
            if sm_total is not None:
                cols.append(csm)
            if cs.size and not np.all(cs == cs[0]):
                cols.append(cs)
            idx = nondominated(*cols) if ct.size else np.zeros(0, dtype=np.intp)
            t, d, s, sm = ct[idx], cd[idx], cs[idx], csm[idx]
            path = np.concatenate([path[ia[idx]], ib[idx, None]], axis=1)
        if len(t) == 0:
            continue
        res_t.append(t)
        res_e.append(s * t + d)
        res_parts.extend([br[k][j] for k, j in enumerate(row)] for row in path)
    if not res_parts:
        why = ("the branches have no ω_dev in common" if not common
               else f"no combination of SM allocations fits sm_total={sm_total}")
        raise CompositionError(f"compose_par: no feasible combination: {why}")
    ft, fe = np.concatenate(res_t), np.concatenate(res_e)
    idx = nondominated(ft, fe)
    idx = idx[thinning.cap(ft[idx], fe[idx])]
    out = []
    for j in idx:
        parts = res_parts[int(j)]
        c = par(*parts, sm_total=sm_total) if len(parts) > 1 else parts[0]
        out.append(_with_choice(c, parts) if len(parts) > 1 else c)
    return Frontier(tuple(out), name=thinning.finish(out_name, meta), criterion="TE", meta=meta)


# ---------------------------------------------------------------------------------------------
# ⊕multi : decoupled per branch
# ---------------------------------------------------------------------------------------------

def compose_par_multi(*frontiers: Frontier | Iterable[Signature], name: str | None = None,
                      max_points: int | None = None) -> Frontier:
    """Frontier of e₁ ⊕multi e₂ … across disjoint devices (spec §9.2), decoupled per branch:

    E*(τ) = Σ_i min{ s_i τ + d_i : T_i ≤ τ } for τ in the union of branch times. Each branch
    picks, on its own, the cheapest point that meets the common makespan counting its device's
    static power over the whole makespan (how Perseus slows non-critical work). The actual
    composite of each τ's choices is formed (its makespan may be below τ) and the set is
    (T, E)-pruned; this equals the brute-force Pareto set of all combinations.

    Inputs should be achievable sets or ``"Tsd"``/``"Td"`` frontiers (a ``"TE"`` frontier
    triggers a :class:`PruningWarning`). ``max_points`` ε-thins the result.
    """
    if not frontiers:
        raise CompositionError("compose_par_multi needs at least one frontier")
    frontiers = tuple(f if isinstance(f, Frontier) else list(f) for f in frontiers)
    meta: dict[str, Any] = {"op": "par_multi"}
    for f in frontiers:
        _warn_criterion(f, "⊕multi (compose_par_multi)", ("Tsd", "Td"), meta)
    elems = [_as_sigs(f, f"compose_par_multi: input {i}") for i, f in enumerate(frontiers)]
    owner: dict[str, int] = {}
    for i, el in enumerate(elems):
        for dv in frozenset().union(*(p.devices for p in el)):
            if dv in owner:
                raise CompositionError(
                    f"compose_par_multi: device {dv!r} is used by inputs {owner[dv]} and {i}; "
                    "⊕multi needs disjoint devices — use compose_par for overlap on one device")
            owner[dv] = i
    pts = [[el[i] for i in _prune_idx(el, "Tsd")] for el in elems]
    out_name = _frontier_name(frontiers, "par_multi", name)
    thinning = _Thinning(max_points)
    arrs = [(np.array([p.time_s for p in ps]), np.array([p.s_w for p in ps]),
             np.array([p.d_j for p in ps])) for ps in pts]
    tmin = max(a[0].min() for a in arrs)
    taus = np.unique(np.concatenate([a[0] for a in arrs]))
    taus = taus[taus >= tmin]
    _check_pairs(len(taus) * sum(len(a[0]) for a in arrs), "compose_par_multi")
    choice = np.empty((len(taus), len(arrs)), dtype=np.intp)
    for i, (t, s, d) in enumerate(arrs):
        cost = s[:, None] * taus[None, :] + d[:, None]
        cost[t[:, None] > taus[None, :]] = np.inf
        choice[:, i] = np.argmin(cost, axis=0)  # first minimum: the fastest on ties
    choice = np.unique(choice, axis=0)
    tt = np.max(np.stack([arrs[i][0][choice[:, i]] for i in range(len(arrs))], axis=1), axis=1)
    ss = np.sum(np.stack([arrs[i][1][choice[:, i]] for i in range(len(arrs))], axis=1), axis=1)
    dd = np.sum(np.stack([arrs[i][2][choice[:, i]] for i in range(len(arrs))], axis=1), axis=1)
    ee = ss * tt + dd
    idx = nondominated(tt, ee)
    idx = idx[thinning.cap(tt[idx], ee[idx])]
    out = []
    for j in idx:
        parts = [pts[i][int(choice[j, i])] for i in range(len(arrs))]
        out.append(_with_choice(par_multi(*parts), parts) if len(parts) > 1 else parts[0])
    return Frontier(tuple(out), name=thinning.finish(out_name, meta), criterion="TE", meta=meta)
