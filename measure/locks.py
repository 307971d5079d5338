"""Advisory inter-process locks: one process per GPU, one writer per results file.

A lock is an ``flock`` on a small file that also holds the holder's PID and what it is doing,
so the second process gets an error naming the holder. The kernel drops an ``flock`` when its
holder dies (even by SIGKILL), so a crashed run never leaves a stale lock behind.

>>> import tempfile, os
>>> d = tempfile.mkdtemp()
>>> with ProcessLock(os.path.join(d, "x.lock"), "results file x"):
...     pass
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from .device import DeviceError


class LockedError(DeviceError):
    """Another process holds the lock. ``holder_pid`` is its PID (None when unreadable)."""

    def __init__(self, what: str, holder_pid: int | None, holder_says: str = ""):
        self.what, self.holder_pid = what, holder_pid
        who = f"process {holder_pid}" if holder_pid is not None else "another process"
        doing = f" ({holder_says})" if holder_says else ""
        super().__init__(f"{what} is in use by {who}{doing}; wait for it to finish or stop it")


def lock_dir() -> Path:
    """Where device locks and journals live: ``$ECAL_STATE_DIR``, else ``~/.cache/energy-calculus``."""
    env = os.environ.get("ECAL_STATE_DIR")
    base = Path(env) if env else Path.home() / ".cache" / "energy-calculus"
    base.mkdir(parents=True, exist_ok=True)
    return base


class ProcessLock:
    """An exclusive, non-blocking lock on ``path`` held for the life of the object (or ``with``).

    ``what`` names the resource in the error a second process gets; ``doing`` is recorded for
    that process to read (e.g. the command line).
    """

    def __init__(self, path: str | os.PathLike, what: str, doing: str = ""):
        self.path, self.what, self.doing = Path(path), what, doing
        self._fd: int | None = None

    def acquire(self) -> ProcessLock:
        """Take the lock or raise :class:`LockedError` naming the holder's PID."""
        if self._fd is not None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, says = _read_holder(fd)
            os.close(fd)
            raise LockedError(self.what, pid, says) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n{self.doing}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Drop the lock (idempotent). The file stays; it is only a rendezvous."""
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.ftruncate(fd, 0)
            finally:
                os.close(fd)       # closing the descriptor drops the flock

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def __enter__(self) -> ProcessLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_holder(fd: int) -> tuple[int | None, str]:
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace").split("\n")
        return int(text[0]), text[1].strip() if len(text) > 1 else ""
    except (OSError, ValueError):
        return None, ""
