"""File formats: signature files and composition workbooks (JSON, ``ecal.signatures/1`` and
``ecal.workbook/1``; docs/formats.md).

Every file is a JSON object naming its format (``"format": "ecal.signatures/1"``; files
written before that say ``"schema_version": 1`` and are read as before) with a ``"units"``
block. Its top-level shape is declared once, in :mod:`frontier.format_models`. The units are
fixed (SI, as the field names say) and the block documents them; a file declaring other units
is rejected rather than silently misread::

    "units": {"time": "s", "energy": "J", "power": "W"}

**Signature** (one entry of ``signatures``, keyed by name)::

    {"s_w": 80.0,                    # static (ready) power of its device(s), W
     "time_s": 0.0015,               # T, s
     "energy_j": 0.42,               # E, J   -- or "d_j": dynamic energy (E = s_w·T + d_j)
     "sd_time_s": 1e-5,              # standard error of T (of the *estimate*), s
     "sd_energy_j": 0.004,           # standard error of E, J
                                     #   (or var_time_s2 / var_energy_j2, or run_sd_time_s /
                                     #    run_sd_energy_j = per-run spread, divided by sqrt(n))
     "n": 5, "devices": ["gpu0"], "omega": {"sm_clock_mhz": 1410, "sm_count": 105},
     "kappa": "cuBLAS", "theta": "bf16 8192^3", "meta": {...}}

or raw runs, turned into a signature by :meth:`Signature.from_runs`::

    {"s_w": 123.0, "runs": {"times_s": [...], "energies_j": [...]}}  # per-invocation T and E per run

A signature file is ``{"format": "ecal.signatures/1", "units": ..., "signatures": {name: signature}}``.
Both directions use the one codec, :mod:`frontier.codec`: :func:`save_signatures` writes every
field (a composite's per-leaf sensitivities ``composed``/``terms`` and bias bookkeeping
included, so a composite loaded back still shares error with its leaves), and the reader takes
that as well as every hand-written form above.

Workbooks (signatures plus compositions to evaluate) are read by :mod:`frontier.workbook`;
the strict JSON reader and atomic writers are in :mod:`frontier.files`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .codec import (
    LEAF_FIELDS,
    _obj,
    _unknown,
    signature_from_dict,
    signature_to_dict,
)
from .errors import FormatError, InputError
from .files import read_json, write_json_atomic
from .formats import KINDS, SI_UNITS, check_units, content, validate
from .signature import Signature

#: The ``schema_version`` of signature files and workbooks before ``"format"`` (still read).
SCHEMA_VERSION = 1
#: The units every file of this project is in (one declaration: frontier.formats.SI_UNITS).
UNITS = SI_UNITS


# -- file header ------------------------------------------------------------------------------

#: Kinds whose files a signature reader takes: a workbook may start as a signature file, a
#: signature file is a workbook without compositions, a store export is a signature file with
#: its ``store`` block.
SIGNATURE_KINDS = ("signatures", "workbook", "store-export")


def _kind_of(doc: Any) -> str:
    """Which of :data:`SIGNATURE_KINDS` ``doc`` names (``"workbook"`` for an older file, which
    does not say; ``"signatures"`` for anything else, which :func:`check_format` then refuses)."""
    tag = doc.get("format") if isinstance(doc, Mapping) else None
    if isinstance(tag, str):
        return next((k for k in SIGNATURE_KINDS if tag.startswith(f"ecal.{k}/")), "signatures")
    return "workbook" if isinstance(doc, Mapping) and "schema_version" in doc else "signatures"


def signature_file_body(file: str, doc: Any) -> dict:
    """A signature file's (or workbook's, or store export's) body: ``doc``'s identity (current or older form), top-level shape (its kind's model) and
    units checked; returns it without its identity keys."""
    from . import format_models

    kind = _kind_of(doc)
    _, body = content(file, doc, kind)
    check_units(file, body.get("units"))
    model: Any = {  # a pydantic model class (mypy sees its metaclass without the plugin)
        "signatures": format_models.SignaturesFile, "workbook": format_models.WorkbookFile,
        "store-export": format_models.StoreExportFile}[kind]
    validate(model, body, file)
    return body


# -- signatures -----------------------------------------------------------------------------------

#: Fields a workbook's ``defaults`` may set under every signature.
_DEFAULT_FIELDS = LEAF_FIELDS - {"name", "runs", "time_s", "energy_j", "d_j"}


def parse_signatures(file: str, doc: Mapping, key: str = "signatures") -> dict[str, Signature]:
    """The signatures under ``doc[key]``, each merged over ``doc["defaults"]`` (a workbook's
    fields shared by every signature), keyed by name; :class:`FormatError` otherwise."""
    sigs = _obj(file, key, doc.get(key, {}))
    defaults = _obj(file, "defaults", doc.get("defaults", {}))
    _unknown(file, "defaults", defaults, _DEFAULT_FIELDS)
    out: dict[str, Signature] = {}
    for nm, body in sigs.items():
        merged = {**defaults, **_obj(file, f"{key}.{nm}", body)}
        out[nm] = signature_from_dict(merged, file, f"{key}.{nm}", name=nm)
    return out


def signatures_doc(sigs: Mapping[str, Signature] | Iterable[Signature],
                   extra: Mapping[str, Any] | None = None, kind: str = "signatures",
                   file: str = "<signatures>") -> dict[str, Any]:
    """The JSON document of a signature file (``"format": "ecal.signatures/1"``, or ``kind``
    ``"store-export"``). A mapping's keys are the names. ``extra``: the informational blocks
    its model declares (``meta``, ``description``; a store export's ``store``). Errors name
    ``file``."""
    if isinstance(sigs, Mapping):
        items = list(sigs.items())
    else:
        items = [(s.name, s) for s in sigs]
    seen: set[str] = set()
    for k, s in items:
        if not isinstance(s, Signature):
            raise FormatError(file, f"signatures.{k}", f"is a {type(s).__name__}, not a Signature")
        if k in seen:
            raise FormatError(file, f"signatures.{k}", "two signatures have this name")
        seen.add(k)
    doc = {"format": KINDS[kind].tag, "units": dict(UNITS),
           "signatures": {k: signature_to_dict(s) for k, s in items}}
    for k, v in (extra or {}).items():
        if k in doc:
            raise InputError(f"extra block {k!r} would replace the file's own")
        doc[k] = v
    return doc


def save_signatures(path: str | os.PathLike, sigs: Mapping[str, Signature] | Iterable[Signature],
                    extra: Mapping[str, Any] | None = None, kind: str = "signatures") -> Path:
    """Write :func:`signatures_doc` of ``sigs`` to ``path`` (atomically)."""
    return write_json_atomic(path, signatures_doc(sigs, extra, kind, str(path)))


def load_signatures(path: str | os.PathLike) -> dict[str, Signature]:
    """Read a signature file (or the ``signatures`` of a workbook) into name → Signature."""
    file = str(path)
    doc = signature_file_body(file, read_json(file))
    if "signatures" not in doc:
        raise FormatError(file, "signatures", "missing")
    return parse_signatures(file, doc)
