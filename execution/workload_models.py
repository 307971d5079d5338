"""The typed model of the workload format (``ecal.workload/1``, :mod:`execution.workload`):
declared once here; :data:`frontier.formats.KINDS` names :class:`WorkloadFile` and
``ecal schema workload`` prints it as JSON Schema.

A model declares shape and types. What a value *means* stays in :mod:`execution.workload`:
an element's source existing and holding the element, the shape naming known elements and
having as many entries as stages, idle power and transitions given for every device, ranks
naming devices of the shape. Fields typed :data:`~frontier.format_models.Codec` are declared
for the schema but checked by that code: ``shape`` (one model per ``kind``, :data:`SHAPES`,
which the reader picks so an error names ``shape.stages``, not a union branch),
``forward``/``backward`` (their lengths depend on ``stages`` and ``chunks``),
``idle_power_w`` (one number or one per device) and ``transitions`` (``"free"``, a constant,
a file or an inline table).

Counts, powers and flags carry the project's wording (``must be an integer >= 1``, ``must be
a non-negative number``, ``must be true or false``), which users and tests know.
"""

from __future__ import annotations

import re
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, SkipValidation
from pydantic_core import PydanticCustomError

from frontier.format_models import Codec, Name, TransitionsFile, number_check
from frontier.formats import Strict


def _count(minimum: int) -> Any:
    """An after-validator taking an integer >= ``minimum`` (not a bool, not 2.0)."""
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise PydanticCustomError("int_type", "must be an integer >= {minimum}",
                                      {"minimum": minimum})
        return v
    return AfterValidator(check)


def _flag(v: Any) -> bool:
    if not isinstance(v, bool):
        raise PydanticCustomError("bool_type", "must be true or false")
    return v


def _listed(what: str) -> Any:
    """An after-validator refusing an empty list or object, saying what it should hold."""
    def check(v: Any) -> Any:
        if not v:
            raise PydanticCustomError("too_short", "must " + what)
        return v
    return AfterValidator(check)


Count = Annotated[int, Field(ge=1), SkipValidation, _count(1)]
Watts = Annotated[float, Field(ge=0, description="W"), SkipValidation,
                  AfterValidator(number_check())]
Seconds = Annotated[float, Field(ge=0, description="s"), SkipValidation,
                    AfterValidator(number_check())]
Joules = Annotated[float, Field(ge=0, description="J"), SkipValidation,
                   AfterValidator(number_check())]
Flag = Annotated[bool, SkipValidation, AfterValidator(_flag)]


def _entry_of(key: str, what: str) -> Any:
    """A before-validator reading a bare string as ``{key: string}`` (the short form); what is
    neither string nor object is refused as "must be WHAT or an object with KEY"."""
    def expand(v: Any) -> Any:
        if isinstance(v, str):
            return {key: v}
        if not isinstance(v, dict):
            raise PydanticCustomError("model_type", f'must be {what} or an object with "{key}"')
        return v
    return expand


# -- elements ------------------------------------------------------------------------------------

class ElementSource(Strict):
    """Where an element's signatures are: every signature becomes one option of its tasks."""

    source: Name = Field(description="a signature file, characterization JSON, workbook, or a "
                                     "results store (.sqlite/.db); relative to the workload")
    element: Name | None = Field(None, description="the element's name in source (default: "
                                 "this entry's name when source has it, else its only element)")
    kappa: Name | None = Field(None, description="keep only this implementation")
    gpu_model: Name | None = Field(None, description="select a GPU in a results store")
    work: Name | None = Field(None, description="the code the element runs (module:factory or "
                              "a simulated preset), for ecal run")


#: An element: ``{"source": ...}`` or just the source's path.
ElementRef = Annotated[ElementSource, BeforeValidator(_entry_of("source", "a path"),
                                                      json_schema_input_type=str | ElementSource)]

# -- shapes --------------------------------------------------------------------------------------

#: Element names per stage: one name for every stage, or a list of S entries, each a name or
#: (interleaved) a list of v names, one per chunk. Lengths are checked by the reader.
StageElements = Codec[str | list[str | list[str]]]


class PipelineShape(Strict):
    """1F1B or GPipe: S stages (devices ``stage0`` …), M microbatches."""

    kind: Literal["1f1b", "gpipe"]
    stages: Count
    microbatches: Count
    forward: StageElements
    backward: StageElements


class InterleavedShape(Strict):
    """Interleaved 1F1B: as a pipeline, with v ≥ 2 chunks per stage and Megatron-LM's
    microbatch group size (default S)."""

    kind: Literal["interleaved-1f1b"]
    stages: Count
    microbatches: Count
    chunks: Annotated[int, Field(ge=2), SkipValidation, _count(2)]
    group_size: Count | None = None
    forward: StageElements
    backward: StageElements


class ChainTask(Strict):
    """A task of a chain: the element it runs and its name (default ``ELEMENT/i``)."""

    element: Name
    name: Name | None = None


class ChainShape(Strict):
    """Tasks run in order on one device; a bare element name is a task named after it."""

    kind: Literal["chain"]
    tasks: Annotated[list[Annotated[ChainTask, BeforeValidator(
        _entry_of("element", "an element name"), json_schema_input_type=str | ChainTask)]],
        _listed("be a non-empty list")]
    device: Name = "gpu0"


class DagTask(Strict):
    """A task of a DAG, listed in its device's order."""

    name: Name
    element: Name
    device: Name


class DagShape(Strict):
    """Tasks on devices and ``[before, after]`` edges between their names."""

    kind: Literal["dag"]
    tasks: Annotated[list[DagTask], _listed("be a non-empty list")]
    edges: list[Annotated[list[Name], Field(min_length=2, max_length=2)]] = []


#: The model of each ``shape.kind``.
SHAPES: dict[str, type[Strict]] = {"1f1b": PipelineShape, "gpipe": PipelineShape,
                                   "interleaved-1f1b": InterleavedShape, "chain": ChainShape,
                                   "dag": DagShape}

Shape = Annotated[PipelineShape | InterleavedShape | ChainShape | DagShape,
                  Field(discriminator="kind")]

# -- transitions ---------------------------------------------------------------------------------


class ConstantCost(Strict):
    """Every switch costs the same."""

    time_s: Seconds
    energy_j: Joules = 0.0


class ConstantRule(Strict):
    """``{"constant": {"time_s", "energy_j"}}``."""

    constant: ConstantCost


class RuleFile(Strict):
    """``{"file": PATH}``: a transition table measured on the device (``ecal transitions``)."""

    file: Name


#: What a switch of ω_dev costs: ``"free"`` (said as an assumption), a constant, a table file,
#: or a table inline (``ecal.transitions``).
Rule = Codec[Literal["free"] | ConstantRule | RuleFile | TransitionsFile]


class DeviceSettings(Strict):
    """One device's own idle power and transitions, overriding the top-level ones."""

    idle_power_w: Watts | None = None
    transitions: Rule | None = None


class WorkloadFile(Strict):
    """A workload (``ecal plan``, ``ecal pareto``, ``ecal transitions``; docs/workload.md):
    the elements a training step runs, where their signatures are, the step's shape, the idle
    power and the cost of switching operating points."""

    name: Name | None = None
    description: str | None = None
    elements: Annotated[dict[str, ElementRef], _listed("name at least one element")]
    shape: Codec[Shape]
    idle_power_w: Codec[Watts | dict[str, Watts]] | None = Field(
        None, description="W a device draws while it waits: one number, or per device")
    transitions: Rule | None = Field(None, description="required unless every device has its "
                                     "own under devices")
    devices: dict[str, DeviceSettings] = {}
    steady_state: Flag | None = Field(None, description="default: true for pipeline shapes")
    ranks: Annotated[list[Name], _listed("be a non-empty list of device names")] | None = None
    reorderable: list[Annotated[list[Name], Field(min_length=2)]] | None = Field(
        None, description="groups of tasks (chain and dag shapes) whose order is free: each a "
        "list of two or more task names, consecutive on one device, with no dependency between "
        "them (ecal reorder searches their orders)")


# -- unknown keys --------------------------------------------------------------------------------

def _model_in(t: Any) -> Any:
    """The type under ``Annotated[...]`` and ``X | None``."""
    while True:
        if get_origin(t) is Annotated:
            t = get_args(t)[0]
        elif get_origin(t) in (Union, types.UnionType):
            t = next(a for a in get_args(t) if a is not type(None))
        else:
            return t


def known_keys(model: type[BaseModel], path: str) -> tuple[str, ...]:
    """The keys allowed beside the last one of ``path`` (relative to ``model``): what an
    "unknown key" error lists. Empty when the path leads to no model."""
    t: Any = model
    for part in re.findall(r"[^.\[\]]+", path)[:-1]:
        t = _model_in(t)
        if isinstance(t, type) and issubclass(t, BaseModel):
            if part not in t.model_fields:
                return ()
            t = t.model_fields[part].annotation
        elif get_origin(t) in (dict, list):
            t = get_args(t)[-1]
        else:
            return ()
    t = _model_in(t)
    if not (isinstance(t, type) and issubclass(t, BaseModel)):
        return ()
    return tuple(sorted(f.alias or n for n, f in t.model_fields.items()))
