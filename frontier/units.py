"""How quantities are printed: one unit per column or table, σ at the value's precision.

A table mixing ``3424 mJ`` and ``3.4 J`` or printing ``0.2853 ± 3.7e-07`` is hard to read; every
human-readable table of this project picks its unit once for all its rows (:func:`time_unit`,
:func:`energy_unit`) and writes ``value ± σ`` with :func:`pm`.

>>> time_unit([0.0012, 0.0450])
(1000.0, 'ms')
>>> pm(0.2853e-3, 3.7e-10, 1e3)
'0.2853 ± <0.0001'
>>> pm(1.7e-3, 7.6e-6, 1e3)
'1.700 ± 0.008'
"""

from __future__ import annotations

import math
from collections.abc import Iterable

#: (threshold, scale, unit): the first whose threshold exceeds the largest |value| is used.
_TIME_UNITS = ((1e-3, 1e6, "us"), (1.0, 1e3, "ms"), (float("inf"), 1.0, "s"))
_ENERGY_UNITS = ((1e-3, 1e6, "uJ"), (10.0, 1e3, "mJ"), (1e4, 1.0, "J"), (float("inf"), 1e-3, "kJ"))


def _unit(values: Iterable[float], table: tuple[tuple[float, float, str], ...]) -> tuple[float, str]:
    finite = [abs(v) for v in values if math.isfinite(v)]
    top = max(finite, default=0.0)
    for threshold, scale, unit in table:
        if top < threshold:
            return scale, unit
    return table[-1][1], table[-1][2]  # pragma: no cover - the last threshold is inf


def time_unit(values_s: Iterable[float]) -> tuple[float, str]:
    """(scale, unit) for times in seconds, chosen by the largest: us below 1 ms, ms below 1 s."""
    return _unit(values_s, _TIME_UNITS)


def energy_unit(values_j: Iterable[float]) -> tuple[float, str]:
    """(scale, unit) for energies in joules, chosen by the largest: mJ below 10 J, J below 10 kJ."""
    return _unit(values_j, _ENERGY_UNITS)


def decimals_for(value: float, digits: int = 4) -> int:
    """Decimals that show ``value`` with ``digits`` significant digits (0 for large values)."""
    if value == 0 or not math.isfinite(value):
        return 0
    return max(0, digits - 1 - int(math.floor(math.log10(abs(value)))))


def pm(value: float, sd: float | None, scale: float = 1.0, digits: int = 4) -> str:
    """``value ± σ`` scaled by ``scale``: the value with ``digits`` significant digits, σ with
    the same decimals (``± <0.0001`` when σ is below the value's last digit); no σ part when
    ``sd`` is None or 0."""
    v = value * scale
    if not math.isfinite(v):
        return f"{v:g}"
    dec = decimals_for(v, digits)
    text = f"{v:.{dec}f}"
    if sd is None or sd <= 0 or not math.isfinite(sd):
        return text
    s = sd * scale
    step = 10.0 ** -dec
    if s < 0.5 * step:
        return f"{text} ± <{step:.{dec}f}"
    return f"{text} ± {s:.{dec}f}"
