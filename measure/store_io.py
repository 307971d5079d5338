"""The results store's file side: import and export of signature files and results logs
(``ecal store import`` / ``ecal store export``), and reading any file a store import takes
(:func:`read_points`: a signature file, a store export, a characterization's JSON or a
results log) into points with the key fields the file records. The store itself, its schema
and its queries are :mod:`measure.store`."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from frontier.errors import FormatError
from frontier.formats import KINDS, content
from frontier.signature import Signature

from .store import (
    ResultsStore,
    SignatureKey,
    StoredSignature,
    StoreError,
    key_of,
    nonfinite_problem,
)

# -- import / export ------------------------------------------------------------------------------

def import_signature_file(store: ResultsStore, path: str | os.PathLike, *,
                          gpu_model: str | None = None, host: str | None = None) -> int:
    """Add every signature of a :mod:`frontier.io` signature file (one transaction); the
    element is the part of its name before ``@`` (``gemm@1980MHz`` → ``gemm``, as ``ecal
    frontier`` groups a file), the rest of the key comes from each signature's metadata where
    ``gpu_model``/``host`` are not given. Returns how many were stored."""
    from frontier.io import load_signatures

    sigs = load_signatures(path)
    for name, s in sigs.items():
        bad = nonfinite_problem(s)
        if bad is not None:
            raise FormatError(str(path), f"signatures.{name}", bad)
    with store.transaction():
        for name, s in sigs.items():
            element = name.split("@", 1)[0]
            if element != s.name and not s.composed:
                s = s.with_(name=element)
            store.add(s, gpu_model=gpu_model, host=host)
    return len(sigs)


#: Format of a signature file exported from a store (``ecal.store-export/1``).
EXPORT_FORMAT = KINDS["store-export"].tag
#: Before ``ecal.store-export/1``: an export was a signature file (``schema_version`` 1) whose
#: ``store`` block said ``"format": "energy-calculus/store-export", "version": 1`` (still read).
LEGACY_EXPORT_FORMAT = KINDS["store-export"].legacy_names[0]
#: The key fields an export's ``store`` block records per signature (with campaign and unit).
KEY_FIELDS = ("element", "kappa", "theta", "omega", "gpu_model", "uuid", "driver", "protocol",
              "host")


def export_signature_file(store: ResultsStore, path: str | os.PathLike, *,
                          element: str | None = None, gpu_model: str | None = None,
                          uuid: str | None = None, host: str | None = None) -> int:
    """Write the store's points (filtered) as a signature file keyed ``element@κ@ω`` like
    ``ecal characterize -o`` (``@<uuid>`` added where several cards measured one point),
    atomically, as ``"format": "ecal.store-export/1"`` (a signature file every reader of
    signature files takes). Its ``store`` block records each signature's store key and
    campaign unit, so :func:`read_points` restores the very rows. Returns how many were
    written."""
    from frontier.io import save_signatures

    rows = store.rows(element=element, gpu_model=gpu_model, uuid=uuid, host=host)
    keyed: dict[str, StoredSignature] = {}
    names = []
    for r in rows:
        s = r.signature
        names.append("@".join([s.name] + ([s.kappa] if s.kappa else []) + [s.omega.label()]))
    dup = {n for n in names if names.count(n) > 1}
    for n, r in zip(names, rows):
        k = f"{n}@{r.key.uuid}" if n in dup else n
        i = 2
        while k in keyed:      # the same card under several protocols or hosts
            k, i = f"{n}@{r.key.uuid}#{i}", i + 1
        keyed[k] = r
    keys = {k: {**dict(zip(KEY_FIELDS, r.key.as_tuple())), "campaign": r.campaign, "unit": r.unit}
            for k, r in keyed.items()}
    save_signatures(path, {k: r.signature for k, r in keyed.items()},
                    extra={"store": {"keys": keys}}, kind="store-export")
    return len(keyed)


def import_results_log(store: ResultsStore, path: str | os.PathLike, *,
                       gpu_model: str | None = None) -> int:
    """Add the points of a :mod:`measure.results_log` file (read only, never changed): the
    header gives the GPU (name, UUID, driver), the protocol and the host. Returns how many."""
    from .results_log import ResultsLog

    log = ResultsLog(path)
    if log.header is None:
        raise FormatError(str(path), "header", "missing: not a results file with points")
    fields = _results_log_fields(log.header)
    if gpu_model:
        fields["gpu_model"] = gpu_model
    for point, sig in log.points.items():
        bad = nonfinite_problem(sig)
        if bad is not None:
            raise FormatError(str(path), f"point {point}", bad)
    with store.transaction():
        for point, sig in log.points.items():
            # the point's key (its κ label) is kept as the row's unit, for a faithful export
            store.add(sig, unit=point, **fields)
    return len(log.points)


def _results_log_fields(header: Mapping[str, Any]) -> dict[str, Any]:
    """The store key fields a results file's header records for all its points."""
    dev = header.get("device") or {}
    return {"gpu_model": dev.get("gpu_model") or dev.get("device"), "uuid": dev.get("uuid"),
            "driver": dev.get("driver"), "protocol": header.get("protocol"), "host": header.get("host")}


def export_results_log(store: ResultsStore, path: str | os.PathLike, element: str, *,
                       uuid: str | None = None, gpu_model: str | None = None,
                       host: str | None = None) -> int:
    """Write one element's points measured on one card under one protocol as a results file
    (``ecal characterize --results`` format; a new file, or one of the same measurement, which
    is then extended). Raises :class:`StoreError` when the selection spans several cards or
    protocols (give ``uuid``). Returns how many points the file gained."""
    from .protocol import Protocol
    from .results_log import ResultsLog, point_key

    rows = store.rows(element=element, gpu_model=gpu_model, uuid=uuid, host=host)
    if not rows:
        raise StoreError(f"{store.path}: no points of {element!r}"
                         + (f" on {gpu_model}" if gpu_model else ""))
    ids = {(r.key.uuid, r.key.driver, r.key.protocol, r.key.host, r.key.gpu_model) for r in rows}
    if len(ids) > 1:
        raise StoreError(f"{store.path}: {element!r} was measured on {len(ids)} cards or "
                         "protocols; a results file holds one: pick a card with uuid=")
    uid, driver, proto, host, model = ids.pop()
    meta = dict(rows[0].signature.meta)
    device: dict[str, Any] = {k: meta[k] for k in ("device", "simulated", "read_only",
                                                   "seed_model", "seed") if k in meta}
    device.update(uuid=uid, driver=driver, gpu_model=model)
    header = {"element": element, "kappas": sorted({r.signature.kappa for r in rows},
                                                   key=lambda k: k or ""),
              "grid": {}, "protocol": json.loads(proto) if proto != "unknown" else {},
              "device": device, "host": host}
    n = 0
    with ResultsLog.open(path, f"export of {element} from {store.path}") as log:
        log.check_identity(header, Protocol().to_dict())
        log.write_header(header)
        for r in rows:
            s = r.signature
            k = r.unit if r.unit and r.unit.startswith("[") else point_key(element, s.kappa,
                                                                              s.omega)
            if k not in log.points:
                log.add_point(k, s)
                n += 1
    return n


# -- reading files for an import (ecal store import) -----------------------------------------------

#: The first bytes of every SQLite database file.
SQLITE_MAGIC = b"SQLite format 3\x00"
#: Formats of ``ecal characterize --json`` documents (signatures as a list).
CHARACTERIZATION_FORMATS = ("energy-calculus/characterization",
                            "energy-calculus/characterization-campaign")


@dataclass(frozen=True)
class FilePoint:
    """One point read from a file, before it is stored: the signature, the key fields the file
    records for it (``gpu_model``, ``uuid``, ``driver``, ``protocol``, ``host``; None where it
    records none, then :func:`key_of` looks in the signature's metadata), its campaign unit
    (a store export's) or results-file point key, and where it is in the file."""

    signature: Signature
    fields: Mapping[str, Any]
    campaign: str | None = None
    unit: str | None = None
    where: str = ""

    def recorded_key(self) -> SignatureKey:
        """The store key from what the file records alone (``"unknown"`` where nothing)."""
        f = self.fields
        return key_of(self.signature, f.get("gpu_model"), f.get("uuid"), f.get("driver"),
                      f.get("protocol"), f.get("host"))


@dataclass(frozen=True)
class PointsRead:
    """The points of one input file: its ``kind`` (``"signatures"`` or ``"results-log"``),
    the points in file order, and warnings (e.g. a torn last line that was left out)."""

    file: str
    kind: str
    points: tuple[FilePoint, ...]
    warnings: tuple[str, ...] = ()


def read_points(path: str | os.PathLike) -> PointsRead:
    """Read an input file for an import, whichever kind it is, told by its content: a results
    log (:mod:`measure.results_log`: JSON lines, the first a ``{"kind": ...`` record) or a JSON
    signature file (:func:`frontier.io.load_signatures`: ``ecal characterize -o``, ``ecal
    import``, a workbook, a store export with its ``store`` block) or an ``ecal characterize
    --json`` document. The file is only read. Raises :class:`FormatError` naming the file (and
    the line or field) for anything else, FileNotFoundError for a missing file. A point with a
    field that is not a finite number (``energy_j`` = s·T + d included) is a
    :class:`FormatError` naming the file and the point: the store takes none of it."""
    p = os.fspath(path)
    with open(p, "rb") as fh:
        head = fh.read(1 << 16)
    if head.startswith(SQLITE_MAGIC):
        raise FormatError(p, "(file)", "is an SQLite database (a results store?), not a signature "
                                       "file or a results log: export it first (ecal store export)")
    lead = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if lead.startswith(b'{"kind"'):
        return _finite(_results_log_points(p))
    if lead.startswith(b"{"):
        return _finite(_signature_file_points(p))
    raise FormatError(p, "(file)", ("is empty" if not lead else "is not JSON") + ": neither a "
                      "signature file (a JSON object with schema_version and signatures) nor a "
                      "results log (JSON lines, a header record first)")


def _finite(read: PointsRead) -> PointsRead:
    """``read``, after checking that every number of every point is finite."""
    for pt in read.points:
        bad = nonfinite_problem(pt.signature)
        if bad is not None:
            raise FormatError(read.file, pt.where, bad)
    return read


def _results_log_points(p: str) -> PointsRead:
    from .results_log import ResultsLog

    log = ResultsLog(p)
    if log.header is None:
        raise FormatError(p, "header", "missing: not a results file with points")
    fields = _results_log_fields(log.header)      # as import_results_log stores them
    pts = tuple(FilePoint(sig, fields, None, key, f"point {key}") for key, sig in log.points.items())
    warn = ("its last line is cut short (a sweep killed while writing it): left out, the complete "
            "points are read",) if log.dropped_partial_line else ()
    return PointsRead(p, "results-log", pts, warn)


def _renamed(s: Signature, element: Any) -> Signature:
    return s.with_(name=element) if isinstance(element, str) and element and element != s.name \
        and not s.composed else s


def _signature_file_points(p: str) -> PointsRead:
    from frontier.files import read_json
    from frontier.io import load_signatures
    from frontier.pareto import signature_from_dict

    doc = read_json(p)
    fmt = doc.get("format") if isinstance(doc, dict) else None
    if fmt in CHARACTERIZATION_FORMATS:
        docs = doc.get("elements") if fmt == CHARACTERIZATION_FORMATS[1] else [doc]
        if not isinstance(docs, list) or not all(isinstance(d, dict) for d in docs):
            raise FormatError(p, "elements", "must be a list of characterizations")
        pts = []
        for i, d in enumerate(docs):
            at = f"elements[{i}]." if fmt == CHARACTERIZATION_FORMATS[1] else ""
            if not isinstance(d.get("signatures"), list):
                raise FormatError(p, f"{at}signatures", "must be a list")
            for j, body in enumerate(d["signatures"]):
                s = signature_from_dict(body, p, f"{at}signatures[{j}]")
                pts.append(FilePoint(_renamed(s, d.get("element")), {}, where=f"{at}signatures[{j}]"))
        return PointsRead(p, "signatures", tuple(pts))
    if fmt is not None and _signature_kind(fmt) is None:
        raise FormatError(p, "format", f"{fmt!r} is not a file of signatures")
    sigs = load_signatures(p)       # checks the identity and the shape (its kind's model)
    keys = _export_keys(p, doc)
    pts = []
    for name, s in sigs.items():
        s = _renamed(s, name.split("@", 1)[0])
        k = keys.get(name, {})
        fields = {f: k.get(f) for f in KEY_FIELDS[4:]}
        pt = FilePoint(s, fields, k.get("campaign"), k.get("unit"), f"signatures.{name}")
        if k and pt.recorded_key().as_tuple()[:4] != tuple(k.get(f) for f in KEY_FIELDS[:4]):
            raise FormatError(p, f"store.keys.{name}", "does not match its signature (element, "
                                                       "kappa, theta or omega differ)")
        pts.append(pt)
    return PointsRead(p, "signatures", tuple(pts))


def _signature_kind(tag: Any) -> str | None:
    """The kind of signature file a ``format`` value names (None: not one)."""
    from frontier.io import SIGNATURE_KINDS

    return next((k for k in SIGNATURE_KINDS if isinstance(tag, str)
                 and tag.startswith(f"ecal.{k}/")), None)


def _export_keys(p: str, doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The store keys by signature name of an export (``ecal.store-export/1``, or an older
    signature file whose ``store`` block says :data:`LEGACY_EXPORT_FORMAT`); ``{}`` for any
    other signature file. The block's shape is :class:`frontier.format_models.StoreExportBlock`."""
    from frontier.format_models import StoreExportBlock
    from frontier.formats import validate

    block = doc.get("store")
    if _signature_kind(doc.get("format")) == "store-export":
        body = block
    elif isinstance(block, dict) and block.get("format") == LEGACY_EXPORT_FORMAT:
        _, body = content(p, block, "store-export")
    else:
        return {}
    m = validate(StoreExportBlock, body, p, prefix="store")
    return {name: k.model_dump(exclude_unset=True) for name, k in m.keys.items()}
