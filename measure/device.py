"""The device interface every backend implements, its typed errors, and ``restoring()``.

Modelled on Zeus's GPU layer: a small interface, units in the names, typed errors. A device
exposes a cumulative energy counter (``energy_j``), its own monotonic clock (``time_s``: real
time for NVML, virtual time for the simulator), the operating points it supports
(:class:`OperatingSet`) and a way to run work on it (``run``).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from frontier.errors import EnergyCalculusError
from frontier.operating_point import OperatingPoint

log = logging.getLogger(__name__)


class DeviceError(EnergyCalculusError):
    """A device could not be opened, read or driven."""


class PermissionDeniedError(DeviceError):
    """A device call needs a privilege this process lacks.

    ``call`` is the driver call (e.g. ``nvmlDeviceSetGpuLockedClocks``), ``nvml_error`` the
    driver's error text, ``what_to_do`` how to get the permission.
    """

    def __init__(self, call: str, nvml_error: str, what_to_do: str):
        self.call, self.nvml_error, self.what_to_do = call, nvml_error, what_to_do
        super().__init__(f"{call} failed: {nvml_error}. {what_to_do}")


class UnsupportedSettingError(DeviceError, ValueError):
    """An operating point asks for a value the device does not support (names value and set)."""


class ReadOnlyError(DeviceError):
    """A setter was called on a device opened read-only."""


class FeatureUnavailableError(DeviceError):
    """An optional capability (e.g. green contexts for SM allocation) is not available here."""


@dataclass(frozen=True)
class OperatingSet:
    """What a device supports.

    ``sm_clocks_mhz`` maps each memory clock (MHz) to the SM clocks supported with it
    (descending). ``power_limit_range_w`` is (min, max) inclusive. ``sm_count`` is the number of
    SMs; ``sm_granularity`` the SM-partition step (8 on Hopper; a request is rounded up).
    ``default`` is the device's default operating point.
    """

    sm_clocks_mhz: Mapping[float, tuple[float, ...]]
    power_limit_range_w: tuple[float, float]
    sm_count: int
    sm_granularity: int = 1
    default: OperatingPoint = OperatingPoint()

    def __post_init__(self) -> None:
        clocks = {float(m): tuple(sorted((float(c) for c in cs), reverse=True))
                  for m, cs in dict(self.sm_clocks_mhz).items()}
        object.__setattr__(self, "sm_clocks_mhz", MappingProxyType(clocks))
        lo, hi = (float(x) for x in self.power_limit_range_w)
        object.__setattr__(self, "power_limit_range_w", (lo, hi))

    @property
    def mem_clocks_mhz(self) -> tuple[float, ...]:
        """Supported memory clocks, descending."""
        return tuple(sorted(self.sm_clocks_mhz, reverse=True))

    def supported_sm_clocks(self, mem_clock_mhz: float | None = None) -> tuple[float, ...]:
        """SM clocks supported with ``mem_clock_mhz`` (the highest memory clock when None)."""
        m = self.mem_clocks_mhz[0] if mem_clock_mhz is None else float(mem_clock_mhz)
        return self.sm_clocks_mhz.get(m, ())

    def granted_sm_count(self, requested: int) -> int:
        """SMs actually granted for a request: rounded up to the granularity, capped at all."""
        g = max(1, self.sm_granularity)
        return min(self.sm_count, -(-int(requested) // g) * g)

    def validate(self, op: OperatingPoint) -> None:
        """Raise :class:`UnsupportedSettingError` naming the value and the allowed set."""
        if op.mem_clock_mhz is not None and op.mem_clock_mhz not in self.sm_clocks_mhz:
            raise UnsupportedSettingError(
                f"memory clock {op.mem_clock_mhz:g} MHz is not supported; supported: "
                f"{[f'{m:g}' for m in self.mem_clocks_mhz]} MHz")
        if op.sm_clock_mhz is not None:
            allowed = self.supported_sm_clocks(op.mem_clock_mhz)
            if op.sm_clock_mhz not in allowed:
                raise UnsupportedSettingError(
                    f"SM clock {op.sm_clock_mhz:g} MHz is not supported with memory clock "
                    f"{(op.mem_clock_mhz or self.mem_clocks_mhz[0]):g} MHz; supported: "
                    f"{_clock_range(allowed)}")
        if op.power_limit_w is not None:
            lo, hi = self.power_limit_range_w
            if not lo <= op.power_limit_w <= hi:
                raise UnsupportedSettingError(
                    f"power limit {op.power_limit_w:g} W is outside the supported range "
                    f"[{lo:g}, {hi:g}] W")
        if op.sm_count is not None and op.sm_count > self.sm_count:
            raise UnsupportedSettingError(
                f"SM allocation {op.sm_count} exceeds the device's {self.sm_count} SMs "
                f"(allowed 1..{self.sm_count}, granted in steps of {self.sm_granularity})")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description."""
        return {"sm_clocks_mhz": {f"{m:g}": list(c) for m, c in self.sm_clocks_mhz.items()},
                "power_limit_range_w": list(self.power_limit_range_w), "sm_count": self.sm_count,
                "sm_granularity": self.sm_granularity, "default": self.default.to_dict()}


def _clock_range(clocks: tuple[float, ...]) -> str:
    if not clocks:
        return "none"
    if len(clocks) <= 8:
        return ", ".join(f"{c:g}" for c in clocks) + " MHz"
    steps = {round(a - b, 6) for a, b in zip(clocks, clocks[1:])}
    step = f" in steps of {steps.pop():g}" if len(steps) == 1 else ""
    return f"{clocks[-1]:g}..{clocks[0]:g} MHz{step} ({len(clocks)} values)"


@dataclass(frozen=True)
class Reading:
    """One snapshot of what the device reports (for per-window metadata)."""

    time_s: float
    sm_clock_mhz: float
    mem_clock_mhz: float
    temperature_c: float
    throttle_reasons: tuple[str, ...] = field(default=())


class Device(ABC):
    """A GPU (real, simulated or replayed) that can be measured and, unless read-only, driven.

    Setters validate against :meth:`operating_set` *before* changing anything. ``restore()``
    puts back the settings found when the device was opened.
    """

    name: str = "device"
    simulated: bool = False
    read_only: bool = False

    @abstractmethod
    def energy_j(self) -> float:
        """Cumulative energy counter, J (advances in ticks of ~100 ms)."""

    @abstractmethod
    def time_s(self) -> float:
        """Monotonic clock of this device, s (virtual on the simulator)."""

    @abstractmethod
    def operating_set(self) -> OperatingSet:
        """What this device supports."""

    @abstractmethod
    def get_operating_point(self) -> OperatingPoint:
        """The operating point currently in force (device-wide knobs + SM allocation)."""

    @abstractmethod
    def set_operating_point(self, op: OperatingPoint) -> None:
        """Apply ``op`` (None knobs mean "leave as is"). Validates first; atomic on error."""

    @abstractmethod
    def restore(self) -> None:
        """Put back the settings found when the device was opened."""

    @abstractmethod
    def temperature_c(self) -> float:
        """GPU temperature, °C."""

    @abstractmethod
    def clocks_mhz(self) -> dict[str, float]:
        """Current clocks: ``{"sm": ..., "mem": ...}`` in MHz."""

    @abstractmethod
    def throttle_reasons(self) -> tuple[str, ...]:
        """Names of the active clock-event (throttle) reasons, e.g. ``("SwPowerCap",)``."""

    @abstractmethod
    def run(self, work: Any, n: int = 1, sm_count: int | None = None) -> None:
        """Execute ``work`` ``n`` times back to back and synchronize. ``sm_count`` (optional)
        overrides the SM allocation in force for this call."""

    def run_parallel(self, streams: Sequence[Any]) -> None:
        """Run several streams of work at once (a co-run) and synchronize. A device that can
        overrides this (the simulator, :class:`~measure.nvml.NVMLDevice`); this one refuses
        with :class:`FeatureUnavailableError` (:func:`can_co_run` tells without trying)."""
        raise FeatureUnavailableError(f"{self.name}: cannot co-run (run_parallel); the simulated "
                                      "H200 and an NVML device with PyTorch can")

    @abstractmethod
    def idle(self, duration_s: float) -> None:
        """Wait ``duration_s`` with the device ready and not working (sleep / virtual time)."""

    def reading(self) -> Reading:
        """A snapshot of clocks, temperature and throttle reasons."""
        c = self.clocks_mhz()
        return Reading(self.time_s(), c.get("sm", 0.0), c.get("mem", 0.0), self.temperature_c(),
                       self.throttle_reasons())

    def run_and_read(self, work: Any, n: int = 1, sm_count: int | None = None) -> Reading:
        """Run ``work`` like :meth:`run` and return a :class:`Reading` taken *while it runs*
        (clocks and throttle reasons of an idle GPU say nothing about the work).

        This default reads after the run; backends override it to read mid-run (NVML: after
        the launches, before synchronizing; the simulator: between two halves of the run).
        """
        self.run(work, n, sm_count=sm_count)
        return self.reading()

    def seed_point(self, key: str) -> None:  # noqa: B027 - optional hook
        """Make the randomness of the next measured point a function of ``key`` (and the
        device's seed) alone, so an interrupted-and-resumed sweep equals an uninterrupted one.
        A no-op on real devices; the simulator reseeds."""

    def describe(self) -> dict[str, Any]:
        """Metadata for every output: ``device`` (name), ``simulated``, ``read_only``; backends
        add ``uuid`` and ``driver`` where they know them (results files record and check
        them)."""
        return {"device": self.name, "simulated": self.simulated, "read_only": self.read_only}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release driver resources. Backends that journal their changes (NVML) restore what is
        still changed first; others restore nothing (call :meth:`restore` first)."""


def can_co_run(device: Any) -> bool:
    """Whether ``device`` runs co-runs: it has a ``run_parallel`` of its own (not the
    :class:`Device` base class's refusal). Checked before work starts, so a plan or a joint
    characterization is refused at once rather than after its first measurements."""
    own = getattr(type(device), "run_parallel", None)
    return callable(own) and own is not Device.run_parallel


def _add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` (Python >= 3.11); on 3.10 the note is logged (an error) instead."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # pragma: no cover - Python 3.10
        log.error("%s", note)


def write_stderr_unlocked(line: str) -> None:
    """Write ``line`` and a newline to file descriptor 2 with ``os.write``, taking no lock.

    Only for the restore path that runs inside a signal handler or at interpreter exit. A
    Python signal handler runs between two bytecodes of whatever the main thread was doing,
    which may be inside ``logging`` (holding its module lock or a handler's lock: the state
    they guard is half updated) or inside ``sys.stderr``'s buffered write (a second write from
    the handler raises "reentrant call"); at interpreter exit the CLI's log handler is gone
    and logging may be shut down. ``os.write`` takes none of these locks. Everything else in
    the library logs through ``logging.getLogger(__name__)``. Never raises."""
    data = (line + "\n").encode("utf-8", errors="replace")
    try:
        while data:
            data = data[os.write(2, data):]
    except OSError:
        pass            # no stderr to say it on: the journal still says it


def _chain(prev: Any, signum: int, frame: Any) -> None:
    """Give a signal to the handler that was installed before ours."""
    if callable(prev):
        prev(signum, frame)
    elif prev == signal.SIG_IGN:
        return
    elif signum == getattr(signal, "SIGINT", None):
        raise KeyboardInterrupt
    else:   # SIG_DFL (or a handler not set from Python): die of the signal, as without us
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)


@contextlib.contextmanager
def restoring(device: Device, attempts: int = 3) -> Iterator[Device]:
    """Restore ``device``'s original settings on normal exit, exception, SIGINT, SIGTERM,
    SIGHUP, SIGQUIT and at interpreter exit (``atexit``).

    The restore holds those signals back while it runs (:func:`measure.shield.shielded`), so a
    Ctrl-C during it (or a second Ctrl-C) cannot cut it short: the signal is delivered after it.
    It is tried up to ``attempts`` times, and only a successful restore counts as done.

    * Normal exit: a failed restore raises its :class:`DeviceError`.
    * Exception: the exception stays the one raised; a failed restore is attached to it as a
      note (``add_note``; on Python 3.10 logged as an error).
    * Signal (main thread only; a signal whose handler was ``SIG_IGN`` is left ignored, so a
      run under ``nohup`` keeps its settings): restore, then chain to the previous handler —
      a callable is called (so a CLI handler that raises still runs); ``SIG_DFL`` means
      KeyboardInterrupt for SIGINT, and for the others the signal is re-raised with its default
      action, so the exit status says which signal ended the process.
    """
    from .shield import SHIELDED_SIGNALS, defer, shielded

    done = False

    def _restore() -> None:
        nonlocal done
        if done:
            return
        last: Exception | None = None
        with shielded():
            for _ in range(max(1, attempts)):
                try:
                    device.restore()
                except Exception as exc:  # noqa: BLE001 - retried, then raised or noted
                    last = exc
                    continue
                done = True
                break
        if not done and last is not None:
            raise last

    previous: dict[signal.Signals | int, Any] = {}

    def _handler(signum: int, frame: Any) -> None:
        if defer(signum):      # a restore or a setter is running: handle it right after
            return
        try:
            _restore()
        except Exception as exc:  # noqa: BLE001 - the signal must still take effect
            # inside a signal handler: no logging (its locks), no sys.stderr (reentrancy)
            write_stderr_unlocked(f"ecal: restoring {device.name} after "
                                  f"{signal.Signals(signum).name} failed: {exc} "
                                  "(run `ecal restore` to put it back)")
        _chain(previous.get(signum), signum, frame)

    def _at_exit() -> None:
        try:
            _restore()
        except Exception as exc:  # noqa: BLE001 - nothing above us at interpreter exit
            # at interpreter exit: the CLI's log handler is gone, logging may be shut down
            write_stderr_unlocked(f"ecal: restoring {device.name} at exit failed: {exc}")

    in_main = threading.current_thread() is threading.main_thread()
    if in_main:
        for s in SHIELDED_SIGNALS:
            prev = signal.getsignal(s)
            if prev == signal.SIG_IGN:
                continue
            previous[s] = prev
            signal.signal(s, _handler)
    atexit.register(_at_exit)
    try:
        yield device
    except BaseException as exc:
        try:
            _restore()
        except Exception as rexc:  # noqa: BLE001 - never replaces the user's error
            _add_note(exc, f"after this error, restoring {device.name} failed: "
                           f"{type(rexc).__name__}: {rexc} (run `ecal restore` to put it back)")
        raise
    else:
        _restore()
    finally:
        atexit.unregister(_at_exit)
        if in_main:
            for sig, h in previous.items():
                signal.signal(sig, h if h is not None else signal.SIG_DFL)


Work = Callable[[], Any]
