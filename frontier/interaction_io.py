"""The interaction-table file format (JSON), its atomic writer and its strict reader.

An interaction table (:class:`frontier.interaction.InteractionTable`) is one JSON object::

    {"format": "ecal.interactions/1",       # older tables: "energy-calculus/interaction-table"
                                             #   with "version": 1, still read
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

The shape is declared once, by :class:`frontier.format_models.InteractionsFile` (``ecal schema
interactions``). The reader refuses, as :class:`~frontier.errors.FormatError` (file, path
inside it, problem): another ``format`` or version, unknown fields anywhere it defines the fields, a pair that
is not two members, a bad element name or SM count, an unknown or non-positive knob, an
``omega_dev`` with ``sm_count``, a composed signature, a signature measured at another ω_dev
than its entry's, two entries for one pair (in either order), a bad provenance field, and
everything :func:`frontier.files.read_json` refuses (binary or non-UTF-8 files, invalid JSON,
NaN/Infinity, numbers that overflow a float). The writer is atomic
(:func:`frontier.files.write_json_atomic`): a reader never sees a partial file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from .codec import number_field
from .errors import EnergyCalculusError, FormatError
from .files import read_json, write_json_atomic
from .formats import KINDS, check_units, content, validate
from .interaction import InteractionEntry, InteractionTable, Member, PairKey, Provenance
from .io import UNITS
from .operating_point import OperatingPoint
from .pareto import signature_from_dict, signature_to_dict

#: The ``format`` this module writes.
FORMAT = KINDS["interactions"].tag
#: The ``format`` (with ``"version": 1``) of tables written before ``ecal.interactions/1``.
LEGACY_FORMAT = "energy-calculus/interaction-table"


# -- writing ---------------------------------------------------------------------------------

def entry_to_dict(entry: InteractionEntry) -> dict[str, Any]:
    """One entry as the file holds it."""
    return {**entry.key.to_dict(), "signature": signature_to_dict(entry.signature),
            "provenance": entry.provenance.to_dict()}


def table_to_dict(table: InteractionTable) -> dict[str, Any]:
    """The whole file as a JSON-ready dict."""
    doc: dict[str, Any] = {"format": FORMAT, "units": dict(UNITS)}
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
# The shape (fields, types, a pair of two members, SM counts) is declared by
# frontier.format_models.InteractionsFile; what is checked here is what it means.

def _omega_dev(file: str, path: str, d: Mapping[str, Any]) -> OperatingPoint:
    if "sm_count" in d:
        raise FormatError(file, f"{path}.sm_count", "an ω_dev has no sm_count (the SMs of each "
                                                    "member go in pair[i].sm_count)")
    for k, x in d.items():
        if x is not None:   # physical knobs are positive, named by field
            number_field(file, f"{path}.{k}", x, positive=True)
    try:
        return OperatingPoint.from_dict(dict(d))
    except ValueError as exc:
        raise FormatError(file, path, str(exc)) from None


def _provenance(file: str, path: str, p: Any) -> Provenance:
    try:
        datetime.fromisoformat(p.recorded_utc.replace("Z", "+00:00"))
    except ValueError:
        raise FormatError(file, f"{path}.recorded_utc",
                          f"not an ISO 8601 time: {p.recorded_utc[:60]!r}") from None
    return Provenance(device=p.device, simulated=p.simulated, protocol=dict(p.protocol),
                      recorded_utc=p.recorded_utc, seed=p.seed, uuid=p.uuid)


def _entry(file: str, path: str, e: Any) -> InteractionEntry:
    a, b = (Member(m.element, m.sm_count) for m in e.pair)
    om = _omega_dev(file, f"{path}.omega_dev", e.omega_dev)
    sig = signature_from_dict(e.signature, file, f"{path}.signature")
    if sig.composed:
        raise FormatError(file, f"{path}.signature.composed",
                          "a composed signature is not a co-run measurement")
    if sig.omega.dev != om:
        raise FormatError(file, f"{path}.signature.omega",
                          f"measured at {sig.omega.dev.label()}, but the entry is for omega_dev "
                          f"{om.label()}")
    prov = _provenance(file, f"{path}.provenance", e.provenance)
    try:
        return InteractionEntry(PairKey(a, b, om), sig, prov)
    except EnergyCalculusError as exc:
        raise FormatError(file, path, str(exc)) from None


def table_from_dict(doc: Any, file: str = "<interaction table>") -> InteractionTable:
    """Validate a parsed document (``ecal.interactions/1``, or the older
    ``energy-calculus/interaction-table`` version 1) and build the table (errors:
    :class:`FormatError`)."""
    from .format_models import InteractionsFile

    _, body = content(file, doc, "interactions")
    check_units(file, body.get("units"))
    m = validate(InteractionsFile, body, file)
    entries: list[InteractionEntry] = []
    where: dict[PairKey, int] = {}
    for i, e in enumerate(m.entries):
        entry = _entry(file, f"entries[{i}]", e)
        if entry.key in where:
            raise FormatError(file, f"entries[{i}]", f"{entry.key.label()} is already entries"
                                                     f"[{where[entry.key]}] (one entry per pair)")
        where[entry.key] = i
        entries.append(entry)
    return InteractionTable(tuple(entries), m.description)


def load_interaction_table(path: str | os.PathLike) -> InteractionTable:
    """Read an interaction-table file (format in the module docstring)."""
    file = str(path)
    return table_from_dict(read_json(file), file)
