"""Characterization campaigns: many elements × κ × ω over many GPUs, resumable, into one store.

A campaign file (YAML or JSON, :func:`load_campaign`) lists elements (simulated presets or
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
import os
import queue
import socket
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frontier.errors import EnergyCalculusError, FormatError
from frontier.operating_point import OperatingPoint

from .device import Device, DeviceError
from .grid import Grid, GridError, parse_grid
from .protocol import Protocol
from .results_log import point_key
from .store import ResultsStore, StoreError

CAMPAIGN_FORMAT = "energy-calculus/campaign"
_TOP_FIELDS = {"format", "name", "device", "seed", "gpu_model", "accelerator_type", "elements",
               "grid", "protocol", "store", "max_retries", "simulate"}
_ELEMENT_FIELDS = {"name", "work", "kappas", "grid"}
_SIM_FIELDS = {"fail_once_dir"}


class CampaignError(EnergyCalculusError):
    """A campaign cannot run or some of its units failed (one-line message)."""


class CampaignMismatchError(StoreError):
    """The store holds a campaign of this name measured another way (device, seed, protocol):
    resuming it would mix measurements."""


class UnitDeviceError(DeviceError):
    """A GPU failed while measuring a unit (retried elsewhere). One message argument only, so
    it crosses process boundaries (multiprocessing, Ray) intact."""


@dataclass(frozen=True)
class ElementSpec:
    """One element of a campaign: its name, its implementations (κ label → work spec: a
    simulated preset name or ``module:function``; label None for a single implementation)
    and an optional grid of its own."""

    name: str
    works: tuple[tuple[str | None, str], ...]
    grid: Grid | None = None


@dataclass(frozen=True)
class CampaignSpec:
    """A parsed campaign file (see ``docs/campaign.md``)."""

    name: str
    elements: tuple[ElementSpec, ...]
    grid: Grid
    protocol: Protocol = Protocol()
    device: str = "sim"
    seed: int = 0
    gpu_model: str | None = None
    accelerator_type: str | None = None
    store: str | None = None
    max_retries: int = 3
    simulate: Mapping[str, Any] = field(default_factory=dict)

    def identity(self) -> dict[str, Any]:
        """What must match for a rerun to resume this campaign in a store (the elements and
        the grid may grow: units are keyed by point)."""
        return {"device": self.device, "seed": self.seed if self.device == "sim" else None,
                "gpu_model": self.gpu_model, "protocol": self.protocol.to_dict()}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (what workers receive)."""
        return {"name": self.name, "device": self.device, "seed": self.seed,
                "gpu_model": self.gpu_model, "protocol": self.protocol.to_dict(),
                "simulate": dict(self.simulate)}


@dataclass(frozen=True)
class Unit:
    """One unit of work: an element's implementation at one operating point (ω_dev and SM
    split). ``key`` is the unit's identity in the store (the results-file point key)."""

    element: str
    kappa: str | None
    work: str
    omega: OperatingPoint

    @property
    def key(self) -> str:
        """``[element, κ, ω]`` as canonical JSON (:func:`measure.results_log.point_key`)."""
        return point_key(self.element, self.kappa, self.omega)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (what a worker receives)."""
        return {"element": self.element, "kappa": self.kappa, "work": self.work,
                "omega": self.omega.to_dict(), "key": self.key}


# -- the campaign file --------------------------------------------------------------------------

def load_campaign(path: str | os.PathLike) -> CampaignSpec:
    """Read a campaign file (``.yaml``/``.yml`` needs PyYAML; anything else is JSON). Errors are
    :class:`FormatError` naming the file and the field."""
    file = str(path)
    text = Path(path).read_text(encoding="utf-8")
    if file.lower().endswith((".yaml", ".yml")):
        try:
            import yaml
        except ImportError:
            raise CampaignError(f"{file}: reading YAML needs PyYAML (pip install pyyaml), or "
                                "give the campaign as JSON") from None
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise FormatError(file, "content", f"invalid YAML: {str(exc).splitlines()[0]}") from None
    else:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise FormatError(file, "content", f"invalid JSON: {exc.msg} (line {exc.lineno})") from None
    return parse_campaign(doc, file, default_name=Path(path).stem)


def _grid(file: str, where: str, v: Any) -> Grid:
    try:
        return parse_grid(v)
    except (GridError, TypeError, ValueError) as exc:
        raise FormatError(file, where, str(exc)) from None


def parse_campaign(doc: Any, file: str = "<campaign>", default_name: str = "campaign") -> CampaignSpec:
    """A :class:`CampaignSpec` from a parsed campaign document (see :func:`load_campaign`)."""
    if not isinstance(doc, Mapping):
        raise FormatError(file, "content", "a campaign must be an object (mapping)")
    unknown = sorted(set(doc) - _TOP_FIELDS)
    if unknown:
        raise FormatError(file, unknown[0], f"unknown field; known: {', '.join(sorted(_TOP_FIELDS))}")
    if "format" in doc and doc["format"] != CAMPAIGN_FORMAT:
        raise FormatError(file, "format", f"{doc['format']!r} is not {CAMPAIGN_FORMAT!r}")
    name = doc.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise FormatError(file, "name", "must be a non-empty string")
    device = doc.get("device", "sim")
    if device not in ("sim", "nvml"):
        raise FormatError(file, "device", f"must be 'sim' or 'nvml', got {device!r}")
    seed = doc.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise FormatError(file, "seed", f"must be an integer, got {seed!r}")
    retries = doc.get("max_retries", 3)
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise FormatError(file, "max_retries", f"must be an integer >= 0, got {retries!r}")
    for f in ("gpu_model", "accelerator_type", "store"):
        if doc.get(f) is not None and not isinstance(doc[f], str):
            raise FormatError(file, f, f"must be a string, got {doc[f]!r}")
    grid = _grid(file, "grid", doc.get("grid"))
    proto = doc.get("protocol") or {}
    if not isinstance(proto, Mapping):
        raise FormatError(file, "protocol", "must be an object of Protocol settings")
    try:
        protocol = Protocol(**dict(proto))
    except TypeError as exc:
        raise FormatError(file, "protocol", str(exc)) from None
    except ValueError as exc:
        raise FormatError(file, "protocol", str(exc)) from None
    sim = doc.get("simulate") or {}
    if not isinstance(sim, Mapping) or set(sim) - _SIM_FIELDS:
        raise FormatError(file, "simulate", f"must be an object with fields {sorted(_SIM_FIELDS)}")
    els = doc.get("elements")
    if not isinstance(els, list) or not els:
        raise FormatError(file, "elements", "must be a non-empty list")
    elements = []
    seen: set[str] = set()
    for i, e in enumerate(els):
        where = f"elements[{i}]"
        if isinstance(e, str):
            e = {"work": e}
        if not isinstance(e, Mapping):
            raise FormatError(file, where, "must be a work name or an object")
        bad = sorted(set(e) - _ELEMENT_FIELDS)
        if bad:
            raise FormatError(file, f"{where}.{bad[0]}", f"unknown field; known: {sorted(_ELEMENT_FIELDS)}")
        if ("work" in e) == ("kappas" in e):
            raise FormatError(file, where, "give either work (one implementation) or kappas "
                                           "(label: work, one per implementation)")
        if "kappas" in e:
            ks = e["kappas"]
            if not isinstance(ks, Mapping) or not ks:
                raise FormatError(file, f"{where}.kappas", "must be a non-empty mapping label: work")
            works = tuple((str(k), v) for k, v in ks.items())
        else:
            works = ((None, e["work"]),)
        for k, w in works:
            if not isinstance(w, str) or not w:
                raise FormatError(file, f"{where}.{'kappas.' + k if k else 'work'}",
                                  "must be a preset name or module:function")
        nm = e.get("name", works[0][1] if len(works) == 1 else None)
        if not isinstance(nm, str) or not nm:
            raise FormatError(file, f"{where}.name", "an element with several kappas needs a name")
        if nm in seen:
            raise FormatError(file, f"{where}.name", f"element {nm!r} is listed twice")
        seen.add(nm)
        g = _grid(file, f"{where}.grid", e["grid"]) if e.get("grid") is not None else None
        elements.append(ElementSpec(nm, works, g))
    return CampaignSpec(name=name, elements=tuple(elements), grid=grid, protocol=protocol,
                        device=device, seed=seed, gpu_model=doc.get("gpu_model"),
                        accelerator_type=doc.get("accelerator_type"), store=doc.get("store"),
                        max_retries=retries, simulate=dict(sim))


def shard(spec: CampaignSpec) -> list[Unit]:
    """Every unit of the campaign: element × κ × grid point (its own grid, else the
    campaign's), in file order."""
    out = []
    for e in spec.elements:
        for op in (e.grid or spec.grid).points():
            for kappa, work in e.works:
                out.append(Unit(e.name, kappa, work, op))
    return out


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
    fail_dir = (spec.get("simulate") or {}).get("fail_once_dir")
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
    """Commits records as they arrive (the driver's only store writes) and keeps count."""

    def __init__(self, store: ResultsStore, spec: CampaignSpec, bar: Any):
        self.store, self.spec, self.bar = store, spec, bar
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
        self.bar.update(1)

    def fail(self, key: str, why: str, work: bool = False) -> None:
        self.failed[key] = why
        if work:
            self.work_failed.append(key)
        self.bar.update(1)


def _progress_bar(total: int, initial: int, name: str, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=name, unit="unit", file=sys.stderr,
                disable=not enabled, dynamic_ncols=True, mininterval=0.2)


def run_campaign(spec: CampaignSpec, store_path: str | os.PathLike, *, gpus: int | None = None,
                 ray_address: str | None = None, progress: bool = True,
                 ray_cpus_per_task: float = 1.0) -> CampaignResult:
    """Measure every unit of ``spec`` not yet committed to the store at ``store_path`` (created
    if missing) and commit each as it arrives. ``gpus``: local workers (default: every GPU of
    the host; 1 simulated GPU); ``ray_address``: run units as Ray tasks instead (``"auto"``,
    ``"local"`` to start a one-machine cluster, or a cluster address). A rerun resumes."""
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
        with contextlib.closing(_progress_bar(len(units), resumed, spec.name, progress)) as bar:
            com = _Committer(store, spec, bar)
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
    only the driver can write to; it reads as ready (EOF) once the driver is gone."""
    import signal

    from .locks import LockedError

    # Ctrl-C reaches the whole process group: the driver decides, and stops workers with
    # SIGTERM (the sweep in progress restores its GPU first)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
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
    try:
        while True:
            try:
                item = tasks.get(timeout=0.5)
            except queue.Empty:
                if driver_alive.poll():     # EOF: the driver died (even by SIGKILL): stop
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


def _run_local(spec: CampaignSpec, todo: Sequence[Unit], com: _Committer, n_workers: int) -> None:
    import multiprocessing as mp

    # never fork this process (it has threads: the progress bar, queue feeders); a fork server
    # imports the measuring code once and forks each worker from that clean process
    methods = mp.get_all_start_methods()
    ctx = mp.get_context("forkserver" if "forkserver" in methods else "spawn")
    if "forkserver" in methods:
        ctx.set_forkserver_preload(["measure.campaign", "measure.sweep", "measure.sim"])
    tasks, results = ctx.Queue(), ctx.Queue()
    by_key = {u.key: u for u in todo}
    attempts = dict.fromkeys(by_key, 0)
    sd = spec.to_dict()
    alive_r, alive_w = ctx.Pipe(duplex=False)
    procs = {i: ctx.Process(target=_local_worker, daemon=True, name=f"ecal-gpu{i}",
                            args=(spec.device, i, spec.seed, sd, tasks, results, alive_r))
             for i in range(n_workers)}
    for p in procs.values():
        p.start()
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


def _requeue(key: str, by_key: Mapping[str, Unit], attempts: dict[str, int], tasks: Any,
             spec: CampaignSpec, com: _Committer, left: set[str], why: str) -> None:
    if attempts[key] > spec.max_retries:
        com.fail(key, f"{why} (after {attempts[key]} attempts)")
        left.discard(key)
    else:
        tasks.put(by_key[key].to_dict())


# -- Ray executor ---------------------------------------------------------------------------------

_AMDSMI_SHIM = '''"""Stand-in for a broken amdsmi (its library is missing): Ray then skips AMD GPUs."""
raise ImportError("amdsmi is installed but libamd_smi.so is not (stand-in from energy-calculus)")
'''


def import_ray() -> Any:
    """``import ray``, or a :class:`CampaignError` saying how to install it.

    Works around one known breakage: the ``amdsmi`` package installed without its shared
    library (e.g. pulled in by ``zeus``) raises ``KeyError`` on import, and Ray imports it
    at start-up. Then this process treats it as absent, and Ray processes started from here
    get a stand-in package (on ``PYTHONPATH``) that does the same."""
    import importlib.util

    if "ray" not in sys.modules and importlib.util.find_spec("ray") is None:
        raise CampaignError("--ray needs Ray: pip install 'energy-calculus[ray]' "
                            "(or pip install 'ray>=2.9')")
    if _amdsmi_broken():
        from .locks import lock_dir

        sys.modules["amdsmi"] = None           # type: ignore[assignment]  # import -> ImportError
        shim = lock_dir() / "ray-amdsmi-shim"
        pkg = shim / "amdsmi"
        if not (pkg / "__init__.py").exists():
            pkg.mkdir(parents=True, exist_ok=True)
            (pkg / "__init__.py").write_text(_AMDSMI_SHIM)
        # inherited by the raylet and workers a local ray.init starts from this process
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if str(shim) not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([str(shim), *paths])
    try:
        import ray
    except ImportError:
        raise CampaignError("--ray needs Ray: pip install 'energy-calculus[ray]' "
                            "(or pip install 'ray>=2.9')") from None
    return ray


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

