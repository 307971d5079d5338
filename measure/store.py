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

**Formats** (:mod:`measure.store_io`). :func:`import_signature_file` /
:func:`export_signature_file` convert to and from :mod:`frontier.io` signature files
(``ecal characterize -o``), :func:`import_results_log` / :func:`export_results_log` to and
from :mod:`measure.results_log` files (``--results``).
:func:`read_signatures` is what ``ecal frontier``, ``ecal plan`` and workload files read.
``ecal store import|export|list`` (:mod:`ecal.cmd_store`) is the command line over
:func:`read_points`, :meth:`ResultsStore.merge` (an import never duplicates a point, and says
what it added) and the exports.

**Failures are one line naming the store.** Every SQLite operation of :class:`ResultsStore`
(opening, queries, transactions, :meth:`~ResultsStore.commit_unit`) turns an
``sqlite3.Error`` (a damaged page: "database disk image is malformed"; a full disk: "database
or disk is full"; a read-only file) into a :class:`StoreError` naming the store's path, which
``ecal`` prints as one line (exit 2) in every command that reads or writes a store (``ecal
store``, ``ecal frontier STORE``, ``ecal plan`` of a workload reading one, ``ecal
campaign``). A failed transaction is rolled back: the store keeps what it held.

**Only finite numbers go in.** A signature with a field that is not a finite number, derived
fields included (``energy_j`` = s·T + d overflows to inf for ``time_s`` = ``d_j`` = 1e308), is
refused: by :func:`read_points` (a :class:`FormatError` naming the file and the point, before
the store is opened, so an import adds nothing) and by :meth:`ResultsStore.add` itself. A row
that cannot be decoded anyway (a store written before this check, or a damaged row) is skipped
by :meth:`ResultsStore.rows` with a warning naming the store and the row (logged to
``measure.store``; ``ecal`` prints it as ``ecal: warning: ...`` on stderr), and the other rows
are read: one bad row never hides the good points of its element.

**Symlinks.** A store path that leads through a symlink another user owns, or into another
user's file, is refused (:func:`frontier.files.check_own_path`): opening a store writes to it.

>>> import tempfile, os
>>> from frontier.signature import Signature
>>> path = os.path.join(tempfile.mkdtemp(), "r.sqlite")
>>> with ResultsStore(path) as st:
...     _ = st.add(Signature("g", s_w=100.0, time_s=1.0, d_j=5.0), gpu_model="H200", uuid="GPU-1")
>>> [s.energy_j for s in read_signatures(path, gpu_model="H200")["g"]]
[105.0]
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frontier.errors import EnergyCalculusError, FormatError, InputError
from frontier.files import check_own_path
from frontier.operating_point import OperatingPoint
from frontier.signature import Signature

_log = logging.getLogger(__name__)

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
    """A store cannot be opened, read or written (names the file and the problem)."""


def _sqlite_problem(exc: sqlite3.Error) -> str:
    """An SQLite error in words, with what to do where that is known."""
    text = str(exc) or type(exc).__name__
    low = text.lower()
    if "disk is full" in low:
        return f"{text} (free space, then rerun: nothing of the failed write was stored)"
    if "malformed" in low or "corrupt" in low:
        return f"{text} (the store is damaged: restore it from a copy)"
    if "readonly" in low or "read-only" in low:
        return f"{text} (the store or its folder is not writable)"
    return text


def _not_a_database(exc: sqlite3.Error) -> bool:
    return (getattr(exc, "sqlite_errorname", "") == "SQLITE_NOTADB"
            or "file is not a database" in str(exc))


def nonfinite_field(sig: Signature) -> tuple[str, Any] | None:
    """The first field of ``sig`` (in its file form, :func:`frontier.pareto.signature_to_dict`,
    metadata aside) that is not a finite number, as (dotted path, value); None when all are.
    Derived fields count: ``energy_j`` = s·T + d overflows to inf when T and d are huge."""
    to_dict, _ = _codec()
    body = to_dict(sig)
    body.pop("meta", None)
    stack: list[tuple[str, Any]] = [("", body)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return path, v
        if isinstance(v, Mapping):
            stack.extend((f"{path}.{k}" if path else str(k), x) for k, x in reversed(v.items()))
        elif isinstance(v, list | tuple):
            stack.extend((f"{path}[{i}]", x) for i, x in reversed(list(enumerate(v))))
    return None


def nonfinite_problem(sig: Signature) -> str | None:
    """Why ``sig`` cannot be stored (a non-finite field, named with its value), or None."""
    bad = nonfinite_field(sig)
    if bad is None:
        return None
    field, value = bad
    why = (f" (E = s_w·T + d_j = {sig.s_w:g}·{sig.time_s:g} + {sig.d_j:g} overflows a float)"
           if field == "energy_j" and math.isfinite(sig.time_s) and math.isfinite(sig.d_j)
           else "")
    return f"{field} is {value}{why}: not a finite number; refusing the point"


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
        self._warned: set[int] = set()
        if not create and not self.path.exists():
            raise FileNotFoundError(2, "no such file", str(path))
        check_own_path(self.path)
        try:
            # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE ... COMMIT)
            self._db = sqlite3.connect(str(self.path), timeout=busy_timeout_s,
                                       isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(f"{path}: cannot open the store: {_sqlite_problem(exc)}") from None
        try:
            self._db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            mode = self._db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{path}: the store needs WAL mode, got {mode!r} (a network "
                                 "file system? put the store on a local disk)")
            self._db.execute("PRAGMA synchronous = FULL")
            self._db.execute("BEGIN IMMEDIATE")   # raw: SQLite errors are sorted out below
            try:
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
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            self._db.close()
            if _not_a_database(exc):
                raise FormatError(str(path), "content", f"not an energy-calculus store ({exc}); "
                                  "refusing to change it") from None
            raise StoreError(f"{path}: cannot open the store: {_sqlite_problem(exc)}") from None
        except BaseException:
            self._db.close()
            raise

    # -- plumbing -------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the connection (idempotent)."""
        db, self._db = getattr(self, "_db", None), None
        if db is not None:
            with self._sql("closing"):
                db.close()

    @contextlib.contextmanager
    def _sql(self, doing: str) -> Iterator[None]:
        """Within the block, an ``sqlite3.Error`` becomes a :class:`StoreError` naming the
        store, what was being done and (where known) what to do."""
        try:
            yield
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {doing}: {_sqlite_problem(exc)}") from None

    def _all(self, sql: str, args: Iterable[Any] = (), doing: str = "reading the store"
             ) -> list[Any]:
        """Every row of a query (fetched inside :meth:`_sql`: a damaged page met half way is
        a :class:`StoreError` too)."""
        with self._sql(doing):
            return self._db.execute(sql, tuple(args)).fetchall()

    def _run(self, sql: str, args: Iterable[Any] = (), doing: str = "writing the store") -> None:
        with self._sql(doing):
            self._db.execute(sql, tuple(args))

    def _warn_row(self, row_id: int, what: str, why: str) -> None:
        if row_id not in self._warned:
            self._warned.add(row_id)
            _log.warning("%s: row %s (%s) cannot be read (%s); skipped, the other rows are read",
                         self.path, row_id, what, why)

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def transaction(self) -> _Transaction:
        """``with store.transaction():`` one write transaction (``BEGIN IMMEDIATE``): all of
        it is committed, or none of it (rolled back on any exception). SQLite errors of the
        transaction itself (a full disk at COMMIT) are :class:`StoreError`."""
        return _Transaction(self)

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
        bad = nonfinite_problem(sig)
        if bad is not None:
            raise StoreError(f"{self.path}: {k.element} at {sig.omega.label()}: {bad}")
        body = _body(sig)
        verb = "INSERT OR REPLACE" if replace else "INSERT OR IGNORE"
        sql = (f"{verb} INTO signatures (element, kappa, theta, omega, gpu_model, uuid, driver, "
               "protocol, host, time_s, energy_j, signature, campaign, unit, stored_at_s) "
               "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
        args = (*k.as_tuple(), float(sig.time_s), float(sig.energy_j), body, campaign, unit,
                time.time())
        if self._db.in_transaction:
            self._run(sql, args, f"storing {k.element}")
        else:
            with self.transaction():
                self._run(sql, args, f"storing {k.element}")
        return k

    def rows(self, element: str | None = None, gpu_model: str | None = None,
             uuid: str | None = None, campaign: str | None = None,
             host: str | None = None) -> list[StoredSignature]:
        """Stored points, filtered (``gpu_model`` by :func:`model_matches`), in a stable order
        (element, κ, θ, ω, then what measured them). A row that cannot be decoded (text that
        is not UTF-8 or JSON, a signature that does not parse, a number that is not finite) is
        skipped with a warning naming the store and the row; the others are returned."""
        where, args = [], []
        for col, v in (("element", element), ("uuid", uuid), ("campaign", campaign),
                       ("host", host)):
            if v is not None:
                where.append(f"{col} = ?")
                args.append(v)
        _, from_dict = _codec()
        out = []
        for row_id, r in self._raw_rows(" WHERE " + " AND ".join(where) if where else "", args):
            try:
                k = SignatureKey(*_texts(r[:9]))
                if gpu_model is not None and not model_matches(k.gpu_model, gpu_model):
                    continue
                campaign_, unit_ = _texts(r[10:12])
                sig = from_dict(json.loads(_texts(r[9:10])[0]), file=str(self.path),
                                path=f"signatures[{k.element}]")
                bad = nonfinite_problem(sig)
                if bad is not None:
                    raise InputError(bad)
            except (ValueError, TypeError) as exc:    # UnicodeDecodeError, JSON, FormatError
                self._warn_row(row_id, _row_label(r), _why(exc))
                continue
            out.append(StoredSignature(k, sig, campaign_, unit_))
        return out

    def _raw_rows(self, where: str = "", args: Iterable[Any] = ()) -> list[tuple[int, tuple]]:
        """(row id, the twelve columns as bytes or None) of every selected row: text is
        decoded per row by the caller, so one undecodable row does not end the query."""
        cols = ", ".join(f"CAST({c} AS BLOB)" for c in _ROW_COLUMNS)
        sql = (f"SELECT id, {cols} FROM signatures{where} ORDER BY element, kappa, theta, "
               "omega, gpu_model, uuid, driver, protocol, host")
        return [(r[0], tuple(r[1:])) for r in self._all(sql, args, "reading its points")]

    def gpu_models(self) -> list[str]:
        """The GPU models the store has measurements of."""
        return [r[0] for r in self._all(
            "SELECT DISTINCT gpu_model FROM signatures ORDER BY gpu_model")]

    def count(self) -> int:
        """Number of stored points."""
        return int(self._all("SELECT COUNT(*) FROM signatures")[0][0])

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
        rows = self._all(
            "SELECT signature FROM signatures WHERE element = ? AND kappa = ? AND theta = ? AND "
            "omega = ? AND gpu_model = ? AND uuid = ? AND driver = ? AND protocol = ? AND host = ?",
            k.as_tuple(), f"looking up {k.element}")
        row = rows[0] if rows else None
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
        for r in self._all("SELECT gpu_model, element, campaign, unit, host, uuid "
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
                for name, created, units, points in self._all(
                    "SELECT c.name, c.created_at_s, "
                    "(SELECT COUNT(*) FROM units u WHERE u.campaign = c.name), "
                    "(SELECT COUNT(*) FROM signatures s WHERE s.campaign = c.name) "
                    "FROM campaigns c ORDER BY c.name")]

    # -- campaigns ------------------------------------------------------------------------------
    def campaign_spec(self, name: str) -> dict[str, Any] | None:
        """The identity a campaign was first run with (None when the store has not seen it)."""
        rows = self._all("SELECT spec FROM campaigns WHERE name = ?", (name,),
                         f"reading campaign {name}")
        if not rows:
            return None
        try:
            return json.loads(rows[0][0])
        except (TypeError, ValueError) as exc:
            raise StoreError(f"{self.path}: campaign {name}: its recorded spec cannot be read "
                             f"({_why(exc)}); use another store or campaign name") from None

    def register_campaign(self, name: str, identity: Mapping[str, Any]) -> None:
        """Record a campaign's identity the first time it runs (no-op afterwards)."""
        with self.transaction():
            self._run("INSERT OR IGNORE INTO campaigns VALUES (?, ?, ?)",
                      (name, _canon(_json_safe(dict(identity))), time.time()),
                      f"registering campaign {name}")

    def done_units(self, campaign: str) -> dict[str, dict[str, Any]]:
        """Committed units of ``campaign``: unit key → its record (a record that cannot be
        decoded is ``{}`` with a warning: the unit is committed all the same)."""
        out = {}
        for u, rec in self._all("SELECT unit, record FROM units WHERE campaign = ?",
                                (campaign,), f"reading the units of campaign {campaign}"):
            try:
                out[u] = json.loads(rec)
            except (TypeError, ValueError) as exc:
                _log.warning("%s: the record of campaign %s unit %s cannot be read (%s); the "
                             "unit counts as done", self.path, campaign, u, _why(exc))
                out[u] = {}
        return out

    def commit_unit(self, campaign: str, unit: str, record: Mapping[str, Any],
                    signatures: Iterable[tuple[Signature, Mapping[str, Any]]]) -> bool:
        """Commit one unit: its record and its signatures (each with its key fields, as
        :meth:`add` takes them) in one transaction. Returns False, changing nothing, when the
        unit was already committed (by this or a concurrent run of the same campaign), so a
        unit is counted exactly once."""
        with self.transaction():
            if self._all("SELECT 1 FROM units WHERE campaign = ? AND unit = ?",
                         (campaign, unit), f"committing unit {unit}"):
                return False
            for sig, fields in signatures:
                self.add(sig, campaign=campaign, unit=unit, **dict(fields))
            self._run("INSERT INTO units VALUES (?, ?, ?, ?)",
                      (campaign, unit, _canon(_json_safe(dict(record))), time.time()),
                      f"committing unit {unit}")
        return True

    def contents(self, measured_by: bool = True) -> list[tuple[Any, ...]]:
        """Every stored point as a comparable tuple (key fields, the signature's JSON). With
        ``measured_by=False`` which card and host measured it is left out (``uuid`` and
        ``host`` from the key and the signature's metadata): two runs that measured the same
        points on different cards of one model then compare equal."""
        out = []
        for row_id, raw in self._raw_rows():
            try:
                r = _texts(raw)
                key, body = list(r[:9]), json.loads(r[9])
                if not isinstance(body, dict):
                    raise InputError("the signature is not a JSON object")
            except (ValueError, TypeError) as exc:
                self._warn_row(row_id, _row_label(raw), _why(exc))
                continue
            if not measured_by:
                key[5] = key[8] = ""
                for f in ("uuid", "host"):
                    body.get("meta", {}).pop(f, None)
            out.append((*key, _canon(body), r[10], r[11]))
        return sorted(out)


#: The columns :meth:`ResultsStore.rows` reads: the key, the signature, campaign and unit.
_ROW_COLUMNS = ("element", "kappa", "theta", "omega", "gpu_model", "uuid", "driver", "protocol",
                "host", "signature", "campaign", "unit")


def _texts(raw: Iterable[Any]) -> list[Any]:
    """Columns read as bytes (``CAST(... AS BLOB)``) back to text; None stays None. Raises
    UnicodeDecodeError (a ValueError) on bytes that are not UTF-8."""
    return [v.decode("utf-8") if isinstance(v, bytes) else v for v in raw]


def _row_label(raw: tuple) -> str:
    """Which point a row holds, in words, from whatever of its key decodes."""
    def text(v: Any) -> str:
        return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
    element, kappa, omega = text(raw[0]), text(raw[1]), text(raw[3])
    try:
        where = OperatingPoint.from_dict(json.loads(omega)).label()
    except (TypeError, ValueError, AttributeError):
        where = omega[:60]
    return f"{element!r}{f' {kappa}' if kappa else ''} at {where}"


def _why(exc: BaseException) -> str:
    if isinstance(exc, FormatError):
        return f"{exc.path}: {exc.problem}"
    if isinstance(exc, UnicodeDecodeError):
        return f"text that is not UTF-8 at byte {exc.start}"
    if isinstance(exc, json.JSONDecodeError):
        return f"invalid JSON: {exc.msg}"
    return str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__


class _Transaction:
    """``BEGIN IMMEDIATE`` … ``COMMIT`` (``ROLLBACK`` on an exception); SQLite errors of the
    transaction are :class:`StoreError` naming the store."""

    def __init__(self, store: ResultsStore):
        self._store = store

    def __enter__(self) -> sqlite3.Connection:
        self._store._run("BEGIN IMMEDIATE", doing="starting a write")
        return self._store._db

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        db = self._store._db
        if exc_type is None:
            try:
                self._store._run("COMMIT", doing="committing")
            except BaseException:
                if db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        db.execute("ROLLBACK")
                raise
        elif db.in_transaction:
            # SQLite may have rolled back already (a full disk); the first error is the one
            # the caller hears
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")


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
