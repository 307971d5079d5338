"""File identity and typed file models: one convention, each format declared once.

Every JSON file this project writes names itself with one key, ``"format": "ecal.KIND/N"``
(KIND a short lower-case name, N the integer version). Readers also take the older forms the
project wrote before this convention — ``"format": "energy-calculus/KIND"`` with ``"version"`` or
``"schema_version"``, or ``"schema_version"`` alone — through :func:`check_format`, so no file a
user already has stops working.

A format's shape is declared once, as a pydantic model deriving from :class:`Strict` (unknown
fields refused, no inf/NaN). :func:`validate` runs a model over a parsed document and turns
pydantic's report into the project's one-line :class:`~frontier.errors.FormatError`
(``file: field.path: problem``). :data:`KINDS` lists every format with the model that declares it
(``"module:Class"``, imported only when asked), which ``ecal schema KIND`` prints as JSON Schema.

Example::

    >>> check_format("s.json", {"format": "ecal.signatures/1"}, "signatures")
    1
    >>> check_format("s.json", {"schema_version": 1}, "signatures")   # the older form
    1
"""
from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import FormatError, InputError

if TYPE_CHECKING:   # pydantic is imported on first use: writers and --help need only the tags
    from pydantic import BaseModel

_TAG = re.compile(r"^ecal\.([a-z][a-z0-9-]*)/([1-9][0-9]*)$")


def format_tag(kind: str, version: int) -> str:
    """The ``format`` value of version ``version`` of ``kind``: ``format_tag("plan", 1)`` is
    ``"ecal.plan/1"``."""
    return f"ecal.{kind}/{version}"


@dataclass(frozen=True)
class Kind:
    """One file format: its name, the versions this code reads, the one it writes, the older
    identities it accepts, and where its model is declared.

    ``legacy_names`` are older ``format`` strings (read with ``version``/``schema_version``);
    ``legacy_schema_version`` lists ``schema_version`` values that alone identified the file
    (e.g. ``1`` for signature files, ``"ecal.plan/1"`` for plans), each mapped to the version it
    means. ``model`` is ``"module:Class"`` or ``""`` where the format has no model yet.
    """

    name: str
    versions: tuple[int, ...]
    legacy_names: tuple[str, ...] = ()
    legacy_schema_version: tuple[tuple[Any, int], ...] = ()
    model: str = ""
    description: str = ""

    @property
    def write_version(self) -> int:
        """The version this code writes (the newest it reads)."""
        return max(self.versions)

    @property
    def tag(self) -> str:
        """The ``format`` value this code writes."""
        return format_tag(self.name, self.write_version)


#: Every file format, by kind, with the model that declares it.
KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("signatures", (1,), legacy_schema_version=((1, 1),),
         model="frontier.format_models:SignaturesFile",
         description="signatures by name (ecal characterize, ecal frontier -o)"),
    Kind("workbook", (1,), legacy_schema_version=((1, 1),),
         model="frontier.format_models:WorkbookFile",
         description="signatures and compositions to compose or check (ecal compose, ecal check)"),
    Kind("interactions", (1,), legacy_names=("energy-calculus/interaction-table",),
         model="frontier.format_models:InteractionsFile",
         description="co-run interaction table (ecal pairs)"),
    Kind("frontier", (1,), legacy_names=("energy-calculus/frontier",),
         model="frontier.format_models:FrontierFile",
         description="a Pareto frontier of one element"),
    Kind("transitions", (1, 2), legacy_names=("energy-calculus/transitions",),
         model="frontier.format_models:TransitionsFile",
         description="switch costs between operating points (ecal transitions)"),
    Kind("problem", (1,), legacy_schema_version=(("ecal.problem/1", 1),),
         model="solvers.format_models:ProblemFile",
         description="a planning problem: devices, tasks, options (ecal plan)"),
    Kind("plan", (1,), legacy_schema_version=(("ecal.plan/1", 1),),
         model="solvers.format_models:PlanFile",
         description="a plan: one operating point per task (ecal plan -o)"),
    Kind("pareto", (1,), legacy_schema_version=(("ecal.pareto/1", 1),),
         model="solvers.format_models:ParetoFile",
         description="a time-energy curve of plans (ecal pareto -o)"),
    Kind("schedule", (1,), model="frontier.format_models:ScheduleFile",
         description="per-device operating-point schedule for a training loop"),
    Kind("workload", (1,), model="execution.workload_models:WorkloadFile",
         description="elements, schedule and transitions of a job"),
    Kind("work", (1,), legacy_names=("energy-calculus/work-table",),
         model="execution.format_models:WorkFile",
         description="simulated work per element (the simulator's work table)"),
    Kind("execution", (1,), legacy_schema_version=(("ecal.execution/1", 1),),
         model="execution.format_models:ExecutionFile",
         description="one run of a plan, predicted against measured (in ecal.run/1)"),
    Kind("baselines", (1,), legacy_names=("energy-calculus/baselines",),
         model="execution.format_models:BaselinesFile",
         description="names the plan files a plan is measured against (ecal demo)"),
    Kind("run", (1,), model="execution.format_models:RunFile",
         description="a plan and its baselines run and measured, with savings "
                                  "(ecal run -o)"),
    Kind("results", (1, 2), legacy_names=("energy-calculus/results",),
         model="frontier.format_models:ResultsHeader",
         description="results log header (append-only JSON lines of a characterization)"),
    Kind("campaign", (1,), legacy_names=("energy-calculus/campaign",),
         model="frontier.format_models:CampaignFile",
         description="a campaign: units to characterize across GPUs (ecal campaign)"),
    Kind("store-export", (1,), legacy_names=("energy-calculus/store-export",),
         model="frontier.format_models:StoreExportFile",
         description="signatures exported from a store (ecal store export)"),
    Kind("contexts", (1,), model="execution.format_models:ContextsFile",
         description="elements characterized at entry temperatures, with each device's thermal "
                     "model (ecal contexts; ecal reorder --save-contexts)"),
    Kind("selftest", (1,),
         model="frontier.format_models:SelftestReport",
         description="a device self-test record (ecal selftest)"),
)}


def kind(name: str) -> Kind:
    """The :class:`Kind` called ``name``; :class:`InputError` listing the kinds otherwise."""
    try:
        return KINDS[name]
    except KeyError:
        raise InputError(f"no file format {name!r}; formats: {', '.join(sorted(KINDS))}") from None


def _show(v: Any, width: int = 60) -> str:
    """A value as an error message quotes it: its repr, cut to ``width`` characters (a hostile
    file's nested value must not flood the message)."""
    r = repr(v)
    return r if len(r) <= width else r[:width - 3] + "..."


def _version_field(file: str, doc: Mapping, k: Kind) -> int:
    for key in ("version", "schema_version"):
        if key in doc:
            v = doc[key]
            if isinstance(v, bool) or not isinstance(v, int) or v not in k.versions:
                raise FormatError(file, key, f"unsupported version {_show(v)} of {k.name} "
                                  f"(this reader understands {', '.join(map(str, k.versions))})")
            return v
    return min(k.versions)


def check_format(file: str, doc: Any, kind_name: str, *, required: bool = True) -> int:
    """Check that ``doc`` (a parsed JSON object) is a ``kind_name`` file this code reads, in the
    current form or an older one; return its version.

    ``required=False`` is for formats whose older files may carry no identity at all (a
    hand-written campaign, a frontier or transition table embedded in another file): such a
    document is read as the version its ``version`` field names, else the oldest.
    Raises :class:`FormatError` (file, the identifying key, what was expected) otherwise.
    """
    k = kind(kind_name)
    if not isinstance(doc, Mapping):
        raise FormatError(file, "(top level)", f"expected a JSON object ({k.tag} file), "
                          f"got {type(doc).__name__}")
    tag = doc.get("format")
    if isinstance(tag, str):
        return _check_tag(file, doc, k, tag)
    if tag is not None:
        raise FormatError(file, "format", f"expected the string {k.tag!r}, got {_show(tag)}")
    sv = doc.get("schema_version")
    for legacy, version in k.legacy_schema_version:
        if sv == legacy and not isinstance(sv, bool) and type(sv) is type(legacy):
            return version
    if isinstance(sv, int) and not isinstance(sv, bool) and any(
            isinstance(legacy, int) for legacy, _ in k.legacy_schema_version):
        raise FormatError(file, "schema_version", f"unsupported version {sv!r} of {k.name} "
                          f"(this reader understands {k.tag}, or schema_version "
                          f"{', '.join(str(x) for x, _ in k.legacy_schema_version)})")
    if not required:
        return _version_field(file, doc, k)
    raise FormatError(file, "format", f"missing (expected \"format\": \"{k.tag}\": "
                      f"{k.description})")


def _check_tag(file: str, doc: Mapping, k: Kind, tag: str) -> int:
    m = _TAG.match(tag)
    if m:
        if m.group(1) != k.name:
            raise FormatError(file, "format", f"this is a {m.group(1)!r} file ({tag}); "
                              f"expected {k.tag} ({k.description})")
        v = int(m.group(2))
        if v not in k.versions:
            raise FormatError(file, "format", f"unsupported version {tag!r} (this reader "
                              f"understands {', '.join(format_tag(k.name, x) for x in k.versions)})")
        return v
    if tag in k.legacy_names:
        return _version_field(file, doc, k)
    raise FormatError(file, "format", f"expected {k.tag}, got {_show(tag)}")


def content(file: str, doc: Any, kind_name: str, *, required: bool = True) -> tuple[int, dict]:
    """:func:`check_format`, then ``doc`` without its identity keys (``format``, and in an
    older form its ``version``/``schema_version``): what the format's model validates. In the
    current form a ``version`` or ``schema_version`` key is left in, so the model refuses it."""
    version = check_format(file, doc, kind_name, required=required)
    tag = doc.get("format")
    drop = {"format"} if isinstance(tag, str) and _TAG.match(tag) else \
        {"format", "version", "schema_version"}
    return version, {k: v for k, v in doc.items() if k not in drop}


#: The units every file of this project is in (the field names carry them: ``time_s``...).
SI_UNITS: Mapping[str, str] = MappingProxyType({"time": "s", "energy": "J", "power": "W"})


def check_units(file: str, units: Any, path: str = "units") -> None:
    """Check a file's ``units`` block (optional; documents the SI units): a unit it names must
    be the SI one, so a file in other units is refused rather than misread."""
    if units is None:
        return
    if not isinstance(units, Mapping):
        raise FormatError(file, path, f"must be an object, got {_show(units)}")
    for key, unit in units.items():
        if key in SI_UNITS and unit != SI_UNITS[key]:
            raise FormatError(file, f"{path}.{key}", f"must be {SI_UNITS[key]!r} (field names "
                              f"carry SI units), got {_show(unit)}")


def _make_strict() -> type:
    from pydantic import BaseModel, ConfigDict

    class Strict(BaseModel):
        """Base of every file model: unknown fields refused, no inf/NaN, no type coercion
        (``"1"`` is not a number, ``true`` not an integer), values immutable."""

        model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True, strict=True)

    Strict.__module__, Strict.__qualname__ = __name__, "Strict"
    return Strict


if TYPE_CHECKING:
    class Strict(BaseModel):
        """Base of every file model (built on first use; see :func:`_make_strict`)."""


def __getattr__(name: str) -> Any:
    # ``Strict`` is built on first access, so importing this module does not import pydantic
    # (about 0.1 s): ``from frontier.formats import Strict`` works as for any class.
    if name == "Strict":
        cls = _make_strict()
        globals()["Strict"] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


M = TypeVar("M", bound="BaseModel")


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _problem(err: Mapping[str, Any]) -> str:
    msg = str(err.get("msg", "invalid"))
    if err.get("type") == "extra_forbidden":
        return "unknown field"
    if err.get("type") == "missing":
        return "missing"
    inp = err.get("input")
    if err.get("type") not in ("missing",) and not isinstance(inp, (dict, list)):
        return f"{msg[:1].lower()}{msg[1:]} (got {_show(inp)})"
    return f"{msg[:1].lower()}{msg[1:]}"


def validate(model: type[M], doc: Any, file: str, prefix: str = "") -> M:
    """``model`` validated from ``doc``; the first fault becomes a one-line
    :class:`FormatError` naming ``file`` and the field path (``prefix`` first, if given)."""
    from pydantic import ValidationError

    try:
        return model.model_validate(doc)
    except ValidationError as e:
        first = e.errors()[0]
        path = _loc(tuple(first.get("loc", ())))
        if prefix:
            path = prefix if path == "(top level)" else f"{prefix}.{path}"
        more = e.error_count() - 1
        tail = f" (and {more} more)" if more else ""
        raise FormatError(file, path, _problem(first) + tail) from None


def model_class(kind_name: str) -> type:
    """The pydantic model that declares ``kind_name``'s current version (imported on first use,
    so reading one format does not import every reader).

    >>> model_class("plan").__name__
    'PlanFile'
    """
    k = kind(kind_name)
    if not k.model:
        raise InputError(f"format {kind_name!r} has no declared model yet")
    module, _, cls = k.model.partition(":")
    model: type = getattr(importlib.import_module(module), cls)
    return model


def json_schema(kind_name: str) -> dict[str, Any]:
    """The JSON Schema of ``kind_name``'s current version (``ecal schema KIND`` prints it)."""
    k = kind(kind_name)
    model: Any = model_class(kind_name)
    schema = model.model_json_schema(by_alias=True)
    # the identity key is checked by check_format, not the model: declare it here
    schema["properties"] = {"format": {"const": k.tag, "description": k.description},
                            **schema.get("properties", {})}
    schema["required"] = ["format", *schema.get("required", [])]
    schema.setdefault("title", k.tag)
    schema["$comment"] = f"{k.tag}: {k.description}"
    return schema
