"""A durable record of every device setting changed, so a killed run can be undone.

Before an NVML setter runs, :class:`DeviceJournal` writes (temp file, ``fsync``, rename,
``fsync`` of the folder) one file per GPU UUID under :func:`~measure.locks.lock_dir`, holding
the UUID, the NVML index and name, the writer's PID, uid, host and boot id, and one entry per
setting changed with the value to restore:

* ``power_limit``: the limit in mW read with ``nvmlDeviceGetPowerManagementLimit`` just before
  the first change — restored exactly;
* ``gpu_locked_clocks`` / ``mem_locked_clocks``: NVML has no call that reads an existing clock
  lock back (``nvmlDeviceSetGpuLockedClocks`` / ``nvmlDeviceSetMemoryLockedClocks`` are
  write-only; ``nvmlDeviceGetClockInfo`` gives the current clock, not a lock; nvidia-ml-py
  13.615 has no ``nvmlDeviceGetGpuLockedClocks``-like getter), so the entry
  says "restore = reset": ``nvmlDeviceResetGpuLockedClocks`` /
  ``nvmlDeviceResetMemoryLockedClocks``. A lock another tool (``nvidia-smi -lgc``) had set
  before ecal ran is therefore reset, not put back.

An entry is written before its setter (an intent: restoring a setting the setter never
changed is harmless); a setter runs only once its entry is on disk, so a journal that cannot
be written (a full disk, a read-only folder) refuses the change with
:class:`JournalWriteError` and nothing is changed. Entries are removed after their restore
(:meth:`DeviceJournal.forget`), best effort: the card is put back first, whatever the disk
does, and a journal that cannot be updated then is left as it was (restoring it again is
harmless) and the failure is reported with its path. The file is deleted when no entry is
left (an unlink works on a full disk too).

A rename is atomic, so a reader sees the old or the new journal, never a torn one. Reading is
strict (:func:`read_journal`): anything that is not a well-formed journal of bounded size —
bad JSON, deep nesting, wrong types, non-finite or out-of-range numbers, unknown settings —
is a :class:`CorruptJournalError` (one line naming the file), and recovery then resets every
setting to the driver default. A journal file another user could have planted — a symlink,
not a regular file, owned by someone other than root or the caller, writable by group or
others, or recording another writer uid — is an :class:`UntrustedJournalError` and is never
applied (journals from before the ``uid`` field are judged by the file's owner).

A writer killed mid-write leaves its temp file ``NAME.PID.tmp`` (created ``O_EXCL |
O_NOFOLLOW``, mode 0600: a planted file or symlink at that name is never written through);
the next holder of the GPU's lock removes it (:func:`remove_stale_temp_files`) when its writer
is gone — only regular files owned by the caller, never a symlink.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import socket
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from frontier.errors import InputError
from frontier.files import fsync_dir

from .device import DeviceError
from .locks import UnsafeFileError, lock_dir

FORMAT = "energy-calculus/device-journal"

#: The settings a journal can hold, in the order a restore puts them back.
SETTINGS = ("gpu_locked_clocks", "mem_locked_clocks", "power_limit")


#: Largest journal file read (ours are well under 2 KB).
MAX_JOURNAL_BYTES = 64 * 1024
#: Largest power limit a journal may hold, mW (NVML takes an unsigned 32-bit value).
MAX_MW = 2 ** 32 - 1


class CorruptJournalError(DeviceError):
    """A journal file exists but cannot be read (``path``; ``problem``: what is wrong). The
    message is one line naming the file and what recovery does about it."""

    def __init__(self, path: Path, problem: str):
        self.path = path
        self.problem = " ".join(str(problem).split())[:160]
        super().__init__(f"{path}: unreadable device journal ({self.problem}); restoring resets "
                         "every setting to the driver default")


class UntrustedJournalError(DeviceError):
    """A journal file that someone else could have written (a symlink, not a regular file,
    another owner, group/other-writable, another writer uid): never applied."""

    def __init__(self, path: Path, problem: str):
        self.path, self.problem = path, problem
        super().__init__(f"{path}: refusing to use this device journal: {problem}; nothing was "
                         "restored from it. Check the GPU's settings (nvidia-smi -q -d "
                         "POWER,CLOCK) and remove the file")


class JournalWriteError(DeviceError):
    """The journal could not be written (``path``, ``errno``; the OSError is the cause)."""

    def __init__(self, path: Path, exc: BaseException, what: str):
        self.path = path
        self.errno = getattr(exc, "errno", None)
        reason = getattr(exc, "strerror", None) or str(exc)
        super().__init__(f"cannot write the device journal {path} ({reason}): {what}")


@dataclass(frozen=True)
class JournalEntry:
    """One changed setting: ``restore_mw`` is the power limit to put back (mW), ``None`` for a
    clock lock (restore = reset); ``set_to`` what ecal was setting (for messages);
    ``time_unix_s`` when the entry was written."""

    setting: str
    restore_mw: int | None = None
    set_to: Any = None
    time_unix_s: float = 0.0

    def describe(self) -> str:
        """What restoring this entry does, e.g. ``power limit 650 W`` or ``SM clock lock reset``."""
        if self.setting == "power_limit":
            return f"power limit {self.restore_mw / 1000:g} W" if self.restore_mw is not None \
                else "power limit to default"
        return {"gpu_locked_clocks": "SM clock lock reset",
                "mem_locked_clocks": "memory clock lock reset"}.get(self.setting, self.setting)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready entry."""
        restore = "reset" if self.setting != "power_limit" else "value"
        return {"setting": self.setting, "restore": restore, "restore_mw": self.restore_mw,
                "set_to": self.set_to, "time_unix_s": self.time_unix_s}


@dataclass(frozen=True)
class JournalRecord:
    """A whole journal: which GPU, who wrote it, and the entries still to restore."""

    uuid: str
    index: int | None = None
    name: str = ""
    pid: int = 0
    host: str = ""
    boot_id: str = ""
    started_unix_s: float = 0.0
    entries: Mapping[str, JournalEntry] = field(default_factory=dict)
    #: The writer's effective uid (None in journals from before it was recorded).
    uid: int | None = None

    def writer_alive(self) -> bool:
        """Whether the writing process may still run: same host and boot, and its PID exists."""
        if self.host != socket.gethostname() or (self.boot_id and self.boot_id != boot_id()):
            return False
        return pid_alive(self.pid)

    def without(self, settings: Any) -> JournalRecord:
        """This record less the entries of ``settings`` (those restored)."""
        gone = set(settings)
        return replace(self, entries={k: v for k, v in self.entries.items() if k not in gone})

    def ordered(self) -> list[JournalEntry]:
        """Entries in restore order (clock locks, then the power limit)."""
        return [self.entries[s] for s in SETTINGS if s in self.entries]

    def device_spec(self) -> str:
        """``nvml:INDEX`` as recorded (``nvml:?`` when unknown)."""
        return f"nvml:{self.index if self.index is not None else '?'}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready record (the file's content)."""
        return {"format": FORMAT, "version": 1, "uuid": self.uuid, "index": self.index,
                "name": self.name, "pid": self.pid, "uid": self.uid, "host": self.host,
                "boot_id": self.boot_id, "started_unix_s": self.started_unix_s,
                "entries": [e.to_dict() for e in self.ordered()]}


def boot_id() -> str:
    """This host's boot id (Linux), '' where there is none: a PID from another boot is dead."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID exists (another user's counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def safe_name(uuid: str) -> str:
    """A file-name-safe form of a GPU UUID."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", uuid)


def path_for(uuid: str, directory: str | os.PathLike | None = None) -> Path:
    """The journal file of GPU ``uuid`` in ``directory`` (default: :func:`lock_dir`)."""
    d = Path(directory) if directory is not None else lock_dir()
    return d / f"{safe_name(uuid)}.journal.json"


def list_journals(directory: str | os.PathLike | None = None) -> list[Path]:
    """Every journal file in ``directory`` (temp files of an interrupted write are not)."""
    d = Path(directory) if directory is not None else lock_dir()
    return sorted(d.glob("*.journal.json"))


def temp_path(path: Path, pid: int | None = None) -> Path:
    """The temp file a writer with ``pid`` (default: this process) fills before renaming it to
    ``path``: ``NAME.PID.tmp``, so a leftover names the writer it belonged to."""
    return path.with_name(f"{path.name}.{os.getpid() if pid is None else int(pid)}.tmp")


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` durably: temp file, fsync, rename, fsync of the folder.

    The temp file (:func:`temp_path`) is created ``O_EXCL | O_NOFOLLOW`` with mode 0600, so
    nothing that already sits at its name is written through; a leftover of this very PID is
    removed first when it is a regular file the caller owns, anything else there is refused
    (:class:`~measure.locks.UnsafeFileError`). A failed write removes its temp file and raises
    the :class:`OSError`."""
    tmp = temp_path(path)
    try:
        st = os.lstat(tmp)
    except FileNotFoundError:
        pass
    else:
        if not (stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()):
            raise UnsafeFileError(tmp, "a journal temp file that is not ours (a symlink or "
                                       "another user's file) is in the way; nothing was written: "
                                       "remove it")
        os.unlink(tmp)
    data = text.encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(path.parent)


def stale_temp_files(uuid: str, directory: str | os.PathLike | None = None) -> list[Path]:
    """Temp files of GPU ``uuid``'s journal left by writers that were killed mid-write.

    A temp file is stale when its writer (the PID in its name) no longer runs, or when it is
    older than the journal (a later write of the journal superseded it). One without a PID in
    its name (``NAME.tmp``, from an older ecal) names no writer: it is stale only when older
    than the journal, or when there is no journal. A live writer's temp file (this process's
    included) that is not older than the journal is never stale. Call this while holding the
    GPU's lock: every writer of that journal held it, so none can be mid-write meanwhile."""
    journal = path_for(uuid, directory)
    try:
        journal_mtime: float | None = os.lstat(journal).st_mtime
    except OSError:
        journal_mtime = None
    me = os.geteuid()
    stale = []
    # a safe name holds no glob metacharacters
    for tmp in sorted(journal.parent.glob(journal.name + ".*tmp")):
        pid = _writer_pid(journal.name, tmp.name)
        if pid is False:
            continue           # not one of ours (another suffix)
        try:
            st = os.lstat(tmp)
        except OSError:
            continue           # gone meanwhile
        if not stat.S_ISREG(st.st_mode) or st.st_uid != me:
            continue           # a symlink or another user's file: not ours to remove
        older = journal_mtime is not None and st.st_mtime < journal_mtime
        if pid is None:
            dead = journal_mtime is None
        else:
            dead = pid != os.getpid() and not pid_alive(pid)
        if older or dead:
            stale.append(tmp)
    return stale


def remove_stale_temp_files(uuid: str, directory: str | os.PathLike | None = None) -> list[Path]:
    """Delete :func:`stale_temp_files` (call it holding the GPU's lock); returns those removed.
    Best effort: one that cannot be removed (a read-only folder) is left."""
    removed = []
    for tmp in stale_temp_files(uuid, directory):
        try:
            tmp.unlink()
        except OSError:
            continue
        removed.append(tmp)
    if removed:
        fsync_dir(removed[0].parent)
    return removed


def _writer_pid(journal_name: str, tmp_name: str) -> int | None | bool:
    """The PID in ``JOURNAL.PID.tmp``; None for ``JOURNAL.tmp``; False for anything else."""
    rest = tmp_name[len(journal_name):]
    if rest == ".tmp":
        return None
    m = re.fullmatch(r"\.(\d+)\.tmp", rest)
    return int(m.group(1)) if m else False


def save_record(path: Path, record: JournalRecord) -> None:
    """Write ``record`` to ``path`` durably, or delete ``path`` when it has no entry left."""
    if record.entries:
        write_atomic(path, json.dumps(record.to_dict(), indent=1) + "\n")
    else:
        remove_durably(path)


def remove_durably(path: Path) -> None:
    """Delete ``path`` (if present) and fsync its folder."""
    try:
        path.unlink()
    except FileNotFoundError:
        return
    fsync_dir(path.parent)


def read_journal(path: str | os.PathLike) -> JournalRecord:
    """Parse a journal file.

    :class:`UntrustedJournalError` when someone other than root or the caller could have
    written it (module doc); :class:`CorruptJournalError` (one line) when it is not a
    well-formed journal: bad JSON, nesting too deep, more than :data:`MAX_JOURNAL_BYTES`,
    wrong types, non-finite or out-of-range numbers, unknown or repeated settings."""
    p = Path(path)
    data = _read_trusted(p)
    try:
        doc = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise CorruptJournalError(p, "nested too deeply") from None
    except (UnicodeDecodeError, ValueError, MemoryError) as exc:
        raise CorruptJournalError(p, f"{type(exc).__name__}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CorruptJournalError(p, f"not a {FORMAT} document")
    try:
        uid = _opt(doc, "uid", _uid)
    except ValueError as exc:
        raise CorruptJournalError(p, f"bad entry: {exc}") from None
    me = os.geteuid()
    if uid is not None and uid not in (0, me):
        raise UntrustedJournalError(p, f"it records writer uid {uid}, neither root nor you "
                                       f"(uid {me})")
    try:
        entries: dict[str, JournalEntry] = {}
        raw = doc.get("entries", [])
        if not isinstance(raw, list) or len(raw) > 3 * len(SETTINGS):
            raise InputError("entries is not a short list")
        for e in raw:
            if not isinstance(e, dict):
                raise InputError("an entry is not an object")
            setting = e.get("setting")
            if setting not in SETTINGS:
                raise InputError(f"unknown setting {str(setting)[:40]!r}")
            if setting in entries:
                raise InputError(f"setting {setting!r} twice")
            mw = _opt(e, "restore_mw", _mw)
            if setting != "power_limit":
                mw = None
            entries[setting] = JournalEntry(setting, mw, _set_to(e.get("set_to")),
                                            _opt(e, "time_unix_s", _time) or 0.0)
        return JournalRecord(_text(doc.get("uuid"), "uuid", required=True),
                             _opt(doc, "index", _index), _text(doc.get("name"), "name"),
                             _opt(doc, "pid", _pid) or 0, _text(doc.get("host"), "host"),
                             _text(doc.get("boot_id"), "boot_id"),
                             _opt(doc, "started_unix_s", _time) or 0.0, entries, uid)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise CorruptJournalError(p, f"bad entry: {exc}") from None


def _read_trusted(p: Path) -> bytes:
    """The bytes of journal ``p``, opened without following a symlink and checked to be a
    regular file that only root or the caller can write."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UntrustedJournalError(p, "it is a symlink") from None
        raise CorruptJournalError(p, f"{type(exc).__name__}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        me = os.geteuid()
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedJournalError(p, "it is not a regular file")
        if st.st_uid not in (0, me):
            raise UntrustedJournalError(p, f"it is owned by uid {st.st_uid}, neither root nor "
                                           f"you (uid {me})")
        if st.st_mode & 0o022:
            raise UntrustedJournalError(p, f"it is writable by group or others (mode "
                                           f"{stat.S_IMODE(st.st_mode):04o})")
        if st.st_size > MAX_JOURNAL_BYTES:
            raise CorruptJournalError(p, f"{st.st_size} bytes, more than a journal holds")
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, MAX_JOURNAL_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_JOURNAL_BYTES:
                raise CorruptJournalError(p, "more bytes than a journal holds")
        return b"".join(chunks)
    except OSError as exc:
        raise CorruptJournalError(p, f"{type(exc).__name__}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _opt(d: Mapping[str, Any], key: str, check: Any) -> Any:
    v = d.get(key)
    return None if v is None else check(v, key)


def _int(v: Any, key: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise InputError(f"{key} is not an integer in [{lo}, {hi}]")
    return v


def _mw(v: Any, key: str) -> int:
    return _int(v, key, 1, MAX_MW)


def _pid(v: Any, key: str) -> int:
    return _int(v, key, 0, 2 ** 31 - 1)


def _uid(v: Any, key: str) -> int:
    return _int(v, key, 0, 2 ** 32 - 1)


def _index(v: Any, key: str) -> int:
    return _int(v, key, 0, 65535)


def _time(v: Any, key: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)) \
            or abs(float(v)) > 1e12:
        raise InputError(f"{key} is not a time")
    return float(v)


def _text(v: Any, key: str, required: bool = False) -> str:
    if v is None and not required:
        return ""
    if not isinstance(v, str) or len(v) > 256 or (required and not v):
        raise InputError(f"{key} is not a short string")
    return v


def _set_to(v: Any) -> Any:
    """What ecal was setting (for messages only): a number or a short list of numbers."""
    if v is None:
        return None
    items = v if isinstance(v, list) else [v]
    if len(items) > 4 or not all(isinstance(x, int) and not isinstance(x, bool)
                                 and abs(x) <= MAX_MW for x in items):
        raise InputError("set_to is not a setting value")
    return v


class DeviceJournal:
    """The journal of one GPU, owned by this process (hold the GPU's lock while writing).

    ``record`` before a setter (on disk before it returns, or :class:`JournalWriteError` and
    no entry); ``forget`` after a setting's restore succeeded (best effort: the entry leaves
    memory at once, the file when it can be written); ``discard``/``clear`` the strict form
    of ``forget`` (raise when the file cannot be written).
    """

    def __init__(self, uuid: str, index: int | None = None, name: str = "",
                 directory: str | os.PathLike | None = None):
        self.path = path_for(uuid, directory)
        self._record = JournalRecord(uuid, index, name, os.getpid(), socket.gethostname(),
                                     boot_id(), time.time(), {}, os.geteuid())
        #: Whether the file differs from :attr:`entries` (a write failed); :meth:`sync` retries.
        self.dirty = False

    @property
    def entries(self) -> dict[str, JournalEntry]:
        """Settings still to restore (a copy)."""
        return dict(self._record.entries)

    def has(self, setting: str) -> bool:
        """Whether ``setting`` has an entry."""
        return setting in self._record.entries

    def record(self, setting: str, restore_mw: int | None = None, set_to: Any = None) -> bool:
        """Write an entry for ``setting`` unless one exists (the first value found is the one
        to restore). Returns whether a new entry was written; :class:`JournalWriteError`
        (nothing recorded: do not change the setting) when the file cannot be written."""
        if setting not in SETTINGS:
            raise InputError(f"unknown setting {setting!r}; known: {SETTINGS}")
        if self.has(setting):
            return False
        entry = JournalEntry(setting, restore_mw, set_to, time.time())
        try:
            self._commit({**self._record.entries, setting: entry})
        except OSError as exc:
            raise JournalWriteError(
                self.path, exc, f"nothing was changed ({setting} is changed only once its "
                f"journal entry is on disk); free space there or make {self.path.parent} "
                "writable, or set ECAL_STATE_DIR to another folder") from exc
        return True

    def discard(self, setting: str) -> None:
        """Drop ``setting``'s entry (its setter failed and changed nothing, or it is restored);
        raises the :class:`OSError` when the file cannot be written."""
        if self.has(setting):
            self._commit({k: v for k, v in self._record.entries.items() if k != setting})

    clear = discard

    def forget(self, settings: Any) -> JournalWriteError | None:
        """Drop the entries of ``settings`` (restored, or never changed) from memory at once
        and from the file if it can be written: never raises for the disk. Returns the
        :class:`JournalWriteError` when the file could not be updated (it keeps the old
        entries: restoring them again is harmless; :attr:`dirty` is set)."""
        gone = set(settings)
        if not gone & set(self._record.entries) and not self.dirty:
            return None
        self._record = self._record.without(gone)
        self.dirty = True
        return self.sync()

    def sync(self) -> JournalWriteError | None:
        """Write the file again if an earlier write failed (:attr:`dirty`); the error if it
        fails again, else None."""
        if not self.dirty:
            return None
        try:
            self._commit(dict(self._record.entries))
        except (OSError, DeviceError) as exc:
            return JournalWriteError(self.path, exc, "left as it was (it still lists settings "
                                     "that are restored already; restoring them again is "
                                     "harmless)")
        return None

    def _commit(self, entries: dict[str, JournalEntry]) -> None:
        rec = replace(self._record, pid=os.getpid(), entries=entries)
        save_record(self.path, rec)
        self._record = rec
        self.dirty = False
