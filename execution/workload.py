"""Workload files: which elements a training step runs, where their signatures are, and the
shape of the step (``"format": "ecal.workload/1"``). ``ecal plan`` and ``ecal pareto`` read
them directly; see docs/workload.md for the full description. Example::

    {"format": "ecal.workload/1",
     "name": "my-4-stage-step",
     "elements": {"fwd": {"source": "fwd.json", "element": "stage_forward"},
                  "bwd": "bwd.json"},
     "shape": {"kind": "1f1b", "stages": 4, "microbatches": 8,
               "forward": "fwd", "backward": "bwd"},
     "idle_power_w": 75.0,
     "transitions": {"constant": {"time_s": 0.002, "energy_j": 0.0}},
     "steady_state": true}

Top-level keys:

- ``format`` (required) ``"ecal.workload/1"``; ``name`` (optional label).
- ``elements`` (required): name → ``{"source": PATH, "element": NAME, "kappa": K,
  "gpu_model": G}`` or just ``PATH`` (the file then holds exactly one element). ``source`` is a
  file ``ecal characterize -o`` or ``ecal import`` writes (a signature file), the JSON that
  ``ecal characterize --json`` prints (``energy-calculus/characterization``), a workbook's
  ``signatures``, or a results store ending in ``.sqlite``/``.db`` (read with
  ``measure.store.read_signatures``; ``gpu_model`` selects a GPU there). ``element`` is the
  element's name in that file (default: the entry's name when the file has it, else the only
  element). ``kappa`` keeps only that implementation. Every signature of the element becomes
  one option (operating point) of the tasks that run it. ``work`` (optional) is the code the
  element runs, as ``ecal characterize`` takes it (``module:factory`` or a simulated preset):
  ``ecal run PLAN --workload FILE`` executes the plan with it (default: the element's name
  when that is a simulated preset).
- ``shape`` (required), by ``kind``:

  - ``"1f1b"`` and ``"gpipe"``: ``stages`` S, ``microbatches`` M, ``forward`` and
    ``backward``: one element name for every stage, or a list of S names;
  - ``"interleaved-1f1b"``: as above plus ``chunks`` v (≥ 2) and optional ``group_size`` N
    (Megatron-LM's ``microbatch_group_size_per_vp_stage``, default S); ``forward`` /
    ``backward``: a name, a list of S entries, each a name or a list of v names (per chunk);
  - ``"chain"``: ``tasks`` (element names or ``{"name", "element"}``) run in order on
    ``device`` (default ``"gpu0"``);
  - ``"dag"``: ``tasks`` (``{"name", "element", "device"}``, listed in each device's order)
    and ``edges`` (``[before, after]`` pairs of task names).

  Pipeline devices are ``stage0`` … ``stage{S-1}`` (rank r runs ``stage{r}``); task names are
  ``s{stage}/{forward|backward}/{microbatch}`` (interleaved: ``s{stage}v{chunk}/…``).
- ``idle_power_w``: the power a device draws while it waits (e.g. Perseus' P2P-blocking power),
  one number for every device or an object per device; required unless every device has it
  under ``devices``.
- ``transitions`` (required, unless every device has its own under ``devices`` or the
  caller overrides them): the cost of switching ω_dev on every device: ``{"file": PATH}`` to
  a transition table measured on the device (``ecal transitions WORKLOAD -o PATH``; pairs
  measured, the others by the rule fitted to them), such a table inline
  (``frontier.transition.TransitionTable.to_dict``), a constant ``{"constant": {"time_s",
  "energy_j"}}``, or ``"free"``: switching costs nothing, an assumption every plan then
  prints (:attr:`Workload.assumptions`). Absent: refused (:data:`MISSING_TRANSITIONS`);
  switches are never free by accident.
- ``devices``: per device ``{"idle_power_w": W, "transitions": RULE or "free"}`` overriding
  the above.
- ``steady_state``: the step repeats, so each device's switch from its last task back to its
  first is charged (default true for pipeline shapes, false for chain and dag).
- ``ranks``: the device of rank 0, 1, … (default for pipelines: ``stage0`` …; none otherwise).
- ``reorderable``: groups of task names whose order is free (chain and dag shapes): each two or
  more tasks consecutive on one device with no dependency path between them
  (:attr:`Workload.reorderable`; ``ecal reorder`` searches their orders).

Relative paths resolve against the workload file's folder. The format is declared once, as
:class:`execution.workload_models.WorkloadFile` (``ecal schema workload``), which checks
shape and types; this module checks what values mean. Bad input is a one-line
:class:`~frontier.errors.FormatError` naming the file and the key: unknown keys, missing
element files, an element not in its file, NaN or negative numbers, unknown element names in
the shape.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard, TypeVar

from frontier.errors import EnergyCalculusError, FormatError
from frontier.formats import KINDS, content, validate
from frontier.operating_point import OperatingPoint
from frontier.signature import Signature
from solvers.model import Problem

if TYPE_CHECKING:   # the models import pydantic: imported when a workload is read
    from pydantic import BaseModel

    from .workload_models import ElementSource, WorkloadFile

M = TypeVar("M", bound="BaseModel")

#: ``format`` of the workload files this code writes (:data:`frontier.formats.KINDS`).
WORKLOAD_FORMAT = KINDS["workload"].tag
CHARACTERIZATION_FORMAT = "energy-calculus/characterization"
PIPELINE_KINDS = ("1f1b", "gpipe", "interleaved-1f1b")
SHAPE_KINDS = PIPELINE_KINDS + ("chain", "dag")

#: ``"transitions": "free"``: switching ω_dev costs nothing, said as an assumption.
FREE = "free"

#: Why a workload without ``transitions`` is refused, and the ways to give them (one line).
MISSING_TRANSITIONS = (
    "missing: say what a switch of clocks or power limit costs: measured on the device "
    "(`ecal transitions WORKLOAD --device nvml:0 -o transitions.json`, then \"transitions\": "
    "{\"file\": \"transitions.json\"}), a fitted rule or a constant (a transition table with a "
    "\"rule\", or {\"constant\": {\"time_s\": 0.004}}), or \"transitions\": \"free\" to plan "
    "switches as free (the plan prints it as an assumption)")


@dataclass(frozen=True)
class Workload:
    """A workload file, read: the planning problem it describes and what a schedule carries.

    ``problem`` is the :class:`solvers.model.Problem`; ``steady_state`` what the file asked for
    (the problem has it too when the model supports it); ``ranks`` the device of each rank
    (None when the shape has no ranks); ``ready_power_w`` per device, the ready power recorded
    with the signatures of that device's elements at its top operating point (None when none
    was recorded); ``simulated`` whether any signature came from the simulated GPU.
    """

    name: str
    file: str
    kind: str
    problem: Problem
    steady_state: bool
    ranks: tuple[str, ...] | None = None
    ready_power_w: Mapping[str, float | None] = field(default_factory=dict)
    simulated: bool = False
    #: task name → the workload element it runs (the entry's name under ``elements``)
    task_elements: Mapping[str, str] = field(default_factory=dict)
    #: element → the work it runs (``module:factory`` or a preset), when the file says or the
    #: element's name in its source is a simulated preset
    works: Mapping[str, str] = field(default_factory=dict)
    #: what the file assumes rather than measures, one sentence each, for every plan to print
    #: (e.g. ``switches are free (transitions: free in w.json)``)
    assumptions: tuple[str, ...] = ()
    #: groups of task names whose order is free (``reorderable``), each in its given order
    reorderable: tuple[tuple[str, ...], ...] = ()
    #: ``element@ω`` → the die temperature its signature was measured at, °C (the mean of its
    #: windows' entry and exit readings, ``meta["temperatures_c"]``), where recorded
    characterized_temp_c: Mapping[str, float] = field(default_factory=dict)


def is_workload(doc: Any) -> bool:
    """Whether a parsed JSON document is a workload file."""
    return isinstance(doc, Mapping) and doc.get("format") == WORKLOAD_FORMAT


def check_workload_format(file: str, doc: Mapping[str, Any]) -> int:
    """The version of workload document ``doc`` (:func:`frontier.formats.check_format`); the
    error says which ``format`` was expected."""
    return _content(file, doc)[0]


def _content(file: str, doc: Any) -> tuple[int, dict[str, Any]]:
    """:func:`frontier.formats.content` of a workload document: its version and its body."""
    try:
        return content(file, doc, "workload")
    except FormatError as exc:
        if "expected" in exc.problem:
            raise
        raise FormatError(file, exc.path, f"expected {WORKLOAD_FORMAT!r}: {exc.problem}") from None


def load_workload(path: str | os.PathLike, *, microbatches: int | None = None,
                  idle_power_w: float | None = None, transitions: Any = None,
                  require_transitions: bool = True, max_tasks: int | None = -1) -> Workload:
    """Read a workload file (format in the module docstring) into a :class:`Workload`.

    ``microbatches`` overrides a pipeline shape's M; ``idle_power_w`` every device's idle
    power; ``transitions`` (a rule with ``cost(frm, to)``) every device's switching cost (then
    the file need not give them). ``require_transitions=False`` reads a file that gives none
    (switches free, said in ``assumptions``): what ``ecal transitions`` does to learn which
    operating points to measure. ``max_tasks`` (-1, the default:
    :data:`solvers.options.DEFAULT_MAX_TASKS`; None: no limit): more tasks raise
    :class:`solvers.model.ProblemTooLargeError` before any is built (``--max-tasks``).
    """
    from frontier.files import read_json

    file = str(path)
    return workload_from_dict(read_json(file), file, microbatches=microbatches,
                              idle_power_w=idle_power_w, transitions=transitions,
                              require_transitions=require_transitions, max_tasks=max_tasks)


def workload_from_dict(doc: Any, file: str = "<workload>", *, base_dir: str | os.PathLike | None = None,
                       microbatches: int | None = None, idle_power_w: float | None = None,
                       transitions: Any = None, require_transitions: bool = True,
                       max_tasks: int | None = -1) -> Workload:
    """Build a :class:`Workload` from a parsed workload document; relative paths resolve
    against ``base_dir`` (default: the folder of ``file``). Options as :func:`load_workload`."""
    from solvers.model import ProblemError
    from solvers.options import DEFAULT_MAX_TASKS

    from .workload_models import WorkloadFile

    r = _Reader(file, Path(base_dir) if base_dir is not None else Path(file).resolve().parent)
    r.max_tasks = DEFAULT_MAX_TASKS if max_tasks == -1 else max_tasks
    m = r.check(WorkloadFile, _content(file, doc)[1])
    name = m.name or Path(file).stem
    specs = r.elements(m.elements)
    shape = m.shape
    if not isinstance(shape, dict):
        raise FormatError(file, "shape", f"must be an object, got {_got(shape)}")
    kind = shape.get("kind")
    if kind not in SHAPE_KINDS:
        raise FormatError(file, "shape.kind", f"must be one of {', '.join(SHAPE_KINDS)}, got {kind!r}")
    pipeline = kind in PIPELINE_KINDS
    steady = pipeline if m.steady_state is None else m.steady_state
    if microbatches is not None and not pipeline:
        raise FormatError(file, "shape.kind", f"--microbatches applies to pipeline shapes, not {kind!r}")

    if pipeline:
        layout, uses, devices = r.pipeline_shape(kind, shape, microbatches)
    else:
        layout, uses, devices = r.graph_shape(kind, shape)
    for el, where in uses.items():
        if el not in specs:
            raise FormatError(file, where, f"names element {el!r}, which is not in elements "
                                           f"(has: {', '.join(sorted(specs)) or 'none'})")
    options = {el: r.options(el, specs[el]) for el in uses}

    idle, rules, free = r.devices(m, devices, idle_power_w,
                                  require_transitions and transitions is None)
    assumptions: tuple[str, ...] = ()
    if transitions is not None:
        rules = {d: transitions for d in devices}
    else:
        assumptions = _free_assumptions(file, free)
    ranks = r.ranks(m.ranks, devices, pipeline)
    tasks = [(nm, dev, options[el]) for nm, dev, el in layout["tasks"]]
    try:
        from solvers.pipeline import build_problem

        problem = build_problem(tasks, layout["edges"], idle, rules or None, name, steady)
    except (ProblemError, EnergyCalculusError) as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(file, "shape", str(exc)) from None
    ready = {d: _top_ready_power([r.signatures_of(el) for el in layout["device_elements"][d]],
                                 [r.file_ready_power(el) for el in layout["device_elements"][d]])
             for d in devices}
    simulated = any(bool(s.meta.get("simulated")) for el in uses for s in r.signatures_of(el))
    task_elements = {nm: el for nm, _dev, el in layout["tasks"]}
    works = {el: w for el in uses if (w := r.work_of(el)) is not None}
    groups = _reorderable(file, kind, m.reorderable, layout["tasks"], layout["edges"])
    temps = {f"{el}@{sg.omega.dev.label()}": t for el in uses for sg in r.signatures_of(el)
             if (t := _window_temp_c(sg)) is not None}
    return Workload(name, file, kind, problem, steady, ranks, ready, simulated, task_elements, works,
                    assumptions, groups, temps)


def _window_temp_c(sig: Signature) -> float | None:
    """The mean die temperature of a signature's measurement windows (``meta["temperatures_c"]``:
    one [entry, exit] pair per window, °C), or None when it has none."""
    pairs = sig.meta.get("temperatures_c") if isinstance(sig.meta, Mapping) else None
    try:
        vals = [float(v) for w in pairs or () for v in w]
    except (TypeError, ValueError):
        return None
    vals = [v for v in vals if math.isfinite(v)]
    return sum(vals) / len(vals) if vals else None


def _reorderable(file: str, kind: str, given: Sequence[Sequence[str]] | None,
                 tasks: Sequence[tuple[str, str, str]],
                 edges: Sequence[tuple[str, str]]) -> tuple[tuple[str, ...], ...]:
    """The ``reorderable`` groups, checked: chain or dag shapes only; every name a task,
    in one group at most; a group's tasks on one device, consecutive in its order, and with
    no dependency path between any two of them (through other tasks or devices)."""
    if not given:
        return ()
    if kind in PIPELINE_KINDS:
        raise FormatError(file, "reorderable", f"applies to chain and dag shapes, not {kind!r} "
                          "(a pipeline's order is its schedule)")
    device = {nm: dev for nm, dev, _ in tasks}
    seq: dict[str, list[str]] = {}
    for nm, dev, _ in tasks:
        seq.setdefault(dev, []).append(nm)
    seen: set[str] = set()
    out = []
    for g, group in enumerate(given):
        path = f"reorderable[{g}]"
        for nm in group:
            if nm not in device:
                raise FormatError(file, path, f"names unknown task {nm!r}")
            if nm in seen:
                raise FormatError(file, path, f"task {nm!r} is in more than one group (or twice)")
            seen.add(nm)
        devs = sorted({device[nm] for nm in group})
        if len(devs) != 1:
            raise FormatError(file, path, f"tasks on devices {', '.join(devs)}: a group's tasks "
                              "must run on one device")
        order = seq[devs[0]]
        where = sorted(order.index(nm) for nm in group)
        if where[-1] - where[0] != len(group) - 1:
            raise FormatError(file, path, f"tasks are not consecutive on {devs[0]} (its order: "
                              f"{', '.join(order)}); a group is a run of consecutive tasks")
        members = set(group)
        succ: dict[str, list[str]] = {}
        for a, b in edges:
            succ.setdefault(a, []).append(b)
        for tasks_of in seq.values():
            for a, b in zip(tasks_of, tasks_of[1:]):
                if not (a in members and b in members):
                    succ.setdefault(a, []).append(b)
        for start in group:
            stack, reached = list(succ.get(start, ())), set()
            while stack:
                x = stack.pop()
                if x in reached:
                    continue
                if x in members:
                    raise FormatError(file, path, f"task {x!r} depends on {start!r}: their order "
                                      "is not free")
                reached.add(x)
                stack.extend(succ.get(x, ()))
        out.append(tuple(order[i] for i in where))
    return tuple(out)


def _free_assumptions(file: str, free: Mapping[str, str]) -> tuple[str, ...]:
    """The assumption sentences of the devices whose switches are free (device → the key that
    said so, or ``""`` when nothing did and none was required)."""
    if not free:
        return ()
    by_key: dict[str, list[str]] = {}
    for d, key in free.items():
        by_key.setdefault(key, []).append(d)
    out = []
    for key, devs in by_key.items():
        where = "switches are free" if key == "transitions" else f"switches on {', '.join(devs)} are free"
        said = f"{key}: free in {file}" if key else f"no transitions in {file}"
        out.append(f"{where} ({said})")
    return tuple(out)


def _top_ready_power(sig_lists: Sequence[Sequence[Signature]],
                     file_maps: Sequence[Mapping[str, float]]) -> float | None:
    """Ready power at the top ω_dev (highest clocks and limit; an unset knob is the device's
    own maximum) among the signatures that recorded one."""
    seen: dict[OperatingPoint, float] = {}
    for sigs, fmap in zip(sig_lists, file_maps):
        for s in sigs:
            dev = s.omega.dev
            w = s.meta.get("ready_power_w")
            if not _is_number(w):
                w = fmap.get(dev.label())
            if _is_number(w):
                seen.setdefault(dev, float(w))
    if not seen:
        return None

    def rank(op: OperatingPoint) -> tuple[float, ...]:
        return tuple(math.inf if v is None else float(v)
                     for v in (op.sm_clock_mhz, op.power_limit_w, op.mem_clock_mhz))

    return seen[max(seen, key=rank)]


def _is_number(v: Any) -> TypeGuard[float]:
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and v >= 0)


def _got(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class _ElementSpec:
    key: str            # path in the workload file, e.g. elements.fwd
    source: Path
    element: str | None
    kappa: str | None
    gpu_model: str | None
    given_name: str     # the entry's own name (default element name)


class _Reader:
    """Strict reading of one workload document: every error names the file and the key."""

    def __init__(self, file: str, base: Path):
        self.file = file
        self.base = base
        self.max_tasks: int | None = None      # set by workload_from_dict
        self._files: dict[tuple, tuple[dict[str, list[Signature]], dict[str, float]]] = {}
        self._specs: dict[str, _ElementSpec] = {}
        self._works: dict[str, str] = {}

    # -- small checks ---------------------------------------------------------------------
    def check(self, model: type[M], doc: Any, prefix: str = "") -> M:
        """``doc`` validated by ``model`` (:func:`frontier.formats.validate`); an unknown key
        is named as such, with the keys known there."""
        from .workload_models import known_keys

        try:
            return validate(model, doc, self.file, prefix)
        except FormatError as exc:
            if not exc.problem.startswith("unknown field"):
                raise
            rel = exc.path[len(prefix) + 1:] if prefix else exc.path
            known = known_keys(model, rel)
            raise FormatError(self.file, exc.path, "unknown key" + (
                f" (known: {', '.join(known)})" if known else "")) from None

    def number(self, path: str, v: Any) -> float:
        from frontier.codec import number_field

        return number_field(self.file, path, v)

    # -- elements ---------------------------------------------------------------------------
    def elements(self, entries: Mapping[str, ElementSource]) -> dict[str, _ElementSpec]:
        """The element specs of the file's ``elements`` (validated by its model): each source
        must exist, and ``gpu_model`` applies to results stores only."""
        for nm, e in entries.items():
            path = f"elements.{nm}"
            src = Path(e.source)
            src = src if src.is_absolute() else self.base / src
            if not src.is_file():
                raise FormatError(self.file, f"{path}.source", f"{src}: no such file")
            if e.work is not None:
                self._works[nm] = e.work
            if e.gpu_model is not None and not _is_store(src):
                raise FormatError(self.file, f"{path}.gpu_model",
                                  f"applies to results stores (.sqlite, .db, .sqlite3), not {src.name}")
            self._specs[nm] = _ElementSpec(path, src, e.element, e.kappa, e.gpu_model, nm)
        return dict(self._specs)

    def _read_source(self, spec: _ElementSpec) -> tuple[dict[str, list[Signature]], dict[str, float]]:
        """Signatures by element name in a source (read once per file and selection), and the
        file's ready power by ω label (contract C: a characterization's meta)."""
        key = (str(spec.source), spec.element if _is_store(spec.source) else None, spec.gpu_model)
        if key in self._files:
            return self._files[key]
        file = str(spec.source)
        ready: dict[str, float] = {}
        if _is_store(spec.source):
            try:
                from measure.store import read_signatures
            except ImportError:
                raise FormatError(self.file, f"{spec.key}.source", f"{file}: reading a results store "
                                  "needs measure.store, which this install does not have") from None
            groups = {str(k): list(v) for k, v in
                      read_signatures(file, element=spec.element, gpu_model=spec.gpu_model).items()}
        else:
            groups, ready = _read_signature_json(file)
        self._files[key] = (groups, ready)
        return groups, ready

    def _resolve(self, el: str) -> tuple[str, list[Signature]]:
        spec = self._specs[el]
        groups, _ = self._read_source(spec)
        if spec.element is not None:
            name = spec.element
            if name not in groups:
                raise FormatError(self.file, f"{spec.key}.element", f"no element {name!r} in "
                                  f"{spec.source} (has: {', '.join(sorted(groups)) or 'none'})")
        elif spec.given_name in groups:
            name = spec.given_name
        elif len(groups) == 1:
            name = next(iter(groups))
        else:
            raise FormatError(self.file, f"{spec.key}.element", f"{spec.source} holds "
                              f"{len(groups)} elements ({', '.join(sorted(groups)) or 'none'}); say which")
        sigs = groups[name]
        if spec.kappa is not None:
            sigs = [s for s in sigs if s.kappa == spec.kappa]
            if not sigs:
                kappas = sorted({str(s.kappa) for s in groups[name]})
                raise FormatError(self.file, f"{spec.key}.kappa", f"element {name!r} in {spec.source} "
                                  f"has no implementation {spec.kappa!r} (has: {', '.join(kappas)})")
        if not sigs:
            raise FormatError(self.file, spec.key, f"element {name!r} in {spec.source} has no signatures")
        return name, sigs

    def work_of(self, el: str) -> str | None:
        """The work element ``el`` runs: its ``work`` key; else the simulated preset its
        signatures were measured with (``meta["work"]``, which ``ecal characterize PRESET
        --name NAME`` records); else its name in its source when that is a preset (the bundled
        examples); else None."""
        if el in self._works:
            return self._works[el]
        from measure.sim import PRESETS

        name, sigs = self._resolve(el)
        recorded = {s.meta.get("work") for s in sigs}
        if len(recorded) == 1 and next(iter(recorded)) in PRESETS:
            return str(next(iter(recorded)))
        return name if name in PRESETS else None

    def signatures_of(self, el: str) -> list[Signature]:
        return self._resolve(el)[1]

    def file_ready_power(self, el: str) -> dict[str, float]:
        return self._read_source(self._specs[el])[1]

    def options(self, el: str, spec: _ElementSpec) -> list[Any]:
        from solvers.model import Option

        return [Option.from_signature(s) for s in self.signatures_of(el)]

    # -- shapes -----------------------------------------------------------------------------
    def _per_stage(self, path: str, v: Any, n_stages: int, n_chunks: int | None,
                   uses: dict[str, str]) -> list[list[str]]:
        """Element names per stage (and per chunk): a name, or a list per stage whose entries
        are names or (interleaved) lists per chunk."""
        chunks = n_chunks or 1
        if isinstance(v, str):
            uses.setdefault(v, path)
            return [[v] * chunks for _ in range(n_stages)]
        if not isinstance(v, list) or len(v) != n_stages:
            raise FormatError(self.file, path, f"must be an element name or a list of {n_stages} "
                                               f"(one per stage), got {_got(v)}")
        out = []
        for s, item in enumerate(v):
            p = f"{path}[{s}]"
            if isinstance(item, str):
                uses.setdefault(item, p)
                out.append([item] * chunks)
            elif n_chunks is not None and isinstance(item, list) and len(item) == n_chunks:
                row = []
                for c, x in enumerate(item):
                    if not isinstance(x, str) or not x:
                        raise FormatError(self.file, f"{p}[{c}]", f"must be an element name, "
                                                                  f"got {_got(x)}")
                    row.append(x)
                    uses.setdefault(x, f"{p}[{c}]")
                out.append(row)
            else:
                want = f"an element name or a list of {n_chunks} (one per chunk)" if n_chunks else "an element name"
                raise FormatError(self.file, p, f"must be {want}, got {_got(item)}")
        return out

    def pipeline_shape(self, kind: str, shape: Mapping, microbatches: int | None):
        from solvers import pipeline as pl

        from .workload_models import InterleavedShape, PipelineShape

        sh: PipelineShape | InterleavedShape
        if kind == "interleaved-1f1b":
            sh = self.check(InterleavedShape, shape, "shape")
        else:
            sh = self.check(PipelineShape, shape, "shape")
        S = sh.stages
        M = sh.microbatches if microbatches is None else microbatches
        v = None
        group = None
        if isinstance(sh, InterleavedShape):
            v, group = sh.chunks, sh.group_size
            try:
                pl.check_interleaved(S, M, v, group)
            except ValueError as exc:
                raise FormatError(self.file, "shape", str(exc)) from None
        uses: dict[str, str] = {}
        per = {inst: self._per_stage(f"shape.{inst}", getattr(sh, inst), S, v, uses)
               for inst in pl.INSTRUCTIONS}
        order, edges = pl.pipeline_layout(kind, S, M, v or 1, group, max_tasks=self.max_tasks)
        tasks = []
        dev_el: dict[str, list[str]] = {}
        for s in range(S):
            dev = pl.device_name(s)
            dev_el[dev] = sorted({per[i][s][c] for i in pl.INSTRUCTIONS for c in range(v or 1)})
            for nm, c, inst, _m in order[s]:
                tasks.append((nm, dev, per[inst][s][c]))
        devices = [pl.device_name(s) for s in range(S)]
        return {"tasks": tasks, "edges": edges, "device_elements": dev_el}, uses, devices

    def graph_shape(self, kind: str, shape: Mapping):
        from solvers.limits import check_tasks

        from .workload_models import ChainShape, DagShape

        raw = shape.get("tasks")
        if isinstance(raw, list):       # refused before a task of a huge list is validated
            check_tasks(len(raw), self.max_tasks, f"{self.file}: shape.tasks")
        uses: dict[str, str] = {}
        tasks: list[tuple[str, str, str]] = []
        edges: list[tuple[str, str]] = []
        if kind == "chain":
            chain = self.check(ChainShape, shape, "shape")
            given = list(zip(chain.tasks, raw or ()))     # the raw entry says which form
            # a bare element name is named after it (ELEMENT/k when it runs more than once)
            bare = Counter(t.element for t, r in given if isinstance(r, str))
            seen: dict[str, int] = {}
            for i, (t, r) in enumerate(given):
                if isinstance(r, str):
                    k = seen[t.element] = seen.get(t.element, 0) + 1
                    nm = t.element if bare[t.element] == 1 else f"{t.element}/{k - 1}"
                else:
                    nm = t.name or f"{t.element}/{i}"
                uses.setdefault(t.element, f"shape.tasks[{i}]")
                tasks.append((nm, chain.device, t.element))
        else:
            dag = self.check(DagShape, shape, "shape")
            for i, d in enumerate(dag.tasks):
                uses.setdefault(d.element, f"shape.tasks[{i}].element")
                tasks.append((d.name, d.device, d.element))
            names = {t[0] for t in tasks}
            for i, e in enumerate(dag.edges):
                for x in e:
                    if x not in names:
                        raise FormatError(self.file, f"shape.edges[{i}]", f"names unknown task {x!r}")
                edges.append((e[0], e[1]))
        devices = list(dict.fromkeys(t[1] for t in tasks))
        dev_el = {d: sorted({el for _, dv, el in tasks if dv == d}) for d in devices}
        return {"tasks": tasks, "edges": edges, "device_elements": dev_el}, uses, devices

    # -- devices ----------------------------------------------------------------------------
    def rule(self, path: str, v: Any) -> Any:
        """A transition rule: constant, inline table, or {"file": PATH} to a table file."""
        from frontier.files import read_json
        from frontier.transition import TransitionTable
        from solvers.model import ConstantTransition

        from .workload_models import ConstantRule, RuleFile

        if not isinstance(v, dict):
            raise FormatError(self.file, path, f'must be a transition rule (an object: "file", '
                                               f'"constant" or a table) or "free", got {_got(v)}')
        if set(v) == {"constant"}:
            c = self.check(ConstantRule, v, path).constant
            return ConstantTransition(c.time_s, c.energy_j)
        if "file" in v:
            src = Path(self.check(RuleFile, v, path).file)
            src = src if src.is_absolute() else self.base / src
            if not src.is_file():
                raise FormatError(self.file, f"{path}.file", f"{src}: no such file")
            return TransitionTable.from_dict(read_json(src), str(src))
        return TransitionTable.from_dict(v, f"{self.file}: {path}")

    def devices(self, doc: WorkloadFile, devices: Sequence[str], idle_override: float | None,
                require_transitions: bool = True):
        """Each device's idle power and transition rule (or where the file said "free")."""
        per = doc.devices
        for d in per:
            if d not in devices:
                raise FormatError(self.file, f"devices.{d}", f"not a device of this shape "
                                  f"(devices: {', '.join(devices)})")
        top_idle = doc.idle_power_w
        idle: dict[str, float] = {}
        for d in devices:
            own = per[d].idle_power_w if d in per else None
            if idle_override is not None:
                idle[d] = float(idle_override)
            elif own is not None:
                idle[d] = own
            elif isinstance(top_idle, dict):
                if d not in top_idle:
                    raise FormatError(self.file, f"idle_power_w.{d}", "missing (the power this device draws while it waits, W)")
                idle[d] = self.number(f"idle_power_w.{d}", top_idle[d])
            elif top_idle is not None:
                idle[d] = self.number("idle_power_w", top_idle)
            else:
                raise FormatError(self.file, "idle_power_w", "missing (the power a device draws while it "
                                  "waits, W: one number, or per device)")
        if isinstance(top_idle, dict):
            for d in top_idle:
                if d not in devices:
                    raise FormatError(self.file, f"idle_power_w.{d}", f"not a device of this shape "
                                      f"(devices: {', '.join(devices)})")
        # transitions: a rule per device, or free where the file says "free"; never free by
        # omission (unless the caller gives them or asks for no requirement)
        rules: dict[str, Any] = {}
        free: dict[str, str] = {}
        if not require_transitions:
            # the caller prices switches itself, or is measuring them (ecal transitions): the
            # file's rules are not read, so a table not measured yet is no error
            return idle, rules, {d: "" for d in devices}
        top = doc.transitions
        top_rule = None if top is None or top == FREE else self.rule("transitions", top)
        for d in devices:
            mine = per[d].transitions if d in per else None
            key = f"devices.{d}.transitions"
            if mine == FREE:
                free[d] = key
            elif mine is not None:
                rules[d] = self.rule(key, mine)
            elif top_rule is not None:
                rules[d] = top_rule
            elif top == FREE:
                free[d] = "transitions"
            elif require_transitions:
                raise FormatError(self.file, "transitions", MISSING_TRANSITIONS.replace(
                    "WORKLOAD", self.file))
            else:
                free[d] = ""
        return idle, rules, free

    def ranks(self, v: Sequence[str] | None, devices: Sequence[str],
              pipeline: bool) -> tuple[str, ...] | None:
        """The device of each rank: the file's ``ranks`` (devices of this shape, each once),
        else the stages of a pipeline, else None."""
        if v is None:
            return tuple(devices) if pipeline else None
        for i, d in enumerate(v):
            if d not in devices:
                raise FormatError(self.file, f"ranks[{i}]", f"{d!r} is not a device of this shape "
                                  f"(devices: {', '.join(devices)})")
        if len(set(v)) != len(v):
            raise FormatError(self.file, "ranks", "names a device twice")
        return tuple(v)


def _is_store(p: Path) -> bool:
    from measure.store import is_store_path  # measure is heavy: imported when a source is read

    return is_store_path(p)


def _read_signature_json(file: str) -> tuple[dict[str, list[Signature]], dict[str, float]]:
    """Signatures by element from a signature file, a workbook or a characterization JSON, and
    the ready power by ω label that a characterization's meta may carry."""
    from frontier.files import read_json
    from frontier.io import load_signatures, signature_from_dict

    doc = read_json(file)
    groups: dict[str, list[Signature]] = {}
    if isinstance(doc, Mapping) and doc.get("format") == CHARACTERIZATION_FORMAT:
        sigs = doc.get("signatures")
        if not isinstance(sigs, list):
            raise FormatError(file, "signatures", "must be a list")
        element = doc.get("element")
        for i, body in enumerate(sigs):
            s = signature_from_dict(body, file, f"signatures[{i}]")
            groups.setdefault(str(element or s.name), []).append(s)
        return groups, _meta_ready_power(doc)
    if isinstance(doc, Mapping) and doc.get("format") == WORKLOAD_FORMAT:
        raise FormatError(file, "format", "is a workload file, not a signature file")
    for key, s in load_signatures(file).items():
        groups.setdefault(key.split("@", 1)[0], []).append(s)
    return groups, _meta_ready_power(doc)


def _meta_ready_power(doc: Any) -> dict[str, float]:
    """``meta.ready_power_w`` ({ω_dev label: W}) of a characterization output (contract C)."""
    meta = doc.get("meta") if isinstance(doc, Mapping) else None
    rp = meta.get("ready_power_w") if isinstance(meta, Mapping) else None
    if not isinstance(rp, Mapping):
        return {}
    return {str(k): float(w) for k, w in rp.items() if _is_number(w)}
