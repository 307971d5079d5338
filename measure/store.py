"""One results store for every measurement: an SQLite database (stdlib ``sqlite3``).

A row of ``signatures`` is one measured point, keyed by what it is and what measured it:
element, κ, θ, ω, GPU model, GPU UUID, driver, protocol and host (:class:`SignatureKey`). Its
signature is kept in the lossless codec of :mod:`frontier.pareto` (exact variances and ``d_j``),
so a point read back equals the point measured, bit for bit.

A campaign (:mod:`measure.campaign`) also keeps, per campaign, its spec and one ``units`` row
per unit committed, written in the same transaction as the unit's signatures: a unit is done
exactly when its row is there, whatever killed the run before or after.

**Writers.** Only the coordinating process of a campaign writes (workers send their records
back to it). Several coordinators (several campaigns, or a campaign and an import) may share one
store: it runs in WAL mode, every write is one ``BEGIN IMMEDIATE`` transaction (one writer at a
time, the others wait up to ``busy_timeout_s``), and ``synchronous=FULL`` makes a committed
transaction durable. Readers never block writers.

**Formats.** :func:`import_signature_file` / :func:`export_signature_file` convert to and from
:mod:`frontier.io` signature files (``ecal characterize -o``), :func:`import_results_log` /
:func:`export_results_log` to and from :mod:`measure.results_log` files (``--results``).
:func:`read_signatures` is what ``ecal frontier``, ``ecal plan`` and workload files read.
``ecal store import|export|list`` (:mod:`ecal.cmd_store`) is the command line over
:func:`read_points`, :meth:`ResultsStore.merge` (an import never duplicates a point, and says
what it added) and the exports.

>>> import tempfile, os
>>> from frontier.signature import Signature
>>> path = os.path.join(tempfile.mkdtemp(), "r.sqlite")
>>> with ResultsStore(path) as st:
...     _ = st.add(Signature("g", s_w=100.0, time_s=1.0, d_j=5.0), gpu_model="H200", uuid="GPU-1")
>>> [s.energy_j for s in read_signatures(path, gpu_model="H200")["g"]]
[105.0]
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frontier.errors import EnergyCalculusError, FormatError
from frontier.operating_point import OperatingPoint
from frontier.signature import Signature

STORE_FORMAT = "energy-calculus/store"
STORE_VERSION = 1
#: File endings read as a store (everything else is a JSON signature file).
STORE_SUFFIXES = (".sqlite", ".db", ".sqlite3")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS signatures (
    id INTEGER PRIMARY KEY,
    element TEXT NOT NULL,
    kappa TEXT NOT NULL,
    theta TEXT NOT NULL,
    omega TEXT NOT NULL,
    gpu_model TEXT NOT NULL,
    uuid TEXT NOT NULL,
    driver TEXT NOT NULL,
    protocol TEXT NOT NULL,
    host TEXT NOT NULL,
    time_s REAL NOT NULL,
    energy_j REAL NOT NULL,
    signature TEXT NOT NULL,
    campaign TEXT,
    unit TEXT,
    stored_at_s REAL NOT NULL,
    UNIQUE (element, kappa, theta, omega, gpu_model, uuid, driver, protocol, host)
);
CREATE INDEX IF NOT EXISTS signatures_by_model ON signatures (gpu_model, element);
CREATE TABLE IF NOT EXISTS campaigns (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    created_at_s REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS units (
    campaign TEXT NOT NULL,
    unit TEXT NOT NULL,
    record TEXT NOT NULL,
    committed_at_s REAL NOT NULL,
    PRIMARY KEY (campaign, unit)
);
"""


class StoreError(EnergyCalculusError):
    """A store cannot be opened or written (names the file and the problem)."""


def is_store_path(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a store (ends in ``.sqlite``, ``.db`` or ``.sqlite3``)."""
    return str(path).lower().endswith(STORE_SUFFIXES)


def _canon(o: Any) -> str:
    """Canonical JSON (sorted keys, no spaces): equal values give equal text."""
    return json.dumps(o, sort_keys=True, separators=(",", ":"), allow_nan=False, default=str)


def _codec() -> tuple[Any, Any]:
    from frontier.pareto import signature_from_dict, signature_to_dict

    return signature_to_dict, signature_from_dict


def _body(sig: Signature) -> str:
    """A signature as the store keeps it: the lossless codec, canonical JSON."""
    to_dict, _ = _codec()
    return _canon(_json_safe(to_dict(sig)))


def _json_safe(o: Any) -> Any:
    if isinstance(o, float):
        return o if o == o and abs(o) != float("inf") else None
    if isinstance(o, dict):
        return {str(k): _json_safe(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_json_safe(v) for v in o]
    return o


@dataclass(frozen=True)
class SignatureKey:
    """What a stored point is and what measured it (the store's unique key).

    ``omega`` and ``protocol`` are canonical JSON (:meth:`OperatingPoint.to_dict`,
    :meth:`~measure.protocol.Protocol.to_dict`); a missing κ or θ is ``""``.
    """

    element: str
    kappa: str
    theta: str
    omega: str
    gpu_model: str
    uuid: str
    driver: str
    protocol: str
    host: str

    @property
    def operating_point(self) -> OperatingPoint:
        """ω as an :class:`OperatingPoint`."""
        return OperatingPoint.from_dict(json.loads(self.omega))

    def as_tuple(self) -> tuple[str, ...]:
        """The nine fields in schema order."""
        return (self.element, self.kappa, self.theta, self.omega, self.gpu_model, self.uuid,
                self.driver, self.protocol, self.host)


def key_of(sig: Signature, gpu_model: str | None = None, uuid: str | None = None,
           driver: str | None = None, protocol: Mapping[str, Any] | str | None = None,
           host: str | None = None) -> SignatureKey:
    """The store key of ``sig``: given fields win, else the signature's metadata (what
    :func:`~measure.protocol.measure_point` records: ``uuid``, ``driver``, ``device``,
    ``protocol_settings``, ``host``), else ``"unknown"``."""
    m = sig.meta

    def pick(given: Any, *names: str) -> str:
        if given is not None:
            return str(given)
        for n in names:
            if m.get(n) not in (None, ""):
                return str(m[n])
        return "unknown"

    if isinstance(protocol, str):
        proto = protocol
    else:
        p = protocol if protocol is not None else m.get("protocol_settings")
        proto = _canon(_json_safe(dict(p))) if isinstance(p, Mapping) else "unknown"
    return SignatureKey(sig.name, sig.kappa or "", sig.theta or "", _canon(sig.omega.to_dict()),
                        pick(gpu_model, "gpu_model", "device"), pick(uuid, "uuid"),
                        pick(driver, "driver"), proto, pick(host, "host"))


def protocol_key(settings: Mapping[str, Any]) -> str:
    """The store's ``protocol`` key field for protocol settings (canonical JSON)."""
    return _canon(_json_safe(dict(settings)))


def model_matches(stored: str, wanted: str) -> bool:
    """Whether GPU model ``stored`` is the ``wanted`` one: equal ignoring case and an
    ``NVIDIA`` prefix (``H200`` matches ``NVIDIA H200``; ``simulated H200`` matches only
    itself, so simulated and real measurements never mix)."""
    def norm(s: str) -> str:
        s = s.strip().lower()
        return s[len("nvidia "):] if s.startswith("nvidia ") else s
    return norm(stored) == norm(wanted)


@dataclass(frozen=True)
class StoredSignature:
    """One row: its key, the signature, and the campaign unit that measured it (if any)."""

    key: SignatureKey
    signature: Signature
    campaign: str | None = None
    unit: str | None = None


@dataclass(frozen=True)
class GroupSummary:
    """The points of one element measured on one GPU model (:meth:`ResultsStore.summary`):
    how many, the campaigns and campaign units that stored them, the hosts and cards."""

    gpu_model: str
    element: str
    points: int
    campaigns: tuple[str, ...]
    units: int
    hosts: tuple[str, ...]
    uuids: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON form (lists for the tuples)."""
        return {"gpu_model": self.gpu_model, "element": self.element, "points": self.points,
                "campaigns": list(self.campaigns), "units": self.units,
                "hosts": list(self.hosts), "uuids": list(self.uuids)}


@dataclass(frozen=True)
class CampaignSummary:
    """One campaign of a store: units committed, points stored, when it first ran."""

    name: str
    units_done: int
    points: int
    created_at_s: float

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"name": self.name, "units_done": self.units_done, "points": self.points,
                "created_at_s": self.created_at_s}


class ResultsStore:
    """An SQLite results store (see the module docstring). Use as a context manager, or
    :meth:`close` it. ``busy_timeout_s``: how long a writer waits for another one."""

    def __init__(self, path: str | os.PathLike, busy_timeout_s: float = 60.0,
                 create: bool = True):
        self.path = Path(path)
        if not create and not self.path.exists():
            raise FileNotFoundError(2, "no such file", str(path))
        try:
            # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE ... COMMIT)
            self._db = sqlite3.connect(str(self.path), timeout=busy_timeout_s,
                                       isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(f"{path}: cannot open the store: {exc}") from None
        try:
            self._db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            mode = self._db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{path}: the store needs WAL mode, got {mode!r} (a network "
                                 "file system? put the store on a local disk)")
            self._db.execute("PRAGMA synchronous = FULL")
            with self.transaction():
                for stmt in _SCHEMA.strip().split(";"):
                    if stmt.strip():
                        self._db.execute(stmt)
                row = self._db.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
                if row is None:
                    self._db.executemany("INSERT INTO meta VALUES (?, ?)",
                                         [("format", STORE_FORMAT), ("version", str(STORE_VERSION))])
                elif row[0] != STORE_FORMAT:
                    raise FormatError(str(path), "meta.format",
                                      f"{row[0]!r} is not an energy-calculus store")
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise FormatError(str(path), "content",
                              f"not an energy-calculus store ({exc}); refusing to change it") from None
        except BaseException:
            self._db.close()
            raise

    # -- plumbing -------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the connection (idempotent)."""
        db, self._db = getattr(self, "_db", None), None
        if db is not None:
            db.close()

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def transaction(self) -> _Transaction:
        """``with store.transaction():`` one write transaction (``BEGIN IMMEDIATE``): all of
        it is committed, or none of it (rolled back on any exception)."""
        return _Transaction(self._db)

    # -- signatures -----------------------------------------------------------------------------
    def add(self, sig: Signature, *, gpu_model: str | None = None, uuid: str | None = None,
            driver: str | None = None, protocol: Mapping[str, Any] | str | None = None,
            host: str | None = None, campaign: str | None = None, unit: str | None = None,
            replace: bool = True) -> SignatureKey:
        """Store one measured signature under its key (:func:`key_of`); returns the key.

        A point already stored under the same key (the same GPU, protocol and host measured it
        again) is replaced by this newer measurement with ``replace`` (default), kept
        otherwise. Runs in the caller's transaction when one is open, else in its own."""
        k = key_of(sig, gpu_model, uuid, driver, protocol, host)
        body = _body(sig)
        verb = "INSERT OR REPLACE" if replace else "INSERT OR IGNORE"
        sql = (f"{verb} INTO signatures (element, kappa, theta, omega, gpu_model, uuid, driver, "
               "protocol, host, time_s, energy_j, signature, campaign, unit, stored_at_s) "
               "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
        args = (*k.as_tuple(), float(sig.time_s), float(sig.energy_j), body, campaign, unit,
                time.time())
        if self._db.in_transaction:
            self._db.execute(sql, args)
        else:
            with self.transaction():
                self._db.execute(sql, args)
        return k

    def rows(self, element: str | None = None, gpu_model: str | None = None,
             uuid: str | None = None, campaign: str | None = None,
             host: str | None = None) -> list[StoredSignature]:
        """Stored points, filtered (``gpu_model`` by :func:`model_matches`), in a stable order
        (element, κ, θ, ω, then what measured them)."""
        where, args = [], []
        for col, v in (("element", element), ("uuid", uuid), ("campaign", campaign),
                       ("host", host)):
            if v is not None:
                where.append(f"{col} = ?")
                args.append(v)
        sql = ("SELECT element, kappa, theta, omega, gpu_model, uuid, driver, protocol, host, "
               "signature, campaign, unit FROM signatures"
               + (" WHERE " + " AND ".join(where) if where else "")
               + " ORDER BY element, kappa, theta, omega, gpu_model, uuid, driver, protocol, host")
        _, from_dict = _codec()
        out = []
        for r in self._db.execute(sql, args):
            k = SignatureKey(*r[:9])
            if gpu_model is not None and not model_matches(k.gpu_model, gpu_model):
                continue
            sig = from_dict(json.loads(r[9]), file=str(self.path), path=f"signatures[{k.element}]")
            out.append(StoredSignature(k, sig, r[10], r[11]))
        return out

    def gpu_models(self) -> list[str]:
        """The GPU models the store has measurements of."""
        return [r[0] for r in self._db.execute(
            "SELECT DISTINCT gpu_model FROM signatures ORDER BY gpu_model")]

    def count(self) -> int:
        """Number of stored points."""
        return int(self._db.execute("SELECT COUNT(*) FROM signatures").fetchone()[0])

    def merge(self, sig: Signature, *, gpu_model: str | None = None, uuid: str | None = None,
              driver: str | None = None, protocol: Mapping[str, Any] | str | None = None,
              host: str | None = None, campaign: str | None = None, unit: str | None = None,
              replace: bool = False) -> str:
        """Store ``sig`` (key fields as :meth:`add` takes them) unless its key already holds a
        point, and say what happened: ``"added"`` (a new key), ``"present"`` (the key holds
        this very signature, compared in the lossless codec: nothing changes, the stored
        campaign and unit stay), ``"kept"`` (the key holds another measurement, left as it is)
        or, with ``replace``, ``"replaced"`` by this one. Runs in the caller's transaction when
        one is open, else in its own (the look-up and the write are one transaction)."""
        if not self._db.in_transaction:
            with self.transaction():
                return self.merge(sig, gpu_model=gpu_model, uuid=uuid, driver=driver,
                                  protocol=protocol, host=host, campaign=campaign, unit=unit,
                                  replace=replace)
        k = key_of(sig, gpu_model, uuid, driver, protocol, host)
        row = self._db.execute(
            "SELECT signature FROM signatures WHERE element = ? AND kappa = ? AND theta = ? AND "
            "omega = ? AND gpu_model = ? AND uuid = ? AND driver = ? AND protocol = ? AND host = ?",
            k.as_tuple()).fetchone()
        if row is not None:
            if row[0] == _body(sig):
                return "present"
            if not replace:
                return "kept"
        self.add(sig, gpu_model=k.gpu_model, uuid=k.uuid, driver=k.driver, protocol=k.protocol,
                 host=k.host, campaign=campaign, unit=unit, replace=True)
        return "added" if row is None else "replaced"

    def summary(self) -> list[GroupSummary]:
        """What the store holds per GPU model and element (sorted by both)."""
        groups: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
        for r in self._db.execute("SELECT gpu_model, element, campaign, unit, host, uuid "
                                  "FROM signatures"):
            groups.setdefault((r[0], r[1]), []).append(r)
        out = []
        for (model, element), rs in sorted(groups.items()):
            out.append(GroupSummary(
                gpu_model=model, element=element, points=len(rs),
                campaigns=tuple(sorted({r[2] for r in rs if r[2] is not None})),
                units=len({(r[2], r[3]) for r in rs if r[2] is not None and r[3] is not None}),
                hosts=tuple(sorted({r[4] for r in rs})), uuids=tuple(sorted({r[5] for r in rs}))))
        return out

    def campaigns(self) -> list[CampaignSummary]:
        """Every campaign the store has seen: units committed and points stored (by name)."""
        return [CampaignSummary(name, int(units), int(points), float(created))
                for name, created, units, points in self._db.execute(
                    "SELECT c.name, c.created_at_s, "
                    "(SELECT COUNT(*) FROM units u WHERE u.campaign = c.name), "
                    "(SELECT COUNT(*) FROM signatures s WHERE s.campaign = c.name) "
                    "FROM campaigns c ORDER BY c.name")]

    # -- campaigns ------------------------------------------------------------------------------
    def campaign_spec(self, name: str) -> dict[str, Any] | None:
        """The identity a campaign was first run with (None when the store has not seen it)."""
        row = self._db.execute("SELECT spec FROM campaigns WHERE name = ?", (name,)).fetchone()
        return json.loads(row[0]) if row else None

    def register_campaign(self, name: str, identity: Mapping[str, Any]) -> None:
        """Record a campaign's identity the first time it runs (no-op afterwards)."""
        with self.transaction():
            self._db.execute("INSERT OR IGNORE INTO campaigns VALUES (?, ?, ?)",
                             (name, _canon(_json_safe(dict(identity))), time.time()))

    def done_units(self, campaign: str) -> dict[str, dict[str, Any]]:
        """Committed units of ``campaign``: unit key → its record."""
        return {u: json.loads(rec) for u, rec in self._db.execute(
            "SELECT unit, record FROM units WHERE campaign = ?", (campaign,))}

    def commit_unit(self, campaign: str, unit: str, record: Mapping[str, Any],
                    signatures: Iterable[tuple[Signature, Mapping[str, Any]]]) -> bool:
        """Commit one unit: its record and its signatures (each with its key fields, as
        :meth:`add` takes them) in one transaction. Returns False, changing nothing, when the
        unit was already committed (by this or a concurrent run of the same campaign), so a
        unit is counted exactly once."""
        with self.transaction():
            if self._db.execute("SELECT 1 FROM units WHERE campaign = ? AND unit = ?",
                                (campaign, unit)).fetchone():
                return False
            for sig, fields in signatures:
                self.add(sig, campaign=campaign, unit=unit, **dict(fields))
            self._db.execute("INSERT INTO units VALUES (?, ?, ?, ?)",
                             (campaign, unit, _canon(_json_safe(dict(record))), time.time()))
        return True

    def contents(self, measured_by: bool = True) -> list[tuple[Any, ...]]:
        """Every stored point as a comparable tuple (key fields, the signature's JSON). With
        ``measured_by=False`` which card and host measured it is left out (``uuid`` and
        ``host`` from the key and the signature's metadata): two runs that measured the same
        points on different cards of one model then compare equal."""
        out = []
        for r in self._db.execute(
                "SELECT element, kappa, theta, omega, gpu_model, uuid, driver, protocol, host, "
                "signature, campaign, unit FROM signatures"):
            key, body = list(r[:9]), json.loads(r[9])
            if not measured_by:
                key[5] = key[8] = ""
                for f in ("uuid", "host"):
                    body.get("meta", {}).pop(f, None)
            out.append((*key, _canon(body), r[10], r[11]))
        return sorted(out)


class _Transaction:
    """``BEGIN IMMEDIATE`` … ``COMMIT`` (``ROLLBACK`` on an exception)."""

    def __init__(self, db: sqlite3.Connection):
        self._db = db

    def __enter__(self) -> sqlite3.Connection:
        self._db.execute("BEGIN IMMEDIATE")
        return self._db

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        if exc_type is None:
            self._db.execute("COMMIT")
        else:
            self._db.execute("ROLLBACK")


# -- contract D: what frontier / plan / workload files read ---------------------------------------

def read_signatures(path: str | os.PathLike, element: str | None = None,
                    gpu_model: str | None = None) -> dict[str, list[Signature]]:
    """Signatures of a store, by element (as :data:`measure.replay.Signatures`), filtered by
    element and GPU model (:func:`model_matches`). Points of one ω measured on several cards
    are all returned. The store must exist (it is not created)."""
    out: dict[str, list[Signature]] = {}
    with ResultsStore(path, create=False) as st:
        for r in st.rows(element=element, gpu_model=gpu_model):
            out.setdefault(r.key.element, []).append(r.signature)
    return out


# -- import / export ------------------------------------------------------------------------------

def import_signature_file(store: ResultsStore, path: str | os.PathLike, *,
                          gpu_model: str | None = None, host: str | None = None) -> int:
    """Add every signature of a :mod:`frontier.io` signature file (one transaction); the
    element is the part of its name before ``@`` (``gemm@1980MHz`` → ``gemm``, as ``ecal
    frontier`` groups a file), the rest of the key comes from each signature's metadata where
    ``gpu_model``/``host`` are not given. Returns how many were stored."""
    from frontier.io import load_signatures

    sigs = load_signatures(path)
    with store.transaction():
        for name, s in sigs.items():
            element = name.split("@", 1)[0]
            if element != s.name and not s.composed:
                s = s.with_(name=element)
            store.add(s, gpu_model=gpu_model, host=host)
    return len(sigs)


#: Format of the ``store`` block of a signature file exported from a store.
EXPORT_FORMAT = "energy-calculus/store-export"
#: The key fields an export's ``store`` block records per signature (with campaign and unit).
KEY_FIELDS = ("element", "kappa", "theta", "omega", "gpu_model", "uuid", "driver", "protocol",
              "host")


def export_signature_file(store: ResultsStore, path: str | os.PathLike, *,
                          element: str | None = None, gpu_model: str | None = None,
                          uuid: str | None = None, host: str | None = None) -> int:
    """Write the store's points (filtered) as a signature file keyed ``element@κ@ω`` like
    ``ecal characterize -o`` (``@<uuid>`` added where several cards measured one point),
    atomically. A top-level ``store`` block (``format`` :data:`EXPORT_FORMAT`; readers of
    signature files ignore it) records each signature's store key and campaign unit, so
    :func:`read_points` restores the very rows. Returns how many were written."""
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
                    extra={"store": {"format": EXPORT_FORMAT, "version": 1, "keys": keys}})
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
    device = {k: meta[k] for k in ("device", "simulated", "read_only", "seed_model", "seed")
              if k in meta}
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
    the line or field) for anything else, FileNotFoundError for a missing file."""
    p = os.fspath(path)
    with open(p, "rb") as fh:
        head = fh.read(1 << 16)
    if head.startswith(SQLITE_MAGIC):
        raise FormatError(p, "(file)", "is an SQLite database (a results store?), not a signature "
                                       "file or a results log: export it first (ecal store export)")
    lead = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if lead.startswith(b'{"kind"'):
        return _results_log_points(p)
    if lead.startswith(b"{"):
        return _signature_file_points(p)
    raise FormatError(p, "(file)", ("is empty" if not lead else "is not JSON") + ": neither a "
                      "signature file (a JSON object with schema_version and signatures) nor a "
                      "results log (JSON lines, a header record first)")


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
    from frontier.io import load_signatures, read_json
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
    if fmt is not None:
        raise FormatError(p, "format", f"{fmt!r} is not a file of signatures")
    sigs = load_signatures(p)
    block = doc.get("store")
    keys = block.get("keys") if isinstance(block, dict) and block.get("format") == EXPORT_FORMAT else {}
    if not isinstance(keys, dict):
        raise FormatError(p, "store.keys", "must be an object")
    pts = []
    for name, s in sigs.items():
        s = _renamed(s, name.split("@", 1)[0])
        k = keys.get(name, {})
        if not isinstance(k, dict) or not all(v is None or isinstance(v, str) for v in k.values()):
            raise FormatError(p, f"store.keys.{name}", "must be an object of strings")
        fields = {f: k.get(f) for f in KEY_FIELDS[4:]}
        pt = FilePoint(s, fields, k.get("campaign"), k.get("unit"), f"signatures.{name}")
        if k and pt.recorded_key().as_tuple()[:4] != tuple(k.get(f) for f in KEY_FIELDS[:4]):
            raise FormatError(p, f"store.keys.{name}", "does not match its signature (element, "
                                                       "kappa, theta or omega differ)")
        pts.append(pt)
    return PointsRead(p, "signatures", tuple(pts))


def default_host() -> str:
    """This machine's host name (what a measurement records as its ``host``)."""
    return socket.gethostname()


def iter_elements(rows: Iterable[StoredSignature]) -> Iterator[str]:
    """Distinct element names of ``rows``, in order."""
    seen: set[str] = set()
    for r in rows:
        if r.key.element not in seen:
            seen.add(r.key.element)
            yield r.key.element
