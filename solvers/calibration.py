"""Measured offsets between a workload's predictions and its runs (``ecal tune``, issue 29).

The algebra predicts a plan's makespan and energy from its elements measured alone, in the
null context. A run on the device measures what the plan really takes; the difference is
what the prediction leaves out (switch settle times, the power of bubbles, the thermal entry
context of each task: docs/loop.md). A :class:`Calibration` holds that difference as
measured on one run of one plan of the workload: for the step (makespan, energy) and for each
device (finish time, energy), each with its σ (the measurement's standard error).

A plan made with a calibration (:func:`solvers.confidence.solve_at_confidence`'s
``calibration``) keeps its deadline on the calibrated makespan:

    T + b_T + z_P·sqrt(σ_T² + σ_b²) ≤ D

and records it in ``meta["calibration"]``, so that ``ecal run`` predicts model + offset with
both σ and judges that with Eq. 23: a calibration measured on one plan is checked on the next
one, which is held-out data for it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from frontier.formats import validate


@dataclass(frozen=True)
class Offset:
    """Measured minus predicted for one device or the step: time (s) and energy (J), each
    with the σ of its measurement."""

    time_s: float = 0.0
    sd_time_s: float = 0.0
    energy_j: float = 0.0
    sd_energy_j: float = 0.0

    def to_dict(self) -> dict[str, float]:
        """``{"time_s", "sd_time_s", "energy_j", "sd_energy_j"}``."""
        return {"time_s": self.time_s, "sd_time_s": self.sd_time_s,
                "energy_j": self.energy_j, "sd_energy_j": self.sd_energy_j}


@dataclass(frozen=True)
class Calibration:
    """Offsets measured on a run (see the module docstring): ``step`` for the makespan and
    the step's energy, ``devices`` per plan device; ``runs``: how many runs it comes from.

    >>> c = Calibration(Offset(0.008, 0.001, -20.0, 2.0))
    >>> round(c.step.time_s * 1e3, 3), Calibration.from_dict(c.to_dict()) == c
    (8.0, True)
    """

    step: Offset = Offset()
    devices: Mapping[str, Offset] = field(default_factory=dict)
    runs: int = 0

    @property
    def is_null(self) -> bool:
        """No offset (no run measured yet)."""
        return self.runs == 0

    def device(self, name: str) -> Offset:
        """The offset of device ``name`` (zero when it was not measured)."""
        return self.devices.get(name, Offset())

    def to_dict(self) -> dict[str, Any]:
        """The plan's ``meta["calibration"]``."""
        return {"step": self.step.to_dict(),
                "devices": {d: o.to_dict() for d, o in self.devices.items()}, "runs": self.runs}

    @classmethod
    def from_dict(cls, d: Any, file: str = "<plan>", path: str = "meta.calibration") -> Calibration:
        """Inverse of :meth:`to_dict` (shape: :class:`solvers.format_models.CalibrationModel`);
        a fault is one :class:`~frontier.errors.FormatError` naming ``file`` and the field."""
        from .format_models import CalibrationModel

        m = validate(CalibrationModel, d, file, path)
        return cls(Offset(**m.step.model_dump()),
                   {k: Offset(**o.model_dump()) for k, o in m.devices.items()}, m.runs)


def plan_calibration(plan: Any) -> Calibration:
    """The calibration a plan was made with (``meta["calibration"]``), else the null one."""
    meta = getattr(plan, "meta", None)
    c = meta.get("calibration") if isinstance(meta, Mapping) else None
    return Calibration() if c is None else Calibration.from_dict(c)


def combined_sd(*sds: float) -> float:
    """σ of a sum of independent terms."""
    return math.sqrt(sum(s * s for s in sds))


__all__ = ["Offset", "Calibration", "plan_calibration", "combined_sd"]
