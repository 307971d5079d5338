"""Energy signatures S = (s, T, d, σ²_T, σ²_E, σ²_s, ...) with E = s·T + d (spec §3).

A signature is either *measured* (a leaf: its variances are those of the estimate, i.e. the
squared standard error) or *composed* by ``seq``/``par``/``par_multi``/``dag``. Either way it
carries, per distinct measured leaf, the first-order sensitivities of its T and E to that leaf's
T and d (the delta method, DESIGN.md). A leaf used k times therefore contributes k²·var, not
k·var: its estimation error is shared by every use.

The static power s is itself measured (ready power, re-measured during long sweeps), and it
drifts: ``var_s_w2`` (σ²_s) carries that uncertainty. A measured E does not depend on s (the
counter measures E; s only splits it into s·T and d), so σ_s leaves a leaf's σ_E unchanged and
widens its d (∂d/∂s = −T). It reaches a composite's E wherever static power is counted once
for several elements — ⊕ (E = E₁ + E₂ − s·overlap) and ⊕multi (an idle device at its s) —
through per-leaf sensitivities (:class:`StaticTerm`, in ``static_terms``) propagated by the
same delta method as T and d. They are kept beside ``terms`` (not in :class:`Term`), so code
and files that know only T and d read and write exactly what they did.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from .errors import InvalidSignatureError
from .operating_point import OperatingPoint

#: Default number of standard deviations of E within which a slightly negative d is treated
#: as noise (clamped to 0 and flagged) rather than rejected.
D_NOISE_SIGMAS = 3.0


@dataclass(frozen=True)
class Term:
    """How one distinct measured leaf enters a signature (first order).

    ``var_time_s2``/``var_d_j2`` are the leaf's own estimate variances; ``dT_dT`` is
    ∂T/∂T_leaf, ``dE_dT`` is ∂E/∂T_leaf and ``dE_dd`` is ∂E/∂d_leaf of the composite.
    """

    var_time_s2: float
    var_d_j2: float
    dT_dT: float
    dE_dT: float
    dE_dd: float


@dataclass(frozen=True)
class StaticTerm:
    """How one measured leaf's static power enters a signature (first order).

    ``var_s_w2`` is the variance of the leaf's s (σ²_s, W²), ``dE_ds`` ∂E/∂s_leaf and
    ``dd_ds`` ∂d/∂s_leaf of the signature (a leaf itself: 0 and −T).
    """

    var_s_w2: float
    dE_ds: float
    dd_ds: float

    def ds_ds(self, time_s: float) -> float:
        """∂s/∂s_leaf of a signature of time ``time_s`` (s = (E − d)/T)."""
        return (self.dE_ds - self.dd_ds) / time_s if time_s > 0 else 0.0


def _finite(name: str, what: str, v: Any) -> float:
    try:
        fv = float(v)
    except (TypeError, ValueError):
        raise InvalidSignatureError(f"element {name!r}: {what} must be a number, got {v!r}") from None
    if not math.isfinite(fv):
        raise InvalidSignatureError(f"element {name!r}: {what} is {fv!r} (must be finite)")
    return fv


@dataclass(frozen=True, eq=False)
class Signature:
    """The energy signature of one element or composite.

    Parameters
    ----------
    name : element name (used in every error message).
    s_w : static (ready) power of the device(s) at ω_dev, W; summed over devices.
    time_s : T, seconds.
    d_j : dynamic energy d = E − s·T, J (≥ 0; slightly negative values within noise are
        clamped to 0 and flagged in ``meta['d_clamped']``).
    var_time_s2, var_energy_j2 : variances of the T and E *estimates* (s², J²).
    var_s_w2 : variance of the static power s (σ²_s, W²): the drift of ready power over the
        measurement (0 when it was measured once). A composite's is propagated from its leaves
        (``static_terms``), and so is its effect on the composite's σ²_E.
    n : number of runs behind the estimate.
    devices : device names it occupies (``{"gpu0"}`` by default).
    omega : operating point; ``kappa`` implementation; ``theta`` workload description.
    meta : free-form metadata (protocol, clocks seen, ...).

    Examples
    --------
    >>> g = Signature("gemm", s_w=123.0, time_s=1.6e-3, d_j=0.98, var_energy_j2=1e-4)
    >>> round(g.energy_j, 4)
    1.1768
    """

    name: str
    s_w: float
    time_s: float
    d_j: float
    var_time_s2: float = 0.0
    var_energy_j2: float = 0.0
    n: int = 1
    devices: frozenset[str] = frozenset({"gpu0"})
    omega: OperatingPoint = OperatingPoint()
    kappa: str | None = None
    theta: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    composed: bool = False
    # First-order sensitivities to distinct measured leaves (see Term). Empty for a leaf: it
    # is then filled with the leaf itself.
    terms: Mapping[str, Term] = field(default_factory=dict, repr=False)
    extra_var_time_s2: float = field(default=0.0, repr=False)
    extra_var_energy_j2: float = field(default=0.0, repr=False)
    # Eq. 13 bookkeeping, in joules of σ_E: Σ m_i σ_E_i, and the σ_E of leaves that take the
    # composite's entry context / all leaves / leaves already in a shared runtime context.
    bias_sigma_j: float = field(default=0.0, repr=False)
    head_sigma_j: float = field(default=-1.0, repr=False)
    all_sigma_j: float = field(default=-1.0, repr=False)
    runtime_sigma_j: float = field(default=0.0, repr=False)
    var_s_w2: float = 0.0
    # Per leaf with a known σ_s, its StaticTerm (see the module doc). Filled for a leaf.
    static_terms: Mapping[str, StaticTerm] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        name = str(self.name)
        object.__setattr__(self, "name", name)
        s = _finite(name, "static power s_w", self.s_w)
        t = _finite(name, "time_s", self.time_s)
        d = _finite(name, "dynamic energy d_j", self.d_j)
        vt = _finite(name, "var_time_s2", self.var_time_s2)
        ve = _finite(name, "var_energy_j2", self.var_energy_j2)
        vs = _finite(name, "var_s_w2", self.var_s_w2)
        if vs < 0:
            raise InvalidSignatureError(f"element {name!r}: var_s_w2 = {vs} W² is negative")
        object.__setattr__(self, "var_s_w2", vs)
        if s < 0:
            raise InvalidSignatureError(f"element {name!r}: static power s_w = {s} W is negative")
        if t < 0:
            raise InvalidSignatureError(f"element {name!r}: time_s = {t} s is negative")
        if vt < 0 or ve < 0:
            raise InvalidSignatureError(
                f"element {name!r}: variances must be >= 0 (var_time_s2={vt}, var_energy_j2={ve})"
            )
        meta = dict(self.meta)
        if d < 0:
            tol = D_NOISE_SIGMAS * math.sqrt(ve) + 1e-9 * max(1.0, abs(s * t))
            if -d > tol:
                raise InvalidSignatureError(
                    f"element {name!r}: dynamic energy d = E - s*T = {d:.6g} J is negative beyond "
                    f"noise ({D_NOISE_SIGMAS:g} sigma = {tol:.3g} J); is the static power s = {s:g} W "
                    f"too high for this element?"
                )
            meta["d_clamped"] = d
            d = 0.0
        if int(self.n) < 1:
            raise InvalidSignatureError(f"element {name!r}: n = {self.n} must be >= 1")
        devices = frozenset(str(x) for x in self.devices)
        if not devices:
            raise InvalidSignatureError(f"element {name!r}: needs at least one device")
        object.__setattr__(self, "s_w", s)
        object.__setattr__(self, "time_s", t)
        object.__setattr__(self, "d_j", d)
        object.__setattr__(self, "var_time_s2", vt)
        object.__setattr__(self, "var_energy_j2", ve)
        object.__setattr__(self, "n", int(self.n))
        object.__setattr__(self, "devices", devices)
        if not isinstance(self.omega, OperatingPoint):
            object.__setattr__(self, "omega", OperatingPoint.from_dict(self.omega))
        if not self.terms:
            var_d = ve - s * s * vt
            if var_d < 0:
                # A noisy estimate made σ²_d negative: clamp at 0 and flag (spec §3.3).
                meta["var_d_clamped"] = var_d
                var_d = 0.0
            object.__setattr__(self, "terms", MappingProxyType({self.key: Term(vt, var_d, 1.0, s, 1.0)}))
            sig_e = math.sqrt(ve)
            object.__setattr__(self, "head_sigma_j", sig_e)
            object.__setattr__(self, "all_sigma_j", sig_e)
            static = {self.key: StaticTerm(vs, 0.0, -t)} if vs else {}
            object.__setattr__(self, "static_terms", MappingProxyType(static))
        else:
            object.__setattr__(self, "terms", MappingProxyType(dict(self.terms)))
            object.__setattr__(self, "static_terms", MappingProxyType(dict(self.static_terms)))
        object.__setattr__(self, "meta", MappingProxyType(meta))

    # -- identity -------------------------------------------------------------------------
    @property
    def key(self) -> str:
        """Content address of this signature: the same measurement loaded twice has one key,
        so repeated use is recognised as shared error (k²·var)."""
        k = self.__dict__.get("_key")
        if k is None:
            raw = repr(
                (self.name, self.kappa, self.theta, sorted(self.devices), self.omega.to_dict(),
                 self.s_w, self.time_s, self.d_j, self.var_time_s2, self.var_energy_j2, self.n)
                + ((self.var_s_w2,) if self.var_s_w2 else ())
            )
            k = hashlib.sha1(raw.encode()).hexdigest()[:16]
            object.__setattr__(self, "_key", k)
        return k

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Signature):
            return NotImplemented
        return self.key == other.key and self.composed == other.composed

    def __hash__(self) -> int:
        return hash(self.key)

    # -- derived quantities ---------------------------------------------------------------
    @property
    def energy_j(self) -> float:
        """E = s·T + d, joules."""
        return self.s_w * self.time_s + self.d_j

    @property
    def var_d_j2(self) -> float:
        """Variance of d: σ²_E − s²σ²_T for a leaf (clamped at 0), propagated for composites."""
        if not self.composed:
            return next(iter(self.terms.values())).var_d_j2
        return sum(t.dE_dd**2 * t.var_d_j2 for t in self.terms.values())

    @property
    def sd_s_w(self) -> float:
        """Standard deviation of the static power s, W (σ_s: its drift; 0 when unknown)."""
        return math.sqrt(self.var_s_w2)

    @property
    def sd_time_s(self) -> float:
        """Standard deviation of the T estimate, s."""
        return math.sqrt(self.var_time_s2)

    @property
    def sd_energy_j(self) -> float:
        """Standard deviation of the E estimate, J."""
        return math.sqrt(self.var_energy_j2)

    @property
    def power_w(self) -> float:
        """Average power E/T, W."""
        return self.energy_j / self.time_s if self.time_s > 0 else self.s_w

    @property
    def cov_time_energy(self) -> float:
        """First-order covariance of the T and E estimates, s·J."""
        return sum(t.dT_dT * t.dE_dT * t.var_time_s2 for t in self.terms.values())

    def bias_bound_j(self, c_alpha: float = 1.96) -> float:
        """Eq. 13 worst-case bias of the context-independent evaluation: c_α Σ m_i σ_E_i (J).

        Zero for a measured element; grows with every context substitution made when composing.
        """
        return c_alpha * self.bias_sigma_j

    def with_(self, **changes: Any) -> Signature:
        """A copy with some fields changed (a new leaf unless ``terms`` are passed)."""
        d = {k: getattr(self, k) for k in ("name", "s_w", "time_s", "d_j", "var_time_s2",
                                           "var_energy_j2", "n", "devices", "omega", "kappa",
                                           "theta", "meta", "var_s_w2")}
        d["meta"] = dict(self.meta)
        d.update(changes)
        return Signature(**d)

    # -- constructors ---------------------------------------------------------------------
    @classmethod
    def from_runs(
        cls,
        name: str,
        times_s: Sequence[float] | np.ndarray,
        energies_j: Sequence[float] | np.ndarray,
        s_w: float,
        **kwargs: Any,
    ) -> Signature:
        """Build a measured signature from repeated runs (per-invocation T and E per run).

        T and E are the run means; the stored variances are those of the *means*
        (sample variance / n), per DESIGN.md; the per-run spread, n and the directly
        estimated σ²_d (sample variance of d_r = E_r − s·T_r, divided by n) go in ``meta``.

        >>> sig = Signature.from_runs("copy", [1.0e-3, 1.02e-3], [0.61, 0.63], s_w=123.0)
        >>> sig.n, round(sig.time_s * 1e3, 3)
        (2, 1.01)
        """
        t = np.asarray(times_s, dtype=float).ravel()
        e = np.asarray(energies_j, dtype=float).ravel()
        if t.size == 0 or t.size != e.size:
            raise InvalidSignatureError(
                f"element {name!r}: need the same non-zero number of times and energies "
                f"(got {t.size} and {e.size})"
            )
        for arr, what in ((t, "time"), (e, "energy")):
            bad = np.flatnonzero(~np.isfinite(arr))
            if bad.size:
                raise InvalidSignatureError(f"element {name!r}: run {bad[0]} {what} is {arr[bad[0]]!r}")
        if np.any(t < 0):
            i = int(np.flatnonzero(t < 0)[0])
            raise InvalidSignatureError(f"element {name!r}: run {i} time {t[i]} s is negative")
        n = t.size
        var_t = float(t.var(ddof=1) / n) if n > 1 else 0.0
        var_e = float(e.var(ddof=1) / n) if n > 1 else 0.0
        dr = e - s_w * t
        meta = dict(kwargs.pop("meta", {}) or {})
        meta.update(
            source="measured",
            n_runs=n,
            run_sd_time_s=float(t.std(ddof=1)) if n > 1 else 0.0,
            run_sd_energy_j=float(e.std(ddof=1)) if n > 1 else 0.0,
            var_d_direct_j2=float(dr.var(ddof=1) / n) if n > 1 else 0.0,
        )
        return cls(name=name, s_w=s_w, time_s=float(t.mean()), d_j=float(dr.mean()),
                   var_time_s2=var_t, var_energy_j2=var_e, n=n, meta=meta, **kwargs)

    @classmethod
    def from_point(
        cls,
        name: str,
        time_s: float,
        energy_j: float,
        s_w: float,
        sd_time_s: float = 0.0,
        sd_energy_j: float = 0.0,
        **kwargs: Any,
    ) -> Signature:
        """Build a signature from point values of T and E (and optional standard deviations)."""
        e = _finite(name, "energy_j", energy_j)
        t = _finite(name, "time_s", time_s)
        return cls(name=name, s_w=s_w, time_s=t, d_j=e - float(s_w) * t,
                   var_time_s2=float(sd_time_s) ** 2, var_energy_j2=float(sd_energy_j) ** 2, **kwargs)


def variances_from_terms(
    terms: Mapping[str, Term], extra_var_time_s2: float = 0.0, extra_var_energy_j2: float = 0.0
) -> tuple[float, float]:
    """(σ²_T, σ²_E) of a composite from its per-leaf sensitivities (delta method), plus the
    non-linear extra that Clark's max adds (zero with the dominant-branch rule)."""
    vt = extra_var_time_s2
    ve = extra_var_energy_j2
    for t in terms.values():
        vt += t.dT_dT**2 * t.var_time_s2
        ve += t.dE_dT**2 * t.var_time_s2 + t.dE_dd**2 * t.var_d_j2
    return max(vt, 0.0), max(ve, 0.0)


def static_variances(static_terms: Mapping[str, StaticTerm], time_s: float) -> tuple[float, float]:
    """(σ²_s, the σ²_E added) of a composite of time ``time_s`` from its leaves' static-power
    sensitivities (delta method: Σ (∂s/∂s_leaf)² σ²_s,leaf and Σ (∂E/∂s_leaf)² σ²_s,leaf)."""
    vs = math.fsum(t.ds_ds(time_s) ** 2 * t.var_s_w2 for t in static_terms.values())
    ve = math.fsum(t.dE_ds ** 2 * t.var_s_w2 for t in static_terms.values())
    return vs, ve
