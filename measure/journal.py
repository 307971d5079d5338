"""A durable record of every device setting changed, so a killed run can be undone.

Before an NVML setter runs, :class:`DeviceJournal` writes (temp file, ``fsync``, rename,
``fsync`` of the folder) one file per GPU UUID under :func:`~measure.locks.lock_dir`, holding
the UUID, the NVML index and name, the writer's PID, host and boot id, and one entry per
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
changed is harmless) and removed only after its restore succeeded; the file is deleted when
no entry is left. A rename is atomic, so a reader sees the old or the new journal, never a
torn one; a journal that cannot be parsed anyway (a disk error, a hand edit) reads as
:class:`CorruptJournalError`, and recovery then resets every setting to the driver default.
A writer killed mid-write leaves its temp file ``NAME.PID.tmp``; the next holder of the GPU's
lock removes it (:func:`remove_stale_temp_files`) when its writer is gone.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from frontier.io import fsync_dir

from .device import DeviceError
from .locks import lock_dir

FORMAT = "energy-calculus/device-journal"

#: The settings a journal can hold, in the order a restore puts them back.
SETTINGS = ("gpu_locked_clocks", "mem_locked_clocks", "power_limit")


class CorruptJournalError(DeviceError):
    """A journal file exists but cannot be read (``path``; what is wrong in the message)."""

    def __init__(self, path: Path, problem: str):
        self.path = path
        super().__init__(f"{path}: unreadable device journal ({problem})")


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
                "name": self.name, "pid": self.pid, "host": self.host, "boot_id": self.boot_id,
                "started_unix_s": self.started_unix_s,
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
    """Replace ``path`` by ``text`` durably: temp file, fsync, rename, fsync of the folder."""
    tmp = temp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
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
        journal_mtime: float | None = journal.stat().st_mtime
    except OSError:
        journal_mtime = None
    stale = []
    # a safe name holds no glob metacharacters
    for tmp in sorted(journal.parent.glob(journal.name + ".*tmp")):
        pid = _writer_pid(journal.name, tmp.name)
        if pid is False:
            continue           # not one of ours (another suffix)
        try:
            mtime = tmp.stat().st_mtime
        except OSError:
            continue           # gone meanwhile
        older = journal_mtime is not None and mtime < journal_mtime
        if pid is None:
            dead = journal_mtime is None
        else:
            dead = pid != os.getpid() and not pid_alive(pid)
        if older or dead:
            stale.append(tmp)
    return stale


def remove_stale_temp_files(uuid: str, directory: str | os.PathLike | None = None) -> list[Path]:
    """Delete :func:`stale_temp_files` (call it holding the GPU's lock); returns those removed."""
    removed = []
    for tmp in stale_temp_files(uuid, directory):
        try:
            tmp.unlink()
        except FileNotFoundError:
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
    """Parse a journal file; :class:`CorruptJournalError` when it cannot be read."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CorruptJournalError(p, f"{type(exc).__name__}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("uuid"), str):
        raise CorruptJournalError(p, f"not a {FORMAT} document")
    try:
        entries = {}
        for e in doc.get("entries", []):
            if e["setting"] not in SETTINGS:
                raise ValueError(f"unknown setting {e['setting']!r}")
            mw = e.get("restore_mw")
            entries[e["setting"]] = JournalEntry(e["setting"], None if mw is None else int(mw),
                                                 e.get("set_to"), float(e.get("time_unix_s", 0.0)))
        return JournalRecord(doc["uuid"], doc.get("index"), str(doc.get("name", "")),
                             int(doc.get("pid", 0)), str(doc.get("host", "")),
                             str(doc.get("boot_id", "")), float(doc.get("started_unix_s", 0.0)),
                             entries)
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptJournalError(p, f"bad entry: {exc}") from None


class DeviceJournal:
    """The journal of one GPU, owned by this process (hold the GPU's lock while writing).

    ``record`` before a setter, ``discard`` after the setter definitely failed, ``clear``
    after a setting's restore succeeded. Every change is on disk before the method returns.
    """

    def __init__(self, uuid: str, index: int | None = None, name: str = "",
                 directory: str | os.PathLike | None = None):
        self.path = path_for(uuid, directory)
        self._record = JournalRecord(uuid, index, name, os.getpid(), socket.gethostname(),
                                     boot_id(), time.time(), {})

    @property
    def entries(self) -> dict[str, JournalEntry]:
        """Settings still to restore (a copy)."""
        return dict(self._record.entries)

    def has(self, setting: str) -> bool:
        """Whether ``setting`` has an entry."""
        return setting in self._record.entries

    def record(self, setting: str, restore_mw: int | None = None, set_to: Any = None) -> bool:
        """Write an entry for ``setting`` unless one exists (the first value found is the one
        to restore). Returns whether a new entry was written."""
        if setting not in SETTINGS:
            raise ValueError(f"unknown setting {setting!r}; known: {SETTINGS}")
        if self.has(setting):
            return False
        entry = JournalEntry(setting, restore_mw, set_to, time.time())
        self._commit({**self._record.entries, setting: entry})
        return True

    def discard(self, setting: str) -> None:
        """Drop ``setting``'s entry (its setter failed and changed nothing, or it is restored)."""
        if self.has(setting):
            self._commit({k: v for k, v in self._record.entries.items() if k != setting})

    clear = discard

    def _commit(self, entries: dict[str, JournalEntry]) -> None:
        rec = replace(self._record, pid=os.getpid(), entries=entries)
        save_record(self.path, rec)
        self._record = rec
