"""Run one function call in a fresh Python process while this one goes on working.

The fast method runs a small portfolio of independent searches (:mod:`solvers.portfolio`)
and keeps the best plan. :func:`start` hands one call to another process, so that a second core
works on it, and :meth:`Pending.result` collects it.

The other process is a fresh interpreter (``python -c`` calling :func:`_main` with a job and
a result file), not a ``multiprocessing`` child:

* ``fork`` copies a process whose HiGHS may already run worker threads; a child that then
  calls HiGHS can deadlock on locks those threads held;
* ``spawn`` and ``forkserver`` import the caller's ``__main__`` again, so a user's script
  without an ``if __name__ == "__main__":`` guard would run a second time.

Call and result travel as pickles in a private temporary directory. Anything that goes wrong
in the worker (it cannot start, the call does not pickle, it raises, it is killed) makes
:meth:`Pending.result` run the call in this process instead: the calls handed over here are
deterministic, so the answer is the same and only the wall time grows.

>>> job = start(max, 3, 7, parallel=False)    # runs here, when the result is asked for
>>> job.result()
7
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from frontier.files import atomic_write

#: The worker's program: not ``-m solvers.workers``, which would run this module a second
#: time as ``__main__`` after the package's own import of it.
_BOOT = "import sys; from solvers.workers import _main; sys.exit(_main(sys.argv[1], sys.argv[2]))"


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class Pending:
    """One call, running in a worker process or waiting to run here; see :func:`start`.

    ``in_worker`` says whether a worker took it; after :meth:`result`, ``fallback`` holds why
    the call ran here instead (None when the worker answered or none was asked for)."""

    def __init__(self, fn: Callable[..., Any], args: tuple, timeout_s: float):
        self.fn, self.args, self.timeout_s = fn, args, timeout_s
        self.proc: subprocess.Popen | None = None
        self.dir: Path | None = None
        self.fallback: str | None = None

    @property
    def in_worker(self) -> bool:
        """Whether a worker process took the call."""
        return self.proc is not None

    def _launch(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ecal-worker-"))
        job = self.dir / "job.pkl"
        with open(job, "wb") as f:
            pickle.dump((self.fn, self.args), f, protocol=pickle.HIGHEST_PROTOCOL)
        env = dict(os.environ)
        # the worker imports what this process can: its package and the caller's modules
        paths = [p for p in sys.path if isinstance(p, str) and p] + [env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        err = open(self.dir / "stderr.txt", "wb")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(job), str(self.dir / "result.pkl")],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env)
        finally:
            err.close()

    def result(self) -> Any:
        """The call's return value: the worker's, else (see ``fallback``) computed here."""
        if self.proc is None:
            return self.fn(*self.args)
        try:
            try:
                code = self.proc.wait(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                code = None
            out = self.dir / "result.pkl"
            if code == 0 and out.exists():
                with open(out, "rb") as f:
                    return pickle.load(f)
            tail = (self.dir / "stderr.txt").read_text(errors="replace").strip().splitlines()[-1:]
            self.fallback = (f"worker timed out after {self.timeout_s:.0f} s" if code is None
                             else f"worker exited with {code}" + (f": {tail[0]}" if tail else ""))
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError) as e:
            self.fallback = f"worker result unreadable: {e!r}"
        finally:
            self.close()
        return self.fn(*self.args)

    def close(self) -> None:
        """Stop the worker if it still runs and remove its files (safe to call twice)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> Pending:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start(fn: Callable[..., Any], *args: Any, parallel: bool = True, timeout_s: float = 600.0) -> Pending:
    """Start ``fn(*args)`` in a worker process when ``parallel`` (else it runs on
    :meth:`Pending.result`). ``fn`` must be a module-level function and ``args`` picklable,
    else the call runs here too; ``timeout_s`` bounds the wait for the worker. Use as a
    context manager, so that an exception in the caller also stops the worker."""
    job = Pending(fn, args, timeout_s)
    if parallel and sys.executable:
        try:
            job._launch()
        except (OSError, pickle.PicklingError, TypeError, AttributeError) as e:
            job.close()
            job.proc, job.fallback = None, f"worker not started: {e!r}"
    return job


def _main(job: str, result: str) -> int:
    """The worker: run the pickled call in ``job``, pickle its value to ``result``."""
    with open(job, "rb") as f:
        fn, args = pickle.load(f)
    value = fn(*args)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)

    atomic_write(result, write)    # all or nothing: a killed worker leaves no half result
    return 0
