"""The typed models of the execution layer's file formats: work tables (``ecal.work/1``),
baselines files (``ecal.baselines/1``), one execution of a plan (``ecal.execution/1``) and a
plan run against its baselines (``ecal.run/1``). Each format is declared here once
(:data:`frontier.formats.KINDS` names the class); readers validate through
:func:`frontier.formats.validate` and ``ecal schema KIND`` prints the class as JSON Schema.

A model declares shape and types. What a value *means* stays in the reader that builds the
objects: a kernel keyed by its own name and doing some work (:mod:`execution.work`), a stream
naming a kernel of the table, a baseline's plan file existing (:mod:`execution.baselines`), a
task or window naming a device of the run (:mod:`execution.results`), savings naming a
baseline (:mod:`execution.savings`).

The identity key ``format`` is not a model field: :func:`frontier.formats.content` checks it
(current and older forms). A run file embeds whole execution documents, identity included:
those fields are :data:`~frontier.format_models.Codec` (declared here for the schema, checked
by the execution reader, which reads their older ``schema_version`` form too).

This module imports pydantic; readers import it when they read.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from frontier.format_models import Codec, Name, NonNegative
from frontier.formats import Strict
from measure.sim import SimKernel

#: A count of SMs, tiles...: an integer >= 1.
Count = Annotated[int, Field(ge=1)]
#: A count that may be zero (steps, an option's index).
Index = Annotated[int, Field(ge=0)]


def _at_least_one(what: str) -> AfterValidator:
    """An after-validator refusing an empty object or list, in the project's wording."""
    def check(v: Any) -> Any:
        if not v:
            raise PydanticCustomError("too_short", "must hold at least one {what}", {"what": what})
        return v
    return AfterValidator(check)


# -- work table (execution.work) -----------------------------------------------------------------

_KERNEL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SimKernel)}


def _default(name: str) -> Any:
    # one source for the defaults: the simulator's own kernel (the reader passes only the
    # fields a file sets, so these show in the schema and never drift from SimKernel)
    return Field(_KERNEL_DEFAULTS[name])


class Kernel(Strict):
    """One simulated kernel (every field of :class:`measure.sim.SimKernel`); ``name`` is its
    key in ``kernels``."""

    name: Name
    flops: NonNegative = _default("flops")
    bytes: NonNegative = _default("bytes")
    link_bytes: NonNegative = _default("link_bytes")
    compute_eff: NonNegative = _default("compute_eff")
    mem_eff: NonNegative = _default("mem_eff")
    activity: NonNegative = _default("activity")
    sm_request: Count | None = _default("sm_request")
    tiles: Count | None = _default("tiles")
    overhead_s: NonNegative = _default("overhead_s")
    overhead_busy: bool = _default("overhead_busy")
    link_bw_bps: NonNegative = _default("link_bw_bps")
    link_sm_sat: Count = _default("link_sm_sat")
    kappa: str | None = _default("kappa")
    theta: str | None = _default("theta")


class Stream(Strict):
    """One kernel of a co-run and the SMs it is given (null: the whole device)."""

    kernel: Name
    sm_count: Count | None = None


class OptionWork(Strict):
    """What one option of a task runs: kernel streams started together."""

    streams: Annotated[list[Stream], _at_least_one("stream")]


class WorkFile(Strict):
    """A work table (the simulator's, ``ecal demo``): kernels by name, and per task one entry
    per option (in option order) naming the kernels it co-runs."""

    simulated: bool = True
    description: str | None = None
    kernels: Annotated[dict[str, Kernel], _at_least_one("kernel")]
    tasks: Annotated[dict[str, Annotated[list[OptionWork], _at_least_one("option")]],
                     _at_least_one("task")]


# -- baselines (execution.baselines) -------------------------------------------------------------

class BaselinesFile(Strict):
    """Names the plan files a plan is measured against: baseline name → plan file (relative
    to this file's folder)."""

    simulated: bool | str = False
    description: str | None = None
    baselines: Annotated[dict[str, Name], _at_least_one("baseline")]


# -- one execution (execution.results) -----------------------------------------------------------

#: A number written as null when it is infinite (JSON has no infinities).
MaybeInf = Annotated[float | None, Field(description="null: infinite (sign of the error)")]


class Deviation(Strict):
    """Eq. 23 on T and E (:class:`frontier.deviation.DeviationResult`)."""

    name: str
    predicted_time_s: float
    predicted_energy_j: float
    measured_time_s: float
    measured_energy_j: float
    sd_predicted_time_s: NonNegative
    sd_predicted_energy_j: NonNegative
    sd_measured_time_s: NonNegative
    sd_measured_energy_j: NonNegative
    error_time_s: float
    error_energy_j: float
    error_time_pct: MaybeInf
    error_energy_pct: MaybeInf
    z_time: MaybeInf
    z_energy: MaybeInf
    c_alpha: NonNegative
    alpha: float = Field(gt=0, lt=1)
    n_tests: Count
    bias_aware: bool
    bias_bound_j: NonNegative
    threshold_time_s: NonNegative
    threshold_energy_j: NonNegative
    flagged_time: bool
    flagged_energy: bool
    flagged: bool | None = Field(None, description="written for readers; not read back")


class ComparisonModel(Strict):
    """Predicted against measured T and E for one device or the step."""

    name: Name
    predicted_time_s: float
    sd_predicted_time_s: NonNegative
    predicted_energy_j: float
    sd_predicted_energy_j: NonNegative
    measured_time_s: float
    sd_measured_time_s: NonNegative
    measured_energy_j: float
    sd_measured_energy_j: NonNegative
    n_steps: Index
    deviation: Deviation
    flagged: bool | None = Field(None, description="written for readers; not read back")


class TaskRunModel(Strict):
    """One task in one measured step (times from the step's start, s)."""

    step: int
    name: Name
    device: Name
    option: Index
    label: str
    work: str
    start_s: float
    end_s: float
    switch_s: NonNegative
    wait_s: NonNegative
    true_energy_j: float | None = None


class WindowModel(Strict):
    """One device's counter window over one step."""

    step: int
    device: Name
    counter_start_j: float
    counter_end_j: float
    tail_s: NonNegative
    ready_power_w: NonNegative
    energy_j: float
    finish_s: NonNegative
    makespan_s: NonNegative
    true_energy_j: float | None = None


class DeadlineModel(Strict):
    """The plan's deadline and how the measured step kept it."""

    deadline_s: NonNegative
    met: bool | None = None
    missed_by_s: float | None = None
    steps_over: Index = 0
    predicted_p_meets_deadline: float | None = Field(None, ge=0, le=1)


class ExecutionFile(Strict):
    """One run of a plan (``ecal run --no-baselines -o``): predicted against measured T and E
    for the step and each device (Eq. 23), every task and counter window, the switches paid.
    ``flagged``, ``problems`` and ``note`` are written for readers and not read back."""

    simulated: bool
    note: str | None = None
    plan: str
    method: str
    device_kind: str
    seed: int
    target_rse: NonNegative
    rse_energy: Annotated[float | None, Field(ge=0, allow_inf_nan=True,
                                              description="null (infinite) with fewer than two "
                                                          "steps or a zero mean step energy")]
    converged: bool
    n_steps: Index
    warmup_steps: Index
    alpha: float = Field(gt=0, lt=1)
    flagged: bool | None = None
    deadline: DeadlineModel | None = None
    problems: list[str] = []
    step: ComparisonModel
    devices: list[ComparisonModel]
    switches_s: dict[str, list[NonNegative]] = {}
    planned_switch_s: dict[str, NonNegative] = {}
    tasks: list[TaskRunModel] = []
    windows: list[WindowModel] = []
    meta: dict[str, Any] = {}


# -- a plan against its baselines (execution.savings) --------------------------------------------

class EmbeddedExecution(ExecutionFile):
    """An execution as a run file embeds it, with its own identity."""

    format: Literal["ecal.execution/1"] | None = None
    schema_version: Literal["ecal.execution/1"] | None = Field(None, description="older form")


class SavingsModel(Strict):
    """1 − E_plan/E_baseline, predicted and measured, with σ."""

    baseline: Name
    predicted: float
    sd_predicted: NonNegative
    measured: float
    sd_measured: NonNegative


class RunFile(Strict):
    """A plan and its baselines, each run and measured, with the measured savings against
    each (``ecal run -o``). ``problems`` and ``notes`` are written for readers and not read
    back."""

    simulated: bool
    plan: Codec[EmbeddedExecution]
    baselines: dict[str, Codec[EmbeddedExecution]] = {}
    savings: list[SavingsModel] = []
    problems: list[str] = []
    notes: list[str] = []


# -- characterized entry contexts (ecal reorder --save-contexts) ----------------------------------

class ThermalModel(Strict):
    """A device's fitted first-order thermal model and its resolution."""

    ambient_c: float
    r_th_c_per_w: NonNegative
    tau_s: Annotated[float, Field(gt=0)]
    sigma_temp_c: NonNegative
    windows: Index = 0


class EntryPoint(Strict):
    """One element characterized at one entry temperature: its signature (as in a signature
    file's ``signatures`` entries)."""

    entry_temp_c: float
    signature: dict[str, Any]


class DeviceContexts(Strict):
    """One device: its thermal model and every element (``element@ω``) at two or more entry
    temperatures."""

    thermal: ThermalModel
    elements: Annotated[dict[str, Annotated[list[EntryPoint], Field(min_length=1)]],
                        _at_least_one("element")]


class ContextsFile(Strict):
    """What ``ecal reorder --save-contexts`` writes and ``--contexts`` reads: elements
    characterized at entry temperatures and each device's thermal model."""

    device: str = ""
    simulated: bool = False
    devices: Annotated[dict[str, DeviceContexts], _at_least_one("device")]
