"""Ready power drifts: re-measure it during long sweeps, carry the spread as σ_s, flag a drift.

Ready (static) power s is what every signature subtracts (d = E − s·T), and what ⊕ and Eq. 23
count once for several elements; it is calibrated once per ω_dev before a sweep's first point
there. It is not constant: a real H200 read 119.6 W, then 127.6 W an hour later (issue 30,
docs/selftest.md), and an energy verdict on a co-run flipped with the value taken at another
time. So a sweep re-measures it (:class:`ReadyRecheck`):

* every ``every_s`` seconds of device time at one ω_dev (default :data:`RECHECK_EVERY_S`,
  10 minutes), before the next point there, and when a resumed sweep (or a campaign reusing
  another element's value) finds the value in force at least that old — a results file
  records when each value was read (``time_unix_s``; one that does not say counts as old);
  each point is measured against the latest value;
* at the end, each ω_dev whose readings differ gets σ_s = their sample standard
  deviation, written into its signatures as ``var_s_w2`` (σ²_s, propagated like σ_T and σ_d:
  :mod:`frontier.signature`), and a relative spread (max − min) / mean beyond ``tolerance``
  (default :data:`DRIFT_TOLERANCE`, 2 %) is flagged: a warning, and ``flagged`` in the
  sweep's ``meta["ready_drift"]``.

On the simulator a re-measurement returns the first value exactly (a calibration depends on
the seed and ω_dev alone), so there is no drift to carry or report, and a resumed sweep still
equals an uninterrupted one.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from frontier.errors import InputError

log = logging.getLogger(__name__)

#: Default seconds of device time between two ready-power readings at one ω_dev.
RECHECK_EVERY_S = 600.0
#: Default relative spread of the readings beyond which the drift is flagged.
DRIFT_TOLERANCE = 0.02


@dataclass(frozen=True)
class ReadyRecheck:
    """How a sweep re-measures ready power: every ``every_s`` seconds of device time at an
    ω_dev (None: never; the first calibration is then the only reading), flagging a spread of
    the readings beyond ``tolerance`` (relative)."""

    every_s: float | None = RECHECK_EVERY_S
    tolerance: float = DRIFT_TOLERANCE

    def __post_init__(self) -> None:
        if self.every_s is not None and not self.every_s > 0:
            raise InputError(f"ready-power recheck interval must be > 0 s, got {self.every_s!r}")
        if not (self.tolerance >= 0 and math.isfinite(self.tolerance)):
            raise InputError(f"ready-power drift tolerance must be >= 0, got {self.tolerance!r}")


@dataclass(frozen=True)
class ReadyDrift:
    """The ready-power readings at one ω_dev and what they say."""

    label: str
    readings_w: tuple[float, ...]
    tolerance: float

    @property
    def mean_w(self) -> float:
        """Mean of the readings, W."""
        return statistics.fmean(self.readings_w)

    @property
    def sigma_s_w(self) -> float:
        """σ_s: the readings' sample standard deviation, W (0 with one reading)."""
        return statistics.stdev(self.readings_w) if len(self.readings_w) > 1 else 0.0

    @property
    def spread(self) -> float:
        """(max − min) / mean of the readings."""
        m = self.mean_w
        return (max(self.readings_w) - min(self.readings_w)) / m if m > 0 else 0.0

    @property
    def flagged(self) -> bool:
        """Whether the spread is beyond the tolerance."""
        return self.spread > self.tolerance

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: readings, mean, σ_s, spread, tolerance, flagged."""
        return {"readings_w": list(self.readings_w), "mean_w": self.mean_w,
                "sigma_s_w": self.sigma_s_w, "spread": self.spread, "tolerance": self.tolerance,
                "flagged": self.flagged}

    def message(self, where: str) -> str:
        """The warning for a flagged drift."""
        return (f"{where}: ready power at {self.label} drifted {self.spread:.1%} over "
                f"{len(self.readings_w)} readings ({min(self.readings_w):.1f}–"
                f"{max(self.readings_w):.1f} W), beyond the {self.tolerance:.0%} tolerance; carried "
                f"as σ_s = {self.sigma_s_w:.2f} W in its signatures (what ⊕ and Eq. 23 subtract is "
                "uncertain by σ_s·T)")


def drifts(history: Mapping[str, Sequence[float]], labels: Mapping[str, str],
           tolerance: float) -> dict[str, ReadyDrift]:
    """ω_dev key → :class:`ReadyDrift` for every key of ``history`` whose readings differ
    (``labels`` names each key for people). Readings that all agree carry nothing: σ_s = 0,
    and the simulator's (which repeat the first value exactly) leave its outputs as they were."""
    return {k: ReadyDrift(labels.get(k, k), tuple(float(w) for w in ws), tolerance)
            for k, ws in history.items() if len(set(ws)) > 1}
