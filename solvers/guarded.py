"""Native solver calls that Ctrl-C, SIGTERM and the safety net can stop.

A solver running in C (scipy's ``linprog``, ``highspy``) does not return to Python until it is
done, so neither a signal handler nor a wall-clock check can run meanwhile: the 800,000-task hull
LP of issue 27 ignored SIGINT and SIGTERM for 24 minutes. Two ways out, used by size:

* :class:`ChildServer`: an object lives in a child process (a fresh interpreter, ``python -c``,
  as :mod:`solvers.workers` explains: no ``fork`` of a process whose HiGHS may run threads, no
  re-import of the caller's ``__main__``), and this process calls its methods over two pipes.
  While the child computes, this process waits in ``select`` in short slices: a signal's
  handler runs at once (KeyboardInterrupt, or ``ecal``'s ``Interrupted``), and when the net
  runs out :class:`solvers.limits.NetFired` is raised. Either way the child is killed
  (SIGKILL) and reaped before the exception leaves, so nothing keeps running or holding
  memory. The child also dies with this process (``PR_SET_PDEATHSIG`` on Linux) and ignores
  SIGINT (a terminal's Ctrl-C reaches the whole process group; this process decides).
  Used for the hull LP from :attr:`solvers.options.LimitOptions.lp_process_min_tasks` tasks on.
* :func:`run_cancellable`: an in-process call that can be told to stop (``highspy``'s
  interrupt callback, behind PuLP's HiGHS) runs in a thread while this one waits in short
  slices; on a signal or the net it asks the call to stop and waits a moment for it.

Command-line solvers (CBC) are child processes already: :mod:`solvers.ilp` kills them.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from .limits import NetFired, net_end

#: The child's program: a fresh interpreter serving one object (see :func:`_serve`).
_BOOT = ("import sys; from solvers.guarded import _serve; "
         "sys.exit(_serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))")
#: A marker on the child's command line (tests and ``ps`` find it by this).
CHILD_TAG = "solvers.guarded"
_HEADER = struct.Struct("<Q")
#: How long one wait slice lasts (s): the longest a signal's handler may wait to run.
_SLICE_S = 0.2


class ChildFailed(RuntimeError):
    """The child process could not start or ended without answering (not killed by us)."""


def _write_all(fd: int, data: bytes, watch: bool = False) -> None:
    """Write all of ``data``; with ``watch``, in 64 KB pieces, each when the pipe has room
    (waiting as :func:`_wait_ready` does: a slow reader cannot hold this process past the
    net, and signal handlers run)."""
    view = memoryview(data)
    while view:
        if watch:
            _wait_ready(fd, write=True)
        n = os.write(fd, view[:1 << 16] if watch else view)
        view = view[n:]


def _read_exact(fd: int, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        b = os.read(fd, min(n - got, 1 << 24))
        if not b:
            raise EOFError("pipe closed")
        parts.append(b)
        got += len(b)
    return b"".join(parts)


def _send(fd: int, obj: Any, watch: bool = False) -> None:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    _write_all(fd, _HEADER.pack(len(body)) + body, watch)


def _recv(fd: int) -> Any:
    (n,) = _HEADER.unpack(_read_exact(fd, _HEADER.size))
    return pickle.loads(_read_exact(fd, n))


def _die_with_parent(parent: int) -> None:
    """Linux: SIGKILL this process when its parent dies; elsewhere nothing."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))          # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:                      # the parent died before prctl
        os._exit(1)


def _serve(fd_in: int, fd_out: int, parent: int) -> int:
    """The child: build the object from the first message, then answer method calls."""
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        factory, args = _recv(fd_in)
        obj = factory(*args)
        _send(fd_out, ("ok", None))
        while True:
            try:
                name, args = _recv(fd_in)
            except EOFError:
                return 0
            try:
                reply = ("ok", getattr(obj, name)(*args))
            except Exception as exc:                 # the caller gets it, re-raised there
                reply = ("err", exc)
            try:
                _send(fd_out, reply)
            except (pickle.PicklingError, TypeError, AttributeError) as exc:
                _send(fd_out, ("err", RuntimeError(f"{type(exc).__name__}: {exc}")))
    except EOFError:
        return 0


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            proc.kill()
        except ProcessLookupError:
            pass
    proc.wait()


class ChildServer:
    """``factory(*args)`` built in a child process; :meth:`call` runs its methods there.

    The child starts on the first call. A call waits until the answer comes, the net
    (:func:`solvers.limits.wall_net`) runs out (:class:`NetFired`), or a signal's handler
    raises; in the last two cases the child is killed and reaped before the exception
    leaves, and the next call starts a new child (replaying the calls named in
    ``replay``, which change the object's state). An exception the method raised in the child
    is raised here. :class:`ChildFailed` when the child cannot start or dies by itself."""

    def __init__(self, factory: Callable[..., Any], args: tuple, replay: tuple[str, ...] = ()):
        self.factory, self.args, self.replay = factory, args, frozenset(replay)
        self.history: list[tuple[str, tuple]] = []
        self.proc: subprocess.Popen | None = None
        self._fds: tuple[int, int] | None = None
        self._finalizer = None

    # -- process ------------------------------------------------------------------------------
    def _start(self) -> None:
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        env = dict(os.environ)
        paths = [p for p in sys.path if isinstance(p, str) and p] + [env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(req_r), str(resp_w), str(os.getpid()), CHILD_TAG],
                pass_fds=(req_r, resp_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, env=env, close_fds=True)
        except BaseException:
            for fd in (req_r, req_w, resp_r, resp_w):
                os.close(fd)
            raise
        os.close(req_r)
        os.close(resp_w)
        self.proc, self._fds = proc, (req_w, resp_r)
        self._finalizer = weakref.finalize(self, _close_child, proc, req_w, resp_r)
        for msg in [(self.factory, self.args)] + self.history:
            status, value = self._exchange(msg)
            if status == "err":
                self.close()
                raise ChildFailed(f"solver child process could not build its object: {value!r}")

    def close(self) -> None:
        """Kill the child (if any) and close the pipes; safe to call twice."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self.proc, self._fds = None, None

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs."""
        return None if self.proc is None else self.proc.pid

    # -- calls --------------------------------------------------------------------------------
    def _exchange(self, msg: Any) -> tuple[str, Any]:
        """Send ``msg``, wait for the answer: ("ok", value) or ("err", the exception raised
        there). Any exception here (a signal's, NetFired, a broken pipe) kills the child."""
        assert self._fds is not None
        w, r = self._fds
        try:
            _send(w, msg, watch=True)
            _wait_ready(r)
            return _recv(r)
        except (EOFError, BrokenPipeError) as exc:
            self.close()
            raise ChildFailed(f"solver child process ended: {exc}") from None
        except BaseException:
            self.close()
            raise

    def call(self, name: str, *args: Any) -> Any:
        """``obj.name(*args)`` in the child (started when needed)."""
        if self.proc is None:
            try:
                self._start()
            except (OSError, ValueError) as exc:
                self.close()
                raise ChildFailed(f"solver child process did not start: {exc}") from None
        status, value = self._exchange((name, args))
        if status == "err":
            raise value
        if name in self.replay:
            self.history.append((name, args))
        return value


def _close_child(proc: subprocess.Popen, *fds: int) -> None:
    _kill(proc)
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _wait_ready(fd: int, write: bool = False) -> None:
    """Wait until ``fd`` has data (``write``: room), in short slices (signal handlers run
    between them); :class:`NetFired` when the net runs out first."""
    while True:
        end = net_end()
        left = None if end is None else end - time.perf_counter()
        wait = _SLICE_S if left is None else min(_SLICE_S, max(left, 0.0))
        rd, wr, _ = select.select([] if write else [fd], [fd] if write else [], [], wait)
        if rd or wr:
            return
        if left is not None and left <= wait:
            raise NetFired("safety net")


def run_cancellable(fn: Callable[[], Any], cancel: Callable[[], None], end: float | None = None,
                    grace_s: float = 2.0) -> tuple[Any, bool]:
    """Run ``fn()`` in a thread while this one waits in short slices; returns (its value,
    whether it had to be stopped). At ``end`` (a ``time.perf_counter()`` instant; None: never)
    ``cancel()`` asks it to stop, and its value (a solver stopped early) comes back with True;
    :class:`NetFired` if it has not stopped ``grace_s`` later. On a signal (an exception its
    handler raises here) ``cancel()`` too, a wait of up to ``grace_s`` for it to stop, and the
    exception goes on. An exception ``fn`` raised is raised here."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:                 # handed to the waiting thread
            box["error"] = exc
        finally:
            done.set()

    th = threading.Thread(target=target, name="ecal-solver", daemon=True)
    th.start()
    stopped = False
    try:
        while not done.wait(_SLICE_S):
            if not stopped and end is not None and time.perf_counter() >= end:
                stopped = True
                cancel()
                if not done.wait(grace_s):
                    raise NetFired("safety net (the solver did not stop)")
    except BaseException:
        if not done.is_set():
            cancel()
            done.wait(grace_s)
        raise
    if "error" in box:
        raise box["error"]
    return box.get("value"), stopped
