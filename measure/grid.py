"""Operating-point grids: ``sm_clock_mhz=1980:1200:-60,power_limit_w=700,500`` and friends.

A grid is the cartesian product of per-knob value lists. It is validated against a device's
:class:`~measure.device.OperatingSet` *before* anything on the device changes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from frontier.operating_point import OperatingPoint

from .device import OperatingSet, ReadOnlyError, UnsupportedSettingError

#: Knobs a grid may vary, in the order points are generated (outermost first). The SM clock is
#: innermost so an early stop along falling clocks skips the rest of one clock scan only.
KNOBS = ("power_limit_w", "mem_clock_mhz", "sm_count", "sm_clock_mhz")
DEVICE_KNOBS = ("sm_clock_mhz", "mem_clock_mhz", "power_limit_w")


class GridError(UnsupportedSettingError):
    """A grid string or mapping is malformed (names the token and what is expected)."""


@dataclass(frozen=True)
class Grid:
    """Per-knob values; points are their cartesian product (knobs not given stay as they are)."""

    axes: Mapping[str, tuple[float, ...]]

    def __post_init__(self) -> None:
        axes = {}
        for k, vs in dict(self.axes).items():
            if k not in KNOBS:
                raise GridError(f"unknown knob {k!r} in grid; known: {', '.join(KNOBS)}")
            vals = tuple(dict.fromkeys(float(v) for v in vs))   # keep order, drop repeats
            if not vals:
                raise GridError(f"knob {k!r} has no values")
            if any(not v > 0 for v in vals):
                raise GridError(f"knob {k!r} has a value <= 0: {vals}")
            if k == "sm_count" and any(v != int(v) for v in vals):
                raise GridError(f"sm_count values must be integers: {vals}")
            axes[k] = vals
        object.__setattr__(self, "axes", MappingProxyType(axes))

    @classmethod
    def parse(cls, text: str) -> Grid:
        """Parse ``knob=v1,v2,...`` and ``knob=start:stop:step`` (inclusive) clauses, separated
        by commas; a bare value continues the previous knob. Empty text → the current point."""
        axes: dict[str, list[float]] = {}
        knob: str | None = None
        for raw in (t.strip() for t in text.split(",")):
            if not raw:
                continue
            if "=" in raw:
                knob, _, raw = (x.strip() for x in raw.partition("="))
                if knob not in KNOBS:
                    raise GridError(f"unknown knob {knob!r} in grid {text!r}; known: {', '.join(KNOBS)}")
                if knob in axes:
                    raise GridError(f"knob {knob!r} given twice in grid {text!r}")
                axes[knob] = []
            if knob is None:
                raise GridError(f"grid {text!r}: value {raw!r} comes before any 'knob='")
            axes[knob].extend(_values(raw, knob, text))
        return cls({k: tuple(v) for k, v in axes.items()})

    def points(self) -> list[OperatingPoint]:
        """All operating points (SM clock varying fastest, in the order given)."""
        keys = [k for k in KNOBS if k in self.axes]
        if not keys:
            return [OperatingPoint()]
        return [OperatingPoint(**dict(zip(keys, combo)))
                for combo in itertools.product(*(self.axes[k] for k in keys))]

    def __len__(self) -> int:
        n = 1
        for v in self.axes.values():
            n *= len(v)
        return n

    @property
    def changes_device(self) -> bool:
        """Whether any point needs a device-wide setting (clock or power limit) changed."""
        return any(k in self.axes for k in DEVICE_KNOBS)

    def validate(self, opset: OperatingSet, read_only: bool = False) -> None:
        """Check every point against ``opset`` (and the read-only guard) before any change."""
        if read_only and self.changes_device:
            bad = [k for k in DEVICE_KNOBS if k in self.axes]
            raise ReadOnlyError(f"the device is read-only but the grid varies {', '.join(bad)}; "
                                "a read-only sweep may vary only sm_count (and implementations)")
        for p in self.points():
            opset.validate(p)

    def granted(self, grant: Callable[[int], int]) -> tuple[Grid, dict[int, int]]:
        """This grid with each ``sm_count`` replaced by what the hardware grants for it
        (``grant``: requested → granted, e.g. :meth:`OperatingSet.granted_sm_count`), repeats
        dropped, and the map requested → granted of the counts that changed (empty when the
        grid already asks only for granted counts)."""
        asked = self.axes.get("sm_count")
        if not asked:
            return self, {}
        got = {int(v): int(grant(int(v))) for v in asked}
        changed = {r: g for r, g in got.items() if r != g}
        if not changed:
            return self, {}
        axes = dict(self.axes)
        axes["sm_count"] = tuple(float(got[int(v)]) for v in asked)
        return Grid(axes), changed

    def to_dict(self) -> dict[str, list[float]]:
        """JSON-ready axes."""
        return {k: list(v) for k, v in self.axes.items()}

    def label(self) -> str:
        """The grid as a string :meth:`parse` accepts."""
        return ",".join(f"{k}=" + ",".join(f"{v:g}" for v in vs) for k, vs in self.axes.items())


#: Most values one ``start:stop:step`` range may list (a GPU supports a few hundred clocks).
MAX_RANGE_VALUES = 10_000


def _values(token: str, knob: str, text: str) -> list[float]:
    if ":" in token:
        parts = token.split(":")
        if len(parts) != 3:
            raise GridError(f"grid {text!r}: range {token!r} for {knob} must be start:stop:step")
        try:
            start, stop, step = (float(p) for p in parts)
        except ValueError:
            raise GridError(f"grid {text!r}: range {token!r} for {knob} has a non-number") from None
        if step == 0 or (stop - start) * step < 0:
            raise GridError(f"grid {text!r}: range {token!r} for {knob}: step {step:g} never reaches {stop:g}")
        if not all(math.isfinite(x) for x in (start, stop, step)):
            raise GridError(f"grid {text!r}: range {token!r} for {knob} must be finite")
        if (stop - start) / step > MAX_RANGE_VALUES:
            # counted before listing: 1:1e12:1 would otherwise allocate a trillion values
            raise GridError(f"grid {text!r}: range {token!r} for {knob} lists more than "
                            f"{MAX_RANGE_VALUES:,} values")
        n = int(round((stop - start) / step + 1e-9))
        vals = [start + i * step for i in range(n + 1) if (start + i * step - stop) * step <= 1e-9]
        return vals
    try:
        return [float(token)]
    except ValueError:
        raise GridError(f"grid {text!r}: value {token!r} for {knob} is not a number") from None


#: Default subsampling of a device's own ranges (see :func:`default_grid` for why).
DEFAULT_SM_CLOCKS = 12
DEFAULT_SM_CLOCK_FLOOR = 0.5
DEFAULT_CAP_FRACTION = 0.4
DEFAULT_SM_COUNTS = 9


def default_grid(opset: OperatingSet, read_only: bool = False) -> Grid:
    """The grid ``ecal characterize`` measures when none is given, from the device's own
    supported clocks and power-limit range (any NVIDIA GPU, no ``--grid`` needed).

    * **SM clocks**: :data:`DEFAULT_SM_CLOCKS` (12) clocks evenly spaced from the highest
      supported SM clock (at the highest memory clock) down to half of it, each snapped to the
      nearest supported clock. Below about half the top clock, static energy dominates and a
      kernel only gets slower *and* costlier (Perseus and Zeus find the energy frontier in the
      upper half of the range); 12 points resolve the frontier's knee at roughly 4 % of the top
      clock per step while keeping a sweep to minutes.
    * **Power limits**: the device's default limit and one :data:`DEFAULT_CAP_FRACTION` (40 %)
      of the way from it down to the minimum, rounded to 10 W. A cap acts only on work that
      draws power near it (the firmware then lowers the clock by itself), so one capped plane
      shows whether capping matters for this element; more planes multiply the device time.
    * The memory clock is left as it is (one plane: the highest).
    * **Read-only** (no device setting may change): SM allocations from all SMs down in
      :data:`DEFAULT_SM_COUNTS` (9) steps that are multiples of the SM-partition granularity,
      each a count the hardware grants (:meth:`OperatingSet.granted_sm_count`: a request is
      rounded up to the granularity, so a grid of requests would record counts never run).

    On the simulated H200 (SM clocks 345–1980 MHz, 200–700 W) this is
    ``sm_clock_mhz=1980:990:-90,power_limit_w=700,500`` (and ``sm_count=132,120:8:-16``
    read-only: all 132 SMs, then multiples of 8).
    """
    if read_only:
        gran = max(1, opset.sm_granularity)
        step = max(gran, int(round(opset.sm_count / (DEFAULT_SM_COUNTS - 1) / gran)) * gran)
        wanted = [c for c in range(opset.sm_count, 0, -step)][:DEFAULT_SM_COUNTS]
        counts = dict.fromkeys(opset.granted_sm_count(c) for c in wanted)   # as granted
        return Grid({"sm_count": tuple(counts)})
    supported = opset.supported_sm_clocks()
    axes: dict[str, tuple[float, ...]] = {}
    if supported:
        top = max(supported)
        n = DEFAULT_SM_CLOCKS
        targets = [top - i * (top * (1 - DEFAULT_SM_CLOCK_FLOOR)) / (n - 1) for i in range(n)]
        picked = [min(supported, key=lambda c, t=t: (abs(c - t), -c)) for t in targets]
        axes["sm_clock_mhz"] = tuple(sorted(set(picked), reverse=True))
    lo, hi = opset.power_limit_range_w
    if hi > 0:
        default = opset.default.power_limit_w or hi
        default = min(max(default, lo), hi)
        capped = round((default - DEFAULT_CAP_FRACTION * (default - lo)) / 10.0) * 10.0
        capped = min(max(capped, lo), hi)
        axes["power_limit_w"] = tuple(dict.fromkeys((default, capped)))
    return Grid(axes)


def parse_grid(spec: str | Grid | Mapping[str, Sequence[float]] | None) -> Grid:
    """A :class:`Grid` from a string, a mapping knob → values, a Grid, or None (current point)."""
    if spec is None:
        return Grid({})
    if isinstance(spec, Grid):
        return spec
    if isinstance(spec, str):
        return Grid.parse(spec)
    if isinstance(spec, Mapping):
        return Grid({k: tuple(v) if isinstance(v, Sequence) and not isinstance(v, str) else (v,)
                     for k, v in spec.items()})
    raise GridError(f"cannot make a grid from {type(spec).__name__}")
