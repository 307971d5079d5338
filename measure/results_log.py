"""The JSON-lines results file of a sweep: every measured point is appended as it is taken
(flush + fsync), so nothing measured is lost, and a rerun resumes from it.

Lines are JSON objects with a ``kind``: ``"header"`` (what is measured, on what, how),
``"ready"`` (ready power at one ω_dev; ``source`` ``"campaign"`` when it was reused from
another element's calibration, see :class:`~measure.sweep.ReadyPowerCache`, ``"recheck"`` when
it re-measured an ω_dev during the sweep, :mod:`measure.ready_drift`: the last record of an
ω_dev is the value in force, all of them its readings) or ``"point"`` (one signature, in the lossless codec of
:mod:`frontier.pareto`: its name, exact variances and ``d_j``, so a resumed point equals the
measured one bit for bit). A malformed line is an error naming the file and line.

**One file, one measurement.** A file has exactly one header, its first record, and every point
belongs to it: a second header (two results logs joined with ``cat``), or a point whose key
``[element, κ, ω]`` names another element than the header's (a point copied from another
file), is a :class:`FormatError` naming the file and the line, on resume as in ``ecal store
import``, and the file is left byte for byte. Points of two measurements are never filed
under one header.

**Never change a file that is not ours.** A file is ours when its first record is a header this
module writes (``format`` :data:`RESULTS_FORMAT`, ``ecal.results/2``; or, from older writers,
``energy-calculus/results`` with a ``version``, or ``kind`` "header"
with no ``format`` and their element, device and grid fields). An empty file is a new one.
Anything else (text, JSON of another tool, binary: NUL bytes or invalid UTF-8, a file with no
complete line) is a :class:`FormatError` "not an energy-calculus results file ...; refusing to
change it", and the file is left byte for byte. A last line cut short by a kill (the bytes after
the last newline) is dropped (truncated) by the writer, and that point measured again, only
when it can be such a remnant (:func:`_torn_tail_ok`: printable ASCII, a prefix of how our
records begin, or starting with it) and either (a) the file's complete lines are valid records
under our header, or (b) the file has no complete line and its bytes are a prefix of our header
line (a kill during the very first write). A complete last line is never dropped: a kill cannot
leave one (the newline is the last byte written).

**Identity.** The header records the element, the κ labels, the grid, the protocol
(:meth:`~measure.protocol.Protocol.to_dict`), the device (``describe()``: name, UUID, driver,
and the simulator's seed) and the host. Resuming checks, with :meth:`ResultsLog.check_identity`,
that this run measures the same element on the same GPU (name, UUID, driver), with the same
seed and protocol; otherwise it raises :class:`ResultsMismatchError`. Not checked, on purpose:

* the grid and the κ labels: points are keyed by (element, κ, ω), so a changed grid or κ set
  resumes exactly the points it shares with the file and measures the rest under the same
  conditions (extending a sweep is the point of resuming);
* the host: the GPU's UUID identifies the card wherever it is plugged in, and a simulator's
  results do not depend on the host (it is recorded for the reader).

Files written before these fields existed (no ``uuid``, ``driver``, ``seed`` or some protocol
setting in the header) are accepted: what the header does record is checked, a missing
protocol setting counts as that setting's default (what the older code used), and the other
missing fields cannot be checked. Their point records may lack a ``name``; the element of the
point's key is used (older writers dropped it, so resumed points came back named
``signature``).

One writer per file: :meth:`ResultsLog.open` locks the real path (``<real path>.lock``, which
names the holder's PID) and the data file's inode (``flock``), so neither a symlink nor a hard
link lets a second writer in (see :func:`_open_locked`).

**No one else's file.** A results path that is a symlink is followed only when the caller owns
the link (or root does) and the file it names (:func:`frontier.files.check_own_path`): a link
another user planted in a shared folder (``alice/r.jsonl -> /secret``) is refused with one line
before anything is created, locked or written, so a run as root never appends to, or leaves a
lock beside, a file of the planter's choice. A write that fails (a full disk, a read-only file
system) is an :class:`OSError` naming the file; the bytes of the failed record are cut off
again where the file system allows, so the file keeps every complete point.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from frontier.errors import FormatError
from frontier.files import check_own_path
from frontier.formats import KINDS, check_format, content, validate
from frontier.operating_point import OperatingPoint
from frontier.signature import Signature

from .device import DeviceError
from .locks import LockedError, ProcessLock

#: The header's ``format``. Version 2: header with identity (uuid, driver, seed, host);
#: points in the lossless codec.
RESULTS_FORMAT = KINDS["results"].tag
RESULTS_VERSION = KINDS["results"].write_version
#: The header's ``format`` (with ``"version"``) before ``ecal.results/2`` (still read).
LEGACY_RESULTS_FORMAT = "energy-calculus/results"

#: Device fields of the header that must match on resume (when the file records them).
DEVICE_IDENTITY = ("device", "uuid", "driver", "seed")


class ResultsMismatchError(DeviceError, ValueError):
    """A results file belongs to another measurement than this run (another GPU, seed,
    protocol or element): resuming it would mix measurements. ``file``, ``field`` (e.g.
    ``device.uuid``, ``protocol.target_rse``), ``found`` (the file's value) and ``this_run``."""

    def __init__(self, file: str, field: str, found: Any, this_run: Any):
        self.file, self.field, self.found, self.this_run = file, field, found, this_run
        ours = "unknown" if this_run is None else repr(this_run)
        super().__init__(
            f"{file}: {field} is {found!r} in this results file but {ours} in this run; "
            f"resuming would mix measurements: use another results file ({_hint(field)})")


def _hint(field: str) -> str:
    if field in ("device.device", "device.uuid", "device.driver"):
        return "or resume this one on the GPU and driver it was measured with"
    if field.startswith("protocol."):
        return f"or rerun with the same protocol setting {field.split('.', 1)[1]}"
    return f"or rerun with the same {field.split('.')[-1]}"


def point_key(element: str, kappa: str | None, omega: OperatingPoint) -> str:
    """Identity of one measured point in a results file."""
    return json.dumps([element, kappa, omega.to_dict()], sort_keys=True)


def dev_key(omega: OperatingPoint) -> str:
    """Identity of an ω_dev (for ready-power calibrations)."""
    return json.dumps(omega.dev.to_dict(), sort_keys=True)


def results_lock(path: str | os.PathLike, doing: str = "") -> ProcessLock:
    """The lock naming the writer of results file ``path``: a :class:`ProcessLock` on
    ``<real path>.lock`` (``os.path.realpath``, so a symlink or another spelling of the path
    meets the same lock; the lock file is removed when its holder releases it). :meth:`ResultsLog.open`
    takes it, then an ``flock`` on the data file itself."""
    real = os.path.realpath(path)
    what = f"results file {os.fspath(path)}" + (f" ({real})" if real != os.path.abspath(path) else "")
    return ProcessLock(f"{real}.lock", what, doing)


def _open_locked(path: Path, doing: str) -> tuple[int, ProcessLock]:
    """Lock results file ``path`` for its one writer and return (its descriptor, the lock).

    Two locks, because a file has many names. (1) :func:`results_lock`, on the real path: taken
    before the file is created or read; it covers symlinks and other spellings of the path and
    records this process's PID and what it does for the error a second writer gets. (2) An
    ``flock`` on the data file's own descriptor, opened ``O_APPEND | O_CREAT`` (never
    truncating, so opening changes nothing): it belongs to the inode, so it also covers hard
    links and bind mounts, whose real paths differ and meet different ``.lock`` files. When
    only (2) is held by another process, its PID is read from ``/proc/locks`` (Linux; else the
    error says "another process"). The kernel drops both when the holder dies.
    """
    lock = results_lock(path, doing).acquire()
    try:
        real = os.path.realpath(path)
        existed = os.path.lexists(real)
        # the real path has no symlink left: O_NOFOLLOW refuses one swapped in since
        fd = os.open(real, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o644)
    except BaseException:
        lock.release()
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FormatError(str(path), "content", "not a regular file; refusing to use it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockedError(lock.what, _flock_holder(st), "through another name of this file "
                              f"(same inode {st.st_ino})") from None
        if not existed:        # make the new file's directory entry durable
            _fsync_dir(os.path.dirname(real))
    except BaseException:
        os.close(fd)
        lock.release()
        raise
    return fd, lock


def _flock_holder(st: os.stat_result) -> int | None:
    """PID of the process holding an flock on the file of ``st``, from ``/proc/locks``."""
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as fh:
            for row in fh:
                f = row.split()
                if len(f) >= 6 and f[1] == "FLOCK" and f[5] == dev and f[4] != str(os.getpid()):
                    return int(f[4])
    except (OSError, ValueError):
        pass
    return None


def _fsync_dir(folder: str) -> None:
    fd = os.open(folder or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_all(fd: int) -> bytes:
    parts, off = [], 0
    while chunk := os.pread(fd, 1 << 20, off):
        parts.append(chunk)
        off += len(chunk)
    return b"".join(parts)


def _header_record(header: Mapping[str, Any]) -> dict[str, Any]:
    # "kind" first: ecal store import tells a results log by how its first line begins
    return {"kind": "header", "format": RESULTS_FORMAT, **header_form(dict(header))}


#: How every header this module writes begins, and how every record begins.
_HEADER_LEAD = json.dumps({"kind": "header", "format": RESULTS_FORMAT})[:-1].encode("ascii")
_RECORD_LEAD = b'{"kind": "'
#: Older headers (before ``format``) always held these fields.
_V1_HEADER_FIELDS = ("element", "device", "grid")


def _is_text(data: bytes) -> bool:
    if b"\0" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _is_our_header(rec: Any) -> bool:
    """Whether ``rec`` (the first record of a file) is a header this tool writes: ``kind``
    "header" and ``format`` :data:`RESULTS_FORMAT` (or, older, :data:`LEGACY_RESULTS_FORMAT`),
    or, from writers before the ``format`` field, ``kind`` "header", no ``format`` and the
    fields they always wrote."""
    if not isinstance(rec, dict) or rec.get("kind") != "header":
        return False
    if "format" in rec:
        try:
            check_format("", rec, "results")
        except FormatError:
            return False
        return True
    return all(f in rec for f in _V1_HEADER_FIELDS)


def _torn_tail_ok(tail: bytes, lead: bytes) -> bool:
    """Whether ``tail`` (the bytes after the last newline) can be what a kill left of a line
    this module writes: printable ASCII (``json.dumps`` escapes everything else) that is a
    prefix of ``lead`` or starts with it. After complete records ``lead`` is how every record
    begins; in a file with no complete line it is how the header begins (a kill during the
    very first write)."""
    if any(b < 0x20 or b > 0x7E for b in tail):
        return False
    return lead.startswith(tail) or tail.startswith(lead)


def _codec() -> tuple[Any, Any]:
    from frontier.pareto import signature_from_dict, signature_to_dict

    return signature_to_dict, signature_from_dict


def _element_of(key: str) -> str | None:
    try:
        k = json.loads(key)
    except (TypeError, ValueError):
        return None
    return k[0] if isinstance(k, list) and k and isinstance(k[0], str) and k[0] else None


def header_form(o: Any) -> Any:
    """``o`` as a results file's header stores it (through JSON; what JSON cannot hold, as
    text): compare a value with a header read back in this form."""
    return json.loads(json.dumps(o, default=str))


class ResultsLog:
    """Append-only JSON-lines store of measured points.

    ``ResultsLog(path)`` reads a file (``path=None``: in memory only) and never changes it: it
    refuses one that is not an energy-calculus results file (:class:`FormatError`) and notes a
    torn last line in ``dropped_partial_line``; it cannot append. :meth:`open` is the one
    writer: it takes the file's locks, drops a torn last line and appends.
    """

    def __init__(self, path: str | os.PathLike | None):
        self.path = Path(path) if path is not None else None
        self.points: dict[str, Signature] = {}
        self.ready_w: dict[str, float] = {}
        #: every ready-power reading per ω_dev key, in file order (the last is ``ready_w``'s)
        self.ready_history: dict[str, list[float]] = {}
        #: when the value in force per ω_dev key was read (Unix time; absent in older files)
        self.ready_unix_s: dict[str, float] = {}
        self.header: dict[str, Any] | None = None
        self._header_line = 0
        self.dropped_partial_line = False
        self._fd: int | None = None
        self._locks: list[ProcessLock] = []
        self._good_end = 0
        if self.path is not None and self.path.exists():
            self._good_end = self._load(self.path.read_bytes())

    @classmethod
    def open(cls, path: str | os.PathLike, doing: str = "") -> ResultsLog:
        """Open ``path`` as its only writer (see :func:`results_lock`; close it, or use
        ``with``). Raises :class:`~measure.locks.LockedError` naming the holder's PID when
        another process writes it, :class:`FormatError` (file unchanged) when it is not an
        energy-calculus results file or holds two measurements (a second header, a point of
        another element), :class:`~frontier.files.UnsafePathError` when ``path`` leads through a
        symlink another user owns or into another user's file (nothing created or locked);
        drops a torn last line."""
        check_own_path(path)
        log = cls(None)
        log.path = Path(path)
        lock_file = results_lock(path).path
        fresh_lock = not os.path.lexists(lock_file)
        try:
            log._fd, lock = _open_locked(log.path, doing)
            log._locks.append(lock)
            try:
                log._good_end = log._load(_read_all(log._fd))
            except FormatError:
                # leave nothing beside a refused file; the flock on the data file still
                # excludes a writer that opened the lock file before this unlink
                if fresh_lock:
                    with contextlib.suppress(OSError):
                        os.unlink(lock_file)
                raise
            if log.dropped_partial_line:
                os.ftruncate(log._fd, log._good_end)
                os.fsync(log._fd)
        except BaseException:
            log.close()
            raise
        return log

    def close(self) -> None:
        """Release the writer's locks (idempotent; a reader has none)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)              # drops the flock on the data file
        while self._locks:
            self._locks.pop().release()

    def __enter__(self) -> ResultsLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _not_ours(self, why: str) -> FormatError:
        return FormatError(str(self.path), "content",
                           f"not an energy-calculus results file ({why}); refusing to change it")

    def _load(self, data: bytes) -> int:
        """Take the records of ``data`` (the whole file); return where its complete lines end.
        See :func:`_torn_tail_ok` for when an incomplete last line may be dropped."""
        cut = data.rfind(b"\n") + 1
        body, tail = data[:cut], data[cut:]
        if not body:
            if tail and not _torn_tail_ok(tail, _HEADER_LEAD):
                raise self._not_ours("no complete line, and not the start of a header this "
                                     "tool writes" if _is_text(tail) else "binary content")
            self.dropped_partial_line = bool(tail)
            return 0
        if not _is_text(body):
            raise self._not_ours("binary content")
        recs: list[tuple[int, Any]] = []
        lines = body.decode("utf-8").split("\n")[:-1]
        n_lines = len(lines)
        for i, raw in enumerate(lines, start=1):
            if raw.strip():
                try:
                    recs.append((i, json.loads(raw)))
                except json.JSONDecodeError as exc:
                    raise FormatError(str(self.path), f"line {i}",
                                      f"invalid JSON: {exc.msg}") from None
        if not recs:
            raise self._not_ours("no record")
        if not _is_our_header(recs[0][1]):
            raise self._not_ours(f"line {recs[0][0]} is not its header")
        for i, rec in recs:
            self._take(rec, i)
        if tail and not _torn_tail_ok(tail, _RECORD_LEAD):
            raise FormatError(str(self.path), f"line {n_lines + 1}",
                              "an incomplete last line that is not a record cut short by a kill; "
                              "refusing to change the file")
        self.dropped_partial_line = bool(tail)
        return len(body)

    def _take(self, rec: Any, line: int) -> None:
        if not isinstance(rec, dict) or "kind" not in rec:
            raise FormatError(str(self.path), f"line {line}", "expected an object with a 'kind'")
        kind = rec["kind"]
        if kind == "header":
            if self.header is not None:
                raise FormatError(str(self.path), f"line {line}",
                                  f"a second header (the file's header is line {self._header_line}): "
                                  "two results logs joined into one? refusing to mix their points "
                                  "(split the file at this line)")
            self._check_header(rec, line)
            self.header, self._header_line = rec, line
        elif kind == "ready":
            try:
                self.ready_w[rec["omega_dev"]] = float(rec["ready_power_w"])
                self.ready_history.setdefault(rec["omega_dev"], []).append(self.ready_w[rec["omega_dev"]])
                when = rec.get("time_unix_s")
                if isinstance(when, (int, float)) and not isinstance(when, bool) and math.isfinite(when):
                    self.ready_unix_s[rec["omega_dev"]] = float(when)
                else:
                    self.ready_unix_s.pop(rec["omega_dev"], None)
            except (KeyError, TypeError, ValueError):
                raise FormatError(str(self.path), f"line {line}",
                                  "a 'ready' record needs omega_dev and a numeric ready_power_w") from None
        elif kind == "point":
            if "key" not in rec or "signature" not in rec:
                raise FormatError(str(self.path), f"line {line}", "a 'point' record needs key and signature")
            self._check_key(rec["key"], line)
            self.points[rec["key"]] = self._decode(rec, f"line {line}.signature")
        else:
            raise FormatError(str(self.path), f"line {line}.kind", f"unknown kind {kind!r}")

    def _check_header(self, rec: Mapping[str, Any], line: int) -> None:
        """The header's shape (:class:`frontier.format_models.ResultsHeader`); a header of a
        writer before ``format`` may lack it (and ``kappas``, ``protocol``, ``host``)."""
        from frontier.format_models import ResultsHeader

        file = str(self.path or "<results>")
        _, body = content(file, rec, "results", required=False)
        validate(ResultsHeader, body, file, prefix=f"line {line}")

    def _check_key(self, key: Any, line: int) -> None:
        """A point's key must be ``[element, κ, ω]`` of the header's element."""
        element = _element_of(key) if isinstance(key, str) else None
        if element is None:
            raise FormatError(str(self.path), f"line {line}.key",
                              f"{str(key)[:80]!r} is not a point key [element, kappa, omega]")
        want = (self.header or {}).get("element")
        if want is not None and element != want:
            raise FormatError(str(self.path), f"line {line}.key",
                              f"a point of element {element!r} under the header (line "
                              f"{self._header_line}) of {want!r}: a point from another results "
                              "log? refusing to mix them")

    def _decode(self, rec: Mapping[str, Any], where: str) -> Signature:
        _, from_dict = _codec()
        body = rec["signature"]
        name = None
        if not (isinstance(body, Mapping) and "name" in body):
            # an older record: the name is the element of the key (or of the header)
            name = _element_of(rec["key"]) or (self.header or {}).get("element") or None
        return from_dict(body, file=str(self.path or "<results>"), path=where, name=name)

    def _append(self, rec: dict[str, Any]) -> str:
        line = json.dumps(rec, allow_nan=False, default=str) + "\n"
        if self.path is None:
            return line
        if self._fd is None:
            raise RuntimeError(f"{self.path}: opened for reading; use ResultsLog.open to write")
        data = line.encode("ascii")        # json.dumps escapes all non-ASCII
        end = -1
        try:
            end = os.fstat(self._fd).st_size
            while data:                    # O_APPEND: every write lands at the end
                data = data[os.write(self._fd, data):]
            os.fsync(self._fd)
        except OSError as exc:
            # a full disk or a failing device: cut off what was written of this record (a
            # resume would drop it as a torn line anyway), and name the file
            if end >= 0:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, end)
            raise OSError(exc.errno, exc.strerror or str(exc), str(self.path)) from exc
        return line

    def check_identity(self, now: Mapping[str, Any], protocol_defaults: Mapping[str, Any]) -> None:
        """Raise :class:`ResultsMismatchError` unless the file's header (if any) describes the
        measurement ``now`` describes (a header as :meth:`write_header` takes): same
        ``element``, same device fields :data:`DEVICE_IDENTITY` where the file records them,
        same protocol (a setting the file lacks counts as its default in
        ``protocol_defaults``). See the module docstring for what is not checked and why."""
        if self.header is None:
            return
        file = str(self.path)
        was, now = self.header, header_form(dict(now))
        if "element" in was and was["element"] != now.get("element"):
            raise ResultsMismatchError(file, "element", was["element"], now.get("element"))
        dev_was, dev_now = was.get("device") or {}, now.get("device") or {}
        for f in DEVICE_IDENTITY:
            if f in dev_was and dev_was[f] != dev_now.get(f):
                raise ResultsMismatchError(file, f"device.{f}", dev_was[f], dev_now.get(f))
        if "protocol" in was:
            p_was, p_now = was["protocol"] or {}, now.get("protocol") or {}
            defaults = header_form(dict(protocol_defaults))
            for f in sorted(set(p_was) | set(p_now)):
                a, b = p_was.get(f, defaults.get(f)), p_now.get(f, defaults.get(f))
                if a != b:
                    raise ResultsMismatchError(file, f"protocol.{f}", a, b)

    def write_header(self, header: Mapping[str, Any]) -> None:
        """Record what is being swept (only when the file is new)."""
        if self.header is None:
            self.header = _header_record(header)
            self._append(self.header)

    def add_ready(self, omega: OperatingPoint, power_w: float, source: str | None = None) -> None:
        """Append a ready-power calibration (durable when this returns). ``source`` says where
        the value came from when it was not calibrated for this file (``"campaign"``: reused
        from another element's calibration at the same ω_dev on the same device); a reader
        uses the value either way, so a resumed run reuses what the first run used. The record
        holds when it was written (``time_unix_s``): a resumed sweep re-measures a value older
        than its recheck interval (:mod:`measure.ready_drift`)."""
        k = dev_key(omega)
        self.ready_w[k] = float(power_w)
        self.ready_history.setdefault(k, []).append(float(power_w))
        self.ready_unix_s[k] = time.time()
        rec: dict[str, Any] = {"kind": "ready", "omega_dev": k, "ready_power_w": float(power_w),
                               "time_unix_s": self.ready_unix_s[k]}
        if source is not None:
            rec["source"] = source
        self._append(rec)

    def add_point(self, key: str, sig: Signature) -> Signature:
        """Append one measured point (durable when this returns) and return it as a resume
        will read it back (the same signature, its metadata in JSON form), so what a sweep
        returns never depends on whether a point was measured or resumed."""
        to_dict, _ = _codec()
        line = self._append({"kind": "point", "key": key, "signature": _json_safe(to_dict(sig))})
        back = self._decode(json.loads(line), "point")
        self.points[key] = back
        return back


def _json_safe(o: Any) -> Any:
    if isinstance(o, float):
        return o if o == o and abs(o) != float("inf") else None
    if isinstance(o, dict):
        return {k: _json_safe(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_json_safe(v) for v in o]
    return o
