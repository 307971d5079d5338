"""The typed models of the planner's file formats: problems (``ecal.problem/1``), plans
(``ecal.plan/1``) and Pareto curves (``ecal.pareto/1``). Each format is declared here once
(:data:`frontier.formats.KINDS` names the class); :func:`solvers.io.problem_from_dict`,
:meth:`solvers.plan.Plan.from_dict` and :meth:`solvers.plan.ParetoCurve.from_dict` validate
through :func:`frontier.formats.validate`, and ``ecal schema KIND`` prints the class as JSON
Schema.

A model declares shape and types; what a value *means* stays in the domain code that builds
the object: an option's dynamic energy being >= 0 and its ω_dev being real knobs
(:mod:`solvers.model`), edges naming known tasks and forming no cycle
(:class:`solvers.model.Problem`), a curve's dense choices fitting its plans
(:mod:`solvers.plan`). :class:`ProblemOption` is also how :class:`solvers.model.Problem`
reads an option given as a mapping in Python, so the option's fields are declared once.

Numbers of a problem are checked here in the project's wording (``must be a non-negative
number``): bools and strings are not numbers, NaN, inf and integers beyond a float are refused.
The identity key ``format`` is not a model field: :func:`frontier.formats.content` checks it
(current and older forms) and hands the model the rest.

This module imports pydantic; readers import it when they read.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, TypeVar

import numpy as np
from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PlainValidator,
    SkipValidation,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError

from frontier.formats import Strict

T = TypeVar("T")

#: A field declared with its model (for the schema) but validated by the domain reader.
Codec = Annotated[T, SkipValidation]


def _number_check(nonneg: bool) -> Any:
    """A plain validator: a finite real number (>= 0 when ``nonneg``) as a float, refused in
    the project's words (the value itself is quoted by :func:`frontier.formats.validate`)."""
    kind = "a non-negative number" if nonneg else "a number"

    def check(v: Any) -> float:
        f = v
        if type(v) is not float:       # the common case first: this runs per number of a file
            # numpy scalars come from dicts built in Python (not JSON); bools are never numbers
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer,
                                                                     np.floating)):
                raise PydanticCustomError("number", f"must be {kind}")
            try:
                f = float(v)
            except OverflowError:
                raise PydanticCustomError("number", f"must be {kind}: it overflows a float") from None
        if not math.isfinite(f):
            raise PydanticCustomError("number", f"must be {kind}, finite")
        if nonneg and f < 0:
            raise PydanticCustomError("number", f"must be {kind}")
        return f
    return PlainValidator(check)


#: A finite number (may be negative).
Number = Annotated[float, _number_check(False), WithJsonSchema({"type": "number"})]
#: A finite number >= 0.
NonNegative = Annotated[float, _number_check(True), WithJsonSchema({"type": "number", "minimum": 0})]


def _nonempty(v: Any) -> Any:
    if not v:
        raise PydanticCustomError("too_short", "must not be empty")
    return v


# -- problem (solvers.io) ------------------------------------------------------------------------

class LeafTerm(Strict):
    """How an option depends on one measured leaf (as :class:`frontier.signature.Term`)."""

    var_time_s2: NonNegative
    var_d_j2: NonNegative
    dT_dT: Number  # noqa: N815  (the paper's symbols)
    dE_dT: Number  # noqa: N815
    dE_dd: Number  # noqa: N815


class ProblemOption(Strict):
    """One operating point of a task: ``time_s``, ``energy_j`` (total) or ``d_j`` (dynamic),
    optional static power ``s_w`` (default 0), standard errors or variances, ``omega`` (or
    ``sm_clock_mhz``), ``label``, ``key`` and per-leaf ``terms``. A task's option may also be
    written as a pair ``[time_s, energy_j]``."""

    time_s: NonNegative
    energy_j: NonNegative | None = None
    d_j: Number | None = Field(None, description="dynamic energy: E = s_w*T + d_j, J")
    s_w: NonNegative | None = Field(None, description="static power while busy, W (default 0)")
    sd_time_s: NonNegative | None = None
    sd_energy_j: NonNegative | None = None
    var_time_s2: NonNegative | None = None
    var_d_j2: NonNegative | None = None
    sm_clock_mhz: NonNegative | None = None
    omega: dict[str, Any] | None = Field(None, description="operating point (device knobs)")
    label: str | None = None
    key: str | None = Field(None, description="same key = same measurement")
    terms: Annotated[dict[str, LeafTerm], AfterValidator(_nonempty)] | None = None
    extra_var_time_s2: Number | None = None
    extra_var_energy_j2: Number | None = None

    @model_validator(mode="after")
    def _energy_given(self) -> ProblemOption:
        # which fields go together is the option's shape; what they mean is solvers.model's
        if self.energy_j is None and self.d_j is None:
            raise PydanticCustomError("needs_field", "needs energy_j or d_j")
        if self.terms is None and (self.extra_var_time_s2 or self.extra_var_energy_j2):
            raise PydanticCustomError("needs_field", "extra_var_* needs terms")
        return self


def _pair(v: Any) -> Any:
    # the short form of an option, [time_s, energy_j], read as the mapping it stands for
    if isinstance(v, (list, tuple)) and len(v) == 2:
        return {"time_s": v[0], "energy_j": v[1]}
    return v


Option = Annotated[ProblemOption, BeforeValidator(_pair)]


class ConstantCost(Strict):
    """What every change of ω_dev costs on a device: time (s) and energy (J, default 0)."""

    time_s: NonNegative
    energy_j: NonNegative = 0.0


class ConstantRule(Strict):
    """A device's switch costs as one constant: ``{"constant": {"time_s", "energy_j"}}``."""

    constant: ConstantCost


class ProblemDevice(Strict):
    """A device: the ready power it holds while waiting, and what a switch of ω_dev costs
    (``{"constant": {...}}`` or an ``ecal.transitions`` table, read by its own reader)."""

    idle_power_w: NonNegative = 0.0
    transitions: Codec[ConstantRule | dict[str, Any]] | None = None


class ProblemTask(Strict):
    """A task on one device and its candidate options (same-device order = listing order)."""

    name: str
    device: str
    options: list[Option]


class ProblemFile(Strict):
    """A planning problem (``ecal plan``): devices, tasks with their options, dependency edges
    ``[before, after]``, and whether the tasks are one iteration of a loop."""

    name: str | None = None
    devices: dict[str, ProblemDevice] = {}
    tasks: Annotated[list[ProblemTask], AfterValidator(_nonempty)]
    edges: list[Annotated[list[str], Field(min_length=2, max_length=2)]] = []
    steady_state: bool = False


# -- plan (solvers.plan) ---------------------------------------------------------------------------

#: A number a plan may hold as inf (a gap or bound without a proof); JSON files hold it as null.
Unbounded = Annotated[float, Field(allow_inf_nan=True)] | None


class TaskPlanModel(Strict):
    """One task's choice in a plan (:class:`solvers.plan.TaskPlan`)."""

    name: str
    device: str
    option: int = Field(ge=0)
    label: str
    start_s: float
    end_s: float
    time_s: float
    energy_j: float
    power_w: float
    slack_s: float
    sm_clock_mhz: float | None = None


class OffsetModel(Strict):
    """Measured minus predicted for one device or the step (:class:`solvers.calibration.Offset`)."""

    time_s: Number
    sd_time_s: NonNegative
    energy_j: Number
    sd_energy_j: NonNegative


class CalibrationModel(Strict):
    """A plan's ``meta["calibration"]``: the offsets ``ecal tune`` measured
    (:class:`solvers.calibration.Calibration`)."""

    step: OffsetModel
    devices: dict[str, OffsetModel] = {}
    runs: int = Field(1, ge=0)


class PlanFile(Strict):
    """A plan (``ecal plan -o``): one operating point per task, its schedule, energy
    breakdown, σ, bound and gap (:class:`solvers.plan.Plan`). ``p_meets_deadline`` is written
    for readers and recomputed on reading; ``workload`` and ``simulated`` are what
    :mod:`execution.runnable` records beside a plan it can run (and checks itself)."""

    problem: str
    method: str
    status: str
    deadline_s: float
    makespan_s: float
    sd_makespan_s: float
    energy_j: float
    sd_energy_j: float
    static_busy_j: float
    idle_j: float
    dynamic_j: float
    transition_j: float
    n_switches: int = Field(ge=0)
    lower_bound_j: Unbounded
    gap: Unbounded
    wall_s: float
    time_capped: bool = Field(False, description="absent in plans written before the flag")
    p_meets_deadline: float | None = None
    meta: dict[str, Any] = {}
    tasks: list[TaskPlanModel] = []
    workload: Codec[dict[str, Any]] | None = None
    simulated: Codec[bool | str] | None = None


# -- pareto curve (solvers.plan) -------------------------------------------------------------------

class DensePoint(Strict):
    """A plan interpolated between two grid plans: its makespan, energy, tangent bound and
    (in files since they were kept) its choice, one option index per task."""

    makespan_s: float
    energy_j: float
    bound_j: float
    choice: list[Annotated[int, Field(ge=0)]] | None = None


class ParetoFile(Strict):
    """An energy-vs-deadline curve (``ecal pareto -o``): grid plans (each an ``ecal.plan/1``
    document, read by the plan reader) and dense points. ``time_capped`` is written for
    readers and recomputed from the plans; ``confidence`` is what ``ecal pareto
    --confidence`` adds; ``simulated`` what ``ecal demo`` adds."""

    problem: str
    method: str
    wall_s: float
    exact: bool = False
    time_capped: bool = False
    plans: list[Codec[PlanFile]] = []
    dense: list[DensePoint] = []
    confidence: dict[str, Any] | None = None
    simulated: Codec[bool | str] | None = None
