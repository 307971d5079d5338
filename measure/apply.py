"""Applying a plan: set each element's operating point around its execution.

>>> from measure.sim import SimulatedGPU, preset
>>> from frontier.operating_point import OperatingPoint
>>> gpu = SimulatedGPU()
>>> plan = {"gemm": OperatingPoint(sm_clock_mhz=1500), "copy": OperatingPoint(sm_clock_mhz=1980)}
>>> with PlanApplier(gpu, plan) as ap:
...     with ap.element("gemm"):
...         gpu.run(preset("gemm_bf16_8192"), 100)
...     with ap.element("copy"):
...         gpu.run(preset("copy_2GiB"), 100)
>>> ap.transitions, gpu.get_operating_point() == gpu.operating_set().default
(2, True)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from frontier.operating_point import OperatingPoint

from .device import Device, restoring
from .protocol import measure_ready_power_w, wait_for_tick


@dataclass(frozen=True)
class ElementRun:
    """One execution of an element under the plan: time, energy (counter delta; ``None``
    unless per-element energy was asked for — it costs counter reads), whether ω switched."""

    name: str
    omega: OperatingPoint
    time_s: float
    energy_j: float | None
    switched: bool


class PlanApplier:
    """Apply ``omegas`` (element name → operating point) around each element's execution.

    Use as a context manager; inside, wrap each element's work in ``with applier.element(name)``.
    The device's operating point is changed only when the element's differs from the one in
    force (``transitions`` counts changes of ω_dev). The whole block is one tick-aligned
    energy window (``total_energy_j``, ``total_time_s``); the device is restored on exit.
    """

    def __init__(self, device: Device, omegas: Mapping[str, OperatingPoint],
                 ready_power_w: float | None = None, per_element_energy: bool = False):
        self.device = device
        self.omegas = dict(omegas)
        for name, op in self.omegas.items():
            device.operating_set().validate(op)   # reject a bad plan before any change
            if device.read_only and op.dev != OperatingPoint():
                from .device import ReadOnlyError

                raise ReadOnlyError(f"plan element {name!r} needs {op.dev.label()} but "
                                    f"{device.name} is read-only")
        self.ready_power_w = ready_power_w
        self.per_element_energy = per_element_energy
        self.runs: list[ElementRun] = []
        self.transitions = 0
        self.total_time_s: float | None = None
        self.total_energy_j: float | None = None
        self._current: OperatingPoint | None = None
        self._stack = contextlib.ExitStack()
        self._t0 = self._e0 = 0.0

    def __enter__(self) -> PlanApplier:
        self._stack.enter_context(restoring(self.device))
        if self.ready_power_w is None:
            self.ready_power_w = measure_ready_power_w(self.device)
        self._current = self.device.get_operating_point()
        self._t0, self._e0 = wait_for_tick(self.device)
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        try:
            if exc_type is None:
                t_end = self.device.time_s()
                # Back to the settings whose ready power was measured before waiting for the
                # closing tick: the tail is then charged at the right power.
                self.device.restore()
                t_b, e_b = wait_for_tick(self.device)
                self.total_time_s = t_end - self._t0
                self.total_energy_j = (e_b - self._e0) - (self.ready_power_w or 0.0) * (t_b - t_end)
        finally:
            self._stack.close()

    @contextlib.contextmanager
    def element(self, name: str) -> Iterator[ElementRun | None]:
        """Run the body under element ``name``'s operating point."""
        if name not in self.omegas:
            raise KeyError(f"element {name!r} is not in the plan; planned: {sorted(self.omegas)}")
        op = self.omegas[name]
        switched = False
        cur = self._current or OperatingPoint()
        want = OperatingPoint(
            op.sm_clock_mhz if op.sm_clock_mhz is not None else cur.sm_clock_mhz,
            op.mem_clock_mhz if op.mem_clock_mhz is not None else cur.mem_clock_mhz,
            op.power_limit_w if op.power_limit_w is not None else cur.power_limit_w,
            op.sm_count)
        if want != cur:
            self.device.set_operating_point(op)
            switched = want.dev != cur.dev
            self.transitions += int(switched)
            self._current = want
        e0 = self.device.energy_j() if self.per_element_energy else None
        t0 = self.device.time_s()
        yield None
        t1 = self.device.time_s()
        e1 = self.device.energy_j() if self.per_element_energy else None
        self.runs.append(ElementRun(name, op, t1 - t0, None if e0 is None else e1 - e0, switched))

    def per_element(self) -> dict[str, dict[str, float]]:
        """Totals per element name: executions, time_s, energy_j (when measured)."""
        out: dict[str, dict[str, float]] = {}
        for r in self.runs:
            d = out.setdefault(r.name, {"executions": 0, "time_s": 0.0, "energy_j": 0.0})
            d["executions"] += 1
            d["time_s"] += r.time_s
            if r.energy_j is not None:
                d["energy_j"] += r.energy_j
        return out
