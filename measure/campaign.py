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

from frontier.errors import FormatError, InputError
from frontier.formats import KINDS, check_format
from frontier.operating_point import OperatingPoint

from .device import Device, DeviceError
from .grid import Grid, GridError, parse_grid
from .progress import ProgressCallback, ProgressEvent, eta_s, report
from .protocol import Protocol
from .results_log import point_key
from .store import ResultsStore, StoreError

log = logging.getLogger(__name__)

#: The ``format`` a campaign file may name (optional: a hand-written campaign need not).
CAMPAIGN_FORMAT = KINDS["campaign"].tag
#: The ``format`` campaign files named before ``ecal.campaign/1`` (still read).
LEGACY_CAMPAIGN_FORMAT = "energy-calculus/campaign"
_TOP_FIELDS = {"format", "name", "device", "seed", "gpu_model", "accelerator_type", "elements",
               "grid", "protocol", "store", "max_retries", "simulate"}
_ELEMENT_FIELDS = {"name", "work", "kappas", "grid"}
#: ``simulate`` (tests, simulated GPUs only): ``fail_once_dir``: the first attempt of every
#: unit fails (a marker file per unit in that folder); ``unit_delay_s``: each unit first waits
#: this long (real time), so a campaign on the simulator lasts long enough to be interrupted.
_SIM_FIELDS = {"fail_once_dir", "unit_delay_s"}
#: Longest campaign or element name (they are keys in the store and appear in messages).
MAX_NAME = 256


class CampaignError(InputError):
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

#: Largest campaign file read (bytes): the example is 1 KB; 2 MiB is ~25,000 elements.
MAX_CAMPAIGN_BYTES = 2 * 1024 * 1024
#: Most values (nodes) a YAML campaign may hold once its aliases are expanded: an anchor may
#: be reused (``protocol: *fast``), but an alias bomb (aliases of aliases, each level
#: multiplying the size) is refused before anything reads the expanded value.
MAX_YAML_NODES = 200_000
#: Most characters of scalars a YAML campaign may hold once its aliases are expanded (a file
#: without aliases never exceeds it: its scalars are no longer than the file).
MAX_YAML_CHARS = MAX_CAMPAIGN_BYTES
#: Deepest nesting of a YAML campaign (a campaign needs 4 levels).
MAX_YAML_DEPTH = 100
#: Most units (element × κ × grid point) one campaign may have: each is a sweep on a GPU,
#: so 100,000 is already months of GPU time; the count is taken before any unit is made.
MAX_UNITS = 100_000
_FLOAT_MAX = 1.7976931348623157e308


def _show(v: Any, width: int = 60) -> str:
    """A short repr of a value from a campaign file for an error message: bounded work and
    length whatever the value (a deep or alias-shared structure is never expanded)."""
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxtuple, r.maxdict, r.maxset = 2, 4, 4, 4, 4
    r.maxstring = r.maxother = r.maxlong = width
    return _clip(r.repr(v), width)


def _clip(text: str, width: int = 200) -> str:
    """``text`` on one line, at most ``width`` characters (a longer one ends with ``...``)."""
    text = " ".join(text[:width * 2].split())
    return text if len(text) <= width else text[:width - 3] + "..."


class _Refused(Exception):
    """A YAML document this reader refuses (raised inside the loader): line (1-based) and why."""

    def __init__(self, line: int | None, why: str):
        super().__init__(why)
        self.line, self.why = line, why


def _strict_yaml_loader() -> type:
    """A ``yaml.SafeLoader`` subclass that refuses, with the line: nesting deeper than
    :data:`MAX_YAML_DEPTH`, a document whose aliases expand past :data:`MAX_YAML_NODES` values
    or :data:`MAX_YAML_CHARS` characters (checked on the composed node graph, before anything
    is constructed, in time proportional to the file), a recursive alias, a key given twice in
    one mapping, and numbers that are not finite 64-bit floats (``.nan``, ``.inf``, ``1e999``,
    integer literals of more than 309 digits)."""
    import math

    import yaml
    from yaml.nodes import MappingNode, ScalarNode, SequenceNode

    def line_of(node: Any) -> int | None:
        mark = getattr(node, "start_mark", None)
        return None if mark is None else mark.line + 1

    class StrictLoader(yaml.SafeLoader):
        _depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            self._depth += 1
            try:
                if self._depth > MAX_YAML_DEPTH:
                    raise _Refused(self.peek_event().start_mark.line + 1,
                                   f"nested deeper than {MAX_YAML_DEPTH} levels")
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

        def compose_document(self) -> Any:
            node = super().compose_document()
            _check_expansion(node)
            return node

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, MappingNode):
                first: dict[Any, int | None] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=True)
                    try:
                        hash(key)
                    except TypeError:
                        continue            # the base class refuses it ("unhashable key")
                    if key in first:
                        raise _Refused(line_of(key_node),
                                       f"key {_show(key)} given twice (first at line "
                                       f"{first[key]}); the later one would silently win")
                    first[key] = line_of(key_node)
            return super().construct_mapping(node, deep=deep)

        def construct_yaml_float(self, node: Any) -> Any:
            v = super().construct_yaml_float(node)
            if not math.isfinite(v):
                raise _Refused(line_of(node), f"number {_show(node.value, 24)} is not a finite "
                                              "64-bit float (NaN, infinity or overflow)")
            return v

        def construct_yaml_int(self, node: Any) -> Any:
            digits = sum(c.isdigit() for c in node.value)
            if digits > 309:
                raise _Refused(line_of(node), f"integer of {digits} digits overflows a 64-bit "
                                              "float")
            v = super().construct_yaml_int(node)
            if abs(v) > _FLOAT_MAX:
                raise _Refused(line_of(node), f"integer {_show(node.value, 24)} overflows a "
                                              "64-bit float")
            return v

    StrictLoader.add_constructor("tag:yaml.org,2002:float", StrictLoader.construct_yaml_float)
    StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)

    def _check_expansion(root: Any) -> None:
        # sizes of every distinct node once expanded, memoised: an alias adds its target's size
        # without being walked again, so a bomb is measured (and refused) in linear time
        size: dict[int, tuple[int, int]] = {}
        open_: set[int] = set()
        stack: list[tuple[Any, bool]] = [(root, False)]
        while stack:
            node, closing = stack.pop()
            k = id(node)
            if isinstance(node, ScalarNode):
                kids: list[Any] = []
            elif isinstance(node, SequenceNode):
                kids = list(node.value)
            elif isinstance(node, MappingNode):
                kids = [x for pair in node.value for x in pair]
            else:
                kids = []
            if closing:
                open_.discard(k)
                n = 1 + sum(size[id(c)][0] for c in kids)
                c = (len(node.value) if isinstance(node, ScalarNode) else 0) + \
                    sum(size[id(x)][1] for x in kids)
                size[k] = (n, c)
                if n > MAX_YAML_NODES:
                    raise _Refused(line_of(node), f"the document expands to more than "
                                                  f"{MAX_YAML_NODES:,} values (YAML aliases "
                                                  "multiplying one another?)")
                if c > MAX_YAML_CHARS:
                    raise _Refused(line_of(node), f"the document expands to more than "
                                                  f"{MAX_YAML_CHARS:,} characters (YAML "
                                                  "aliases multiplying one another?)")
                continue
            if k in size:
                continue
            if k in open_:
                raise _Refused(line_of(node), "a YAML alias refers to a value that contains "
                                              "it (a recursive structure)")
            open_.add(k)
            stack.append((node, True))
            stack.extend((x, False) for x in reversed(kids))

    return StrictLoader


def load_campaign(path: str | os.PathLike) -> CampaignSpec:
    """Read a campaign file: ``.yaml``/``.yml`` with PyYAML through a strict loader
    (:func:`_strict_yaml_loader`: no alias bombs, no duplicate keys, finite numbers, bounded
    depth), anything else as JSON through :func:`frontier.files.read_json` (finite numbers,
    bounded depth). Either way a UTF-8 BOM is accepted and a binary or non-UTF-8 file refused;
    the file may hold at most :data:`MAX_CAMPAIGN_BYTES`. Errors are one-line
    :class:`FormatError` naming the file and the line or field, and never quote more than a
    short, truncated piece of a value."""
    from frontier.files import read_json, read_text

    file = str(path)
    try:
        n_bytes = os.stat(file).st_size
    except OSError as exc:
        raise FormatError(file, "(file)", f"cannot read: {exc.strerror or exc}") from None
    if n_bytes > MAX_CAMPAIGN_BYTES:
        raise FormatError(file, "(file)", f"{n_bytes:,} bytes; a campaign file may hold at most "
                                          f"{MAX_CAMPAIGN_BYTES:,}")
    if file.lower().endswith((".yaml", ".yml")):
        try:
            import yaml
        except ImportError:
            raise CampaignError(f"{file}: reading YAML needs PyYAML (pip install pyyaml), or "
                                "give the campaign as JSON") from None
        text = read_text(file, "YAML text")
        loader = _strict_yaml_loader()(text)
        try:
            doc = loader.get_single_data()
        except _Refused as exc:
            raise FormatError(file, f"line {exc.line}" if exc.line else "(file)", exc.why) from None
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            where = f"line {mark.line + 1} column {mark.column + 1}" if mark else "(file)"
            why = exc.problem or exc.context or type(exc).__name__
            raise FormatError(file, where, f"invalid YAML: {_clip(why)}") from None
        except yaml.YAMLError as exc:
            raise FormatError(file, "(file)", f"invalid YAML: {_clip(str(exc))}") from None
        except RecursionError:
            raise FormatError(file, "(file)", f"YAML nested too deeply (limit "
                                              f"{MAX_YAML_DEPTH})") from None
        finally:
            loader.dispose()
    else:
        doc = read_json(file)
    return parse_campaign(doc, file, default_name=Path(path).stem)


def _grid(file: str, where: str, v: Any) -> Grid:
    if isinstance(v, str):
        _check_ranges(file, where, v)
    try:
        return parse_grid(v)
    except (GridError, TypeError, ValueError) as exc:
        raise FormatError(file, where, _clip(str(exc))) from None


def _check_ranges(file: str, where: str, text: str) -> None:
    """Refuse a ``start:stop:step`` range of more than :data:`MAX_UNITS` values before the
    grid parser lists them (``sm_clock_mhz=1:1e12:1`` would not fit in memory)."""
    for token in text.split(","):
        parts = token.partition("=")[2].split(":") if "=" in token else token.split(":")
        if len(parts) != 3:
            continue
        try:
            start, stop, step = (float(p) for p in parts)
        except ValueError:
            continue                     # the grid parser names the bad token
        if step != 0 and abs((stop - start) / step) > MAX_UNITS:
            raise FormatError(file, where, f"range {_clip(token.strip(), 60)} has more than "
                                           f"{MAX_UNITS:,} values")


def parse_campaign(doc: Any, file: str = "<campaign>", default_name: str = "campaign") -> CampaignSpec:
    """A :class:`CampaignSpec` from a parsed campaign document (see :func:`load_campaign`)."""
    if not isinstance(doc, Mapping):
        raise FormatError(file, "content", "a campaign must be an object (mapping)")
    unknown = sorted((str(k) for k in set(doc) - _TOP_FIELDS), key=str)
    if unknown:
        raise FormatError(file, _clip(unknown[0], 60),
                          f"unknown field; known: {', '.join(sorted(_TOP_FIELDS))}")
    check_format(file, doc, "campaign", required=False)
    name = doc.get("name", default_name)
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        raise FormatError(file, "name", f"must be a non-empty string of at most {MAX_NAME} "
                                        "characters")
    device = doc.get("device", "sim")
    if not isinstance(device, str) or device not in ("sim", "nvml"):
        raise FormatError(file, "device", f"must be 'sim' or 'nvml', got {_show(device)}")
    seed = doc.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise FormatError(file, "seed", f"must be an integer, got {_show(seed)}")
    retries = doc.get("max_retries", 3)
    if not isinstance(retries, int) or isinstance(retries, bool) or not 0 <= retries <= 1000:
        raise FormatError(file, "max_retries", f"must be an integer from 0 to 1000, got "
                                               f"{_show(retries)}")
    for f in ("gpu_model", "accelerator_type", "store"):
        if doc.get(f) is not None and not isinstance(doc[f], str):
            raise FormatError(file, f, f"must be a string, got {_show(doc[f])}")
    grid = _grid(file, "grid", doc.get("grid"))
    proto = doc.get("protocol") or {}
    if not isinstance(proto, Mapping):
        raise FormatError(file, "protocol", "must be an object of Protocol settings")
    try:
        protocol = Protocol(**dict(proto))
    except (TypeError, ValueError) as exc:
        raise FormatError(file, "protocol", _clip(str(exc))) from None
    sim = doc.get("simulate") or {}
    if not isinstance(sim, Mapping) or set(sim) - _SIM_FIELDS:
        raise FormatError(file, "simulate", f"must be an object with fields {sorted(_SIM_FIELDS)}")
    if sim.get("fail_once_dir") is not None and not isinstance(sim["fail_once_dir"], str):
        raise FormatError(file, "simulate.fail_once_dir", "must be a folder name")
    delay = sim.get("unit_delay_s", 0)
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay <= 3600:
        raise FormatError(file, "simulate.unit_delay_s", f"must be seconds from 0 to 3600, got "
                                                         f"{_show(delay)}")
    els = doc.get("elements")
    if not isinstance(els, list) or not els:
        raise FormatError(file, "elements", "must be a non-empty list")
    elements = []
    seen: set[str] = set()
    n_units = 0
    for i, e in enumerate(els):
        where = f"elements[{i}]"
        if isinstance(e, str):
            e = {"work": e}
        if not isinstance(e, Mapping):
            raise FormatError(file, where, "must be a work name or an object")
        bad = sorted((str(k) for k in set(e) - _ELEMENT_FIELDS), key=str)
        if bad:
            raise FormatError(file, f"{where}.{_clip(bad[0], 60)}",
                              f"unknown field; known: {sorted(_ELEMENT_FIELDS)}")
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
                raise FormatError(file, f"{where}.{'kappas.' + _clip(k, 60) if k else 'work'}",
                                  "must be a preset name or module:function")
        nm = e.get("name", works[0][1] if len(works) == 1 else None)
        if not isinstance(nm, str) or not nm:
            raise FormatError(file, f"{where}.name", "an element with several kappas needs a name")
        if len(nm) > MAX_NAME:
            raise FormatError(file, f"{where}.name", f"longer than {MAX_NAME} characters")
        if nm in seen:
            raise FormatError(file, f"{where}.name", f"element {_show(nm)} is listed twice")
        seen.add(nm)
        g = _grid(file, f"{where}.grid", e["grid"]) if e.get("grid") is not None else None
        elements.append(ElementSpec(nm, works, g))
        n_units += len(g if g is not None else grid) * len(works)
        if n_units > MAX_UNITS:
            raise FormatError(file, where, f"the campaign has more than {MAX_UNITS:,} units "
                                           "(element x kappa x grid point); split it")
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

