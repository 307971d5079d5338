"""Output helpers for the CLI: output-path checks, all-or-nothing file commits, JSON printing,
and stderr: the library's log records as ``ecal: ...`` lines (:func:`cli_logging`, entered by
``ecal.cli.main``) and progress (:func:`progress_reporter`: a tqdm bar on a terminal, one line
per event otherwise). The libraries themselves never write to stderr: they log with
``logging.getLogger(__name__)`` and report progress to the callback they are given
(:mod:`measure.progress`); a program that configures no logging sees Python's default
(warnings and errors on stderr, bare, through logging's last-resort handler).

The contract of :class:`Outputs` (what ``ecal`` promises about the files a user names):

* Paths are checked before any work starts (:func:`check_output_path`): a bad path is a
  one-line error naming the user's path and the real cause.
* **No one else chooses where an output goes.** An output path that is a symlink the caller
  owns updates the file it names (the link stays a link). A symlink owned by another user
  (anywhere on the path; root's own links such as ``/var/run`` excepted), or one pointing at
  a file another user owns, is refused with one line and nothing is written
  (:func:`frontier.files.check_own_path`): a link planted in a shared folder cannot make root's
  ``-o`` replace a file of the planter's choice. Checked before the work and again when the
  files are committed.
* A full disk, a read-only file system or a permission error while writing names the file
  (``PATH: No space left on device``), never a temp file.
* :meth:`Outputs.commit` first produces *every* file into a temp file next to its target
  (same folder, fsynced). Only when all are ready are they renamed into place. If producing
  any fails, only the temps are removed: a file that existed before is never deleted or altered.
* The renames run with SIGINT/SIGTERM/SIGHUP blocked, and each replaced file is kept as a hard
  link until every rename succeeded; should a rename fail anyway (practically impossible
  within one folder), the renamed files are put back from those links, so the commit is all
  or nothing. Where the file system has no hard links, a failure between renames leaves the
  files renamed so far in place (new content) and the rest untouched; it is reported as an
  error naming the file that failed. Only SIGKILL or a crash between the steps can leave a
  ``.NAME.tmp.*`` or ``.NAME.bak.*`` file behind.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frontier.errors import EnergyCalculusError, InputError
from frontier.files import UnsafePathError, check_own_path, file_mode, fsync_dir

if TYPE_CHECKING:       # measure is imported by the commands that measure, not at start-up
    from measure.progress import ProgressEvent

#: Signals held back while files are renamed into place (delivered right after).
_COMMIT_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP")
                        if hasattr(signal, n))


class OutputPathError(InputError):
    """An output path that cannot be written (reported as a one-line error, exit code 2)."""


# -- checks before any work ------------------------------------------------------------------

def _cause(exc: OSError, folder: Path) -> str:
    """The real reason a folder refused a new file, in words."""
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"permission denied in {folder}"
    if exc.errno == errno.EROFS:
        return f"{folder} is on a read-only file system"
    if exc.errno == errno.ENOENT:
        # the folder exists (we checked) but refuses new entries, e.g. /proc
        return f"{folder} does not accept new files"
    if exc.errno == errno.ENOSPC:
        return f"no space left in {folder}"
    return f"{folder}: {exc.strerror or exc}"


def _probe_folder(folder: Path) -> OSError | None:
    """Try to create (and remove) a file in ``folder``; the error, or None if it can."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".ecal-probe.", dir=folder)
    except OSError as exc:
        return exc
    os.close(fd)
    os.unlink(tmp)
    return None


def _check_folder(folder: Path, where: str) -> None:
    """``folder`` exists as a writable folder, or can be created under its nearest existing
    ancestor; otherwise :class:`OutputPathError` starting with ``where``."""
    while not folder.exists():
        if folder.is_symlink():
            raise OutputPathError(f"{where}: {folder} is a broken link")
        folder = folder.parent
    if not folder.is_dir():
        raise OutputPathError(f"{where}: {folder} is not a folder")
    err = _probe_folder(folder)
    if err is not None:
        raise OutputPathError(f"{where}: {_cause(err, folder)}")


def check_output_path(path: str | os.PathLike, option: str = "output") -> Path:
    """Check before any work that ``path`` can be written as an output file.

    Its folder must exist or be creatable (the nearest existing ancestor is a writable folder)
    and the path must not be a folder. Raises :class:`OutputPathError` naming ``option`` and the
    user's path with the real cause; leaves nothing behind (a probe file is created and removed).
    """
    p = Path(path)
    where = f"cannot write {option} {os.fspath(path)}"
    if os.fspath(path) == "" or p.name in ("", ".", ".."):
        raise OutputPathError(f"{where}: not a file name")
    if p.is_dir():
        raise OutputPathError(f"{where}: is a folder")
    try:
        check_own_path(p)
    except UnsafePathError as exc:
        raise OutputPathError(f"{where}: {exc.problem}") from None
    _refuse_special(p, where)
    _check_folder(p.parent, where)
    return p


def _refuse_special(path: Path, where: str) -> None:
    """A device node, FIFO or socket is never replaced by an output file (as root, ``-o
    /dev/null`` would otherwise replace the device itself)."""
    try:
        mode = os.stat(path).st_mode          # follows a symlink to what it names
    except OSError:
        return                                 # nothing there (or a dangling link): a new file
    if not stat.S_ISREG(mode):
        raise OutputPathError(f"{where}: is not a regular file (a device, FIFO or socket); "
                              "give the path of a file")


def _target(path: str | os.PathLike) -> Path:
    """Where an output for ``path`` goes: through a symlink the caller owns to the file it
    names (the link stays a link), else ``path`` itself. A symlink another user owns, or one
    into another user's file, is refused (:func:`frontier.files.check_own_path`)."""
    real = check_own_path(path)
    return Path(real) if os.path.islink(path) else Path(path)


def check_output_dir(path: str | os.PathLike, option: str = "--out") -> Path:
    """Check before any work that ``path`` is (or can be created as) a writable folder."""
    p = Path(path)
    where = f"cannot write {option} {os.fspath(path)}"
    if os.path.lexists(p) and not p.is_dir():
        raise OutputPathError(f"{where}: exists and is not a folder")
    _check_folder(p, where)
    return p


def check_image_path(path: str | os.PathLike, option: str = "--plot") -> Path:
    """:func:`check_output_path`, and the suffix must name an image format matplotlib writes
    (checked now, not after the work, e.g. ``--plot out.xyz``)."""
    p = check_output_path(path, option)
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    fmt = p.suffix.lstrip(".").lower() or "png"
    if fmt not in formats:
        raise OutputPathError(f"cannot write {option} {os.fspath(path)}: unknown image format "
                              f"{p.suffix!r} (use .png, .pdf or .svg)")
    return p


def check_distinct(paths: dict[str, str | os.PathLike | None]) -> None:
    """Two options may not name the same output file (one would silently replace the other)."""
    seen: dict[str, str] = {}
    for option, path in paths.items():
        if path is None:
            continue
        key = os.path.realpath(path)
        if key in seen:
            raise OutputPathError(f"{seen[key]} and {option} both name {os.fspath(path)}")
        seen[key] = option


# -- all-or-nothing commits ------------------------------------------------------------------

@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP back (POSIX) so a rename batch is not cut in the middle."""
    if not hasattr(signal, "pthread_sigmask"):  # pragma: no cover - Windows
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _COMMIT_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _fsync_file(path: str) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())




def _mkdirs(folder: Path, made: list[Path]) -> None:
    """Create ``folder`` and its missing parents, recording each one made (outermost first)."""
    missing = []
    f = folder
    while not f.exists():
        missing.append(f)
        f = f.parent
    for d in reversed(missing):
        d.mkdir()
        made.append(d)


def _user_error(exc: BaseException, tmp: str, path: Path) -> BaseException:
    """``exc`` from producing ``tmp``, restated about the user's ``path`` (never the temp)."""
    if isinstance(exc, OSError):
        return OSError(exc.errno, exc.strerror or str(exc), os.fspath(path))
    text = str(exc).replace(tmp, os.fspath(path)) if tmp else str(exc)
    msg = text.strip().splitlines()
    return OutputPathError(f"cannot write {path}: {msg[0] if msg else type(exc).__name__}")


class Outputs:
    """Collects a command's output files and writes them all, or none, when it has succeeded.

    See the module docstring for the contract: an existing file is replaced only when every
    staged file is ready, and is never deleted or altered by a failed commit.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[Path, Callable[[str], None]]] = []

    def json(self, path: str | os.PathLike, obj: Any) -> None:
        """Stage a JSON document."""
        from frontier.files import finite_json

        # round-trip through the converter first so numpy values are floats finite_json sees
        plain = json.loads(json.dumps(obj, default=_json_default))
        text = json.dumps(finite_json(plain), indent=2, sort_keys=False, allow_nan=False) + "\n"
        self.text(path, text)

    def text(self, path: str | os.PathLike, text: str) -> None:
        """Stage a text file."""

        def write(tmp: str) -> None:
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)

        self._pending.append((_target(path), write))

    def custom(self, path: str | os.PathLike, write: Callable[[str], None]) -> None:
        """Stage a file produced by ``write(tmp_path)`` (e.g. a library's own saver)."""
        self._pending.append((_target(path), write))

    def figure(self, path: str | os.PathLike, fig: Any) -> None:
        """Stage a matplotlib figure (format from the file suffix)."""
        fmt = Path(path).suffix.lstrip(".") or "png"

        def write(tmp: str) -> None:
            fig.savefig(tmp, format=fmt, dpi=130, bbox_inches="tight")

        self._pending.append((_target(path), write))

    @property
    def paths(self) -> list[Path]:
        """The staged target paths, in staging order."""
        return [p for p, _ in self._pending]

    def commit(self) -> list[Path]:
        """Produce every staged file into a temp file, then rename them all into place.

        On any failure before the renames, only the temps (and folders this commit created)
        are removed and the error names the user's path. Returns the paths written.
        """
        made: list[Path] = []
        temps: list[tuple[Path, str]] = []
        try:
            for path, write in self._pending:
                tmp = ""
                check_own_path(path)      # again: the folder may have changed since staging
                _refuse_special(path, f"cannot write {os.fspath(path)}")
                try:
                    _mkdirs(path.parent, made)
                    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp.", suffix=path.suffix,
                                               dir=path.parent)
                    os.close(fd)
                    temps.append((path, tmp))
                    os.chmod(tmp, file_mode())   # mkstemp makes 0600; give the usual permissions
                    write(tmp)
                    _fsync_file(tmp)
                except (OSError, ValueError, EnergyCalculusError) as exc:
                    # errors name the temp file: restate them about the user's path (other
                    # exceptions are bugs and propagate as they are; temps are removed either way)
                    raise _user_error(exc, tmp, path) from exc
            with _signals_held():
                _rename_all(temps)
        except BaseException:
            for _, tmp in temps:
                _remove(tmp)
            for d in reversed(made):
                try:
                    d.rmdir()
                except OSError:
                    pass
            raise
        for folder in {p.parent for p, _ in temps}:
            fsync_dir(folder)
        self._pending.clear()
        return [p for p, _ in temps]


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _backup(path: Path) -> str | None:
    """A hard link to the file at ``path`` (kept until every rename succeeded), or None when
    there is no file there or the file system cannot link."""
    if not os.path.lexists(path):
        return None
    for _ in range(100):
        bak = os.path.join(path.parent, f".{path.name}.bak.{os.urandom(4).hex()}")
        try:
            os.link(path, bak, follow_symlinks=False)
            return bak
        except FileExistsError:
            continue
        except OSError:
            return None
    return None  # pragma: no cover


def _rename_all(temps: list[tuple[Path, str]]) -> None:
    """Rename each temp onto its target; on a failure put the replaced files back."""
    done: list[tuple[Path, str | None, bool]] = []   # (target, backup, existed before)
    backups: list[str] = []
    try:
        for path, tmp in temps:
            existed = os.path.lexists(path)
            bak = _backup(path)
            if bak is not None:
                backups.append(bak)
            try:
                os.replace(tmp, path)
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror or str(exc), os.fspath(path)) from exc
            done.append((path, bak, existed))
    except BaseException:
        for path, bak, existed in reversed(done):
            if bak is not None:
                os.replace(bak, path)
            elif not existed:
                _remove(os.fspath(path))
            # else: replaced without a backup (no hard links here): the new file stays
        for bak in backups:
            _remove(bak)
        raise
    for bak in backups:
        _remove(bak)


def _json_default(o: Any) -> Any:
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


# -- stderr: the library's log records and progress events -------------------------------------

#: The packages whose log records ``ecal`` shows on stderr (warnings and errors).
WARNING_LOGGERS = ("measure", "frontier", "solvers", "execution", "ecal")

#: Loggers whose INFO notes ``ecal`` shows too: what it printed as ``ecal: ...`` before the
#: library logged (the recovery of a GPU a killed run left changed; a campaign's driver
#: relays its workers' recoveries).
NOTE_LOGGERS = ("measure.nvml", "measure.campaign")


class _StderrLine(logging.Handler):
    """Writes a log record as one line on the *current* ``sys.stderr`` (looked up per record,
    so a redirected stderr, or pytest's capture, gets it): ``ecal: warning: MESSAGE`` for a
    warning, ``ecal: MESSAGE`` for a note (INFO) or an error (whose message says what failed).
    WARNING and above from every logger it is attached to; INFO only from
    :data:`NOTE_LOGGERS`. Above a progress bar it writes through ``tqdm.write``."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)

    def filter(self, record: logging.LogRecord) -> bool:
        """WARNING and above; INFO from :data:`NOTE_LOGGERS` only."""
        return record.levelno >= logging.WARNING or record.name in NOTE_LOGGERS

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tag = "warning: " if record.levelno == logging.WARNING else ""
            _write_line(f"ecal: {tag}{record.getMessage()}")
        except BrokenPipeError:
            silence(sys.stderr)
        except Exception:  # noqa: BLE001 - a warning must never end the command
            self.handleError(record)


def _write_line(text: str) -> None:
    """One line on the current ``sys.stderr`` (through ``tqdm.write`` while a bar is drawn)."""
    if any(r.drawing() for r in _REPORTERS):
        from tqdm import tqdm

        tqdm.write(text, file=sys.stderr)
    else:
        print(text, file=sys.stderr, flush=True)


@contextmanager
def cli_logging() -> Iterator[None]:
    """The CLI's stderr for one ``ecal.cli.main`` call: one handler (``ecal: ...`` lines, see
    :class:`_StderrLine`) on the packages' loggers (:data:`WARNING_LOGGERS`), INFO enabled on
    :data:`NOTE_LOGGERS`; on exit the handler is removed, the loggers' levels are put back
    and any progress bar still drawn is closed (``main`` runs many times in one process: tests).

    A program using the libraries without ``ecal`` configures logging itself; if it configures
    nothing, Python's default applies: warnings and errors on stderr (logging's last-resort
    handler, bare messages), notes not shown."""
    if any(isinstance(h, _StderrLine) for h in logging.getLogger(WARNING_LOGGERS[0]).handlers):
        yield                       # already installed (main inside main): one handler only
        return
    handler = _StderrLine()
    levels = {}
    for name in WARNING_LOGGERS:
        logging.getLogger(name).addHandler(handler)
    for name in NOTE_LOGGERS:
        lg = logging.getLogger(name)
        levels[name] = lg.level
        if lg.getEffectiveLevel() > logging.INFO:
            lg.setLevel(logging.INFO)
    try:
        yield
    finally:
        for r in list(_REPORTERS):
            r.close()
        for name in WARNING_LOGGERS:
            logging.getLogger(name).removeHandler(handler)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


#: Reporters whose bars may be drawn (closed by :func:`cli_logging` when ``main`` returns).
_REPORTERS: list[ProgressReporter] = []

#: The unit a bar counts, per operation (others count units).
_BAR_UNITS = {"sweep": "point", "joint": "point", "selftest": "stage"}


class ProgressReporter:
    """The CLI's progress callback (a :data:`measure.progress.ProgressCallback`).

    ``bar=True``: a tqdm bar on stderr per operation that counts its steps (``total`` known;
    closed when ``done`` reaches ``total``, or by :meth:`close`), and the events of operations
    that do not count (``total`` None) as lines above it. ``bar=False``: one line per event
    (:meth:`measure.progress.ProgressEvent.line`). Output goes to the current ``sys.stderr``;
    once its reader is gone (``2>&1 | head``) the reporter says nothing more instead of
    aborting the work, whose files the user still wants."""

    def __init__(self, bar: bool):
        self.bar = bool(bar)
        self._bars: dict[str, Any] = {}
        self._quiet = False

    def __call__(self, event: ProgressEvent) -> None:
        if self._quiet:
            return
        try:
            if self.bar:
                self._draw(event)
            else:
                print(event.line(), file=sys.stderr, flush=True)
        except (OSError, ValueError):   # reader gone, stderr closed: progress never ends the work
            self._quiet = True
            self.close()
            silence(sys.stderr)

    def drawing(self) -> bool:
        """Whether a bar of this reporter is on the screen now."""
        return bool(self._bars)

    def _draw(self, ev: ProgressEvent) -> None:
        from tqdm import tqdm

        if ev.total is None:
            tqdm.write(ev.line(), file=sys.stderr)
            return
        key = ev.operation or ev.label
        bar = self._bars.get(key)
        if bar is not None and bar.total != ev.total:
            bar.close()
            bar = None
        if bar is None:
            bar = tqdm(total=ev.total, initial=ev.done, desc=key, file=sys.stderr,
                       unit=_BAR_UNITS.get(ev.operation, "unit"), dynamic_ncols=True,
                       mininterval=0.2)
            self._bars[key] = bar
            if self not in _REPORTERS:
                _REPORTERS.append(self)
        else:
            bar.update(ev.done - bar.n)
        if ev.label and ev.label != key:
            bar.set_postfix_str(ev.label, refresh=False)
        if ev.done >= ev.total:
            self._bars.pop(key).close()

    def close(self) -> None:
        """Close the bars still drawn (idempotent)."""
        while self._bars:
            _, bar = self._bars.popitem()
            try:
                bar.close()
            except (OSError, ValueError):
                pass            # stderr gone: nothing to tidy up on it
        if self in _REPORTERS:
            _REPORTERS.remove(self)

    def __enter__(self) -> ProgressReporter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def stderr_is_terminal() -> bool:
    """Whether the current ``sys.stderr`` is a terminal (a closed or odd stream is not)."""
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def progress_reporter(enabled: bool = True) -> ProgressReporter | None:
    """The progress callback ``ecal`` passes to a long operation: None when not ``enabled``
    (``--json``, ``--quiet``), else a :class:`ProgressReporter` drawing a tqdm bar when stderr
    is a terminal and writing one plain line per event otherwise (logs, pipes, tests)."""
    return ProgressReporter(bar=stderr_is_terminal()) if enabled else None


def silence(stream: Any) -> None:
    """Point ``stream``'s file descriptor at /dev/null, so that later writes and Python's
    flush at exit cannot fail again on a pipe whose reader went away."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(fd, stream.fileno())
        finally:
            os.close(fd)
    except (OSError, ValueError, AttributeError):
        pass


def json_text(obj: Any) -> str:
    """``obj`` as the indented JSON the CLI prints (numpy values, sets, paths converted)."""
    return json.dumps(obj, indent=2, default=_json_default)


def dump_json(obj: Any, file=None) -> None:
    """Print machine-readable output (to ``sys.stdout`` at call time by default)."""
    file = sys.stdout if file is None else file
    file.write(json_text(obj) + "\n")
