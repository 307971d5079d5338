"""A real NVIDIA GPU through NVML (``pynvml`` from the nvidia-ml-py package).

* energy: ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since driver load; advances ~every 100 ms);
* SM clock lock ``nvmlDeviceSetGpuLockedClocks``, memory clock lock
  ``nvmlDeviceSetMemoryLockedClocks``, power limit ``nvmlDeviceSetPowerManagementLimit`` (mW):
  each validated against the supported values first, applied atomically (rolled back if a later
  one fails), and undone by :meth:`NVMLDevice.restore`;
* a missing permission raises :class:`PermissionDeniedError` naming the NVML call, the NVML
  error and what to do;
* ``read_only=True`` never changes a device setting (a sweep may then vary only the SM
  allocation, through green contexts, and implementations); setters refuse clearly.

The pynvml module is injectable (``nvml=``) so tests run against a strict fake.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from frontier.operating_point import OperatingPoint

from .device import (
    Device,
    DeviceError,
    OperatingSet,
    PermissionDeniedError,
    ReadOnlyError,
    UnsupportedSettingError,
)

WHAT_TO_DO = ("Changing clocks or power limits needs root: run as root (sudo) or in a container "
              "with CAP_SYS_ADMIN, keep the driver loaded with persistence mode (`sudo nvidia-smi "
              "-pm 1`), or use `sudo nvidia-smi -lgc/-lmc/-pl` yourself; otherwise open the device "
              "read-only (--read-only) to sweep only the SM allocation and implementations.")

#: Bit → name of NVML clock-event (throttle) reasons (values from nvml.h).
EVENT_REASONS = {
    0x1: "GpuIdle", 0x2: "ApplicationsClocksSetting", 0x4: "SwPowerCap", 0x8: "HwSlowdown",
    0x10: "SyncBoost", 0x20: "SwThermalSlowdown", 0x40: "HwThermalSlowdown",
    0x80: "HwPowerBrakeSlowdown", 0x100: "DisplayClockSetting",
}

# CUDA cores per SM by NVML architecture id (no NVML call returns the SM count).
_CORES_PER_SM = {5: 64, 6: 64, 7: 128, 8: 128, 9: 128, 10: 128}


def _load_pynvml() -> Any:
    try:
        import pynvml
    except ImportError:
        raise DeviceError("pynvml is not installed: `pip install nvidia-ml-py` (not the deprecated "
                          "`pynvml` package)") from None
    return pynvml


class NVMLDevice(Device):
    """GPU ``index`` via NVML. ``clock``/``sleep``/``synchronize`` are injectable for tests;
    ``synchronize`` defaults to ``torch.cuda.synchronize`` when torch is importable."""

    simulated = False

    def __init__(self, index: int = 0, read_only: bool = False, nvml: Any = None,
                 sm_count: int | None = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 synchronize: Callable[[], None] | None = None):
        self.nvml = nvml if nvml is not None else _load_pynvml()
        self.index = int(index)
        self.read_only = bool(read_only)
        self._clock, self._sleep = clock, sleep
        self._sync = synchronize
        self._call("nvmlInit")
        try:
            self.handle = self._call("nvmlDeviceGetHandleByIndex", self.index)
        except DeviceError:
            self._call("nvmlShutdown")
            raise
        name = self._call("nvmlDeviceGetName", self.handle)
        self.name = f"{name.decode() if isinstance(name, bytes) else name} (nvml:{self.index})"
        self._opset: OperatingSet | None = None
        self._sm_count_override = sm_count
        self._original_limit_mw = self._call("nvmlDeviceGetPowerManagementLimit", self.handle)
        self._locked_sm: float | None = None
        self._locked_mem: float | None = None
        self._limit_changed = False
        self._sm_alloc: int | None = None

    # -- NVML calls with typed errors ---------------------------------------------------------
    def _call(self, fn: str, *args: Any) -> Any:
        nv = self.nvml
        try:
            return getattr(nv, fn)(*args)
        except nv.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == getattr(nv, "NVML_ERROR_NO_PERMISSION", 4):
                raise PermissionDeniedError(fn, f"{type(exc).__name__}: {exc}", WHAT_TO_DO) from None
            if code == getattr(nv, "NVML_ERROR_NOT_SUPPORTED", 3):
                raise UnsupportedSettingError(f"{fn} is not supported on this GPU ({exc})") from None
            if code in (getattr(nv, "NVML_ERROR_LIBRARY_NOT_FOUND", 12),
                        getattr(nv, "NVML_ERROR_DRIVER_NOT_LOADED", 9)):
                raise DeviceError(f"{fn} failed: {exc} — no usable NVIDIA driver here "
                                  "(use the simulated device: --device sim)") from None
            raise DeviceError(f"{fn} failed: {type(exc).__name__}: {exc}") from None

    # -- reads ---------------------------------------------------------------------------------
    def energy_j(self) -> float:
        """Total-energy counter, J (NVML reports mJ)."""
        return self._call("nvmlDeviceGetTotalEnergyConsumption", self.handle) / 1000.0

    def time_s(self) -> float:
        """Real monotonic time, s."""
        return float(self._clock())

    def idle(self, duration_s: float) -> None:
        """Sleep (the GPU stays ready with the context alive)."""
        self._sleep(float(duration_s))

    def temperature_c(self) -> float:
        """GPU temperature, °C."""
        return float(self._call("nvmlDeviceGetTemperature", self.handle,
                                getattr(self.nvml, "NVML_TEMPERATURE_GPU", 0)))

    def clocks_mhz(self) -> dict[str, float]:
        """Current SM and memory clocks, MHz."""
        nv = self.nvml
        return {"sm": float(self._call("nvmlDeviceGetClockInfo", self.handle, getattr(nv, "NVML_CLOCK_SM", 1))),
                "mem": float(self._call("nvmlDeviceGetClockInfo", self.handle, getattr(nv, "NVML_CLOCK_MEM", 2)))}

    def throttle_reasons(self) -> tuple[str, ...]:
        """Active clock-event reasons by name."""
        # Older bindings/drivers only have the deprecated "throttle reasons" name.
        fn = ("nvmlDeviceGetCurrentClocksEventReasons"
              if hasattr(self.nvml, "nvmlDeviceGetCurrentClocksEventReasons")
              else "nvmlDeviceGetCurrentClocksThrottleReasons")
        mask = int(self._call(fn, self.handle))
        return tuple(n for bit, n in EVENT_REASONS.items() if mask & bit)

    def _sm_total(self) -> int:
        if self._sm_count_override:
            return int(self._sm_count_override)
        try:
            import torch  # optional

            if torch.cuda.is_available():
                return int(torch.cuda.get_device_properties(self.index).multi_processor_count)
        except ImportError:
            pass
        cores = int(self._call("nvmlDeviceGetNumGpuCores", self.handle))
        try:
            arch = int(self._call("nvmlDeviceGetArchitecture", self.handle))
        except DeviceError:
            arch = 9
        per = _CORES_PER_SM.get(arch, 128)
        name = self.name.upper()
        if arch == 7 and ("A100" in name or "A30" in name):
            per = 64    # GA100 has 64 FP32 cores per SM; GA10x has 128
        return max(1, cores // per)

    def operating_set(self) -> OperatingSet:
        """Supported memory clocks and SM clocks per memory clock, power-limit range, SM count."""
        if self._opset is None:
            mems = self._call("nvmlDeviceGetSupportedMemoryClocks", self.handle)
            clocks = {float(m): tuple(float(c) for c in
                                      self._call("nvmlDeviceGetSupportedGraphicsClocks", self.handle, m))
                      for m in mems}
            lo, hi = self._call("nvmlDeviceGetPowerManagementLimitConstraints", self.handle)
            try:
                default_w = self._call("nvmlDeviceGetPowerManagementDefaultLimit", self.handle) / 1000.0
            except DeviceError:
                default_w = self._original_limit_mw / 1000.0
            arch_gran = 8 if self._arch() >= 9 else 1
            self._opset = OperatingSet(sm_clocks_mhz=clocks, power_limit_range_w=(lo / 1000.0, hi / 1000.0),
                                       sm_count=self._sm_total(), sm_granularity=arch_gran,
                                       default=OperatingPoint(power_limit_w=default_w))
        return self._opset

    def _arch(self) -> int:
        try:
            return int(self._call("nvmlDeviceGetArchitecture", self.handle))
        except DeviceError:
            return 0

    def get_operating_point(self) -> OperatingPoint:
        """Locked clocks (None when not locked by us), the current power limit, SM allocation."""
        limit_w = self._call("nvmlDeviceGetPowerManagementLimit", self.handle) / 1000.0
        return OperatingPoint(self._locked_sm, self._locked_mem, limit_w, self._sm_alloc)

    # -- setters -------------------------------------------------------------------------------
    def set_operating_point(self, op: OperatingPoint) -> None:
        """Apply ``op``'s power limit, memory-clock lock and SM-clock lock (None = leave as is)
        after validating all of them; on a failure, undo what this call already changed."""
        if self.read_only and op.dev != OperatingPoint():
            raise ReadOnlyError(
                f"{self.name} was opened read-only: refusing to set {op.dev.label()} (no clock or "
                "power-limit call is made on a read-only device; sweep sm_count and implementations only)")
        self.operating_set().validate(op)
        undo: list[Callable[[], None]] = []
        h = self.handle
        try:
            if op.power_limit_w is not None:
                before = self._call("nvmlDeviceGetPowerManagementLimit", h)
                self._call("nvmlDeviceSetPowerManagementLimit", h, int(round(op.power_limit_w * 1000)))
                self._limit_changed = True
                undo.append(lambda: self._call("nvmlDeviceSetPowerManagementLimit", h, before))
            if op.mem_clock_mhz is not None:
                prev = self._locked_mem
                m = int(op.mem_clock_mhz)
                self._call("nvmlDeviceSetMemoryLockedClocks", h, m, m)
                self._locked_mem = op.mem_clock_mhz
                undo.append(lambda: self._relock_mem(prev))
            if op.sm_clock_mhz is not None:
                prev_sm = self._locked_sm
                f = int(op.sm_clock_mhz)
                self._call("nvmlDeviceSetGpuLockedClocks", h, f, f)
                self._locked_sm = op.sm_clock_mhz
                undo.append(lambda: self._relock_sm(prev_sm))
        except DeviceError:
            for u in reversed(undo):
                try:
                    u()
                except DeviceError:
                    pass
            raise
        self._sm_alloc = op.sm_count

    def _relock_mem(self, prev: float | None) -> None:
        if prev is None:
            self._call("nvmlDeviceResetMemoryLockedClocks", self.handle)
        else:
            self._call("nvmlDeviceSetMemoryLockedClocks", self.handle, int(prev), int(prev))
        self._locked_mem = prev

    def _relock_sm(self, prev: float | None) -> None:
        if prev is None:
            self._call("nvmlDeviceResetGpuLockedClocks", self.handle)
        else:
            self._call("nvmlDeviceSetGpuLockedClocks", self.handle, int(prev), int(prev))
        self._locked_sm = prev

    def restore(self) -> None:
        """Undo what this object changed: reset clock locks, put back the original power limit.
        Tries every step and raises the first failure after trying them all."""
        errors: list[DeviceError] = []
        steps: list[Callable[[], None]] = []
        if self._locked_sm is not None:
            steps.append(lambda: self._relock_sm(None))
        if self._locked_mem is not None:
            steps.append(lambda: self._relock_mem(None))
        if self._limit_changed:
            steps.append(lambda: self._call("nvmlDeviceSetPowerManagementLimit", self.handle,
                                            self._original_limit_mw))
        for s in steps:
            try:
                s()
            except DeviceError as exc:
                errors.append(exc)
        if not errors:
            self._limit_changed = False
        self._sm_alloc = None
        if errors:
            raise errors[0]

    # -- work ----------------------------------------------------------------------------------
    def _synchronize(self) -> None:
        if self._sync is not None:
            self._sync()
            return
        try:
            import torch  # optional
        except ImportError:
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize(self.index)

    def run(self, work: Any, n: int = 1, sm_count: int | None = None) -> None:
        """Call ``work()`` n times (on ``sm_count`` SMs via a green context when given, else the
        allocation in force), then synchronize."""
        if not callable(work):
            raise TypeError(f"work for {self.name} must be callable, got {type(work).__name__}")
        alloc = sm_count if sm_count is not None else self._sm_alloc
        if alloc is not None and alloc < self.operating_set().sm_count:
            from .sm_alloc import run_on_sms

            run_on_sms(work, int(n), int(alloc), device_index=self.index)
        else:
            for _ in range(int(n)):
                work()
        self._synchronize()

    def describe(self) -> dict[str, Any]:
        """Metadata: the GPU name, not simulated."""
        return {"device": self.name, "simulated": False, "read_only": self.read_only}

    def close(self) -> None:
        """``nvmlShutdown`` (call :meth:`restore` first)."""
        self._call("nvmlShutdown")
