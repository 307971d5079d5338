"""measure: devices and protocols.

* :class:`Device` — the interface (energy counter, clock, operating set, setters, ``run``);
  typed errors (:class:`DeviceError`, :class:`PermissionDeniedError`,
  :class:`UnsupportedSettingError`, :class:`ReadOnlyError`, :class:`FeatureUnavailableError`);
  :func:`restoring` puts settings back on exit, exception, SIGINT, SIGTERM, SIGHUP, SIGQUIT
  and at interpreter exit.
* :class:`SimulatedGPU` — physics-based H200 in virtual time (``simulated=True`` everywhere);
  :class:`SimKernel` work and ``PRESETS`` matching the H200 data elements.
* :class:`NVMLDevice` — a real GPU through pynvml (``read_only=True`` never changes settings);
  every change is journalled first (:mod:`measure.journal`) and a journal left by a killed run
  is restored on the next open (or by ``ecal restore``); one process per GPU
  (:class:`LockedError`); :class:`GpuLostError`, :class:`RestoreFailedError`.
* :mod:`measure.replay` — signatures from recorded tables (H200, Zeus, NV-DVFS, Perseus).
* :mod:`measure.sm_alloc` — run work on n SMs via CUDA green contexts (optional torch).
* :class:`Protocol`, :func:`measure_point` — warm-up, null context, tick-aligned windows,
  repetitions to a target relative standard error.
* :func:`characterize` / :func:`sweep` over ω × κ grids (:func:`parse_grid`), resumable.
* :class:`ProgressEvent` (:mod:`measure.progress`) — what every long operation reports through
  its ``progress`` callback (default none: the library shows no progress by itself); warnings
  and notes go to ``logging.getLogger(__name__)`` (unconfigured: warnings on stderr only).
* :class:`PlanApplier` — apply per-element operating points around their execution (from a
  schedule file, :mod:`measure.schedule`);
  :func:`measure_transitions` — settle-time probe → a measured ``TransitionTable``.
* :func:`open_device` — ``"sim"``, ``"sim:h200"``, ``"nvml:0"``; :func:`resolve_work` /
  :func:`load_work` — a simulated preset name or ``module:attribute`` (a work, or a factory
  called once that returns it), imported from the working directory.
* :func:`default_grid` — a device's default grid from its own supported clocks and power
  limits; :class:`ReadyPowerCache` — one ready-power calibration per (device, ω_dev) shared
  by a campaign's sweeps.
* :mod:`measure.calibration` — the simulator against the H200 data (table).

``ecal characterize`` in four calls::

    dev = open_device(args.device, read_only=args.read_only, seed=args.seed)
    work = resolve_work(args.work, dev)
    res = characterize(work, device=dev, grid=args.grid, results_path=args.results,
                       protocol=Protocol(target_rse=args.target_rse), name=args.work,
                       progress=reporter)           # ecal's: ecal.output.progress_reporter
    res.save(args.output); table = res.to_table()   # signature file keyed element@κ@ω

Imports ``frontier``, never ``solvers`` or ``execution`` (running a plan is
:mod:`execution`, which imports this).
"""

from .adaptive import AdaptiveOptions, AdaptiveResult, SkippedPoint, characterize_adaptive
from .apply import PlanApplier
from .characterize import CharacterizationResult, characterize, save_characterizations
from .device import (
    Device,
    DeviceError,
    FeatureUnavailableError,
    OperatingSet,
    PermissionDeniedError,
    ReadOnlyError,
    UnsupportedSettingError,
    restoring,
)
from .factory import ResolvedWork, UserCodeError, load_work, open_device, resolve_work
from .grid import Grid, GridError, default_grid, parse_grid
from .journal import CorruptJournalError, JournalWriteError, UntrustedJournalError
from .locks import LockedError, UnsafeFileError, UnsafeStateDirError
from .nvml import GpuLostError, NVMLDevice, RestoreFailedError, cuda_index_for
from .progress import ProgressCallback, ProgressEvent
from .protocol import NAIVE_5S, Protocol, measure_point, measure_ready_power_w
from .ready_drift import ReadyRecheck
from .replay import (
    ReplayDevice,
    load_h200,
    load_nvdvfs,
    load_perseus,
    load_zeus_profile,
    load_zeus_trace,
)
from .results_log import ResultsMismatchError
from .sim import H200, PRESETS, SimKernel, SimSpec, SimulatedGPU, list_presets, preset
from .sweep import Progress, ReadyPowerCache, SweepResult, sweep
from .transitions import measure_transitions, settle_time_s

__all__ = [
    "characterize_adaptive", "AdaptiveOptions", "AdaptiveResult", "SkippedPoint",
    "Device", "DeviceError", "PermissionDeniedError", "UnsupportedSettingError", "ReadOnlyError",
    "FeatureUnavailableError", "OperatingSet", "restoring",
    "SimulatedGPU", "SimKernel", "SimSpec", "H200", "PRESETS", "preset", "list_presets",
    "NVMLDevice", "GpuLostError", "RestoreFailedError", "LockedError", "cuda_index_for",
    "CorruptJournalError", "JournalWriteError", "UntrustedJournalError", "UnsafeFileError",
    "UnsafeStateDirError",
    "Protocol", "NAIVE_5S", "measure_point", "measure_ready_power_w",
    "Grid", "GridError", "parse_grid", "default_grid", "sweep", "ReadyPowerCache", "ReadyRecheck", "SweepResult", "Progress",
    "ProgressEvent", "ProgressCallback",
    "characterize", "CharacterizationResult", "save_characterizations", "PlanApplier",
    "open_device", "resolve_work", "load_work", "ResolvedWork", "UserCodeError",
    "measure_transitions", "settle_time_s", "ResultsMismatchError",
    "ReplayDevice", "load_h200", "load_zeus_trace", "load_zeus_profile", "load_nvdvfs", "load_perseus",
]
