"""Runnable plan files: a plan and where the workload it was made for is, and running them.

A plan file ``ecal run`` executes names its workload in a ``"workload"`` object, in one of two
forms (paths relative to the plan file unless absolute):

- ``{"problem": "problem.json", "work": "work.json", "baselines": "baselines.json"}``: the
  problem the plan was made for (``solvers.io`` JSON), the work table (what each task's
  options run, :mod:`execution.work`) and, optionally, the baselines to measure savings
  against (:mod:`execution.baselines`) — what ``ecal demo`` writes;
- ``{"file": "workload.json", "resolved": "/abs/workload.json", "microbatches": 8, ...}``: the
  workload file ``ecal plan WORKLOAD -o PLAN`` was given (as given, and resolved), with the
  overrides it was planned with (:class:`WorkloadRef`), so ``ecal run PLAN`` rebuilds the
  same problem and runs each element's ``work``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frontier.errors import FormatError
from frontier.files import read_json
from measure.device import Device
from measure.factory import load_work, open_device
from measure.protocol import Protocol
from solvers.io import load_problem
from solvers.model import ConstantTransition, Problem
from solvers.plan import Plan

from .baselines import all_max_plan, read_baselines
from .multi_gpu import parse_gpu_list
from .predict import chosen_options
from .results import ExecutionResult
from .run import run_plan, simulated_devices
from .savings import PlanComparison, savings
from .work import CallableWork, ExecutionError, WorkTable, load_work_table
from .workload import Workload, load_workload

log = logging.getLogger(__name__)

_TABLE_FIELDS = ("problem", "work", "baselines")
_REF_FIELDS = ("file", "resolved", "microbatches", "idle_power_w", "transition_time_s",
               "transition_energy_j")


class RunInputError(ExecutionError):
    """A plan file that cannot be run (no workload, a missing file, another device)."""


# -- the workload a plan names -------------------------------------------------------------

@dataclass(frozen=True)
class WorkloadRef:
    """The workload file a plan was made from, as ``ecal plan`` was given it: ``file`` (the
    path as given), ``resolved`` (absolute, at planning time) and the overrides that shaped
    the problem (``--microbatches``, ``--idle-power-w``, ``--transition-time-s`` /
    ``--transition-energy-j``; None or 0: not given)."""

    file: str
    resolved: str = ""
    microbatches: int | None = None
    idle_power_w: float | None = None
    transition_time_s: float = 0.0
    transition_energy_j: float = 0.0

    @classmethod
    def of(cls, file: str | os.PathLike, **overrides: Any) -> WorkloadRef:
        """The reference to ``file`` (resolved now) with ``overrides``."""
        return cls(os.fspath(file), os.fspath(Path(file).resolve()), **overrides)

    def to_dict(self) -> dict[str, Any]:
        """The plan file's ``"workload"`` object (defaults left out)."""
        d: dict[str, Any] = {"file": self.file, "resolved": self.resolved}
        if self.microbatches is not None:
            d["microbatches"] = self.microbatches
        if self.idle_power_w is not None:
            d["idle_power_w"] = self.idle_power_w
        if self.transition_time_s or self.transition_energy_j:
            d["transition_time_s"] = self.transition_time_s
            d["transition_energy_j"] = self.transition_energy_j
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], file: str) -> WorkloadRef:
        """Inverse of :meth:`to_dict`; errors name the plan file and field."""
        extra = sorted(set(d) - set(_REF_FIELDS))
        if extra:
            raise FormatError(file, f"workload.{extra[0]}",
                              f"unknown field (allowed: {', '.join(_REF_FIELDS)})")
        for k in ("file", "resolved"):
            if k in d and (not isinstance(d[k], str) or not d[k]):
                raise FormatError(file, f"workload.{k}", f"must be a file name, got {d[k]!r}")
        mb = d.get("microbatches")
        if mb is not None and (isinstance(mb, bool) or not isinstance(mb, int) or mb < 1):
            raise FormatError(file, "workload.microbatches", f"must be an integer >= 1, got {mb!r}")
        nums = {}
        for k in ("idle_power_w", "transition_time_s", "transition_energy_j"):
            v = d.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
                raise FormatError(file, f"workload.{k}", f"must be a number >= 0, got {v!r}")
            if v is not None:
                nums[k] = float(v)
        return cls(d["file"], d.get("resolved", ""), mb, **nums)

    def locate(self, plan_file: str | os.PathLike) -> Path:
        """The workload file: as given (from the working folder), else beside the plan file,
        else where it was at planning time. :class:`RunInputError` naming ``--workload`` when
        none exists."""
        given = Path(self.file)
        tries = [given] if given.is_absolute() else [given, Path(plan_file).parent / given]
        if self.resolved:
            tries.append(Path(self.resolved))
        for p in tries:
            if p.is_file():
                return p
        raise RunInputError(f"{os.fspath(plan_file)}: workload.file: {self.file}: no such file "
                            f"(tried {', '.join(os.fspath(p) for p in tries)}); give the workload "
                            "file the plan was made from with --workload FILE")

    def load(self, path: str | os.PathLike) -> Workload:
        """Read the workload at ``path`` with this reference's overrides (the problem the plan
        was made for)."""
        trans = None
        if self.transition_time_s > 0 or self.transition_energy_j > 0:
            trans = ConstantTransition(self.transition_time_s, self.transition_energy_j)
        return load_workload(path, microbatches=self.microbatches,
                             idle_power_w=self.idle_power_w, transitions=trans)


def runnable_plan_dict(plan: Plan, problem_file: str, work_file: str, *, simulated: bool | str = False,
                       **extra: str) -> dict[str, Any]:
    """A plan file ``ecal run`` can execute: the plan, and where its problem and work table
    are (paths relative to the plan file; ``extra``: e.g. ``baselines``)."""
    return {**plan.to_dict(), "simulated": simulated,
            "workload": {"problem": problem_file, "work": work_file, **extra}}


def plan_with_workload(plan: Plan, ref: WorkloadRef) -> dict[str, Any]:
    """The plan file ``ecal plan WORKLOAD -o PLAN`` writes: the plan and its :class:`WorkloadRef`."""
    return {**plan.to_dict(), "workload": ref.to_dict()}


def _plan_doc(plan_file: str | os.PathLike) -> tuple[str, Mapping[str, Any]]:
    file = os.fspath(plan_file)
    if not Path(file).is_file():
        raise FileNotFoundError(2, "no such file", file)
    doc = read_json(file)
    if not isinstance(doc, Mapping):
        raise FormatError(file, "$", "a plan must be a JSON object")
    return file, doc


def recorded_workload(plan_file: str | os.PathLike) -> WorkloadRef | None:
    """The :class:`WorkloadRef` a plan file records (``ecal plan -o``), or None when it
    records none or names a problem and work table instead."""
    file, doc = _plan_doc(plan_file)
    wl = doc.get("workload")
    if not isinstance(wl, Mapping) or "file" not in wl:
        return None
    return WorkloadRef.from_dict(wl, file)


def _path(base: Path, file: Any, field: str, plan_file: str) -> Path:
    if not isinstance(file, str) or not file:
        raise FormatError(plan_file, f"workload.{field}", f"must be a file name, got {file!r}")
    p = Path(file)
    p = p if p.is_absolute() else base / p
    if not p.is_file():
        raise RunInputError(f"{plan_file}: workload.{field}: {os.fspath(p)}: no such file")
    return p


def load_runnable(plan_file: str | os.PathLike) -> tuple[Plan, Problem, WorkTable, dict[str, Path]]:
    """(plan, problem, work table, {field: path}) of a plan file naming its problem and work
    table; every fault is a one-line error naming the file and field."""
    file, doc = _plan_doc(plan_file)
    wl = doc.get("workload")
    if wl is None:
        raise RunInputError(f"{file}: the plan names no workload: give --workload FILE (the "
                            "workload file ecal plan was given), or plan with ecal plan WORKLOAD "
                            "-o PLAN, which records it; ecal demo writes runnable plans "
                            "(demo/plan.json)")
    if not isinstance(wl, Mapping):
        raise FormatError(file, "workload", "must be an object with 'problem' and 'work'")
    extra = sorted(set(wl) - set(_TABLE_FIELDS))
    if extra:
        raise FormatError(file, f"workload.{extra[0]}",
                          f"unknown field (allowed: {', '.join(_TABLE_FIELDS)})")
    for k in ("problem", "work"):
        if k not in wl:
            raise FormatError(file, f"workload.{k}", "missing")
    plan = Plan.from_dict(doc, file)
    base = Path(file).parent
    paths = {k: _path(base, wl[k], k, file) for k in _TABLE_FIELDS if k in wl}
    problem = load_problem(paths["problem"])
    work = load_work_table(paths["work"])
    return plan, problem, work, paths


# -- running -------------------------------------------------------------------------------

def run_plan_file(plan_file: str | os.PathLike, *, seed: int = 0, target_rse: float = 0.01,
                  baselines: bool = True, warmup_steps: int = 1) -> ExecutionResult | PlanComparison:
    """Run a plan file naming its problem and work table (and the baselines it names) on
    simulated H200s: an :class:`ExecutionResult`, or a :class:`PlanComparison` when there
    are baselines."""
    plan, problem, work, paths = load_runnable(plan_file)
    base = read_baselines(paths["baselines"]) if baselines and "baselines" in paths else {}
    loaded = {n: load_runnable(p)[:3] for n, p in base.items()}   # all inputs read before any run
    proto = Protocol(target_rse=target_rse)
    main = run_plan(plan, problem, work, seed=seed, protocol=proto, warmup_steps=warmup_steps)
    if not loaded:
        return main
    runs = {n: run_plan(*b, seed=seed, protocol=proto, warmup_steps=warmup_steps) for n, b in loaded.items()}
    return PlanComparison(main, runs, tuple(savings(main, r, n) for n, r in runs.items()))


def open_run_devices(names: list[str], spec: str, seed: int, nvml: object | None = None
                     ) -> dict[str, Device]:
    """One device per plan device: simulated H200s (``spec`` ``"sim"``), or the one real GPU
    ``spec`` names for a single-device plan (a multi-GPU plan runs on ``nvml:I,J,...``:
    :mod:`execution.multi_gpu`)."""
    if spec == "sim":
        return simulated_devices(names, seed)
    if parse_gpu_list(spec) is not None:
        raise RunInputError(f"--device {spec}: a list of GPUs runs a plan with ecal run (one "
                            "worker process per GPU); here give sim or nvml:INDEX")
    if len(names) != 1:
        raise RunInputError(f"--device {spec} runs single-device plans; this plan spans "
                            f"{len(names)} devices ({', '.join(names)}): give one GPU per plan "
                            f"device, in order: --device nvml:{','.join(map(str, range(len(names))))}")
    return {names[0]: open_device(spec, nvml=nvml)}


def element_work_specs(wl: Workload, workload_file: str) -> dict[str, str]:
    """Each element's work (``module:factory``) of the workload's tasks; refuses an element
    without one (:class:`RunInputError`), before anything is run or called."""
    out: dict[str, str] = {}
    for el in dict.fromkeys(wl.task_elements.values()):
        spec = wl.works.get(el)
        if spec is None:
            raise RunInputError(f"{workload_file}: elements.{el}: no work to run; add "
                                '"work": "module:factory" (what ecal characterize measured) to '
                                "the workload, or give --workload FILE naming one that has it")
        out[el] = spec
    return out


def workload_work_table(wl: Workload, gpus: Mapping[str, Device], workload_file: str
                        ) -> dict[str, tuple[CallableWork, ...]]:
    """The work table of a workload's problem: each task runs its element's work
    (:class:`~execution.work.CallableWork`; every option the same code, at its own ω).
    Each element's work is resolved once (a factory called once, on the first device)."""
    first = next(iter(gpus.values()))
    resolved: dict[str, CallableWork] = {}
    for el, spec in element_work_specs(wl, workload_file).items():
        work = load_work(spec, device=first).work
        if isinstance(work, Mapping):
            raise RunInputError(f"{workload_file}: elements.{el}: work {spec!r} gives one callable "
                                "per implementation (kappa); name one implementation's work")
        resolved[el] = CallableWork(work, el)
    return {t.name: tuple(resolved[wl.task_elements[t.name]] for _ in t.options)
            for t in wl.problem.tasks}


def run_plan_with_workload(plan_file: str | os.PathLike, workload_file: str | os.PathLike | None
                           = None, *, device: str = "sim", seed: int = 0,
                           target_rse: float = 0.01, baselines: bool = True,
                           microbatches: int | None = None, nvml: object | None = None,
                           opener: Any = None, warmup_steps: int = 1) -> ExecutionResult | PlanComparison:
    """Run a plan ``ecal plan WORKLOAD -o PLAN`` wrote with its workload's own work: an
    :class:`ExecutionResult`, or a :class:`PlanComparison` against the all-top-clock
    baseline. ``workload_file`` None: the workload the plan file records (with the overrides
    it was planned with); given: that file, with ``microbatches``. Devices are restored and
    closed whatever happens. ``device`` ``"nvml:I,J,..."`` runs a multi-device plan with one
    worker process per GPU (:mod:`execution.multi_gpu`; ``opener`` opens a GPU there, by
    default through NVML); ``nvml`` injects a pynvml-like module for a single GPU.
    ``warmup_steps``: unmeasured steps before the measured ones (more: the die at the thermal
    steady state a long job runs at, which the plan's periodic entry context assumes)."""
    file, doc = _plan_doc(plan_file)
    plan = Plan.from_dict(doc, file)
    if workload_file is None:
        ref = recorded_workload(file)
        if ref is None:
            raise RunInputError(f"{file}: the plan records no workload file: give --workload FILE "
                                "(the workload file ecal plan was given)")
        path = ref.locate(file)
        log.info("running %s with its recorded workload %s", file, os.fspath(path))
    else:
        ref, path = WorkloadRef.of(workload_file, microbatches=microbatches), Path(workload_file)
    wl, wl_name = ref.load(path), os.fspath(path)
    problem = wl.problem
    indices = parse_gpu_list(device)
    if indices is not None:
        return _run_on_gpus(plan, wl, ref, wl_name, indices, device, target_rse=target_rse,
                            baselines=baselines, opener=opener, warmup_steps=warmup_steps)
    gpus = open_run_devices(list(problem.index.devices), device, seed, nvml)
    try:
        table = workload_work_table(wl, gpus, wl_name)
        proto = Protocol(target_rse=target_rse)
        main = run_plan(plan, problem, table, seed=seed, protocol=proto, devices=gpus,
                        warmup_steps=warmup_steps)
        if not baselines:
            return main
        top = all_max_plan(problem, plan.target_deadline_s)
        base = run_plan(top, problem, table, seed=seed, protocol=proto, devices=gpus,
                        warmup_steps=warmup_steps)
        return PlanComparison(main, {"all_max": base}, (savings(main, base, "all_max"),))
    finally:
        for g in gpus.values():
            g.close()


def _run_on_gpus(plan: Plan, wl: Workload, ref: WorkloadRef, wl_name: str, indices: tuple[int, ...],
                 device: str, *, target_rse: float, baselines: bool,
                 opener: Any, warmup_steps: int = 1) -> ExecutionResult | PlanComparison:
    """The plan (and its all-top-clock baseline) on one worker process per GPU."""
    from .multi_gpu import map_gpus, run_plans_on_gpus

    problem = wl.problem
    gpus = map_gpus(device, indices, list(problem.index.devices))
    element_work_specs(wl, wl_name)          # refuse a missing work before any GPU is opened
    chosen_options(plan, problem)            # ... and a plan made for another problem
    plans = [plan] + ([all_max_plan(problem, plan.target_deadline_s)] if baselines else [])
    elements = [wl.task_elements[t.name] for t in problem.tasks]
    at = WorkloadRef.of(wl_name, microbatches=ref.microbatches, idle_power_w=ref.idle_power_w,
                        transition_time_s=ref.transition_time_s,
                        transition_energy_j=ref.transition_energy_j)
    main, *rest = run_plans_on_gpus(plans, problem, gpus, workload_ref=at,
                                    workload_path=os.path.abspath(wl_name), elements=elements,
                                    protocol=Protocol(target_rse=target_rse), opener=opener,
                                    warmup_steps=warmup_steps)
    if not rest:
        return main
    base = rest[0]
    return PlanComparison(main, {"all_max": base}, (savings(main, base, "all_max"),))
