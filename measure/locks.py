"""Advisory inter-process locks (one process per GPU, one writer per results file) and the
per-user state folder that holds the GPU locks and device journals.

A lock is an ``flock`` on a small file that also holds the holder's PID and what it is doing
(``PID\\nDOING\\n``), so the second process gets an error naming the holder. The kernel drops
an ``flock`` when its holder dies (even by SIGKILL), so a crashed run never leaves a stale lock
behind; the file a killed holder leaves (our format, a dead PID) is taken over by the next one.

**No planted file is followed or emptied.** A lock file is opened with ``O_NOFOLLOW``: a
symlink there (``alice/r.jsonl.lock -> /secret``) is refused with one line
(:class:`UnsafeFileError`) and its target is never opened. An existing file that is not a
regular file, has other hard links, or holds anything but our own format (empty, or
``PID\\nDOING\\n``) is refused the same way and left byte for byte: the tool only ever writes
into, truncates or removes a lock file that is its own. The holder removes its lock file
when it releases the lock (the folder is left as found); a process that takes a lock checks,
once it holds the ``flock``, that the path still names the file it locked, so a file removed
by its releasing holder meanwhile cannot hand the lock to two processes. Where the holder's
line cannot be written (a full disk) the lock is still held; on a read-only file system an
existing lock file is locked read-only, and one that does not exist cannot be created (an
error naming it: nothing was changed).

**The state folder** (:func:`lock_dir`): ``$ECAL_STATE_DIR``, else
``~/.cache/energy-calculus`` (per user through the home folder). It is created with mode 0700
whatever the umask, and used only while it is a real folder (not a symlink) owned by the
caller and not writable by group or others; otherwise :class:`UnsafeStateDirError` says, in
one line, what to do (``chmod 700``, ``chown``, or another ``ECAL_STATE_DIR``). Another user
can therefore neither plant a journal or lock there nor swap one.

>>> import tempfile, os
>>> d = tempfile.mkdtemp()
>>> with ProcessLock(os.path.join(d, "x.lock"), "results file x"):
...     pass
>>> os.path.exists(os.path.join(d, "x.lock"))
False
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
from pathlib import Path

from .device import DeviceError

#: What a lock file of ours holds: nothing, or "PID\nDOING\n" (DOING one line).
_OURS = re.compile(rb"\A(?:\d{1,10}(?:\n[^\n]*\n?)?)?\Z")
#: Longest lock file content read back (ours are a PID and a 200-character command line).
_MAX_LOCK_BYTES = 4096


class LockedError(DeviceError):
    """Another process holds the lock. ``holder_pid`` is its PID (None when unreadable)."""

    def __init__(self, what: str, holder_pid: int | None, holder_says: str = ""):
        self.what, self.holder_pid = what, holder_pid
        who = f"process {holder_pid}" if holder_pid is not None else "another process"
        doing = f" ({holder_says})" if holder_says else ""
        super().__init__(f"{what} is in use by {who}{doing}; wait for it to finish or stop it")


class UnsafeFileError(DeviceError):
    """A file (or folder) the tool would use is not safely its own: a symlink, not a regular
    file, owned by another user, or holding someone else's content. Nothing was written to
    it. ``path``; the rest of the one-line message says what is wrong and what to do."""

    def __init__(self, path: str | os.PathLike, problem: str):
        self.path = Path(path)
        super().__init__(f"{path}: {problem}")


class UnsafeStateDirError(UnsafeFileError):
    """The state folder (:func:`lock_dir`) is a symlink, not the caller's, or writable by
    group/other: another user could plant journals or locks in it."""


def state_dir_path() -> Path:
    """The state folder's path, unchecked and not created: ``$ECAL_STATE_DIR``, else
    ``~/.cache/energy-calculus``."""
    env = os.environ.get("ECAL_STATE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "energy-calculus"


def lock_dir() -> Path:
    """Where device locks and journals live (:func:`state_dir_path`), created with mode 0700
    if missing (missing parents too) and checked to be the caller's own: raises
    :class:`UnsafeStateDirError` (one line, what to do) otherwise."""
    base = state_dir_path()
    _make_private_dirs(base)
    check_private_dir(base)
    return base


def _make_private_dirs(path: Path) -> None:
    """Create ``path`` and its missing parents with mode 0700, whatever the umask."""
    missing = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            continue               # made meanwhile by someone else: the check below judges it
        except OSError as exc:
            raise DeviceError(f"cannot create the state folder {d} ({exc.strerror or exc}); "
                              "set ECAL_STATE_DIR to a folder you can write") from None
        # the umask may have taken bits off; fchmod through O_NOFOLLOW, so a folder swapped
        # for a symlink meanwhile is not followed (the check below then refuses it)
        try:
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)


def check_private_dir(path: str | os.PathLike) -> None:
    """Refuse (:class:`UnsafeStateDirError`) a state folder another user could write into."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise DeviceError(f"cannot use the state folder {path} ({exc.strerror or exc}); "
                          "set ECAL_STATE_DIR to a folder you own") from None
    me = os.geteuid()
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeStateDirError(path, "the state folder is a symlink; refusing to follow it "
                                        "(set ECAL_STATE_DIR to the real folder, after checking "
                                        "who owns it)")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeStateDirError(path, "the state folder is not a folder; set ECAL_STATE_DIR "
                                        "to another path")
    if st.st_uid != me:
        raise UnsafeStateDirError(path, f"the state folder is owned by uid {st.st_uid}, not by "
                                        f"you (uid {me}): another user could plant GPU journals "
                                        f"there; `chown {me} {path}` if it is yours, or set "
                                        "ECAL_STATE_DIR to a folder of your own")
    if st.st_mode & 0o022:
        raise UnsafeStateDirError(path, f"the state folder is writable by group or others (mode "
                                        f"{stat.S_IMODE(st.st_mode):04o}): another user could "
                                        f"plant GPU journals there; `chmod 700 {path}`, or set "
                                        "ECAL_STATE_DIR to a folder of your own")


class ProcessLock:
    """An exclusive, non-blocking lock on ``path`` held for the life of the object (or ``with``).

    ``what`` names the resource in the error a second process gets; ``doing`` is recorded for
    that process to read (e.g. the command line). See the module doc for what is refused.
    """

    def __init__(self, path: str | os.PathLike, what: str, doing: str = ""):
        self.path, self.what = Path(path), what
        self.doing = " ".join(str(doing).splitlines())     # one line: the format is PID\nDOING\n
        self._fd: int | None = None
        self._writable = False

    def acquire(self) -> ProcessLock:
        """Take the lock or raise :class:`LockedError` naming the holder's PID;
        :class:`UnsafeFileError` for a lock file that is not ours (left untouched)."""
        if self._fd is not None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(100):       # retried only when a releasing holder removed the file
            fd, writable = self._open()
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    pid, says = _read_holder(fd)
                    raise LockedError(self.what, pid, says) from None
                st = os.fstat(fd)
                if not self._still_named(st):
                    os.close(fd)
                    continue
                self._check_ours(fd, st)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.close(fd)
                raise
            self._fd, self._writable = fd, writable
            self._write_holder()
            return self
        raise DeviceError(f"{self.path}: the lock file keeps disappearing; is another tool "
                          "removing it?")

    def _open(self) -> tuple[int, bool]:
        flags = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | flags, 0o644), True
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafeFileError(self.path, "the lock file is a symlink; refusing to follow "
                                                 "it (nothing was written; remove the link if no "
                                                 "one needs it)") from None
            if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise DeviceError(f"cannot open the lock file {self.path} "
                                  f"({exc.strerror or exc}); nothing was changed") from None
            first = exc
        try:       # a read-only folder: an existing lock file can still be flocked
            return os.open(self.path, os.O_RDONLY | flags), False
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafeFileError(self.path, "the lock file is a symlink; refusing to follow "
                                                 "it") from None
            raise DeviceError(f"cannot create the lock file {self.path} "
                              f"({first.strerror or first}); nothing was changed: make its "
                              "folder writable (or, for a GPU, set ECAL_STATE_DIR to a writable "
                              "folder)") from None

    def _still_named(self, st: os.stat_result) -> bool:
        """Whether ``self.path`` still names the file we locked (a releasing holder removes its
        file: a lock on a removed file locks nothing)."""
        try:
            now = os.lstat(self.path)
        except FileNotFoundError:
            return False
        return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)

    def _check_ours(self, fd: int, st: os.stat_result) -> None:
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFileError(self.path, "the lock file is not a regular file; refusing to "
                                             "use it (nothing was written)")
        if st.st_nlink != 1:
            raise UnsafeFileError(self.path, f"the lock file has {st.st_nlink} hard links; "
                                             "refusing to write into a file that is also "
                                             "elsewhere (nothing was written; remove it)")
        try:
            data = os.pread(fd, _MAX_LOCK_BYTES + 1, 0)
        except OSError:
            data = b"?"
        if len(data) > _MAX_LOCK_BYTES or not _OURS.match(data):
            raise UnsafeFileError(self.path, "an existing file that is not an energy-calculus "
                                             "lock (it has other content); refusing to use or "
                                             "empty it: move it away, or choose another path")

    def _write_holder(self) -> None:
        """Record our PID and what we do (best effort: a full disk still lets us hold it)."""
        if not self._writable or self._fd is None:
            return
        data = f"{os.getpid()}\n{self.doing}\n".encode()[:_MAX_LOCK_BYTES]
        try:
            os.pwrite(self._fd, data, 0)
            os.ftruncate(self._fd, len(data))
        except OSError:
            try:
                os.ftruncate(self._fd, 0)
            except OSError:
                pass

    def release(self) -> None:
        """Drop the lock (idempotent) and remove the lock file, ours while we hold it (where it
        cannot be removed, it is emptied instead)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            removed = False
            try:
                if self._still_named(os.fstat(fd)):
                    os.unlink(self.path)      # still holding the flock: see the module doc
                    removed = True
            except OSError:
                pass
            if not removed and self._writable:
                try:
                    os.ftruncate(fd, 0)
                except OSError:
                    pass
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
        text = os.pread(fd, _MAX_LOCK_BYTES, 0).decode("utf-8", "replace").split("\n")
        return int(text[0]), text[1].strip()[:200] if len(text) > 1 else ""
    except (OSError, ValueError):
        return None, ""
