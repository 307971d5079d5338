"""A strict fake of ``pynvml`` for tests without a GPU.

``make_fake_pynvml()`` returns a module-like object whose ``nvml*`` functions are real Python
functions with pynvml's parameter names (a wrong call signature raises ``TypeError``, and a
test checks the names against the installed nvidia-ml-py), real NVML constants and
``NVMLError`` classes (``NVMLError(NVML_ERROR_NO_PERMISSION)`` constructs
``NVMLError_NoPermission``, like the real one), a fake clock, an energy counter that advances
only every 100 ms of that clock, and settable failures per call.

Use it by injection: ``NVMLDevice(nvml=fake, clock=fake.time, sleep=fake.sleep)``.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

try:  # real constants and error classes when nvidia-ml-py is installed
    import pynvml as _real
except ImportError:  # pragma: no cover - nvidia-ml-py is a declared dependency
    _real = None


def _error_classes() -> dict[str, Any]:
    if _real is not None:
        return {k: getattr(_real, k) for k in dir(_real) if k.startswith("NVMLError")}

    class NVMLError(Exception):  # minimal stand-in with the same shape
        def __init__(self, value: int):
            self.value = value

        def __str__(self) -> str:
            return f"NVML error {self.value}"

    return {"NVMLError": NVMLError}


def _constants() -> dict[str, Any]:
    if _real is not None:
        return {k: getattr(_real, k) for k in dir(_real)
                if (k.startswith("NVML_") or k.startswith("nvmlClocks")) and isinstance(getattr(_real, k), int)}
    return {"NVML_ERROR_NO_PERMISSION": 4, "NVML_ERROR_NOT_SUPPORTED": 3, "NVML_ERROR_INVALID_ARGUMENT": 2,
            "NVML_ERROR_UNINITIALIZED": 1, "NVML_CLOCK_SM": 1, "NVML_CLOCK_MEM": 2, "NVML_TEMPERATURE_GPU": 0,
            "NVML_DEVICE_ARCH_HOPPER": 9}


@dataclass
class FakeGPU:
    """State behind the fake: an H200-like card on a controllable clock."""

    name: str = "NVIDIA H200"
    mem_clocks: tuple[int, ...] = (3201, 2201)
    sm_clocks: tuple[int, ...] = tuple(range(1980, 344, -15))
    limit_range_mw: tuple[int, int] = (200_000, 700_000)
    limit_mw: int = 700_000
    default_limit_mw: int = 700_000
    cores: int = 132 * 128
    arch: int = 9
    idle_power_w: float = 123.0
    temperature_c: int = 35
    event_reasons: int = 0x1
    tick_s: float = 0.1
    energy_read_cost_s: float = 0.004
    t: float = 0.0
    energy_true_j: float = 5000.0
    counter_mj: int = 5_000_000
    next_tick: float = 0.1
    locked_sm: tuple[int, int] | None = None
    locked_mem: tuple[int, int] | None = None
    initialized: int = 0
    fail: dict[str, int] = field(default_factory=dict)   # call name -> NVML error code
    calls: list[tuple[str, tuple]] = field(default_factory=list)

    def advance(self, dt: float, power_w: float | None = None) -> None:
        """Move the fake clock by dt at power_w (idle power by default); ticks the counter."""
        p = self.idle_power_w if power_w is None else power_w
        end = self.t + dt
        while self.next_tick <= end:
            self.counter_mj = int((self.energy_true_j + p * (self.next_tick - self.t)) * 1000)
            self.next_tick += self.tick_s
        self.energy_true_j += p * dt
        self.t = end

    @property
    def setter_calls(self) -> list[tuple[str, tuple]]:
        """Calls that change device settings."""
        return [c for c in self.calls if c[0].startswith("nvmlDeviceSet") or c[0].startswith("nvmlDeviceReset")]


def make_fake_pynvml(gpu: FakeGPU | None = None) -> types.SimpleNamespace:
    """A fresh fake pynvml module over ``gpu`` (a new :class:`FakeGPU` by default)."""
    g = gpu or FakeGPU()
    errors = _error_classes()
    NVMLError = errors["NVMLError"]
    consts = _constants()
    handle = object()

    def _enter(name: str, *args: Any) -> None:
        g.calls.append((name, args))
        if name in g.fail:
            raise NVMLError(g.fail[name])
        if name not in ("nvmlInit", "nvmlInitWithFlags") and g.initialized <= 0:
            raise NVMLError(consts.get("NVML_ERROR_UNINITIALIZED", 1))

    def _check_handle(h: Any) -> None:
        if h is not handle:
            raise NVMLError(consts.get("NVML_ERROR_INVALID_ARGUMENT", 2))

    def nvmlInit():
        _enter("nvmlInit")
        g.initialized += 1

    def nvmlShutdown():
        _enter("nvmlShutdown")
        g.initialized -= 1

    def nvmlDeviceGetCount():
        _enter("nvmlDeviceGetCount")
        return 1

    def nvmlDeviceGetHandleByIndex(index):
        _enter("nvmlDeviceGetHandleByIndex", index)
        if index != 0:
            raise NVMLError(consts.get("NVML_ERROR_INVALID_ARGUMENT", 2))
        return handle

    def nvmlDeviceGetName(handle):
        _enter("nvmlDeviceGetName", handle)
        _check_handle(handle)
        return g.name

    def nvmlDeviceGetTotalEnergyConsumption(handle):
        _enter("nvmlDeviceGetTotalEnergyConsumption", handle)
        _check_handle(handle)
        g.advance(g.energy_read_cost_s)
        return g.counter_mj

    def nvmlDeviceGetSupportedMemoryClocks(handle):
        _enter("nvmlDeviceGetSupportedMemoryClocks", handle)
        _check_handle(handle)
        return list(g.mem_clocks)

    def nvmlDeviceGetSupportedGraphicsClocks(handle, memoryClockMHz):
        _enter("nvmlDeviceGetSupportedGraphicsClocks", handle, memoryClockMHz)
        _check_handle(handle)
        if memoryClockMHz not in g.mem_clocks:
            raise NVMLError(consts.get("NVML_ERROR_NOT_FOUND", 6))
        return list(g.sm_clocks)

    def nvmlDeviceSetGpuLockedClocks(handle, minGpuClockMHz, maxGpuClockMHz):
        _enter("nvmlDeviceSetGpuLockedClocks", handle, minGpuClockMHz, maxGpuClockMHz)
        _check_handle(handle)
        g.locked_sm = (minGpuClockMHz, maxGpuClockMHz)

    def nvmlDeviceResetGpuLockedClocks(handle):
        _enter("nvmlDeviceResetGpuLockedClocks", handle)
        _check_handle(handle)
        g.locked_sm = None

    def nvmlDeviceSetMemoryLockedClocks(handle, minMemClockMHz, maxMemClockMHz):
        _enter("nvmlDeviceSetMemoryLockedClocks", handle, minMemClockMHz, maxMemClockMHz)
        _check_handle(handle)
        g.locked_mem = (minMemClockMHz, maxMemClockMHz)

    def nvmlDeviceResetMemoryLockedClocks(handle):
        _enter("nvmlDeviceResetMemoryLockedClocks", handle)
        _check_handle(handle)
        g.locked_mem = None

    def nvmlDeviceSetPowerManagementLimit(handle, limit):
        _enter("nvmlDeviceSetPowerManagementLimit", handle, limit)
        _check_handle(handle)
        if not g.limit_range_mw[0] <= limit <= g.limit_range_mw[1]:
            raise NVMLError(consts.get("NVML_ERROR_INVALID_ARGUMENT", 2))
        g.limit_mw = int(limit)

    def nvmlDeviceGetPowerManagementLimit(handle):
        _enter("nvmlDeviceGetPowerManagementLimit", handle)
        _check_handle(handle)
        return g.limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(handle):
        _enter("nvmlDeviceGetPowerManagementDefaultLimit", handle)
        _check_handle(handle)
        return g.default_limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(handle):
        _enter("nvmlDeviceGetPowerManagementLimitConstraints", handle)
        _check_handle(handle)
        return list(g.limit_range_mw)

    def nvmlDeviceGetTemperature(handle, sensor):
        _enter("nvmlDeviceGetTemperature", handle, sensor)
        _check_handle(handle)
        return g.temperature_c

    def nvmlDeviceGetClockInfo(handle, type):  # noqa: A002 - pynvml's parameter name
        _enter("nvmlDeviceGetClockInfo", handle, type)
        _check_handle(handle)
        if type == consts.get("NVML_CLOCK_MEM", 2):
            return g.locked_mem[1] if g.locked_mem else g.mem_clocks[0]
        return g.locked_sm[1] if g.locked_sm else g.sm_clocks[0]

    def nvmlDeviceGetCurrentClocksEventReasons(handle):
        _enter("nvmlDeviceGetCurrentClocksEventReasons", handle)
        _check_handle(handle)
        return g.event_reasons

    def nvmlDeviceGetNumGpuCores(device):
        _enter("nvmlDeviceGetNumGpuCores", device)
        _check_handle(device)
        return g.cores

    def nvmlDeviceGetArchitecture(device):
        _enter("nvmlDeviceGetArchitecture", device)
        _check_handle(device)
        return g.arch

    funcs = {f.__name__: f for f in [
        nvmlInit, nvmlShutdown, nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex, nvmlDeviceGetName,
        nvmlDeviceGetTotalEnergyConsumption, nvmlDeviceGetSupportedMemoryClocks,
        nvmlDeviceGetSupportedGraphicsClocks, nvmlDeviceSetGpuLockedClocks, nvmlDeviceResetGpuLockedClocks,
        nvmlDeviceSetMemoryLockedClocks, nvmlDeviceResetMemoryLockedClocks,
        nvmlDeviceSetPowerManagementLimit, nvmlDeviceGetPowerManagementLimit,
        nvmlDeviceGetPowerManagementDefaultLimit, nvmlDeviceGetPowerManagementLimitConstraints,
        nvmlDeviceGetTemperature, nvmlDeviceGetClockInfo, nvmlDeviceGetCurrentClocksEventReasons,
        nvmlDeviceGetNumGpuCores, nvmlDeviceGetArchitecture,
    ]}
    mod = types.SimpleNamespace(**consts, **errors, **funcs)
    mod.gpu = g
    mod.time = lambda: g.t
    mod.sleep = lambda dt: g.advance(dt)
    mod.busy = lambda dt, power_w: g.advance(dt, power_w)
    mod.FUNCTIONS = tuple(funcs)
    return mod
