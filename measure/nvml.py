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
* **Without root**: with ``ZEUSD_SOCK_PATH`` set (or ``setter_relay=``), those three setters and
  the two clock-lock resets go to zeusd, Zeus's privileged daemon (:mod:`measure.zeusd`,
  docs/zeusd.md); every read stays on NVML, and the journal, signals and restores below work
  unchanged through it.

Never leaving a GPU changed:

* **Journal.** Before each setter the setting and the value to restore are written durably to
  a journal per GPU UUID (:mod:`measure.journal`), with SIGINT/SIGTERM/SIGHUP/SIGQUIT blocked
  around the record and the call (:mod:`measure.shield`), so no signal lands between them.
  That write is the check that the journal can be written: when it fails (a full disk, a
  read-only state folder) the setter does not run, and :class:`~measure.journal.JournalWriteError`
  names the journal and says nothing was changed (what this call had changed is rolled back).
* **The card before the disk.** Every restore (:meth:`NVMLDevice.restore`, ``close()``, the
  ``atexit`` hook, a lost GPU, the recovery at open, ``ecal restore``) puts the card back
  first and updates the journal only afterwards, best effort: a journal that cannot be
  written never stops or fails a restore. It is left as it was (restoring twice is
  harmless), one line on stderr names it (written to fd 2 directly: this runs inside signal
  handlers and at exit, where logging's locks must not be taken), and the next open or
  ``ecal restore`` clears it.
* **What NVML reads back.** The power limit is read (``nvmlDeviceGetPowerManagementLimit``,
  mW) and restored exactly. NVML has no call that reads a clock *lock* (only the current
  clock), so clock locks are restored by resetting them (``nvmlDeviceResetGpuLockedClocks``,
  ``nvmlDeviceResetMemoryLockedClocks``): a lock another tool set before ecal ran is reset,
  not put back.
* **One process per GPU.** A device opened for changes holds an ``flock`` on its UUID
  (:class:`~measure.locks.ProcessLock`); a second process gets :class:`LockedError` naming the
  holder's PID. The kernel drops the lock when the holder dies, even by SIGKILL. Locks and
  journals live in the caller's own state folder (:func:`~measure.locks.lock_dir`: mode 0700,
  refused when another user could write it), and no symlink or foreign file there is
  followed, written or emptied.
* **Recovery.** Opening a GPU (not read-only) whose journal was left by a process that no
  longer holds it (killed, crashed, or a restore that failed) restores it first and says so
  in one line (logged at INFO on ``measure.nvml``; ``ecal`` shows it on stderr); if that
  restore fails, the open fails with a one-line :class:`RestoreFailedError` naming
  ``ecal restore --device nvml:N``. A journal is applied
  only as far as the card allows: an unreadable one resets every setting to the driver
  default, a power limit outside ``nvmlDeviceGetPowerManagementLimitConstraints`` is replaced
  by ``nvmlDeviceGetPowerManagementDefaultLimit`` (both said in the line), and one someone
  else could have written (another owner or writer uid, a symlink, group/other-writable) is
  refused with :class:`~measure.journal.UntrustedJournalError`: nothing restored, nothing
  changed.
* **Exit.** Settings still changed at interpreter exit are restored by an ``atexit`` hook;
  ``close()`` restores them too. Only SIGKILL, a power loss or ``os._exit`` skip all of these,
  and then the journal is there for the next open or ``ecal restore``.
* **Transient errors** (``NVML_ERROR_TIMEOUT``, ``NVML_ERROR_UNKNOWN``, ``NVML_ERROR_NOT_READY``)
  are retried a bounded number of times with exponential backoff; ``NVML_ERROR_GPU_IS_LOST``
  triggers a restore attempt and a clear :class:`GpuLostError`.

The pynvml module is injectable (``nvml=``) so tests run against a strict fake.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import sys
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from frontier.operating_point import OperatingPoint

from . import journal as jr
from .device import (
    Device,
    DeviceError,
    OperatingSet,
    PermissionDeniedError,
    Reading,
    ReadOnlyError,
    UnsupportedSettingError,
    write_stderr_unlocked,
)
from .locks import ProcessLock, lock_dir
from .shield import shielded
from .zeusd import SetterRelay, zeusd_from_env

log = logging.getLogger(__name__)

WHAT_TO_DO = ("Changing clocks or power limits needs root: run as root (sudo) or in a container "
              "with CAP_SYS_ADMIN, keep the driver loaded with persistence mode (`sudo nvidia-smi "
              "-pm 1`), or use `sudo nvidia-smi -lgc/-lmc/-pl` yourself; without root, let a "
              "running zeusd (Zeus's privileged daemon) make them: `export "
              "ZEUSD_SOCK_PATH=/run/zeusd/zeusd.sock` (docs/zeusd.md); otherwise open the device "
              "read-only (--read-only) to sweep only the SM allocation and implementations.")

#: The root-only NVML calls a setter relay makes instead (:mod:`measure.zeusd`), by the relay
#: method's name; it gets the GPU's NVML index and the call's values (no handle).
RELAYED_SETTERS = {
    "nvmlDeviceSetGpuLockedClocks": "set_gpu_locked_clocks",
    "nvmlDeviceResetGpuLockedClocks": "reset_gpu_locked_clocks",
    "nvmlDeviceSetMemoryLockedClocks": "set_mem_locked_clocks",
    "nvmlDeviceResetMemoryLockedClocks": "reset_mem_locked_clocks",
    "nvmlDeviceSetPowerManagementLimit": "set_power_limit",
}

#: Bit → name of NVML clock-event (throttle) reasons (values from nvml.h).
EVENT_REASONS = {
    0x1: "GpuIdle", 0x2: "ApplicationsClocksSetting", 0x4: "SwPowerCap", 0x8: "HwSlowdown",
    0x10: "SyncBoost", 0x20: "SwThermalSlowdown", 0x40: "HwThermalSlowdown",
    0x80: "HwPowerBrakeSlowdown", 0x100: "DisplayClockSetting",
}

#: NVML error names retried with backoff (a busy or briefly unresponsive driver).
TRANSIENT_ERRORS = ("NVML_ERROR_TIMEOUT", "NVML_ERROR_UNKNOWN", "NVML_ERROR_NOT_READY")
_TRANSIENT_DEFAULTS = {"NVML_ERROR_TIMEOUT": 10, "NVML_ERROR_UNKNOWN": 999, "NVML_ERROR_NOT_READY": 27}

# SM step of a green-context request by NVML architecture id (CUDA driver docs on
# cuDevSmResourceSplitByCount: Volta to Ada 2 (Ampere's minimum of 4 is not modelled), Hopper and
# later 8; older: 1). NVML ids: 5 Volta, 6 Turing, 7 Ampere, 8 Ada, 9 Hopper, 10 Blackwell.
_SM_GRANULARITY = {5: 2, 6: 2, 7: 2, 8: 2}

# CUDA cores per SM by NVML architecture id (no NVML call returns the SM count).
_CORES_PER_SM = {5: 64, 6: 64, 7: 128, 8: 128, 9: 128, 10: 128}


class GpuLostError(DeviceError):
    """NVML reported ``NVML_ERROR_GPU_IS_LOST``: the GPU fell off the bus or hung."""


class RestoreFailedError(DeviceError):
    """Settings left by an earlier process could not all be restored (``cause``: the first
    NVML error; ``recovery``: per setting, what was put back and what was not). The journal
    keeps only the settings that failed, for ``ecal restore``."""

    def __init__(self, message: str, cause: DeviceError | None = None,
                 recovery: Recovery | None = None):
        self.cause = cause
        self.recovery = recovery
        super().__init__(message)


@dataclass(frozen=True)
class Recovery:
    """What opening a GPU restored from a journal left by an earlier process."""

    uuid: str
    index: int
    restored: tuple[str, ...]
    pid: int | None
    host: str
    writer_alive: bool
    corrupt: bool
    #: Settings that could not be put back: (setting, what restoring it does, the error).
    failed: tuple[tuple[str, str, str], ...] = ()
    #: What was not applied as the journal said, and why (an unreadable journal, a power limit
    #: outside the GPU's range), one line each.
    notes: tuple[str, ...] = ()
    #: Why the journal could not be updated after the restore ('' when it was): the card is
    #: restored all the same, and the journal left as it was (restoring again is harmless).
    journal_error: str = ""

    def left_by(self) -> str:
        """Who left the GPU changed, for messages."""
        if self.corrupt:
            return "an unreadable journal"
        return f"process {self.pid} on {self.host}" + ("" if self.writer_alive
                                                       else " (no longer running)")

    def summary(self) -> str:
        """One line: which GPU, what was put back, what was not, who left it."""
        done = ", ".join(self.restored) if self.restored else "nothing"
        line = f"restored {self.uuid} (nvml:{self.index}) left changed by {self.left_by()}: {done}"
        if self.failed:
            line += "; NOT restored: " + "; ".join(f"{what} ({err})" for _, what, err in self.failed)
        for note in self.notes:
            line += f"; {note}"
        if self.journal_error:
            line += f"; {self.journal_error}"
        return line

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description."""
        return {"uuid": self.uuid, "device": f"nvml:{self.index}", "restored": list(self.restored),
                "not_restored": [{"setting": s, "restore": what, "error": err}
                                 for s, what, err in self.failed],
                "left_by_pid": self.pid, "left_on_host": self.host,
                "writer_alive": self.writer_alive, "journal_corrupt": self.corrupt,
                "notes": list(self.notes), "journal_error": self.journal_error}


def _release_at_gc(lock: ProcessLock) -> None:
    """Release a dropped device's GPU lock with termination signals held back."""
    with shielded():
        lock.release()


def _load_pynvml() -> Any:
    try:
        import pynvml
    except ImportError:
        raise DeviceError("pynvml is not installed: `pip install nvidia-ml-py` (not the deprecated "
                          "`pynvml` package)") from None
    return pynvml


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _norm_uuid(u: str) -> str:
    u = u.strip().lower()
    return u[4:] if u.startswith("gpu-") else u


def cuda_index_for(uuid: str, nvml_index: int, torch: Any = None,
                   environ: Mapping[str, str] | None = None) -> int:
    """The CUDA device index of the GPU whose NVML UUID is ``uuid`` (``GPU-…``).

    With torch (injected, or importable) and CUDA available: the index ``i`` whose
    ``torch.cuda.get_device_properties(i).uuid`` is that UUID. Otherwise from
    ``CUDA_VISIBLE_DEVICES`` (indices or ``GPU-`` UUIDs or unique UUID prefixes, as CUDA
    accepts; CUDA stops at the first entry it cannot parse): the position of the entry naming
    this GPU. Unset: the NVML index (CUDA's order then matches NVML's PCI order only with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; torch, when present, settles it by UUID).
    """
    env = os.environ if environ is None else environ
    want = _norm_uuid(uuid)
    if torch is None:
        try:
            import torch  # optional
        except ImportError:
            torch = None
    if torch is not None and torch.cuda.is_available():
        n = int(torch.cuda.device_count())
        for i in range(n):
            u = getattr(torch.cuda.get_device_properties(i), "uuid", None)
            if u is not None and _norm_uuid(str(u)) == want:
                return i
        raise DeviceError(f"{uuid} (nvml:{nvml_index}) is not among the {n} CUDA devices this "
                          f"process sees (CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r})")
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return int(nvml_index)
    for pos, item in enumerate(x.strip() for x in visible.split(",")):
        if re.fullmatch(r"\d+", item):
            if int(item) == int(nvml_index):
                return pos
        elif item.lower().startswith("gpu-") and len(item) > 4:
            if want.startswith(_norm_uuid(item)):
                return pos
        else:
            break    # CUDA ignores this entry and every one after it (MIG- ones included here)
    raise DeviceError(f"{uuid} (nvml:{nvml_index}) is not visible to CUDA "
                      f"(CUDA_VISIBLE_DEVICES={visible!r}); add it or open another nvml:INDEX")


class NVMLDevice(Device):
    """GPU ``index`` via NVML. ``clock``/``sleep``/``synchronize`` are injectable for tests;
    ``synchronize`` defaults to ``torch.cuda.synchronize`` when torch is importable.

    ``retry_sleep`` (default: ``sleep``) waits between retries of transient NVML errors
    (``attempts`` tries in all, ``backoff_s`` doubling). ``cuda_index`` overrides the CUDA
    device found by UUID (:func:`cuda_index_for`). ``announce`` logs the one-line notice of a
    recovery (INFO on ``measure.nvml``; ``ecal`` shows it on stderr; :attr:`recovered` holds it
    either way). Opening for changes (not
    read-only) takes the GPU's lock and recovers a journal left behind (see module doc).
    ``setter_relay`` makes the root-only setters and resets (:data:`RELAYED_SETTERS`) instead of
    NVML: by default (``"env"``) a :class:`~measure.zeusd.ZeusdClient` when ``ZEUSD_SOCK_PATH``
    is set at open, else none (NVML itself); ``None``: always NVML.
    """

    simulated = False

    def __init__(self, index: int = 0, read_only: bool = False, nvml: Any = None,
                 sm_count: int | None = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 synchronize: Callable[[], None] | None = None,
                 retry_sleep: Callable[[float], None] | None = None, attempts: int = 5,
                 backoff_s: float = 0.05, cuda_index: int | None = None, announce: bool = True,
                 setter_relay: SetterRelay | None | Literal["env"] = "env"):
        self.nvml = nvml if nvml is not None else _load_pynvml()
        self.setter_relay = zeusd_from_env() if setter_relay == "env" else setter_relay
        self.index = int(index)
        self.read_only = bool(read_only)
        self._clock, self._sleep = clock, sleep
        self._retry_sleep = retry_sleep or sleep
        self._attempts, self._backoff_s = max(1, int(attempts)), float(backoff_s)
        self._transient = {getattr(self.nvml, n, d) for n, d in _TRANSIENT_DEFAULTS.items()}
        self._lost_code = getattr(self.nvml, "NVML_ERROR_GPU_IS_LOST", 15)
        self._lost = False
        self._sync = synchronize
        self._cuda_index = cuda_index
        self._corunner: Any = None      # measure.corun.CoRunner, made at the first co-run
        self._journal: jr.DeviceJournal | None = None
        self._lock: ProcessLock | None = None
        self._lock_finalizer: weakref.finalize | None = None
        self.removed_temp_files: tuple[Any, ...] = ()
        self._atexit_armed = False
        self._closed = False
        self._journal_reported = False
        self.recovered: Recovery | None = None
        self._call("nvmlInit")
        try:
            self._open(announce)
        except BaseException:
            self._release()
            raise
        self._opset: OperatingSet | None = None
        self._sm_count_override = sm_count
        self._locked_sm: float | None = None
        self._locked_mem: float | None = None
        self._sm_alloc: int | None = None

    def _open(self, announce: bool) -> None:
        self.handle = self._call("nvmlDeviceGetHandleByIndex", self.index)
        self.uuid = _text(self._call("nvmlDeviceGetUUID", self.handle))
        try:
            self.driver = _text(self._call("nvmlSystemGetDriverVersion"))
        except DeviceError:
            self.driver = "unknown"
        self.model = _text(self._call("nvmlDeviceGetName", self.handle))
        self.name = f"{self.model} (nvml:{self.index})"
        if self.read_only:
            self._warn_if_left_changed()
        else:
            self._lock = ProcessLock(lock_dir() / f"{jr.safe_name(self.uuid)}.lock",
                                     f"GPU {self.uuid} (nvml:{self.index})",
                                     ' '.join(sys.argv)[:200]).acquire()
            # Only for a device dropped without close(); close() detaches it, so no lock code
            # runs from the garbage collector, where a Ctrl-C would be "Exception ignored".
            self._lock_finalizer = weakref.finalize(self, _release_at_gc, self._lock)
            try:
                self.recovered = self._recover()
            finally:    # temp files of writers killed mid-write (we hold the lock: none is live)
                self.removed_temp_files = tuple(jr.remove_stale_temp_files(self.uuid))
            if self.recovered is not None and announce:
                # a note (INFO): `ecal` shows it as "ecal: restored ..."; a script reads
                # self.recovered, or enables INFO for measure.nvml
                log.info("%s", self.recovered.summary())
            self._journal = jr.DeviceJournal(self.uuid, self.index, self.model)
            if self.recovered is not None and self.recovered.journal_error:
                self._journal.dirty = True          # close() tries to clear the file again
                self._journal_reported = True       # said in the recovery line (or the doc)
        self._original_limit_mw = self._call("nvmlDeviceGetPowerManagementLimit", self.handle)

    def _release(self) -> None:
        self._release_lock()
        try:
            self.nvml.nvmlShutdown()
        except Exception:   # noqa: BLE001 - best effort while an open is failing
            pass

    def _release_lock(self) -> None:
        if self._lock_finalizer is not None:
            self._lock_finalizer.detach()
        if self._lock is not None:
            with shielded():
                self._lock.release()

    # -- NVML calls with typed errors and retries ---------------------------------------------
    def _call(self, fn: str, *args: Any) -> Any:
        if self.setter_relay is not None and fn in RELAYED_SETTERS:   # args: handle, values
            return getattr(self.setter_relay, RELAYED_SETTERS[fn])(self.index, *args[1:])
        nv = self.nvml
        delay = self._backoff_s
        for attempt in range(self._attempts):
            try:
                return getattr(nv, fn)(*args)
            except nv.NVMLError as exc:
                code = getattr(exc, "value", None)
                if code in self._transient and attempt + 1 < self._attempts:
                    self._retry_sleep(delay)
                    delay *= 2
                    continue
                if code == self._lost_code:
                    raise self._gpu_lost(fn, exc) from None
                err = self._typed(fn, exc, code)
                err.nvml_code = code
                raise err from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _typed(self, fn: str, exc: Exception, code: Any) -> DeviceError:
        nv = self.nvml
        if code == getattr(nv, "NVML_ERROR_NO_PERMISSION", 4):
            return PermissionDeniedError(fn, f"{type(exc).__name__}: {exc}", WHAT_TO_DO)
        if code == getattr(nv, "NVML_ERROR_NOT_SUPPORTED", 3):
            return UnsupportedSettingError(f"{fn} is not supported on this GPU ({exc})")
        if code in (getattr(nv, "NVML_ERROR_LIBRARY_NOT_FOUND", 12),
                    getattr(nv, "NVML_ERROR_DRIVER_NOT_LOADED", 9)):
            return DeviceError(f"{fn} failed: {exc} — no usable NVIDIA driver here "
                               "(without a GPU: plan from profiles or Zeus logs, or use the simulator's presets with --device sim)")
        tries = f" after {self._attempts} tries" if code in self._transient else ""
        return DeviceError(f"{fn} failed{tries}: {type(exc).__name__}: {exc}")

    def _gpu_lost(self, fn: str, exc: Exception) -> GpuLostError:
        where = getattr(self, "name", f"nvml:{self.index}")
        if self._lost:      # inside the restore attempt below: no second attempt
            err = GpuLostError(f"{where}: the GPU is lost ({fn}: {exc})")
            err.nvml_code = self._lost_code
            return err
        self._lost = True
        outcome = "nothing was changed"
        if self._journal is not None and self._journal.entries:
            try:
                self.restore()
                outcome = "its settings were restored"
            except DeviceError:
                outcome = (f"its settings could not be restored (journal kept: after the reset run "
                           f"`ecal restore --device nvml:{self.index}`)")
        err = GpuLostError(f"{where}: the GPU is lost (NVML_ERROR_GPU_IS_LOST in {fn}); {outcome}. "
                           f"It needs a reset (`nvidia-smi -r -i {self.index}`) or a reboot")
        err.nvml_code = self._lost_code
        return err

    # -- identity and recovery ----------------------------------------------------------------
    @property
    def cuda_index(self) -> int:
        """The CUDA device index of this GPU (found by UUID; see :func:`cuda_index_for`)."""
        if self._cuda_index is None:
            self._cuda_index = cuda_index_for(self.uuid, self.index)
        return self._cuda_index

    def _warn_if_left_changed(self) -> None:
        path = jr.path_for(self.uuid)
        if os.path.lexists(path):
            log.warning("%s (nvml:%d) has a journal of settings left changed (%s); a read-only "
                        "open restores nothing: run `ecal restore --device nvml:%d`",
                        self.uuid, self.index, path, self.index)

    def _recover(self) -> Recovery | None:
        """Restore from a journal left by an earlier holder of this GPU (we hold its lock, so
        that process has died or closed it). Every setting is tried; then the journal keeps
        only the ones that failed — written best effort: a journal that cannot be updated (a
        full or read-only folder) never stops the card being restored, and is left as it was
        (:attr:`Recovery.journal_error`). Raises :class:`RestoreFailedError` (with the
        per-setting :class:`Recovery`) if a setting failed, and
        :class:`~measure.journal.UntrustedJournalError` (nothing restored) for a journal
        someone else could have written."""
        path = jr.path_for(self.uuid)
        if not os.path.lexists(path):
            return None
        notes: list[str] = []
        try:
            rec = jr.read_journal(path)
        except jr.CorruptJournalError as exc:
            # Unknown what was changed: put everything back to the driver defaults.
            rec, corrupt = jr.JournalRecord(self.uuid, self.index, self.model, entries={
                s: jr.JournalEntry(s) for s in jr.SETTINGS}), True
            notes.append(str(exc))
        else:
            corrupt = False
            rec = self._within_range(rec, path, notes)
        done: list[str] = []
        put_back: list[str] = []
        failed: list[tuple[str, str, str]] = []
        first: DeviceError | None = None
        with shielded():
            for e in rec.ordered():
                try:
                    done.append(self._undo(e))
                except DeviceError as exc:
                    failed.append((e.setting, e.describe(), str(exc)))
                    first = first or exc
                    continue
                put_back.append(e.setting)
            # The card first, the journal after: a readable journal of what still failed.
            journal_error = ""
            try:
                jr.save_record(path, rec.without(put_back))
            except (OSError, DeviceError) as exc:
                journal_error = (f"the journal {path} could not be updated "
                                 f"({getattr(exc, 'strerror', None) or exc}); it is left as it "
                                 "was (restoring it again is harmless)")
        if not done and not failed:
            return None                            # a journal with no entry left
        recovery = Recovery(self.uuid, self.index, tuple(done), None if corrupt else rec.pid,
                            "" if corrupt else rec.host, False if corrupt else rec.writer_alive(),
                            corrupt, tuple(failed), tuple(notes), journal_error)
        if failed:
            put_back_msg = f"put back {', '.join(done)}; " if done else ""
            raise RestoreFailedError(
                f"{self.model} (nvml:{self.index}, {self.uuid}) was left changed by "
                f"{recovery.left_by()}: {put_back_msg}NOT restored "
                + "; ".join(f"{what} ({err})" for _, what, err in failed)
                + f"; run `ecal restore --device nvml:{self.index}` (as root, or with "
                "ZEUSD_SOCK_PATH set: docs/zeusd.md)", first, recovery)
        return recovery

    def _within_range(self, rec: jr.JournalRecord, path: Any, notes: list[str]) -> jr.JournalRecord:
        """``rec`` with a power limit outside this GPU's own range
        (``nvmlDeviceGetPowerManagementLimitConstraints``) replaced by "restore the default
        limit", noted in ``notes``: a journal's value is applied only when the card allows it."""
        e = rec.entries.get("power_limit")
        if e is None or e.restore_mw is None:
            return rec
        try:
            lo, hi = self._call("nvmlDeviceGetPowerManagementLimitConstraints", self.handle)
        except DeviceError:
            return rec             # cannot check: NVML's setter refuses what the card does not take
        if int(lo) <= e.restore_mw <= int(hi):
            return rec
        notes.append(f"{path}: its power limit {e.restore_mw / 1000:g} W is outside this GPU's "
                     f"range {int(lo) / 1000:g}-{int(hi) / 1000:g} W, not applied: the default "
                     "limit was set instead")
        return replace(rec, entries={**rec.entries, "power_limit": jr.JournalEntry("power_limit")})

    def _undo(self, e: jr.JournalEntry) -> str:
        """Put one journalled setting back; returns what was done (for messages)."""
        h = self.handle
        if e.setting == "gpu_locked_clocks":
            self._call("nvmlDeviceResetGpuLockedClocks", h)
            self._locked_sm = None
        elif e.setting == "mem_locked_clocks":
            self._call("nvmlDeviceResetMemoryLockedClocks", h)
            self._locked_mem = None
        else:
            mw = e.restore_mw
            if mw is None:
                mw = self._call("nvmlDeviceGetPowerManagementDefaultLimit", h)
            self._call("nvmlDeviceSetPowerManagementLimit", h, int(mw))
            return f"power limit {int(mw) / 1000:g} W"
        return e.describe()

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
                return int(torch.cuda.get_device_properties(self.cuda_index).multi_processor_count)
        except (ImportError, DeviceError):
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
            arch = self._arch()
            arch_gran = 8 if arch >= 9 else _SM_GRANULARITY.get(arch, 1)
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
        after validating all of them; on a failure, undo what this call already changed.

        Each setter is journalled first, with termination signals held back (module doc)."""
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
                mw = int(round(op.power_limit_w * 1000))
                self._change("power_limit", "nvmlDeviceSetPowerManagementLimit", mw, found_mw=before)
                undo.append(lambda: self._change("power_limit", "nvmlDeviceSetPowerManagementLimit",
                                                 before, found_mw=before))
            if op.mem_clock_mhz is not None:
                prev = self._locked_mem
                m = int(op.mem_clock_mhz)
                self._change("mem_locked_clocks", "nvmlDeviceSetMemoryLockedClocks", m, m)
                self._locked_mem = op.mem_clock_mhz
                undo.append(lambda: self._relock_mem(prev))
            if op.sm_clock_mhz is not None:
                prev_sm = self._locked_sm
                f = int(op.sm_clock_mhz)
                self._change("gpu_locked_clocks", "nvmlDeviceSetGpuLockedClocks", f, f)
                self._locked_sm = op.sm_clock_mhz
                undo.append(lambda: self._relock_sm(prev_sm))
        except DeviceError:
            for u in reversed(undo):
                try:
                    u()
                except DeviceError:
                    pass     # the journal still holds it: restore() or the next open puts it back
            raise
        # the count the hardware grants (a green context rounds a request up), not the request
        self._sm_alloc = (None if op.sm_count is None
                          else self.operating_set().granted_sm_count(int(op.sm_count)))

    def _change(self, setting: str, fn: str, *values: int, found_mw: int | None = None) -> None:
        """Journal ``setting`` (durably, if not journalled yet), then call setter ``fn``, with
        termination signals held back throughout. A setter that definitely failed (an NVML
        error other than a transient or lost-GPU one) drops the entry it added."""
        journal = self._writable()
        with shielded():
            if setting == "power_limit" and not journal.has(setting) and found_mw is None:
                found_mw = self._call("nvmlDeviceGetPowerManagementLimit", self.handle)
            new = journal.record(setting, found_mw if setting == "power_limit" else None,
                                 list(values) if len(values) > 1 else values[0])
            if new:
                self._arm_atexit()
            try:
                self._call(fn, self.handle, *values)
            except DeviceError as exc:
                code = getattr(exc, "nvml_code", None)
                if (new and code not in self._transient and code != self._lost_code
                        and not getattr(exc, "maybe_applied", False)):   # a relay's unknown outcome
                    self._report_journal(journal.forget([setting]))
                raise

    def _writable(self) -> jr.DeviceJournal:
        if self._journal is None:
            raise ReadOnlyError(f"{self.name} was opened read-only: no setting can be changed")
        if self._closed:
            raise DeviceError(f"{self.name} is closed")
        return self._journal

    def _relock_mem(self, prev: float | None) -> None:
        if prev is None:
            with shielded():
                self._call("nvmlDeviceResetMemoryLockedClocks", self.handle)
        else:
            self._change("mem_locked_clocks", "nvmlDeviceSetMemoryLockedClocks", int(prev), int(prev))
        self._locked_mem = prev

    def _relock_sm(self, prev: float | None) -> None:
        if prev is None:
            with shielded():
                self._call("nvmlDeviceResetGpuLockedClocks", self.handle)
        else:
            self._change("gpu_locked_clocks", "nvmlDeviceSetGpuLockedClocks", int(prev), int(prev))
        self._locked_sm = prev

    def restore(self) -> None:
        """Undo what this object changed: reset clock locks, put back the power limit found
        before the first change. Signals are held back meanwhile; each step is retried on
        transient errors. Tries every step and raises the first NVML failure after trying them
        all. The card comes first: the journal loses the restored entries only afterwards,
        best effort — a journal that cannot be written (a full or read-only folder) never
        stops or fails a restore; it is left as it was (restoring again is harmless) and one
        line on stderr names it."""
        self._sm_alloc = None
        if self._journal is None:
            return
        errors: list[DeviceError] = []
        done: list[str] = []
        with shielded():
            for e in [self._journal.entries[s] for s in jr.SETTINGS if self._journal.has(s)]:
                try:
                    self._undo(e)
                except DeviceError as exc:
                    errors.append(exc)
                    continue
                done.append(e.setting)
            self._report_journal(self._journal.forget(done))
        if not self._journal.entries:
            self._disarm_atexit()
        if errors:
            if len(errors) > 1:
                raise DeviceError(f"restoring {self.name} failed: "
                                  + "; ".join(str(e) for e in errors)) from errors[0]
            raise errors[0]

    def _report_journal(self, err: DeviceError | None) -> None:
        """One line on stderr for a journal that could not be updated (once per device).

        Written with :func:`~measure.device.write_stderr_unlocked`, not logged: this runs on
        every restore, including the one inside a signal handler (``restoring``) and the one at
        interpreter exit, where logging's locks must not be taken."""
        if err is None or self._journal_reported:
            return
        self._journal_reported = True
        write_stderr_unlocked(f"ecal: {self.name}: {err}; `ecal restore --device "
                              f"nvml:{self.index}` clears it once it can be written")

    @property
    def changed_settings(self) -> tuple[str, ...]:
        """Settings journalled as changed and not restored yet."""
        return tuple(self._journal.entries) if self._journal is not None else ()

    def _arm_atexit(self) -> None:
        if not self._atexit_armed:
            atexit.register(self._restore_at_exit)
            self._atexit_armed = True

    def _disarm_atexit(self) -> None:
        if self._atexit_armed:
            atexit.unregister(self._restore_at_exit)
            self._atexit_armed = False

    def _restore_at_exit(self) -> None:
        """atexit: put back whatever is still changed (one line on stderr if that fails)."""
        if not self.changed_settings:
            return
        try:
            self.restore()
        except Exception as exc:  # noqa: BLE001 - nothing above us at interpreter exit
            # at interpreter exit: the CLI's log handler is gone, logging may be shut down
            write_stderr_unlocked(f"ecal: restoring {self.name} at exit failed ({exc}); run "
                                  f"`ecal restore --device nvml:{self.index}`")

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
            torch.cuda.synchronize(self.cuda_index)

    def _launch(self, work: Any, n: int, sm_count: int | None) -> None:
        if not callable(work):
            raise TypeError(f"work for {self.name} must be callable, got {type(work).__name__}")
        alloc = sm_count if sm_count is not None else self._sm_alloc
        if alloc is not None and alloc < self.operating_set().sm_count:
            from .sm_alloc import run_on_sms

            run_on_sms(work, int(n), int(alloc), device_index=self.cuda_index)
        else:
            for _ in range(int(n)):
                work()

    def run(self, work: Any, n: int = 1, sm_count: int | None = None) -> None:
        """Call ``work()`` n times (on ``sm_count`` SMs via a green context when given, else the
        allocation in force), then synchronize."""
        self._launch(work, n, sm_count)
        self._synchronize()

    def run_parallel(self, streams: Sequence[tuple[Any, int, int | None]]) -> None:
        """Run a co-run and synchronize: each ``(work, k, sm_count)`` runs ``work()`` ``k``
        times on its own CUDA stream, all started together (:class:`measure.corun.CoRunner`:
        whole-device streams, or the disjoint partitions of one SM split, labelled
        ``overlapping`` where only separate green contexts exist; :attr:`last_split`).
        Needs PyTorch (:class:`~measure.device.FeatureUnavailableError` otherwise)."""
        if self._corunner is None:
            from .corun import CoRunner
            from .sm_alloc import _torch

            self._corunner = CoRunner(_torch(), self.cuda_index, self.operating_set().sm_count)
        self._corunner.launch(streams)
        self._synchronize()

    @property
    def last_split(self) -> Any:
        """The :class:`~measure.sm_alloc.SMSplit` of the latest partitioned co-run (None
        before one, or after a co-run on whole-device streams)."""
        return None if self._corunner is None else self._corunner.last_split

    def run_and_read(self, work: Any, n: int = 1, sm_count: int | None = None) -> Reading:
        """Launch the work like :meth:`run`, read clocks, temperature and throttle reasons
        *before* synchronizing (the launches are asynchronous, so the GPU is still busy with
        them), then synchronize. ``Reading.time_s`` is when the reading was taken, before the
        work finished: take a window's end time after this returns."""
        self._launch(work, n, sm_count)
        try:
            reading = self.reading()
        finally:
            self._synchronize()
        return reading

    def describe(self) -> dict[str, Any]:
        """Metadata: the GPU name, not simulated, read-only or not, NVML UUID and driver."""
        return {"device": self.name, "simulated": False, "read_only": self.read_only,
                "uuid": self.uuid, "driver": self.driver}

    def close(self) -> None:
        """Restore what is still changed, release the GPU's lock, ``nvmlShutdown``.

        Never raises a failed restore (``close`` often runs in a ``finally`` whose exception
        must stay the one raised): it logs one line (an error on ``measure.nvml``), and the
        journal stays for the next open or ``ecal restore``. A journal that cannot be written never stops it either."""
        if self._closed:
            return
        try:
            if self.changed_settings:
                self.restore()
            if self._journal is not None:
                self._report_journal(self._journal.sync())
        except (DeviceError, OSError) as exc:
            # an error, not a warning: the card is left changed (ecal shows "ecal: closing ...")
            log.error("closing %s without restoring it (%s); run `ecal restore --device nvml:%d`",
                      self.name, exc, self.index)
        finally:
            self._closed = True
            self._disarm_atexit()
            self._release_lock()
            self._call("nvmlShutdown")
