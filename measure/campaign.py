"""Characterization campaigns: many elements × κ × ω over many GPUs, resumable, into one store.

A campaign file (YAML or JSON, :func:`load_campaign`, read by :mod:`measure.campaign_file`) lists elements (simulated presets or
``module:function``), their implementations κ, the grid and the protocol. :func:`shard` cuts it
into **units**, one per (element, κ, ω_dev, SM split) point of the grid; :func:`run_campaign`
measures every unit not yet committed to the store (:mod:`measure.store`) and commits each in
one transaction together with its record (which host and GPU UUID measured it, when, how many
attempts). A unit is done exactly when committed, so after any interruption (Ctrl-C, SIGKILL of
the driver, a lost node) a rerun measures exactly the units that are not; units measured but
not yet committed when the driver died are measured again (their results never reached the
store).

Executors (the coordinating process alone writes the store; workers send records back):

* **local** (default): one worker process per GPU of this host (``--device nvml``: every GPU
  NVML sees, or ``--gpus N``), or per simulated GPU (``--device sim --gpus 4``). Each worker
  holds its GPU's lock for its whole life (NVML devices take it when opened; a simulated GPU
  takes the same kind of :class:`~measure.locks.ProcessLock` on its synthetic UUID), takes the
  next unit from a shared queue, measures it with :func:`~measure.sweep.sweep` and sends the
  record back. A unit whose GPU raised a :class:`~measure.device.DeviceError` is retried (up to
  ``max_retries``) by whichever worker is free next.
* **Ray** (``--ray auto|local|ADDRESS``, the optional ``ray`` extra): each unit is a Ray task
  asking for ``num_gpus=1`` (and ``accelerator_type`` when the campaign names one, so a retry
  runs on a GPU of the same model); Ray's ``max_retries`` / ``retry_exceptions`` retry a unit
  whose task failed or whose node died; the task opens the GPU Ray assigned it
  (``ray.get_gpu_ids()``) and returns its record to the driver, which commits it.

Simulated GPUs: GPU ``i`` is a :class:`~measure.sim.SimulatedGPU` with the campaign's seed and
the synthetic UUID ``SIM-H200-i``. Every simulated point is seeded by its key
(``device.seed_point``), so a unit measures the same on any simulated GPU and in any order: an
interrupted-and-resumed campaign stores what an uninterrupted one stores, which GPU measured
each unit aside (:meth:`~measure.store.ResultsStore.contents` with ``measured_by=False``).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import queue
import socket
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frontier.operating_point import OperatingPoint

# the campaign file's names, importable from here as before
from .campaign_file import (  # noqa: F401
    CAMPAIGN_FORMAT,
    MAX_CAMPAIGN_BYTES,
    MAX_UNITS,
    CampaignError,
    CampaignSpec,
    ElementSpec,
    Unit,
    load_campaign,
    parse_campaign,
    shard,
)
from .device import Device, DeviceError
from .progress import ProgressCallback, ProgressEvent, eta_s, report
from .protocol import Protocol
from .store import ResultsStore, StoreError

log = logging.getLogger(__name__)


class CampaignMismatchError(StoreError):
    """The store holds a campaign of this name measured another way (device, seed, protocol):
    resuming it would mix measurements."""


class UnitDeviceError(DeviceError):
    """A GPU failed while measuring a unit (retried elsewhere). One message argument only, so
    it crosses process boundaries (multiprocessing, Ray) intact."""


# -- devices --------------------------------------------------------------------------------------

def _sim_class() -> type:
    from .sim import SimulatedGPU

    class CampaignSimGPU(SimulatedGPU):
        """Simulated GPU ``index`` of a campaign: the campaign's seed, UUID ``SIM-H200-index``."""

        def __init__(self, index: int, seed: int = 0):
            super().__init__(seed=seed)
            self.index = int(index)
            self.uuid = f"SIM-{self.spec.name}-{self.index}"
            self.model = self.name            # "simulated H200": never mixed with a real H200

        def describe(self) -> dict[str, Any]:
            return {**super().describe(), "uuid": self.uuid}

    return CampaignSimGPU


@contextlib.contextmanager
def gpu_session(kind: str, index: int, seed: int = 0) -> Iterator[Device]:
    """Open GPU ``index`` for a worker and hold its lock until the block ends: ``"sim"`` →
    simulated GPU ``index`` (a :class:`~measure.locks.ProcessLock` on its UUID), ``"nvml"`` →
    :class:`~measure.nvml.NVMLDevice` (it takes the lock itself and journals every change)."""
    if kind == "sim":
        from .journal import safe_name
        from .locks import ProcessLock, lock_dir

        dev = _sim_class()(index, seed)
        with ProcessLock(lock_dir() / f"{safe_name(dev.uuid)}.lock", f"simulated GPU {index}",
                         " ".join(sys.argv)[:200]):
            yield dev
        return
    if kind == "nvml":
        from .nvml import NVMLDevice

        dev = NVMLDevice(index=index)
        try:
            yield dev
        finally:
            dev.close()
        return
    raise DeviceError(f"unknown campaign device {kind!r}; use sim or nvml")


def gpu_model_of(device: Device) -> str:
    """The GPU model a device's measurements are filed under (NVML's name, e.g. ``NVIDIA
    H200``; ``simulated H200`` for the simulator)."""
    return str(getattr(device, "model", None) or device.name)


def count_gpus(kind: str) -> int:
    """GPUs of this host NVML sees (``"nvml"``); 1 simulated GPU (``"sim"``)."""
    if kind != "nvml":
        return 1
    from .nvml import _load_pynvml

    nv = _load_pynvml()
    nv.nvmlInit()
    try:
        return int(nv.nvmlDeviceGetCount())
    finally:
        nv.nvmlShutdown()


# -- one unit, in a worker ------------------------------------------------------------------------

def measure_unit(unit: Mapping[str, Any], spec: Mapping[str, Any], device: Device,
                 gpu_index: int, ready_cache: Any = None) -> dict[str, Any]:
    """Measure one unit (a :meth:`Unit.to_dict`) on ``device`` with the campaign's protocol,
    through :func:`~measure.sweep.sweep`, and return its record: the signatures (lossless
    codec), their store key fields and who measured it. ``ready_cache``: a
    :class:`~measure.sweep.ReadyPowerCache` the worker keeps for its GPU, so the ready power
    at an ω_dev is calibrated once per GPU rather than once per unit. Raises
    :class:`UnitDeviceError` when the GPU failed (a retry may succeed elsewhere); other
    exceptions are the work's own."""
    from frontier.pareto import signature_to_dict

    from .factory import resolve_work
    from .sweep import sweep

    t0 = time.time()
    sim = spec.get("simulate") or {}
    if sim.get("unit_delay_s") and device.simulated:
        time.sleep(float(sim["unit_delay_s"]))    # a slow unit (tests interrupt campaigns)
    fail_dir = sim.get("fail_once_dir")
    if fail_dir and device.simulated:
        # a simulated fault: the first attempt of every unit fails (tests Ray's retries)
        marker = Path(fail_dir) / (_safe(unit["key"]) + ".failed")
        if not marker.exists():
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
            raise UnitDeviceError(f"simulated fault on GPU {gpu_index} measuring {unit['element']}")
    omega = OperatingPoint.from_dict(unit["omega"])
    grid = {k: [v] for k, v in omega.to_dict().items() if v is not None}
    try:
        work = resolve_work(unit["work"], device)
    except DeviceError as exc:      # the work cannot be loaded: not the GPU's fault, no retry
        raise CampaignError(f"work {unit['work']!r}: {exc}") from None
    try:
        res = sweep(device, {unit["kappa"]: work}, unit["element"], grid=grid or None,
                    protocol=Protocol(**spec["protocol"]), progress=None, ready_cache=ready_cache)
    except DeviceError as exc:
        raise UnitDeviceError(f"{type(exc).__name__}: {exc}") from None
    desc = device.describe()
    host = socket.gethostname()
    fields = {"gpu_model": gpu_model_of(device), "uuid": str(desc.get("uuid", "unknown")),
              "driver": str(desc.get("driver", "unknown")), "protocol": spec["protocol"],
              "host": host}
    return {"unit": unit["key"], "element": unit["element"], "kappa": unit["kappa"],
            "omega": unit["omega"],
            "signatures": [signature_to_dict(s) for s in res.signatures], "fields": fields,
            "measured_by": {"host": host, "uuid": fields["uuid"], "gpu_index": int(gpu_index),
                            "gpu_model": fields["gpu_model"], "pid": os.getpid()},
            "wall_s": time.time() - t0}


def _safe(key: str) -> str:
    import hashlib

    return hashlib.sha256(key.encode()).hexdigest()[:16]


# -- the driver -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class CampaignResult:
    """What one run of a campaign did: units in the campaign, already done before this run,
    measured and committed now, failed (unit key → error), and per GPU UUID how many units
    it measured in this run; ``work_failed``: the failed units whose work itself raised (not
    their GPU)."""

    name: str
    store: str
    total: int
    resumed: int
    measured: int
    failed: Mapping[str, str] = field(default_factory=dict)
    by_gpu: Mapping[str, int] = field(default_factory=dict)
    executor: str = "local"
    work_failed: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary."""
        return {"campaign": self.name, "store": self.store, "executor": self.executor,
                "units": self.total, "resumed": self.resumed, "measured": self.measured,
                "failed": dict(self.failed), "work_failed": list(self.work_failed),
                "by_gpu": dict(self.by_gpu)}

    def summary(self) -> str:
        """A few printable lines."""
        lines = [f"campaign {self.name} ({self.executor}): {self.total} unit(s): {self.resumed} "
                 f"already in {self.store}, {self.measured} measured now, {len(self.failed)} failed"]
        lines += [f"  {g}: {n} unit(s)" for g, n in sorted(self.by_gpu.items())]
        lines += [f"  failed {k}: {v}" for k, v in list(self.failed.items())[:5]]
        return "\n".join(lines)


class _Committer:
    """Commits records as they arrive (the driver's only store writes), keeps count and
    reports one progress event per unit done (committed or failed)."""

    def __init__(self, store: ResultsStore, spec: CampaignSpec, total: int, resumed: int,
                 progress: ProgressCallback | None):
        self.store, self.spec = store, spec
        self.total, self.done, self.progress = total, resumed, progress
        self.t0 = time.monotonic()
        self.measured = 0
        self.by_gpu: dict[str, int] = {}
        self.failed: dict[str, str] = {}
        self.work_failed: list[str] = []

    def commit(self, rec: Mapping[str, Any], attempts: int = 1) -> None:
        from frontier.pareto import signature_from_dict

        sigs = [(signature_from_dict(d, file="<worker>", path="signature"), rec["fields"])
                for d in rec["signatures"]]
        record = {k: v for k, v in rec.items() if k != "signatures"}
        record["attempts"] = attempts
        if self.store.commit_unit(self.spec.name, rec["unit"], record, sigs):
            self.measured += 1
            g = rec["measured_by"]["uuid"]
            self.by_gpu[g] = self.by_gpu.get(g, 0) + 1
        omega = OperatingPoint.from_dict(rec["omega"]).label()
        kappa = rec.get("kappa")
        self._tick(f"{rec['element']}{'/' + kappa if kappa else ''} @ {omega}", "measured")

    def fail(self, key: str, why: str, work: bool = False) -> None:
        self.failed[key] = why
        if work:
            self.work_failed.append(key)
        self._tick(key, "failed")

    def _tick(self, label: str, status: str) -> None:
        self.done += 1
        if self.progress is None:
            return
        elapsed = time.monotonic() - self.t0
        n = self.measured + len(self.failed)       # units of this run: the rate so far
        self.progress(ProgressEvent(self.done, self.total, label, elapsed,
                                    eta_s(elapsed, n, self.total - self.done),
                                    measured=status == "measured", operation=self.spec.name,
                                    status=status))


def _start_event(spec: CampaignSpec, store_path: Any, total: int, resumed: int) -> ProgressEvent:
    """The event a campaign reports before its first unit (a bar starts at ``resumed``)."""
    return ProgressEvent(resumed, total, spec.name, operation=spec.name,
                         message=f"campaign {spec.name}: {total} unit(s), {resumed} already in "
                                 f"{store_path}")


def run_campaign(spec: CampaignSpec, store_path: str | os.PathLike, *, gpus: int | None = None,
                 ray_address: str | None = None, progress: ProgressCallback | bool | None = None,
                 ray_cpus_per_task: float = 1.0) -> CampaignResult:
    """Measure every unit of ``spec`` not yet committed to the store at ``store_path`` (created
    if missing) and commit each as it arrives. ``gpus``: local workers (default: every GPU of
    the host; 1 simulated GPU); ``ray_address``: run units as Ray tasks instead (``"auto"``,
    ``"local"`` to start a one-machine cluster, or a cluster address). A rerun resumes.

    ``progress`` (default: none) gets a :class:`~measure.progress.ProgressEvent` before the
    first unit (``done`` = units already in the store) and one per unit committed or failed
    (``operation`` = the campaign's name). A bool (this parameter's older form, which drew a
    bar here) shows nothing: the caller draws it (``ecal`` does)."""
    if isinstance(progress, bool):
        progress = None
    units = shard(spec)
    keys = [u.key for u in units]
    if len(set(keys)) != len(keys):
        raise CampaignError(f"campaign {spec.name}: two units measure the same point (an element "
                            "listed with one implementation twice?)")
    if spec.device == "sim":     # check the grids before any worker starts
        from .factory import resolve_work
        from .sim import SimulatedGPU

        probe = SimulatedGPU()
        opset = probe.operating_set()
        for e in spec.elements:
            (e.grid or spec.grid).validate(opset)
            for _, w in e.works:
                resolve_work(w, probe)      # an unknown preset is bad input, before any work
    if ray_address is not None:      # a cluster that cannot be reached leaves no store behind
        _ray_for(spec, ray_address, gpus)
    with ResultsStore(store_path) as store:
        was = store.campaign_spec(spec.name)
        now = json.loads(json.dumps(spec.identity()))
        if was is not None:
            for k in sorted(set(was) | set(now)):
                if was.get(k) != now.get(k):
                    raise CampaignMismatchError(
                        f"{store_path}: campaign {spec.name!r} was run with {k} = {was.get(k)!r}, "
                        f"this run has {now.get(k)!r}; resuming would mix measurements (rename the "
                        "campaign or use another store)")
        store.register_campaign(spec.name, now)
        done = store.done_units(spec.name)
        todo = [u for u in units if u.key not in done]
        resumed = len(units) - len(todo)
        report(progress, _start_event(spec, store_path, len(units), resumed))
        com = _Committer(store, spec, len(units), resumed, progress)
        if todo:
            if ray_address is not None:
                _run_ray(spec, todo, com, ray_address, ray_cpus_per_task, gpus)
            else:
                n = gpus if gpus is not None else count_gpus(spec.device)
                _run_local(spec, todo, com, max(1, min(int(n), len(todo))))
    return CampaignResult(spec.name, str(store_path), len(units), resumed, com.measured,
                          com.failed, com.by_gpu, "ray" if ray_address is not None else "local",
                          tuple(com.work_failed))


# -- local executor -------------------------------------------------------------------------------

def _local_worker(kind: str, index: int, seed: int, spec: dict[str, Any], tasks: Any,
                  results: Any, driver_alive: Any, lock_wait_s: float = 15.0) -> None:
    """A worker process: hold GPU ``index`` (waiting up to ``lock_wait_s`` for its lock),
    measure units from ``tasks`` until ``None``. ``driver_alive``: the read end of a pipe
    only the driver can write to; it reads as ready (EOF) once the driver is gone, however it
    ended (SIGKILL included): :func:`_watch_driver` then ends this worker."""
    import signal

    from .locks import LockedError

    # Ctrl-C reaches the whole process group: the driver decides, and stops workers with
    # SIGTERM (the sweep in progress restores its GPU first)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch_driver(driver_alive, results)
    from .sweep import ReadyPowerCache

    ready = ReadyPowerCache()       # this GPU's ready-power calibrations, for all its units
    deadline = time.monotonic() + lock_wait_s
    while True:
        try:
            session = gpu_session(kind, index, seed)
            dev = session.__enter__()
            break
        except LockedError as exc:
            # a worker of a killed run may still be finishing its unit: give it a moment
            if time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            results.put(("dead", index, None, f"{type(exc).__name__}: {exc}"))
            return
        except Exception as exc:  # noqa: BLE001 - reported to the driver, which decides
            results.put(("dead", index, None, f"{type(exc).__name__}: {exc}"))
            return
    recovered = getattr(dev, "recovered", None)
    if recovered is not None:       # logged in this process, where no one shows it: tell the driver
        results.put(("note", index, None, recovered.summary()))
    try:
        while True:
            try:
                item = tasks.get(timeout=0.5)
            except queue.Empty:
                if driver_alive.poll():     # EOF: the driver died (even by SIGKILL): stop
                    results.cancel_join_thread()    # no one reads the records left
                    return
                continue
            if item is None:
                return
            results.put(("start", index, item["key"], None))
            try:
                results.put(("done", index, item["key"],
                             measure_unit(item, spec, dev, index, ready)))
            except UnitDeviceError as exc:
                results.put(("retry", index, item["key"], str(exc)))
            except Exception as exc:  # noqa: BLE001 - the work's own error: the unit fails
                results.put(("failed", index, item["key"], f"{type(exc).__name__}: {exc}"))
    finally:
        session.__exit__(None, None, None)


#: Seconds a worker whose driver died gives its unit in progress to stop on SIGTERM (a sweep
#: restores its GPU first) before it ends itself with SIGKILL.
WORKER_ORPHAN_GRACE_S = 30.0


def _watch_driver(driver_alive: Any, results: Any, grace_s: float = WORKER_ORPHAN_GRACE_S) -> Any:
    """Start the thread that ends this worker once its driver is gone.

    The worker's parent is the fork server, not the driver, so ``PR_SET_PDEATHSIG`` or a
    ``getppid()`` watch would not see the driver die; the pipe does: ``driver_alive`` reads as
    ready (EOF) once the driver's end is closed, which the kernel does when the driver exits by
    any means, SIGKILL included. Then the records not yet sent are dropped (no one reads them,
    and a full pipe would block the exit forever), and SIGTERM goes to the worker's main thread:
    outside a sweep it ends the process at once; inside one, the sweep's handler restores the
    GPU first (a restore in progress holds it back until done). If the worker is still alive
    ``grace_s`` later, it ends itself with SIGKILL. With the workers gone, the fork server and
    the resource tracker see their pipes close and exit too."""
    import signal
    import threading

    from .shield import SHIELDED_SIGNALS

    main = threading.main_thread().ident

    def watch() -> None:
        if hasattr(signal, "pthread_sigmask"):    # termination signals go to the main thread
            signal.pthread_sigmask(signal.SIG_BLOCK, SHIELDED_SIGNALS)
        try:
            driver_alive.poll(None)
        except (OSError, EOFError, ValueError):
            pass                                  # the pipe is gone: so is the driver
        with contextlib.suppress(Exception):
            results.cancel_join_thread()
        if main is not None and hasattr(signal, "pthread_kill"):
            signal.pthread_kill(main, signal.SIGTERM)
        else:                                     # pragma: no cover - not POSIX
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))

    t = threading.Thread(target=watch, name="ecal-driver-watch", daemon=True)
    t.start()
    return t


def _run_local(spec: CampaignSpec, todo: Sequence[Unit], com: _Committer, n_workers: int) -> None:
    import multiprocessing as mp

    # never fork this process (it has threads: a caller's progress bar, queue feeders); a fork server
    # imports the measuring code once and forks each worker from that clean process
    methods = mp.get_all_start_methods()
    ctx = mp.get_context("forkserver" if "forkserver" in methods else "spawn")
    if "forkserver" in methods:
        ctx.set_forkserver_preload(["measure.campaign", "measure.sweep", "measure.sim"])
    try:
        tasks, results = ctx.Queue(), ctx.Queue()
        alive_r, alive_w = ctx.Pipe(duplex=False)
    except OSError as exc:     # e.g. /dev/shm full: POSIX semaphores live there
        raise _named(exc, "/dev/shm (the worker queues' semaphores)") from None
    by_key = {u.key: u for u in todo}
    attempts = dict.fromkeys(by_key, 0)
    sd = spec.to_dict()
    procs = {i: ctx.Process(target=_local_worker, daemon=True, name=f"ecal-gpu{i}",
                            args=(spec.device, i, spec.seed, sd, tasks, results, alive_r))
             for i in range(n_workers)}
    try:
        for p in procs.values():
            p.start()
    except OSError as exc:     # e.g. no space for the fork server's socket
        import tempfile

        for p in procs.values():
            if p.pid is not None:
                p.terminate()
        raise _named(exc, f"{tempfile.gettempdir()} (the worker processes' fork server)") from None
    alive_r.close()
    for u in todo:
        tasks.put(u.to_dict())
    inflight: dict[int, str] = {}
    dead: dict[int, str] = {}
    left = set(by_key)
    try:
        while left:
            try:
                kind, idx, key, payload = results.get(timeout=1.0)
            except queue.Empty:
                for i, p in procs.items():
                    if i not in dead and not p.is_alive():
                        dead[i] = f"worker for GPU {i} exited ({p.exitcode})"
                        if i in inflight:            # its unit goes back in the queue
                            _requeue(inflight.pop(i), by_key, attempts, tasks, spec, com, left,
                                     dead[i])
                if len(dead) == len(procs):
                    raise CampaignError(f"campaign {spec.name}: every worker stopped; "
                                        f"first: {next(iter(dead.values()))}") from None
                continue
            if kind == "dead":
                dead[idx] = payload
            elif kind == "start":
                inflight[idx] = key
                attempts[key] += 1
            elif kind == "done":
                inflight.pop(idx, None)
                com.commit(payload, attempts[key])
                left.discard(key)
            elif kind == "retry":
                inflight.pop(idx, None)
                _requeue(key, by_key, attempts, tasks, spec, com, left, payload)
            elif kind == "note":            # e.g. the worker's GPU was recovered at open
                log.info("%s", payload)
            else:
                inflight.pop(idx, None)
                com.fail(key, payload, work=True)
                left.discard(key)
            if len(dead) == len(procs) and left:
                raise CampaignError(f"campaign {spec.name}: no GPU could be opened: "
                                    f"{next(iter(dead.values()))}")
    except BaseException:
        for p in procs.values():       # interrupted or failed: stop now, not after the queue
            if p.is_alive():
                p.terminate()
        raise
    finally:
        for _ in procs:
            tasks.put(None)
        for p in procs.values():
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()        # its sweep restores the GPU on SIGTERM
                p.join(timeout=10)
        # units left unsent (an interrupted run) must not keep this process from exiting
        tasks.cancel_join_thread()
        tasks.close()
        results.close()
        alive_w.close()


def _named(exc: OSError, where: str) -> OSError:
    """``exc`` with a file name (``where``) when it is a disk error that names none."""
    import errno

    disk = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, getattr(errno, "EDQUOT", -1)}
    if exc.filename is not None or exc.errno not in disk:
        return exc
    return type(exc)(exc.errno, exc.strerror or str(exc), where)


def _requeue(key: str, by_key: Mapping[str, Unit], attempts: dict[str, int], tasks: Any,
             spec: CampaignSpec, com: _Committer, left: set[str], why: str) -> None:
    if attempts[key] > spec.max_retries:
        com.fail(key, f"{why} (after {attempts[key]} attempts)")
        left.discard(key)
    else:
        tasks.put(by_key[key].to_dict())


# -- Ray executor ---------------------------------------------------------------------------------

#: The stand-in ``amdsmi`` package Ray processes get when the installed one is broken: shipped
#: in this package (``measure/_ray_hide_amdsmi/amdsmi/__init__.py``), never written at run time.
AMDSMI_STANDIN = Path(__file__).resolve().parent / "_ray_hide_amdsmi"


def import_ray() -> Any:
    """``import ray``, or a :class:`CampaignError` saying how to install it.

    Works around one known breakage: the ``amdsmi`` package installed without its shared
    library (e.g. pulled in by ``zeus``) raises ``KeyError`` on import, and Ray imports it in
    every one of its processes (its AMD GPU detection, which no setting turns off). Then this
    process treats ``amdsmi`` as absent, and the Ray processes started from here get the
    stand-in shipped with this package (:data:`AMDSMI_STANDIN`, first on ``PYTHONPATH``), which
    raises ImportError, so Ray skips AMD GPUs. Nothing is written, and nothing is loaded from
    the state folder or any other folder a user can write: the stand-in is used only when it
    and its folders are owned by root or the caller, are not symlinks and are writable by no
    one else; otherwise a one-line :class:`CampaignError` says to ``pip uninstall amdsmi``."""
    import importlib.util

    if "ray" not in sys.modules and importlib.util.find_spec("ray") is None:
        raise CampaignError("--ray needs Ray: pip install 'energy-calculus[ray]' "
                            "(or pip install 'ray>=2.9')")
    if _amdsmi_broken():
        unsafe = _unsafe_standin(AMDSMI_STANDIN)
        if unsafe:
            raise CampaignError(f"the installed amdsmi package is broken (its library "
                                f"libamd_smi.so is missing) and Ray imports it; the stand-in "
                                f"that hides it is not safe to load ({unsafe}): pip uninstall "
                                "amdsmi")
        sys.modules["amdsmi"] = None           # type: ignore[assignment]  # import -> ImportError
        # inherited by the raylet and workers a local ray.init starts from this process
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if str(AMDSMI_STANDIN) not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([str(AMDSMI_STANDIN), *paths])
    try:
        import ray
    except ImportError:
        raise CampaignError("--ray needs Ray: pip install 'energy-calculus[ray]' "
                            "(or pip install 'ray>=2.9')") from None
    return ray


def _unsafe_standin(folder: Path) -> str | None:
    """Why ``folder`` (the amdsmi stand-in) must not be put on ``PYTHONPATH``, or None: every
    entry in it (a ``__pycache__`` included) and the folder itself must be a real file or
    folder (no symlink) owned by root or the caller and writable by neither group nor others."""
    import stat

    me = os.geteuid() if hasattr(os, "geteuid") else None
    entries = [folder]
    for root, dirs, files in os.walk(folder, followlinks=False):
        entries += [Path(root, n) for n in dirs + files]
    if not (folder / "amdsmi" / "__init__.py").is_file():
        return f"{folder / 'amdsmi' / '__init__.py'} is missing"
    for p in entries:
        try:
            st = os.lstat(p)
        except OSError as exc:
            return f"{p}: {exc.strerror}"
        if stat.S_ISLNK(st.st_mode):
            return f"{p} is a symlink"
        if me is not None and st.st_uid not in (0, me):
            return f"{p} is owned by uid {st.st_uid}"
        if st.st_mode & 0o022:
            return f"{p} is writable by group or others"
    return None


def _amdsmi_broken() -> bool:
    import importlib.util

    if "amdsmi" in sys.modules:
        return False
    try:
        if importlib.util.find_spec("amdsmi") is None:
            return False
    except (ImportError, ValueError):
        return False
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            import amdsmi  # noqa: F401
    except ImportError:
        return False
    except Exception:  # noqa: BLE001 - exactly the breakage worked around
        sys.modules.pop("amdsmi", None)
        return True
    return False


def _ray_unit(unit: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """The body of a unit's Ray task: open the GPU Ray assigned, measure, return the record."""
    ray = import_ray()
    ids = ray.get_gpu_ids()
    if not ids:
        raise UnitDeviceError("the Ray task was given no GPU (num_gpus=1 expected)")
    index = int(ids[0])
    try:
        with gpu_session(spec["device"], index, spec["seed"]) as dev:
            if spec.get("gpu_model") and spec["device"] != "sim":
                from .store import model_matches

                if not model_matches(gpu_model_of(dev), spec["gpu_model"]):
                    raise UnitDeviceError(f"GPU {index} is a {gpu_model_of(dev)}, not a "
                                          f"{spec['gpu_model']}")
            rec = measure_unit(unit, spec, dev, index)
    except UnitDeviceError:
        raise
    except DeviceError as exc:      # e.g. the GPU's lock is held: retry elsewhere
        raise UnitDeviceError(f"{type(exc).__name__}: {exc}") from None
    ctx = ray.get_runtime_context()
    rec["measured_by"].update(node_id=ctx.get_node_id(), ray_gpu_ids=[str(i) for i in ids])
    return rec


def connect_ray(address: str, **init_kwargs: Any) -> Any:
    """``ray.init`` for ``--ray``: ``"local"`` starts a cluster on this machine, ``"auto"``
    joins the running one (``ray start`` / ``RAY_ADDRESS``), anything else is an address."""
    ray = import_ray()
    if not ray.is_initialized():
        kw = {"include_dashboard": False, "log_to_driver": False, **init_kwargs}
        if address == "local":
            ray.init(**kw)
        else:
            ray.init(address=address, **kw)
    return ray


def _ray_for(spec: CampaignSpec, address: str, gpus: int | None) -> Any:
    """Ray, connected, with at least one GPU in the cluster (else :class:`CampaignError`)."""
    # a cluster started here declares the simulated GPUs (Ray finds none on a CPU machine)
    local = {"num_gpus": gpus or 1} if address == "local" and spec.device == "sim" else {}
    ray = connect_ray(address, **local)
    if ray.cluster_resources().get("GPU", 0) < 1:
        raise CampaignError(f"the Ray cluster at {address} has no GPUs (for simulated GPUs, "
                            "start it with `ray start --head --num-gpus N`, or use --ray local "
                            "--gpus N)")
    return ray


def _run_ray(spec: CampaignSpec, todo: Sequence[Unit], com: _Committer, address: str,
             cpus_per_task: float, gpus: int | None) -> None:
    ray = _ray_for(spec, address, gpus)
    opts: dict[str, Any] = {"num_gpus": 1, "num_cpus": cpus_per_task,
                            "max_retries": spec.max_retries,
                            "retry_exceptions": [UnitDeviceError]}
    if spec.accelerator_type:
        opts["accelerator_type"] = spec.accelerator_type
    task = ray.remote(_ray_unit).options(**opts)
    sd = spec.to_dict()
    refs = {task.remote(u.to_dict(), sd): u.key for u in todo}
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=1.0)
        for ref in ready:
            try:
                rec = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - Ray gave up on this unit: record why
                cause = getattr(exc, "cause", None)
                com.fail(refs[ref], _first_line(exc),
                         work=cause is not None and not isinstance(cause, DeviceError))
                continue
            com.commit(rec)


def _first_line(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None) or exc
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[-1] if text else ''}"


def units_by_state(store_path: str | os.PathLike, spec: CampaignSpec) -> dict[str, list[str]]:
    """``{"done": [...], "todo": [...]}`` unit keys of ``spec`` in a store (for status)."""
    with ResultsStore(store_path) as st:
        done = st.done_units(spec.name)
    keys = [u.key for u in shard(spec)]
    return {"done": [k for k in keys if k in done], "todo": [k for k in keys if k not in done]}

