"""The campaign file: what a characterization campaign measures (elements, their κ, the grid,
the protocol, the device kind), read from YAML or JSON (:func:`load_campaign`) into a frozen
:class:`CampaignSpec`, and cut into units (:func:`shard`). Running it is
:mod:`measure.campaign`; the format is docs/campaign.md (``ecal schema campaign``).

The YAML reader is hardened for files from anywhere: alias bombs, deep nesting, duplicate
keys, non-finite numbers and oversized files are refused in one line naming the file and line.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frontier.errors import FormatError, InputError
from frontier.formats import KINDS, check_format
from frontier.operating_point import OperatingPoint

from .grid import Grid, GridError, parse_grid
from .protocol import Protocol
from .results_log import point_key

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
            works: tuple[tuple[str | None, Any], ...] = tuple((str(k), v) for k, v in ks.items())
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
