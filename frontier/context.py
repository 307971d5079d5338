"""The entry context in the algebra: mechanisms with state, and composition that carries it.

The context-independent algebra (:mod:`frontier.compose`) evaluates every element at the null
context φ_null. Where an element's signature depends on the state its predecessor left behind,
the spec's general form applies instead (§2.6, §4.1):

    φ₂ = φ'₁ = U₁(φ),   T₁⊗₂(φ) = T₁(φ) + T₂(φ'₁),   E₁⊗₂(φ) = E₁(φ) + E₂(φ'₁).

This module holds that form for the first mechanism that matters on GPUs, **thermal** (spec §5,
Table 1). Its effective state variable is the die temperature Θ (°C); its update rule is the
first-order RC model

    Θ' = Θ∞ + (Θ − Θ∞)·exp(−T/τ_th),   Θ∞ = Θ_amb + R_th·P̄,   P̄ = E/T,

and an element's signature at entry temperature Θ is interpolated between signatures
characterized at two or more entry temperatures (:class:`ContextualSignature`; the
characterization protocol's ``context_temp_c`` pre-heat measures them).

The null context stays the default: an element given as a plain :class:`Signature` has no
entry dependence, and :func:`seq_in_context` with only such elements (or with no mechanism) is
exactly :func:`frontier.compose.seq`. The Reduction Theorem (:mod:`frontier.insensitivity`)
still decides where the context may be dropped.

Example::

    >>> th = ThermalMechanism(ambient_c=30.0, r_th_c_per_w=0.1, tau_s=20.0)
    >>> round(th.exit_temp_c(entry_c=30.0, time_s=20.0, energy_j=20.0 * 500.0), 2)
    61.61
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .compose import seq
from .errors import InputError
from .signature import Signature


@dataclass(frozen=True)
class ThermalMechanism:
    """A device's first-order thermal model (one RC stage, superposition of heat inputs).

    Parameters
    ----------
    ambient_c : Θ_amb, the temperature the die settles to with no power, °C.
    r_th_c_per_w : R_th, the steady temperature rise per watt of average power, °C/W.
    tau_s : τ_th, the time constant of the approach to steady state, s.
    """

    ambient_c: float
    r_th_c_per_w: float
    tau_s: float

    def __post_init__(self) -> None:
        for name in ("ambient_c", "r_th_c_per_w", "tau_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise InputError(f"thermal mechanism: {name} must be a finite number, got {v!r}")
        if self.r_th_c_per_w < 0:
            raise InputError(f"thermal mechanism: r_th_c_per_w = {self.r_th_c_per_w} °C/W is negative")
        if self.tau_s <= 0:
            raise InputError(f"thermal mechanism: tau_s = {self.tau_s} s must be > 0")

    def steady_temp_c(self, power_w: float) -> float:
        """Θ∞ = Θ_amb + R_th·P: where the die settles under a constant ``power_w``, °C."""
        return self.ambient_c + self.r_th_c_per_w * power_w

    def exit_temp_c(self, entry_c: float, time_s: float, energy_j: float) -> float:
        """The temperature an element leaves behind, °C: it started at ``entry_c`` and released
        ``energy_j`` as heat over ``time_s`` (average power E/T). A zero-length element leaves
        the entry temperature unchanged."""
        if time_s < 0 or not math.isfinite(time_s):
            raise InputError(f"thermal update: time_s = {time_s!r} must be finite and >= 0")
        if time_s == 0:
            return float(entry_c)
        theta_inf = self.steady_temp_c(energy_j / time_s)
        return theta_inf + (entry_c - theta_inf) * math.exp(-time_s / self.tau_s)

    def idle_temp_c(self, entry_c: float, duration_s: float, power_w: float) -> float:
        """The temperature after waiting ``duration_s`` at ``power_w`` (a bubble, a cooldown)."""
        return self.exit_temp_c(entry_c, duration_s, power_w * duration_s)


@dataclass(frozen=True)
class ThermalObservation:
    """One window of a device's temperature: it entered at ``entry_c``, drew ``power_w`` on
    average for ``time_s``, and ended at ``exit_c``."""

    entry_c: float
    time_s: float
    power_w: float
    exit_c: float


def _fit_given_tau(obs: Sequence[ThermalObservation], tau_s: float) -> tuple[float, float, float]:
    """(Θ_amb, R_th, squared residual) by least squares with τ fixed: the rule is linear in
    Θ_amb and R_th once τ is known (Θ' − Θ·a = (1 − a)·Θ_amb + (1 − a)·P·R_th, a = e^{−T/τ})."""
    a = np.exp(-np.array([o.time_s for o in obs]) / tau_s)
    y = np.array([o.exit_c for o in obs]) - np.array([o.entry_c for o in obs]) * a
    x = np.column_stack([1.0 - a, (1.0 - a) * np.array([o.power_w for o in obs])])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = float(np.sum((x @ coef - y) ** 2))
    return float(coef[0]), float(coef[1]), resid


def fit_thermal(obs: Sequence[ThermalObservation], tau_bounds_s: tuple[float, float] = (0.5, 600.0),
                ) -> ThermalMechanism:
    """Fit a :class:`ThermalMechanism` to observed windows (least squares over Θ_amb, R_th,
    and τ by a log-spaced scan refined by golden-section search).

    Needs at least three windows with at least two distinct average powers (otherwise R_th and
    Θ_amb cannot be told apart): :class:`InputError` otherwise.
    """
    obs = list(obs)
    if len(obs) < 3:
        raise InputError(f"fit_thermal: need at least 3 windows, got {len(obs)}")
    if len({round(o.power_w, 6) for o in obs}) < 2:
        raise InputError("fit_thermal: every window has the same power; R_th and the ambient "
                         "temperature cannot be told apart (measure at two powers)")
    for o in obs:
        vals = (o.entry_c, o.time_s, o.power_w, o.exit_c)
        if not all(math.isfinite(v) for v in vals) or o.time_s <= 0 or o.power_w < 0:
            raise InputError(f"fit_thermal: bad window {o} (finite values, time_s > 0, power >= 0)")
    lo, hi = math.log(tau_bounds_s[0]), math.log(tau_bounds_s[1])
    grid = np.linspace(lo, hi, 61)
    best = min(grid, key=lambda g: _fit_given_tau(obs, math.exp(g))[2])
    step = (hi - lo) / 60
    a, b = max(lo, best - step), min(hi, best + step)
    phi = (math.sqrt(5) - 1) / 2
    for _ in range(60):
        c, d = b - phi * (b - a), a + phi * (b - a)
        if _fit_given_tau(obs, math.exp(c))[2] <= _fit_given_tau(obs, math.exp(d))[2]:
            b = d
        else:
            a = c
    tau = math.exp((a + b) / 2)
    amb, r_th, _ = _fit_given_tau(obs, tau)
    return ThermalMechanism(ambient_c=amb, r_th_c_per_w=max(0.0, r_th), tau_s=tau)


@dataclass(frozen=True)
class ContextualSignature:
    """One element's signature as a function of its entry temperature.

    ``by_entry_c`` maps entry temperatures (°C) to the signature characterized there (two or
    more; one is allowed and means no dependence). :meth:`at` interpolates linearly in Θ
    between the two nearest characterized temperatures and holds the end values outside them
    (extrapolating a fitted slope past what was measured would invent physics); the result's
    ``meta`` records the entry temperature and whether it was clamped.
    """

    name: str
    by_entry_c: Mapping[float, Signature] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.by_entry_c:
            raise InputError(f"element {self.name!r}: no signature at any entry temperature")
        temps = sorted(float(t) for t in self.by_entry_c)
        if not all(math.isfinite(t) for t in temps):
            raise InputError(f"element {self.name!r}: entry temperatures must be finite: {temps}")
        devs = {s.devices for s in self.by_entry_c.values()}
        if len(devs) != 1:
            raise InputError(f"element {self.name!r}: signatures at different entry temperatures "
                             f"run on different devices {sorted(sorted(d) for d in devs)}")
        object.__setattr__(self, "by_entry_c", {t: self.by_entry_c[t] for t in sorted(self.by_entry_c)})

    @property
    def temps_c(self) -> list[float]:
        """The characterized entry temperatures, ascending, °C."""
        return [float(t) for t in self.by_entry_c]

    def weights(self, entry_c: float | None) -> dict[float, float]:
        """The characterized entry temperatures (°C) the value at ``entry_c`` is a weighted sum
        of, with their weights, as :meth:`at` interpolates: linear between the two nearest, the
        end value outside them; ``None`` (the null context) is the coolest."""
        temps = self.temps_c
        if entry_c is None or len(temps) == 1 or entry_c <= temps[0]:
            return {temps[0]: 1.0}
        if entry_c >= temps[-1]:
            return {temps[-1]: 1.0}
        j = bisect.bisect_right(temps, entry_c)
        w = (entry_c - temps[j - 1]) / (temps[j] - temps[j - 1])
        return {temps[j - 1]: 1.0 - w, temps[j]: w}

    def at(self, entry_c: float) -> Signature:
        """The signature at entry temperature ``entry_c`` (°C), interpolated."""
        temps = self.temps_c
        sigs = list(self.by_entry_c.values())
        if len(temps) == 1:
            return sigs[0]
        if entry_c <= temps[0] or entry_c >= temps[-1]:
            i = 0 if entry_c <= temps[0] else len(temps) - 1
            if entry_c == temps[i]:
                return sigs[i]
            return sigs[i].with_(meta={**sigs[i].meta, "entry_temp_c": float(entry_c),
                                       "entry_temp_clamped_c": temps[i]})
        j = bisect.bisect_right(temps, entry_c)
        t0, t1 = temps[j - 1], temps[j]
        if entry_c == t0:
            return sigs[j - 1]
        return _interpolate(sigs[j - 1], sigs[j], (entry_c - t0) / (t1 - t0), entry_c)


def _interpolate(a: Signature, b: Signature, w: float, entry_c: float) -> Signature:
    """(1 − w)·a + w·b field by field; the variance of the weighted mean of two independent
    estimates, (1 − w)²σ²_a + w²σ²_b. The result is a new leaf (its error is not tracked as
    shared with ``a`` or ``b`` used elsewhere: a first-order simplification stated here)."""
    mix = lambda x, y: (1.0 - w) * x + w * y  # noqa: E731
    var = lambda x, y: (1.0 - w) ** 2 * x + w**2 * y  # noqa: E731
    return a.with_(s_w=mix(a.s_w, b.s_w), time_s=mix(a.time_s, b.time_s), d_j=mix(a.d_j, b.d_j),
                   var_time_s2=var(a.var_time_s2, b.var_time_s2),
                   var_energy_j2=var(a.var_energy_j2, b.var_energy_j2), n=min(a.n, b.n),
                   meta={**a.meta, "entry_temp_c": float(entry_c), "interpolated": True})


Element = Signature | ContextualSignature


@dataclass(frozen=True)
class ContextRun:
    """What :func:`seq_in_context` computed: the composite, the entry temperature of every
    element (°C, ``None`` where it was composed at the null context), and the exit
    temperature of the sequence (°C, ``None`` without a mechanism)."""

    signature: Signature
    entry_temps_c: tuple[float | None, ...]
    exit_temp_c: float | None


def seq_in_context(elems: Sequence[Element], entry_c: float | None = None,
                   mechanism: ThermalMechanism | None = None, name: str | None = None) -> ContextRun:
    """e₁ ⊗ e₂ ⊗ … with the entry temperature carried from each element to the next.

    Each element is evaluated at the temperature its predecessor left (``entry_c`` for the
    first); a plain :class:`Signature` is context-free (null context) but still heats the die.
    With ``mechanism=None`` every element is taken at the null context — a
    :class:`ContextualSignature` at its coolest characterized temperature, the protocol's
    φ_null — and the result equals :func:`frontier.compose.seq` of those signatures.
    """
    if not elems:
        raise InputError("seq_in_context needs at least one element")
    if mechanism is not None and entry_c is None:
        entry_c = mechanism.ambient_c
    temp = entry_c if mechanism is not None else None
    sigs: list[Signature] = []
    entries: list[float | None] = []
    for e in elems:
        if isinstance(e, ContextualSignature):
            sig = e.at(temp) if temp is not None else e.by_entry_c[min(e.by_entry_c)]
            entries.append(temp)
        else:
            sig = e
            entries.append(None)
        sigs.append(sig)
        if mechanism is not None and temp is not None:
            temp = mechanism.exit_temp_c(temp, sig.time_s, sig.energy_j)
    return ContextRun(seq(*sigs, name=name), tuple(entries), temp)
