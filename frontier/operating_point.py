"""Operating points ω = (ω_dev, ω_elem): the knobs an element runs under (spec §2.4)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import total_ordering
from typing import Any

from .errors import InputError


def _key(v: float | int | None) -> tuple[int, float]:
    # None ("device default") sorts before any explicit value.
    return (0, 0.0) if v is None else (1, float(v))


@total_ordering
@dataclass(frozen=True)
class OperatingPoint:
    """Where an element runs.

    Device-wide knobs (ω_dev, shared by everything on the device at the same time):
    ``sm_clock_mhz``, ``mem_clock_mhz``, ``power_limit_w``. Per-element knob (ω_elem):
    ``sm_count`` (SMs allocated to the element). ``None`` means "the device default / not set".

    Hashable and totally ordered, so it can key dicts and sort tables.

    >>> OperatingPoint(sm_clock_mhz=1410, sm_count=105).dev
    OperatingPoint(sm_clock_mhz=1410.0, mem_clock_mhz=None, power_limit_w=None, sm_count=None)
    """

    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    power_limit_w: float | None = None
    sm_count: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            try:
                fv = float(v)
            except (TypeError, ValueError):
                raise InputError(f"OperatingPoint.{f.name} must be a number, got {v!r}") from None
            if not math.isfinite(fv) or fv <= 0:
                raise InputError(f"OperatingPoint.{f.name} must be finite and > 0, got {v!r}")
            if f.name == "sm_count":
                if fv != int(fv):
                    raise InputError(f"OperatingPoint.sm_count must be an integer, got {v!r}")
                object.__setattr__(self, f.name, int(fv))
            else:
                object.__setattr__(self, f.name, fv)

    def _sort_key(self) -> tuple:
        return tuple(_key(getattr(self, f.name)) for f in fields(self))

    def __lt__(self, other: OperatingPoint) -> bool:
        if not isinstance(other, OperatingPoint):
            return NotImplemented
        return self._sort_key() < other._sort_key()

    @property
    def dev(self) -> OperatingPoint:
        """The device-wide part ω_dev (``sm_count`` dropped)."""
        if self.sm_count is None:
            return self              # already device-wide (immutable): no new object per call
        return OperatingPoint(self.sm_clock_mhz, self.mem_clock_mhz, self.power_limit_w)

    def with_(self, **changes: Any) -> OperatingPoint:
        """A copy with some knobs changed."""
        d = self.to_dict()
        d.update(changes)
        return OperatingPoint(**d)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the set knobs (JSON-ready)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> OperatingPoint:
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError`` naming them."""
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise InputError(f"unknown operating-point knob(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**d)

    def label(self) -> str:
        """Short human label such as ``1410MHz/105SM``."""
        parts = []
        if self.sm_clock_mhz is not None:
            parts.append(f"{self.sm_clock_mhz:g}MHz")
        if self.mem_clock_mhz is not None:
            parts.append(f"mem{self.mem_clock_mhz:g}")
        if self.power_limit_w is not None:
            parts.append(f"{self.power_limit_w:g}W")
        if self.sm_count is not None:
            parts.append(f"{self.sm_count}SM")
        return "/".join(parts) or "default"
