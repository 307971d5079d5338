"""Transition elements e_{ω→ω'}: the cost of switching a device's ω_dev (spec §9.5).

Changing SM clock, memory clock or power limit between two consecutive elements on one device
is not free: the driver call takes time, the clocks settle, and the device draws its static
power meanwhile. A :class:`TransitionTable` gives, per device, the (time, energy) of each switch:

- explicit pairs (from ω_dev, to ω_dev) → (time_s, energy_j), e.g. measured with a settle-time
  probe (poll the clock until it reads the target, measurement-notes §4 step 1);
- otherwise a per-knob rule (what changing each knob costs; costs of several knobs add, as the
  driver calls are issued one after another);
- otherwise a rule fitted to the measured pairs (:class:`FittedRule`, below), where it
  applies;
- otherwise a constant cost for any change;
- zero when ω_dev is unchanged (the solver can always choose *not* to switch).

A change nothing above prices is never silently free when the table holds measured pairs: it
raises :class:`TransitionRuleError` (``on_unpriced="error"``; an empty table, such as
:meth:`TransitionTable.zero`, prices it at 0 by default, as it says).

The fitted rule (:func:`fit_transition_rule`): τ is linear, with non-negative coefficients
fitted by non-negative least squares, in an intercept, |Δ SM clock| and |Δ memory clock| (GHz)
and whether the power limit changes; ε = ready power at the target × τ (the device idles
while it settles), with the target's measured ready power where known, else the highest one
measured (an upper bound, not a guess from below). A feature that takes one value in every
measured pair cannot be fitted: the rule then covers only pairs with that value (e.g. without
a measured power-limit change it prices no power-limit change), and raises otherwise. The
rule records its RMS and largest residual over the measured pairs. Clock steps beyond the
measured range are extrapolated linearly.

``energy_j`` is the switch's *total* energy. The element built by :meth:`TransitionTable.element`
has T = time_s, the device's static power s, and d = energy_j − s·time_s clamped at 0, so its
energy is max(energy_j, s·time_s): a stall of τ seconds costs at least its static energy.
It composes with ⊗ like any other element.

Defaults (:meth:`TransitionTable.assumed_default`) are an **assumption**, not a measurement:
10 ms per changed knob and no energy beyond static. Reason: locking clocks through NVML
(``nvmlDeviceSetGpuLockedClocks`` / ``...MemoryLockedClocks``) and setting a power limit return
quickly, but the clock then ramps to the target; switching latency measured with the LATEST
tool (Velička et al., arXiv 2502.20075) depends mostly on the target frequency and differs a lot
between GPUs (GH200, A100, RTX 6000), at the order of milliseconds to tens of milliseconds.
Measure your own device and build a table from pairs for anything that matters.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import EnergyCalculusError, FormatError, InputError
from .formats import content, format_tag, validate
from .operating_point import OperatingPoint
from .signature import Signature

#: Knobs of ω_dev a per-knob rule can price (``sm_count`` is per element, not a device switch).
DEV_KNOBS: tuple[str, ...] = ("sm_clock_mhz", "mem_clock_mhz", "power_limit_w")

#: Assumed per-knob switch latency, s (see the module docstring: an assumption, not measured).
ASSUMED_SWITCH_TIME_S = 0.010

Cost = tuple[float, float]

#: The fitted rule's features of a switch (from, to): its τ is Σ coef · feature.
RULE_FEATURES: tuple[str, ...] = ("intercept", "d_sm_clock_ghz", "d_mem_clock_ghz",
                                  "power_limit_changes")
#: How :class:`TransitionTable` prices a change nothing else in it prices.
ON_UNPRICED = ("auto", "error", "free")


class TransitionRuleError(InputError):
    """A switch that no measured pair, rule or default of a transition table prices."""


def _features(a: OperatingPoint, b: OperatingPoint) -> tuple[float, ...] | str:
    """The rule's features of switching ``a`` → ``b``, or why there are none (a knob set on
    one side only: its step is unknown)."""
    out = [1.0]
    for k in ("sm_clock_mhz", "mem_clock_mhz"):
        x, y = getattr(a, k), getattr(b, k)
        if (x is None) != (y is None):
            return f"{k} is set on one side only"
        out.append(0.0 if x is None else abs(float(y) - float(x)) / 1000.0)
    out.append(float(a.power_limit_w != b.power_limit_w))
    return tuple(out)


@dataclass(frozen=True)
class FittedRule:
    """τ of a switch from the measured ones: ``Σ coef_s[k] · feature_k`` over ``features``
    (a subset of :data:`RULE_FEATURES`); ε = ready power at the target × τ.

    ``held``: features that took one value in every measured pair (not fitted); the rule
    prices only switches with those values. ``power_w``: measured ready power per target
    ω_dev; ``default_power_w`` for any other target (the highest measured). Residuals are
    over the ``n_pairs`` measured pairs, s.
    """

    features: tuple[str, ...]
    coef_s: tuple[float, ...]
    held: tuple[tuple[str, float], ...] = ()
    power_w: tuple[tuple[OperatingPoint, float], ...] = ()
    default_power_w: float = 0.0
    n_pairs: int = 0
    rms_residual_s: float = 0.0
    max_abs_residual_s: float = 0.0

    def __post_init__(self) -> None:
        if len(self.features) != len(self.coef_s):
            raise EnergyCalculusError("transition rule: one coefficient per feature")
        for f in list(self.features) + [h for h, _ in self.held]:
            if f not in RULE_FEATURES:
                raise EnergyCalculusError(f"transition rule: unknown feature {f!r}; known: "
                                          f"{', '.join(RULE_FEATURES)}")
        for what, v in ([("coefficient", c) for c in self.coef_s]
                        + [("power", w) for _, w in self.power_w]
                        + [("default power", self.default_power_w)]):
            if not math.isfinite(float(v)) or float(v) < 0:
                raise EnergyCalculusError(f"transition rule: {what} must be finite and >= 0, got {v!r}")
        object.__setattr__(self, "power_w", tuple((_dev(w), float(x)) for w, x in self.power_w))

    def describe(self) -> str:
        """One line: the rule and its residual."""
        terms = " + ".join(f"{c:.4g}" + ("" if f == "intercept" else f"·{f}")
                           for f, c in zip(self.features, self.coef_s))
        held = "".join(f", {f} = {v:g} only" for f, v in self.held)
        return (f"τ = {terms or '0'} s (NNLS over {self.n_pairs} measured pairs, RMS residual "
                f"{self.rms_residual_s * 1e3:.3g} ms, max {self.max_abs_residual_s * 1e3:.3g} ms"
                f"{held}); ε = ready power × τ")

    def time_s(self, frm: OperatingPoint, to: OperatingPoint) -> float:
        """τ of ``frm`` → ``to``; :class:`TransitionRuleError` when the rule does not cover it."""
        a, b = _dev(frm), _dev(to)
        x = _features(a, b)
        if isinstance(x, str):
            raise TransitionRuleError(f"transition {a.label()} -> {b.label()}: not measured, and "
                                      f"the fitted rule cannot price it ({x})")
        val = dict(zip(RULE_FEATURES, x))
        for f, v in self.held:
            if val[f] != v:
                raise TransitionRuleError(
                    f"transition {a.label()} -> {b.label()}: not measured, and the fitted rule "
                    f"cannot price it: every measured pair has {f} = {v:g}, this one {val[f]:g} "
                    f"(measure pairs that vary it, or measure this pair)")
        return max(0.0, float(sum(c * val[f] for f, c in zip(self.features, self.coef_s))))

    def cost(self, frm: OperatingPoint, to: OperatingPoint) -> Cost:
        """(τ, ε) of ``frm`` → ``to`` by the rule."""
        t = self.time_s(frm, to)
        return (t, dict(self.power_w).get(_dev(to), self.default_power_w) * t)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``kind: "nnls-linear/1"``)."""
        return {"kind": "nnls-linear/1",
                "coef_s": {f: c for f, c in zip(self.features, self.coef_s)},
                "held": {f: v for f, v in self.held},
                "power_w": [{"omega": w.to_dict(), "power_w": x} for w, x in self.power_w],
                "default_power_w": self.default_power_w, "n_pairs": self.n_pairs,
                "rms_residual_s": self.rms_residual_s,
                "max_abs_residual_s": self.max_abs_residual_s}


def fit_transition_rule(pairs: Mapping[tuple[OperatingPoint, OperatingPoint], tuple[float, float]],
                        power_w: Mapping[OperatingPoint, float] | None = None) -> FittedRule | None:
    """The rule (see the module docstring) fitted to measured ``pairs`` ((from, to) → (τ, ε));
    ``power_w``: ready power per ω_dev (default: ε/τ of the pairs into it). None when no pair
    has features (none measured, or every one has a knob set on one side only)."""
    rows, ys = [], []
    for (a, b), c in pairs.items():
        a, b = _dev(a), _dev(b)
        x = _features(a, b)
        if a == b or isinstance(x, str):
            continue
        rows.append(x)
        ys.append(_cost(c, f"transition {a.label()} -> {b.label()}")[0])
    if not rows:
        return None
    X, y = np.array(rows), np.array(ys)
    cols, held = [0], []
    for k in range(1, len(RULE_FEATURES)):
        vals = np.unique(X[:, k])
        if len(vals) >= 2:
            cols.append(k)
        else:
            held.append((RULE_FEATURES[k], float(vals[0])))
    from scipy.optimize import nnls

    coef, _ = nnls(X[:, cols], y)
    res = X[:, cols] @ coef - y
    if power_w is None:
        got: dict[OperatingPoint, list[float]] = {}
        for (_, b), c in pairs.items():
            t, e = _cost(c, "transition")
            if t > 0:
                got.setdefault(_dev(b), []).append(e / t)
        pw = {w: float(np.median(v)) for w, v in got.items()}
    else:
        pw = {_dev(w): float(v) for w, v in power_w.items()}
    return FittedRule(tuple(RULE_FEATURES[k] for k in cols), tuple(float(c) for c in coef),
                      tuple(held), tuple(sorted(pw.items())), max(pw.values(), default=0.0),
                      len(rows), float(np.sqrt(np.mean(res**2))), float(np.max(np.abs(res))))


def _rule_from_dict(d: Any, file: str) -> FittedRule:
    if not isinstance(d, Mapping) or d.get("kind") != "nnls-linear/1":
        raise FormatError(file, "rule", "must be an object with kind 'nnls-linear/1'")

    def num(v: Any, path: str) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise FormatError(file, path, f"must be a finite number >= 0, got {v!r}")
        return float(v)

    coef, held = d.get("coef_s"), d.get("held", {})
    if not isinstance(coef, Mapping) or not isinstance(held, Mapping):
        raise FormatError(file, "rule.coef_s", "coef_s and held must be objects keyed by feature")
    pws = d.get("power_w", [])
    if not isinstance(pws, list):
        raise FormatError(file, "rule.power_w", "must be a list")
    power = []
    for i, e in enumerate(pws):
        if not isinstance(e, Mapping) or not isinstance(e.get("omega"), Mapping):
            raise FormatError(file, f"rule.power_w[{i}]", "must be an object with omega and power_w")
        try:
            w = OperatingPoint.from_dict(dict(e["omega"])).dev
        except ValueError as exc:
            raise FormatError(file, f"rule.power_w[{i}].omega", str(exc)) from None
        power.append((w, num(e.get("power_w"), f"rule.power_w[{i}].power_w")))
    n = d.get("n_pairs", 0)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise FormatError(file, "rule.n_pairs", f"must be an integer >= 0, got {n!r}")
    try:
        return FittedRule(tuple(coef), tuple(num(v, f"rule.coef_s.{k}") for k, v in coef.items()),
                          tuple((k, num(v, f"rule.held.{k}")) for k, v in held.items()),
                          tuple(power), num(d.get("default_power_w", 0.0), "rule.default_power_w"),
                          n, num(d.get("rms_residual_s", 0.0), "rule.rms_residual_s"),
                          num(d.get("max_abs_residual_s", 0.0), "rule.max_abs_residual_s"))
    except EnergyCalculusError as exc:
        raise FormatError(file, "rule", str(exc)) from None


def _cost(v: Any, what: str) -> Cost:
    try:
        t, e = (float(x) for x in v)
    except (TypeError, ValueError):
        raise EnergyCalculusError(f"{what}: cost must be a (time_s, energy_j) pair, got {v!r}") from None
    if not (math.isfinite(t) and math.isfinite(e)) or t < 0 or e < 0:
        raise EnergyCalculusError(f"{what}: cost must be finite and >= 0, got (time_s={t}, energy_j={e})")
    return (t, e)


def _dev(w: OperatingPoint | Mapping[str, Any] | None) -> OperatingPoint:
    if w is None:
        return OperatingPoint()
    if not isinstance(w, OperatingPoint):
        w = OperatingPoint.from_dict(dict(w))
    return w.dev


@dataclass(frozen=True)
class TransitionTable:
    """Per-device cost of switching ω_dev.

    Parameters
    ----------
    pairs : ((from ω_dev, to ω_dev), (time_s, energy_j)) entries; looked up first.
    knobs : (knob, (time_s, energy_j)) entries: the cost of changing that knob; several changed
        knobs add. Knobs not listed cost ``constant`` (or nothing if it is ``None``).
    constant : (time_s, energy_j) for any change no pair, knob rule or fitted rule prices.
    device : which device the table describes (informational).
    source : where the numbers come from ("measured ...", "assumed ...").
    rule : a :class:`FittedRule` for pairs not measured (after pairs and knobs).
    on_unpriced : a change nothing prices: ``"error"`` raises :class:`TransitionRuleError`,
        ``"free"`` costs (0, 0), ``"auto"`` (default) raises when the table holds pairs or a
        rule and is free when it is empty (:meth:`zero`).

    >>> tt = TransitionTable.constant(0.01, 0.5)
    >>> a, b = OperatingPoint(sm_clock_mhz=1980), OperatingPoint(sm_clock_mhz=1410)
    >>> tt.cost(a, b), tt.cost(a, a)
    ((0.01, 0.5), (0.0, 0.0))
    >>> round(tt.element(a, b, "gpu0", s_w=120.0).energy_j, 6)   # max(0.5, 120 W x 10 ms)
    1.2
    """

    pairs: tuple[tuple[tuple[OperatingPoint, OperatingPoint], Cost], ...] = ()
    knobs: tuple[tuple[str, Cost], ...] = ()
    constant_cost: Cost | None = None
    device: str | None = None
    source: str = "given"
    rule: FittedRule | None = None
    on_unpriced: str = "auto"
    _lookup: dict | None = field(init=False, repr=False, compare=False, hash=False, default=None)

    def __post_init__(self) -> None:
        pairs_in = self.pairs.items() if isinstance(self.pairs, Mapping) else self.pairs
        lookup: dict[tuple[OperatingPoint, OperatingPoint], Cost] = {}
        for entry in pairs_in:
            (frm, to), c = entry
            frm, to = _dev(frm), _dev(to)
            c = _cost(c, f"transition {frm.label()} -> {to.label()}")
            lookup[(frm, to)] = c
        pairs = tuple(sorted(lookup.items(), key=lambda kv: (kv[0][0], kv[0][1])))
        knobs_in = self.knobs.items() if isinstance(self.knobs, Mapping) else self.knobs
        knobs = {}
        for k, c in knobs_in:
            if k not in DEV_KNOBS:
                raise EnergyCalculusError(
                    f"transition knob {k!r} is not a device knob; known: {', '.join(DEV_KNOBS)}")
            knobs[k] = _cost(c, f"transition knob {k}")
        const = None if self.constant_cost is None else _cost(self.constant_cost, "transition constant")
        if self.rule is not None and not isinstance(self.rule, FittedRule):
            raise EnergyCalculusError(f"transition rule must be a FittedRule, got {self.rule!r}")
        if self.on_unpriced not in ON_UNPRICED:
            raise EnergyCalculusError(f"on_unpriced must be one of {ON_UNPRICED}, got {self.on_unpriced!r}")
        object.__setattr__(self, "pairs", pairs)
        object.__setattr__(self, "knobs", tuple(sorted(knobs.items())))
        object.__setattr__(self, "constant_cost", const)
        object.__setattr__(self, "_lookup", lookup)

    # -- constructors ---------------------------------------------------------------------------
    @classmethod
    def zero(cls) -> TransitionTable:
        """Switching is free (then composing with transitions equals composing without)."""
        return cls(source="zero: switching assumed free")

    @classmethod
    def constant(cls, time_s: float, energy_j: float = 0.0, device: str | None = None,
                 source: str = "given constant") -> TransitionTable:
        """Every change of ω_dev costs (time_s, energy_j)."""
        return cls(constant_cost=(time_s, energy_j), device=device, source=source)

    @classmethod
    def per_knob(cls, device: str | None = None, source: str = "given per knob",
                 **knob_costs: tuple[float, float]) -> TransitionTable:
        """Cost per changed knob, e.g. ``per_knob(sm_clock_mhz=(0.01, 0), power_limit_w=(0.1, 0))``;
        several changed knobs add; an unlisted knob changes for free."""
        return cls(knobs=tuple(knob_costs.items()), device=device, source=source)

    @classmethod
    def from_pairs(cls, pairs: Mapping[tuple[OperatingPoint, OperatingPoint], tuple[float, float]],
                   default: tuple[float, float] | None = None, device: str | None = None,
                   source: str = "measured pairs", rule: FittedRule | None = None) -> TransitionTable:
        """Explicit (from, to) → (time_s, energy_j); ``rule`` then ``default`` price any other
        change; a change neither prices raises :class:`TransitionRuleError`."""
        return cls(pairs=tuple(pairs.items()), constant_cost=default, device=device, source=source,
                   rule=rule, on_unpriced="error")

    @classmethod
    def fitted(cls, pairs: Mapping[tuple[OperatingPoint, OperatingPoint], tuple[float, float]],
               power_w: Mapping[OperatingPoint, float] | None = None, device: str | None = None,
               source: str = "measured pairs") -> TransitionTable:
        """Measured pairs as measured, any other change by :func:`fit_transition_rule` fitted to
        them (``power_w``: ready power per ω_dev); what the rule cannot price raises."""
        return cls.from_pairs(pairs, device=device, source=source,
                              rule=fit_transition_rule(pairs, power_w))

    @classmethod
    def assumed_default(cls, device: str | None = None) -> TransitionTable:
        """10 ms per changed device knob, no energy beyond static power during the stall.

        An **assumption** (see the module docstring): measure the settle time of your device."""
        c = (ASSUMED_SWITCH_TIME_S, 0.0)
        return cls(knobs=tuple((k, c) for k in DEV_KNOBS), device=device,
                   source="assumed: 10 ms per changed knob (order of NVML clock-lock settle "
                          "latency, arXiv 2502.20075), no energy beyond static power")

    # -- queries --------------------------------------------------------------------------------
    def cost(self, frm: OperatingPoint | None, to: OperatingPoint | None) -> Cost:
        """(time_s, energy_j) of switching ω_dev from ``frm`` to ``to`` (only ω_dev matters;
        ``None`` as the source means "unknown / free start" and costs nothing)."""
        if frm is None or to is None:
            return (0.0, 0.0)
        a, b = _dev(frm), _dev(to)
        if a == b:
            return (0.0, 0.0)
        c = self._lookup.get((a, b)) if self._lookup is not None else None
        if c is not None:
            return c
        if self.knobs:
            rule = dict(self.knobs)
            t = e = 0.0
            fallback = False
            for k in DEV_KNOBS:
                if getattr(a, k) != getattr(b, k):
                    if k in rule:
                        t += rule[k][0]
                        e += rule[k][1]
                    else:
                        fallback = True
            if fallback and self.constant_cost is not None:
                t += self.constant_cost[0]
                e += self.constant_cost[1]
            return (t, e)
        why = "no rule"
        if self.rule is not None:
            try:
                return self.rule.cost(a, b)
            except TransitionRuleError as exc:
                why = str(exc)
        if self.constant_cost is not None:
            return self.constant_cost
        strict = self.on_unpriced == "error" or (
            self.on_unpriced == "auto" and (self._lookup or self.rule is not None))
        if strict:
            if self.rule is not None:
                raise TransitionRuleError(f"{why} (table: {self.source})")
            raise TransitionRuleError(
                f"transition {a.label()} -> {b.label()}: not measured, and the table "
                f"({self.source}) has no rule or default for other pairs; measure it, or build "
                f"the table with TransitionTable.fitted / a default")
        return (0.0, 0.0)

    def element(self, frm: OperatingPoint, to: OperatingPoint, device: str | Iterable[str],
                s_w: float) -> Signature:
        """The transition element e_{ω→ω'} on ``device`` at static power ``s_w``:
        T = time, d = max(energy − s·T, 0) (so E = max(energy, s·T)); compose it with ⊗."""
        t, e = self.cost(frm, to)
        a, b = _dev(frm), _dev(to)
        devs = frozenset([device]) if isinstance(device, str) else frozenset(device)
        dname = ",".join(sorted(devs))
        return Signature(
            name=f"switch[{dname}] {a.label()}->{b.label()}", s_w=s_w, time_s=t,
            d_j=max(e - float(s_w) * t, 0.0), devices=devs, omega=b,
            meta={"source": "transition", "from": a.to_dict(), "to": b.to_dict(),
                  "table_source": self.source},
        )

    # -- files ----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: ``ecal.transitions/1``, or ``ecal.transitions/2`` when the table has
        a fitted ``rule`` or a non-default ``on_unpriced`` (both kept)."""
        c = self.constant_cost
        v2 = self.rule is not None or self.on_unpriced != "auto"
        out = {
            "format": format_tag("transitions", 2 if v2 else 1),
            "device": self.device,
            "source": self.source,
            "constant": None if c is None else {"time_s": c[0], "energy_j": c[1]},
            "knobs": {k: {"time_s": v[0], "energy_j": v[1]} for k, v in self.knobs},
            "pairs": [{"from": a.to_dict(), "to": b.to_dict(), "time_s": v[0], "energy_j": v[1]}
                      for (a, b), v in self.pairs],
        }
        if v2:
            out["on_unpriced"] = self.on_unpriced
            out["rule"] = None if self.rule is None else self.rule.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: Any, file: str = "<dict>") -> TransitionTable:
        """Inverse of :meth:`to_dict`; errors name ``file`` and the path inside it."""
        from .format_models import TransitionsFile

        version, body = content(file, d, "transitions", required=False)
        m = validate(TransitionsFile, body, file)
        # costs, knobs, pairs and the rule are declared in the model; their values (finite,
        # >= 0, real device knobs) are checked here, in the wording users know

        def cost_at(v: Any, path: str) -> Cost:
            if not isinstance(v, Mapping):
                raise FormatError(file, path, "must be an object with time_s and energy_j")
            out = []
            for k in ("time_s", "energy_j"):
                x = v.get(k, 0.0 if k == "energy_j" else None)
                if isinstance(x, bool) or not isinstance(x, (int, float)):
                    raise FormatError(file, f"{path}.{k}", f"must be a number, got {x!r}")
                if not math.isfinite(x) or x < 0:
                    raise FormatError(file, f"{path}.{k}", f"must be finite and >= 0, got {x!r}")
                out.append(float(x))
            return (out[0], out[1])

        def omega_at(v: Any, path: str) -> OperatingPoint:
            if not isinstance(v, Mapping):
                raise FormatError(file, path, "must be an object of device knobs")
            try:
                return OperatingPoint.from_dict(dict(v)).dev
            except ValueError as e:
                raise FormatError(file, path, str(e)) from None

        const_c = None if m.constant is None else cost_at(m.constant, "constant")
        knobs = []
        for k, v in m.knobs.items():
            if k not in DEV_KNOBS:
                raise FormatError(file, f"knobs.{k}", f"not a device knob (known: {', '.join(DEV_KNOBS)})")
            knobs.append((k, cost_at(v, f"knobs.{k}")))
        pairs = []
        for i, p in enumerate(m.pairs):
            path = f"pairs[{i}]"
            if not isinstance(p, Mapping):
                raise FormatError(file, path, "must be an object with from, to, time_s, energy_j")
            pairs.append(((omega_at(p.get("from"), f"{path}.from"), omega_at(p.get("to"), f"{path}.to")),
                          cost_at(p, path)))
        rule, on = None, "auto"
        if version == 2:
            rule = None if m.rule is None else _rule_from_dict(m.rule, file)
            on = m.on_unpriced
            if on not in ON_UNPRICED:
                raise FormatError(file, "on_unpriced", f"must be one of {ON_UNPRICED}, got {on!r}")
        device, source = m.device, m.source
        return cls(pairs=tuple(pairs), knobs=tuple(knobs), constant_cost=const_c, device=device,
                   source=source, rule=rule, on_unpriced=on)


__all__ = ["TransitionTable", "FittedRule", "TransitionRuleError", "fit_transition_rule",
           "DEV_KNOBS", "ASSUMED_SWITCH_TIME_S", "RULE_FEATURES"]
