"""The typed models of the measurement-side file formats: signatures, workbooks, frontiers,
interaction tables, transition tables, results-log headers, campaigns, store exports and
selftest reports. Each format is declared here once (:data:`frontier.formats.KINDS` names the
class); readers validate through :func:`frontier.formats.validate` and ``ecal schema KIND``
prints the class as JSON Schema.

A model declares shape and types; what a value *means* (a signature being physical, sd and var
agreeing, an ω_dev without ``sm_count``, a pair measured at its entry's ω_dev) stays in the
domain code that builds the object. Fields typed :data:`Codec` are declared here (the schema
shows them whole) but validated by that domain code (:mod:`frontier.codec` for signatures),
which also reads every older hand-written form and names the faulty field in its own words.

The identity key ``format`` is not a model field: :func:`frontier.formats.content` checks it
(current and older forms) and hands the model the rest; :func:`frontier.formats.json_schema`
adds it to the schema.

This module imports pydantic; readers import it when they read, so importing
:mod:`frontier.io` (or running ``ecal --help``) does not.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, Field, SkipValidation
from pydantic_core import PydanticCustomError

from .formats import Strict

T = TypeVar("T")

#: A field declared with its model (for the schema) but validated by the domain reader.
Codec = Annotated[T, SkipValidation]

Units = Annotated[dict[str, str], Field(description="SI units the field names carry: "
                                        '{"time": "s", "energy": "J", "power": "W"}')]
Name = Annotated[str, Field(min_length=1)]
NonNegative = Annotated[float, Field(ge=0)]
Knobs = dict[str, float | None]


def _nonempty(v: list) -> list:
    # the project's wording for an empty list of points (users and tests know it)
    if not v:
        raise PydanticCustomError("too_short", "must hold at least one point")
    return v


def _one_of(*choices: str) -> Any:
    """An after-validator refusing anything but ``choices``, in the project's wording (the
    field stays a ``Literal`` in the schema)."""
    def check(v: Any) -> Any:
        if v not in choices:
            raise PydanticCustomError("literal_error", "must be one of {choices}",
                                      {"choices": list(choices)})
        return v
    return AfterValidator(check)


# -- signatures (frontier.codec) -----------------------------------------------------------------

class Runs(Strict):
    """Raw runs instead of values: per-invocation T and E of each run."""

    times_s: list[NonNegative] = Field(min_length=1)
    energies_j: list[NonNegative] = Field(min_length=1)


class Term(Strict):
    """A composite's sensitivity to one measured leaf."""

    var_time_s2: float
    var_d_j2: float
    dT_dT: float  # noqa: N815  (the paper's symbols)
    dE_dT: float  # noqa: N815
    dE_dd: float  # noqa: N815


class StaticTermModel(Strict):
    """A composite's sensitivity to one measured leaf's static power (σ_s)."""

    var_s_w2: NonNegative
    dE_ds: float  # noqa: N815
    dd_ds: float


class SignatureModel(Strict):
    """One signature, as :func:`frontier.codec.signature_to_dict` writes it or a person writes
    it: ``s_w`` and ``time_s`` with ``energy_j`` or ``d_j`` (or ``runs``); errors as ``sd_*``,
    ``var_*`` or ``run_sd_*`` (one of them); a composite also carries ``composed``, ``terms``
    and its bias bookkeeping."""

    name: str | None = None
    description: str | None = None
    s_w: NonNegative | None = Field(None, description="static (ready) power, W")
    time_s: NonNegative | None = None
    energy_j: NonNegative | None = None
    d_j: float | None = Field(None, description="dynamic energy: E = s_w*T + d_j, J")
    sd_time_s: NonNegative | None = None
    sd_energy_j: NonNegative | None = None
    var_time_s2: NonNegative | None = None
    var_energy_j2: NonNegative | None = None
    run_sd_time_s: NonNegative | None = None
    run_sd_energy_j: NonNegative | None = None
    var_s_w2: NonNegative | None = Field(None, description="variance of the static power (its drift), W²")
    sd_s_w: NonNegative | None = Field(None, description="standard deviation of the static power, W")
    n: int | None = Field(None, ge=1)
    devices: list[str] | str | None = None
    omega: Knobs | None = None
    kappa: str | None = None
    theta: str | None = None
    meta: dict[str, Any] | None = None
    runs: Runs | None = None
    composed: bool | None = None
    terms: dict[str, Term] | None = None
    static_terms: dict[str, StaticTermModel] | None = None
    extra_var_time_s2: float | None = None
    extra_var_energy_j2: float | None = None
    bias_sigma_j: float | None = None
    head_sigma_j: float | None = None
    all_sigma_j: float | None = None
    runtime_sigma_j: float | None = None


SignatureField = Codec[SignatureModel]


class SignaturesFile(Strict):
    """A signature file (``ecal characterize -o``, ``ecal frontier -o``, ``ecal import``):
    signatures by name. ``meta`` is what its writer records beside them (elements, device,
    ready power...); ``store`` a store export's block in files written before
    ``ecal.store-export/1``."""

    units: Units | None = None
    description: str | None = None
    signatures: dict[str, SignatureField]
    meta: dict[str, Any] | None = None
    store: dict[str, Any] | None = None


class Composition(Strict):
    """One composition of a workbook: an expression over signature and composition names
    (``{"seq": [...]}``, ``{"par": [...]}``, ``{"par_multi": [...]}``, ``{"repeat": e,
    "times": k}``, ``{"on": dev, "expr": e}``, ``{"idle": {...}}``, ``{"dag": {...}}``; see
    :mod:`frontier.io`) and, optionally, its measurement."""

    name: Name
    expr: str | dict[str, Any]
    measured: dict[str, Any] | None = None
    description: str | None = None


class WorkbookFile(Strict):
    """A composition workbook (``ecal compose``, ``ecal check``): signatures, ``defaults``
    merged under each, and compositions evaluated in order. A signature file is a workbook
    without compositions."""

    units: Units | None = None
    description: str | None = None
    source: Any = None
    defaults: SignatureField | None = None
    signatures: dict[str, SignatureField] = {}
    compositions: list[Codec[Composition]] = []
    meta: dict[str, Any] | None = None
    store: dict[str, Any] | None = None


# -- frontier (frontier.pareto) ----------------------------------------------------------------

class FrontierFile(Strict):
    """A Pareto frontier of one element: its points, the pruning criterion, metadata."""

    units: Units | None = None
    name: str = "frontier"
    criterion: Annotated[Literal["TE", "Td", "Tsd"], SkipValidation,
                         _one_of("TE", "Td", "Tsd")] = "TE"
    meta: dict[str, Any] | None = None
    points: Annotated[list[SignatureField], AfterValidator(_nonempty)]


# -- interaction table (frontier.interaction_io) -------------------------------------------------

class Member(Strict):
    """One co-running element and the SMs it was given (null: the whole device)."""

    element: Name
    sm_count: int | None = Field(None, ge=1, le=2**31)


class Provenance(Strict):
    """Where and when a joint measurement was taken."""

    device: Name
    simulated: bool
    seed: int | None = None
    uuid: Name | None = None
    protocol: dict[str, Any] = {}
    recorded_utc: Name = Field(description="ISO 8601 UTC, e.g. 2026-12-01T23:59:00Z")


class InteractionEntry(Strict):
    """One jointly measured pair at one ω_dev (which has no ``sm_count``)."""

    pair: list[Member] = Field(min_length=2, max_length=2)
    omega_dev: Knobs = {}
    signature: SignatureField
    provenance: Provenance


class InteractionsFile(Strict):
    """A co-run interaction table (``ecal pairs``)."""

    units: Units | None = None
    description: Name | None = None
    entries: list[InteractionEntry]


# -- transition table (frontier.transition) ------------------------------------------------------

class Cost(Strict):
    """What one switch costs: time (s) and energy (J, default 0)."""

    time_s: NonNegative
    energy_j: NonNegative = 0.0


class TransitionPair(Cost):
    """A measured switch between two ω_dev."""

    from_: Knobs = Field(alias="from")
    to: Knobs


class PowerAt(Strict):
    """Power drawn during a switch into one ω_dev."""

    omega: Knobs
    power_w: NonNegative


class FittedRule(Strict):
    """A switch-cost rule fitted to measured pairs (version 2)."""

    kind: Literal["nnls-linear/1"]
    coef_s: dict[str, NonNegative]
    held: dict[str, NonNegative] = {}
    power_w: list[PowerAt] = []
    default_power_w: NonNegative = 0.0
    n_pairs: int = Field(0, ge=0)
    rms_residual_s: NonNegative = 0.0
    max_abs_residual_s: NonNegative = 0.0


class TransitionsFile(Strict):
    """Switch costs between operating points (``ecal transitions``): a constant, per-knob
    costs, measured pairs, and (version 2) a fitted rule and what to do for unpriced pairs."""

    device: str | None = None
    source: str = "given"
    constant: Codec[Cost] | None = None
    knobs: dict[str, Codec[Cost]] = {}
    pairs: list[Codec[TransitionPair]] = []
    on_unpriced: Annotated[Literal["auto", "error", "free"], SkipValidation] = "auto"
    rule: Codec[FittedRule] | None = None


# -- results log header (measure.results_log) ----------------------------------------------------

class ResultsHeader(Strict):
    """The first line of a results log (JSON lines; then ``ready`` and ``point`` records):
    what is measured, on what, how. Headers of writers before ``format`` may lack
    ``kappas``, ``protocol`` and ``host``."""

    kind: Literal["header"]
    element: Name
    kappas: list[str | None] | None = None
    grid: dict[str, Any]
    protocol: dict[str, Any] | None = None
    device: dict[str, Any]
    host: str | None = None
    sm_granted: dict[str, Any] | None = None
    adaptive: dict[str, Any] | None = None


# -- campaign (measure.campaign) -----------------------------------------------------------------

class CampaignElement(Strict):
    """One element: a work (``preset`` or ``module:function``) or κ label → work, and an
    optional grid of its own."""

    name: str | None = None
    work: str | None = None
    kappas: dict[str, str] | None = None
    grid: Any = None


class CampaignFile(Strict):
    """A campaign (``ecal campaign``, YAML or JSON): elements × grid to characterize across
    GPUs into a store (docs/campaign.md)."""

    name: str | None = None
    device: Literal["sim", "nvml"] = "sim"
    seed: int = 0
    gpu_model: str | None = None
    accelerator_type: str | None = None
    store: str | None = None
    max_retries: int = Field(3, ge=0, le=1000)
    grid: Any = None
    protocol: dict[str, Any] | None = None
    simulate: dict[str, Any] | None = None
    elements: list[str | CampaignElement] = Field(min_length=1)


# -- store export (measure.store) ----------------------------------------------------------------

class StoreKey(Strict):
    """A signature's store key and campaign unit."""

    element: str | None = None
    kappa: str | None = None
    theta: str | None = None
    omega: str | None = None
    gpu_model: str | None = None
    uuid: str | None = None
    driver: str | None = None
    protocol: str | None = None
    host: str | None = None
    campaign: str | None = None
    unit: str | None = None


class StoreExportBlock(Strict):
    """The ``store`` block of a store export: each signature's store key, by the signature's
    name in the file."""

    keys: dict[str, StoreKey]


class StoreExportFile(SignaturesFile):
    """A signature file exported from a results store (``ecal store export``): its ``store``
    block records each signature's store key and campaign unit, so an import restores the
    very rows."""

    store: StoreExportBlock  # type: ignore[assignment]


# -- selftest report (measure.selftest) ----------------------------------------------------------

Verdict = Literal["pass", "warn", "fail", "skipped"]


class SelftestCheck(Strict):
    """One assumption held against one measured number."""

    name: Name
    assumption: str
    verdict: Verdict
    value: float | None = None
    unit: str = ""
    detail: str = ""
    data: dict[str, Any] = {}


class SelftestReport(Strict):
    """What ``ecal selftest -o`` writes (docs/selftest.md)."""

    device: dict[str, Any]
    simulated: bool
    read_only: bool
    verdict: Verdict
    ok: bool
    verdicts: dict[str, Verdict]
    checks: list[SelftestCheck]
    device_time_s: NonNegative
    real_time_s: NonNegative
    write_checks: str = ""


# -- schedule (measure.schedule) -----------------------------------------------------------------

def number_check(positive: bool = False) -> Any:
    """A check of a JSON number in the project's wording (``must be a non-negative number``,
    ``must be a positive number``; NaN, inf, bools and strings refused), for an
    ``AfterValidator`` on a field declared ``Annotated[float, Field(...), SkipValidation]``."""
    import math

    kind = "a positive" if positive else "a non-negative"

    def check(v: Any) -> float:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        try:
            fv = float(v) if ok else math.nan
        except OverflowError:          # an integer of hundreds of digits
            fv = math.nan
        if not math.isfinite(fv) or fv < 0 or (positive and fv == 0):
            finite = " finite" if ok and not math.isfinite(fv) else ""
            raise PydanticCustomError("number_type", f"must be {kind}{finite} number")
        return fv
    return check


Positive = Annotated[float, Field(gt=0), SkipValidation, AfterValidator(number_check(True))]


class ScheduleTask(Strict):
    """One task of a device's schedule, in execution order: its planned start and end (s from
    the step's start) and the knobs to set before it (absent or null: leave as is)."""

    task: Name
    start_s: float | None = None
    end_s: float | None = None
    sm_clock_mhz: Positive | None = None
    mem_clock_mhz: Positive | None = None
    power_limit_w: Positive | None = None
    sm_count: Positive | None = Field(None, description="SMs (green contexts); an integer")


class ScheduleDevice(Strict):
    """What a schedule says about one device."""

    ready_power_w: Positive | None = Field(None, description="ready power at the device's top "
                                           "operating point, W (null: not recorded)")
    switches_per_iteration: int | None = Field(None, ge=0, description="changes of ω_dev in "
                                               "one iteration, the wrap-around included")


class ScheduleFile(Strict):
    """A per-device operating-point schedule for a training loop (``ecal plan --schedule``;
    :mod:`measure.schedule`): device → its tasks in execution order, and optionally the ranks,
    whether the step repeats, what each device draws and how often it switches."""

    problem: str | None = None
    deadline_s: float | None = None
    makespan_s: float | None = None
    energy_j: float | None = None
    simulated: bool = False
    confidence: float | None = None
    solved_deadline_s: float | None = None
    p_meets_deadline: float | None = None
    steady_state: bool = False
    device_info: dict[str, ScheduleDevice] | None = None
    ranks: list[str] | None = Field(None, description="the device of rank 0, 1, …")
    devices: dict[str, Annotated[list[ScheduleTask], Field(min_length=1)]] = Field(min_length=1)
