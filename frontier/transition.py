"""Transition elements e_{ω→ω'}: the cost of switching a device's ω_dev (spec §9.5).

Changing SM clock, memory clock or power limit between two consecutive elements on one device
is not free: the driver call takes time, the clocks settle, and the device draws its static
power meanwhile. A :class:`TransitionTable` gives, per device, the (time, energy) of each switch:

- explicit pairs (from ω_dev, to ω_dev) → (time_s, energy_j), e.g. measured with a settle-time
  probe (poll the clock until it reads the target, measurement-notes §4 step 1);
- otherwise a per-knob rule (what changing each knob costs; costs of several knobs add, as the
  driver calls are issued one after another);
- otherwise a constant cost for any change;
- zero when ω_dev is unchanged (the solver can always choose *not* to switch).

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

from .errors import EnergyCalculusError, FormatError
from .operating_point import OperatingPoint
from .signature import Signature

#: Knobs of ω_dev a per-knob rule can price (``sm_count`` is per element, not a device switch).
DEV_KNOBS: tuple[str, ...] = ("sm_clock_mhz", "mem_clock_mhz", "power_limit_w")

#: Assumed per-knob switch latency, s (see the module docstring: an assumption, not measured).
ASSUMED_SWITCH_TIME_S = 0.010

Cost = tuple[float, float]


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
    constant : (time_s, energy_j) for any change no pair or knob rule prices.
    device : which device the table describes (informational).
    source : where the numbers come from ("measured ...", "assumed ...").

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
    _lookup: dict = field(init=False, repr=False, compare=False, hash=False, default=None)

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
                   source: str = "measured pairs") -> TransitionTable:
        """Explicit (from, to) → (time_s, energy_j); ``default`` prices any other change."""
        return cls(pairs=tuple(pairs.items()), constant_cost=default, device=device, source=source)

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
        c = self._lookup.get((a, b))
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
        return self.constant_cost if self.constant_cost is not None else (0.0, 0.0)

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
        """JSON-ready dict (``energy-calculus/transitions`` v1)."""
        c = self.constant_cost
        return {
            "format": "energy-calculus/transitions",
            "version": 1,
            "device": self.device,
            "source": self.source,
            "constant": None if c is None else {"time_s": c[0], "energy_j": c[1]},
            "knobs": {k: {"time_s": v[0], "energy_j": v[1]} for k, v in self.knobs},
            "pairs": [{"from": a.to_dict(), "to": b.to_dict(), "time_s": v[0], "energy_j": v[1]}
                      for (a, b), v in self.pairs],
        }

    @classmethod
    def from_dict(cls, d: Any, file: str = "<dict>") -> TransitionTable:
        """Inverse of :meth:`to_dict`; errors name ``file`` and the path inside it."""
        if not isinstance(d, Mapping):
            raise FormatError(file, "$", f"must be an object (a transition table), got {type(d).__name__}")
        fmt = d.get("format", "energy-calculus/transitions")
        if fmt != "energy-calculus/transitions":
            raise FormatError(file, "format", f"expected 'energy-calculus/transitions', got {fmt!r}")
        if d.get("version", 1) != 1:
            raise FormatError(file, "version", f"unsupported version {d.get('version')!r}")

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

        const = d.get("constant")
        const_c = None if const is None else cost_at(const, "constant")
        knobs_raw = d.get("knobs") or {}
        if not isinstance(knobs_raw, Mapping):
            raise FormatError(file, "knobs", "must be an object keyed by knob name")
        knobs = []
        for k, v in knobs_raw.items():
            if k not in DEV_KNOBS:
                raise FormatError(file, f"knobs.{k}", f"not a device knob (known: {', '.join(DEV_KNOBS)})")
            knobs.append((k, cost_at(v, f"knobs.{k}")))
        pairs_raw = d.get("pairs") or []
        if not isinstance(pairs_raw, list):
            raise FormatError(file, "pairs", "must be a list")
        pairs = []
        for i, p in enumerate(pairs_raw):
            path = f"pairs[{i}]"
            if not isinstance(p, Mapping):
                raise FormatError(file, path, "must be an object with from, to, time_s, energy_j")
            pairs.append(((omega_at(p.get("from"), f"{path}.from"), omega_at(p.get("to"), f"{path}.to")),
                          cost_at(p, path)))
        device = d.get("device")
        if device is not None and not isinstance(device, str):
            raise FormatError(file, "device", f"must be a string or null, got {device!r}")
        source = d.get("source", "given")
        if not isinstance(source, str):
            raise FormatError(file, "source", f"must be a string, got {source!r}")
        return cls(pairs=tuple(pairs), knobs=tuple(knobs), constant_cost=const_c, device=device,
                   source=source)


__all__ = ["TransitionTable", "DEV_KNOBS", "ASSUMED_SWITCH_TIME_S"]
