"""Keep termination signals out of a device change or a restore until it has finished.

``with shielded():`` blocks SIGINT, SIGTERM, SIGHUP and SIGQUIT for the calling thread
(``signal.pthread_sigmask``): a signal sent meanwhile stays pending in the kernel and its
handler runs right after the block ends, so no handler can run between an NVML setter and the
journal record of it, or in the middle of a restore.

The kernel may still hand a process-directed signal to *another* thread (torch starts some),
whose mask is not ours; CPython then runs the Python handler in the main thread at the next
bytecode, inside the shielded block. Handlers that must not run there (``restoring()``'s)
call :func:`defer` first: inside a shield it records the signal and returns True, and the
outermost shield re-raises every deferred signal once it ends.

Shield state is per process (signals are), kept in this module.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

#: The signals ``restoring()`` handles and a shield holds back (those this platform has).
SHIELDED_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, n))

# Re-entrant: a Python handler runs in the main thread between any two bytecodes, also while
# that thread holds this lock in shielded() below, and may enter a shield itself.
_lock = threading.RLock()
_depth = 0
_deferred: list[int] = []


def active() -> bool:
    """Whether some thread is inside :func:`shielded`."""
    return _depth > 0


def defer(signum: int) -> bool:
    """For a signal handler: inside a shield, remember ``signum`` for re-delivery when the
    shield ends and return True (the handler should return at once); else False."""
    if _depth > 0:
        _deferred.append(signum)
        return True
    return False


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Hold back :data:`SHIELDED_SIGNALS` for the body (re-entrant; see module doc)."""
    global _depth
    can_mask = hasattr(signal, "pthread_sigmask")
    old = signal.pthread_sigmask(signal.SIG_BLOCK, SHIELDED_SIGNALS) if can_mask else None
    with _lock:
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            outermost = _depth == 0
            pending = list(_deferred) if outermost else []
            if outermost:
                _deferred.clear()
        if can_mask:
            # Unblocking delivers what the kernel held: its handlers run right after this.
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        for s in dict.fromkeys(pending):
            signal.raise_signal(s)
