"""The interaction-table file format (JSON), its atomic writer and its strict reader.

An interaction table (:class:`frontier.interaction.InteractionTable`) is one JSON object::

    {"format": "energy-calculus/interaction-table",
     "version": 1,
     "units": {"time": "s", "energy": "J", "power": "W"},     # optional; SI, as in frontier.io
     "description": "stage compute || p2p send, simulated H200", # optional
     "entries": [
       {"pair": [{"element": "s0_forward", "sm_count": 116},   # order does not matter
                 {"element": "p2p_send", "sm_count": 16}],     # sm_count: integer >= 1 or null
        "omega_dev": {"sm_clock_mhz": 1980, "power_limit_w": 700},   # no sm_count here
        "signature": {...},        # the co-run signature of a || b, in frontier.pareto's
                                   # lossless codec; a measurement (not "composed"), at omega_dev
        "provenance": {"device": "simulated H200", "simulated": true, "seed": 0,
                       "uuid": "SIM-H200", "protocol": {...},
                       "recorded_utc": "2026-12-01T23:59:00Z"}}]}

The reader refuses, as :class:`~frontier.errors.FormatError` (file, path inside it, problem):
another ``format`` or ``version``, unknown fields anywhere it defines the fields, a pair that
is not two members, a bad element name or SM count, an unknown or non-positive knob, an
``omega_dev`` with ``sm_count``, a composed signature, a signature measured at another ω_dev
than its entry's, two entries for one pair (in either order), a bad provenance field, and
everything :func:`frontier.io.read_json` refuses (binary or non-UTF-8 files, invalid JSON,
NaN/Infinity, numbers that overflow a float). The writer is atomic
(:func:`frontier.io.write_json_atomic`): a reader never sees a partial file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from .errors import EnergyCalculusError, FormatError
from .interaction import InteractionEntry, InteractionTable, Member, PairKey, Provenance
from .io import UNITS, number_field, read_json, write_json_atomic
from .operating_point import OperatingPoint
from .pareto import signature_from_dict, signature_to_dict

FORMAT = "energy-calculus/interaction-table"
VERSION = 1

_TOP = ("format", "version", "units", "description", "entries")
_ENTRY = ("pair", "omega_dev", "signature", "provenance")
_MEMBER = ("element", "sm_count")
_PROV = ("device", "simulated", "seed", "uuid", "protocol", "recorded_utc")


# -- writing ---------------------------------------------------------------------------------

def entry_to_dict(entry: InteractionEntry) -> dict[str, Any]:
    """One entry as the file holds it."""
    return {**entry.key.to_dict(), "signature": signature_to_dict(entry.signature),
            "provenance": entry.provenance.to_dict()}


def table_to_dict(table: InteractionTable) -> dict[str, Any]:
    """The whole file as a JSON-ready dict."""
    doc: dict[str, Any] = {"format": FORMAT, "version": VERSION, "units": dict(UNITS)}
    if table.description:
        doc["description"] = table.description
    doc["entries"] = [entry_to_dict(e) for e in table.entries]
    return doc


def save_interaction_table(path: str | os.PathLike, table: InteractionTable) -> Path:
    """Write ``table`` to ``path`` atomically (the old file stays whole until the rename)."""
    if not isinstance(table, InteractionTable):
        raise TypeError(f"save_interaction_table needs an InteractionTable, got {type(table).__name__}")
    return write_json_atomic(path, table_to_dict(table))


# -- reading ---------------------------------------------------------------------------------

def _show(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _obj(file: str, path: str, v: Any, fields: tuple[str, ...] | None = None) -> dict:
    if not isinstance(v, dict):
        raise FormatError(file, path, f"must be an object, got {_show(v)}")
    if fields is not None:
        extra = sorted(set(v) - set(fields))
        if extra:
            where = f"{path}.{extra[0]}" if path != "(top level)" else extra[0]
            raise FormatError(file, where, f"unknown field (known: {', '.join(fields)})")
    return v


def _need(file: str, path: str, d: Mapping, key: str, what: str) -> Any:
    if key not in d:
        raise FormatError(file, f"{path}.{key}" if path != "(top level)" else key, f"missing ({what})")
    return d[key]


def _text(file: str, path: str, v: Any, nullable: bool = False) -> str | None:
    if v is None and nullable:
        return None
    if not isinstance(v, str) or not v:
        raise FormatError(file, path, f"must be a non-empty string{' or null' if nullable else ''}, "
                                      f"got {_show(v)}")
    return v


def _sm(file: str, path: str, v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 2**31:
        raise FormatError(file, path, f"must be an integer >= 1 or null, got {_show(v)}")
    return v


def _omega_dev(file: str, path: str, v: Any) -> OperatingPoint:
    d = _obj(file, path, v)
    if "sm_count" in d:
        raise FormatError(file, f"{path}.sm_count", "an ω_dev has no sm_count (the SMs of each "
                                                    "member go in pair[i].sm_count)")
    for k, x in d.items():
        if x is not None:   # NaN/inf/bools/strings, named by field
            number_field(file, f"{path}.{k}", x, positive=True)
    try:
        return OperatingPoint.from_dict(d)
    except ValueError as exc:
        raise FormatError(file, path, str(exc)) from None


def _pair(file: str, path: str, v: Any) -> tuple[Member, Member]:
    if not isinstance(v, list) or len(v) != 2:
        raise FormatError(file, path, f"must be a list of two members, got {_show(v)}")
    out = []
    for i, m in enumerate(v):
        p = f"{path}[{i}]"
        m = _obj(file, p, m, _MEMBER)
        el = _text(file, f"{p}.element", _need(file, p, m, "element", "the element's name"))
        out.append(Member(el, _sm(file, f"{p}.sm_count", m.get("sm_count"))))
    return out[0], out[1]


def _provenance(file: str, path: str, v: Any) -> Provenance:
    d = _obj(file, path, v, _PROV)
    device = _text(file, f"{path}.device", _need(file, path, d, "device", "the device measured on"))
    sim = _need(file, path, d, "simulated", "true for the simulator")
    if not isinstance(sim, bool):
        raise FormatError(file, f"{path}.simulated", f"must be true or false, got {_show(sim)}")
    seed = d.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise FormatError(file, f"{path}.seed", f"must be an integer or null, got {_show(seed)}")
    uuid = _text(file, f"{path}.uuid", d.get("uuid"), nullable=True)
    protocol = _obj(file, f"{path}.protocol", d.get("protocol", {}))
    when = _text(file, f"{path}.recorded_utc",
                 _need(file, path, d, "recorded_utc", "when the entry was recorded, ISO 8601 UTC"))
    try:
        datetime.fromisoformat(when.replace("Z", "+00:00"))
    except ValueError:
        raise FormatError(file, f"{path}.recorded_utc", f"not an ISO 8601 time: {_show(when)}") from None
    return Provenance(device=device, simulated=sim, protocol=protocol, recorded_utc=when,
                      seed=seed, uuid=uuid)


def _entry(file: str, path: str, v: Any) -> InteractionEntry:
    d = _obj(file, path, v, _ENTRY)
    a, b = _pair(file, f"{path}.pair", _need(file, path, d, "pair", "the two co-running members"))
    om = _omega_dev(file, f"{path}.omega_dev", d.get("omega_dev", {}))
    body = _need(file, path, d, "signature", "the co-run signature")
    sig = signature_from_dict(body, file, f"{path}.signature")
    if sig.composed:
        raise FormatError(file, f"{path}.signature.composed",
                          "a composed signature is not a co-run measurement")
    if sig.omega.dev != om:
        raise FormatError(file, f"{path}.signature.omega",
                          f"measured at {sig.omega.dev.label()}, but the entry is for omega_dev "
                          f"{om.label()}")
    prov = _provenance(file, f"{path}.provenance",
                       _need(file, path, d, "provenance", "device, protocol, when"))
    try:
        return InteractionEntry(PairKey(a, b, om), sig, prov)
    except EnergyCalculusError as exc:
        raise FormatError(file, path, str(exc)) from None


def table_from_dict(doc: Any, file: str = "<interaction table>") -> InteractionTable:
    """Validate a parsed document and build the table (errors: :class:`FormatError`)."""
    doc = _obj(file, "(top level)", doc, _TOP)
    fmt = _need(file, "(top level)", doc, "format", f"this reader understands {FORMAT!r}")
    if fmt != FORMAT:
        raise FormatError(file, "format", f"is {_show(fmt)}, not {FORMAT!r}")
    ver = _need(file, "(top level)", doc, "version", f"this reader understands {VERSION}")
    if isinstance(ver, bool) or ver != VERSION:
        raise FormatError(file, "version", f"unsupported version {_show(ver)} (this reader understands {VERSION})")
    units = _obj(file, "units", doc.get("units", dict(UNITS)))
    for k, u in units.items():
        if k in UNITS and u != UNITS[k]:
            raise FormatError(file, f"units.{k}", f"must be {UNITS[k]!r} (field names carry SI units), "
                                                  f"got {_show(u)}")
    desc = _text(file, "description", doc.get("description"), nullable=True)
    raw = _need(file, "(top level)", doc, "entries", "a list of jointly measured pairs")
    if not isinstance(raw, list):
        raise FormatError(file, "entries", f"must be a list, got {_show(raw)}")
    entries: list[InteractionEntry] = []
    where: dict[PairKey, int] = {}
    for i, e in enumerate(raw):
        entry = _entry(file, f"entries[{i}]", e)
        if entry.key in where:
            raise FormatError(file, f"entries[{i}]", f"{entry.key.label()} is already entries"
                                                     f"[{where[entry.key]}] (one entry per pair)")
        where[entry.key] = i
        entries.append(entry)
    return InteractionTable(tuple(entries), desc)


def load_interaction_table(path: str | os.PathLike) -> InteractionTable:
    """Read an interaction-table file (format in the module docstring)."""
    file = str(path)
    return table_from_dict(read_json(file), file)
