"""Open devices and resolve work from command-line strings (``ecal characterize``)."""

from __future__ import annotations

import importlib
from typing import Any

from .device import Device, DeviceError


def open_device(spec: str = "sim", read_only: bool = False, seed: int = 0, nvml: Any = None) -> Device:
    """``"sim"`` / ``"sim:h200"`` → a simulated H200; ``"nvml:INDEX"`` → a real GPU via NVML
    (``nvml``: an injected pynvml-like module, for tests)."""
    kind, _, arg = spec.strip().lower().partition(":")
    if kind == "sim":
        if arg not in ("", "h200"):
            raise DeviceError(f"unknown simulated device {spec!r}; known: sim, sim:h200")
        from .sim import SimulatedGPU

        return SimulatedGPU(seed=seed, read_only=read_only)
    if kind == "nvml":
        try:
            index = int(arg or "0")
        except ValueError:
            raise DeviceError(f"device {spec!r}: expected nvml:INDEX with an integer index") from None
        from .nvml import NVMLDevice

        return NVMLDevice(index=index, read_only=read_only, nvml=nvml)
    raise DeviceError(f"unknown device {spec!r}; use sim, sim:h200 or nvml:INDEX")


def resolve_work(spec: str, device: Device | None = None) -> Any:
    """A simulated kernel preset by name (on the simulator), or ``module:function`` (a callable
    taking no arguments) for a real GPU."""
    if ":" in spec:
        mod, _, attr = spec.partition(":")
        try:
            obj = getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as exc:
            raise DeviceError(f"cannot load work {spec!r}: {exc}") from None
        if not callable(obj):
            raise DeviceError(f"work {spec!r} is not callable")
        return obj
    from .sim import PRESETS

    if spec in PRESETS:
        if device is not None and not device.simulated:
            raise DeviceError(f"{spec!r} is a simulated kernel; on a real GPU give module:function")
        return PRESETS[spec]
    raise DeviceError(f"unknown work {spec!r}: give a simulated preset ({', '.join(sorted(PRESETS))}) "
                      "or module:function")
