"""Size limits checked before allocation, and the wall-clock safety net of a whole call.

Sizes: :func:`check_tasks` and :func:`check_options` refuse a problem over
:class:`solvers.options.LimitOptions` with :class:`solvers.model.ProblemTooLargeError`, from
numbers the caller computes *before* building anything (a pipeline's stages × microbatches ×
2, the length of a file's task list), so a runaway input costs no memory. Pipeline builders,
problem files and workload files call them with their ``max_tasks`` keyword; :func:`solvers.solve`
and :func:`solvers.pareto` call them with ``options.limits`` before the first solver array.

The safety net: :func:`wall_net` opens a wall-clock net for a block (nested nets keep the
earliest end). Solver calls that can run long in native code (the hull LP in its child
process, :mod:`solvers.guarded`; the MILP backends, :mod:`solvers.ilp`) read what is left
with :func:`net_left` and stop when it is spent: a guarded call raises :class:`NetFired`,
which the method catches and reports as ``time_capped``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from .errors import ProblemTooLargeError
from .options import LimitOptions

#: The absolute end (``time.perf_counter()``) of the innermost wall-clock net, or None.
_END: ContextVar[float | None] = ContextVar("ecal_net_end", default=None)

#: Where each limit is raised, for the messages.
_RAISE = {"tasks": "--max-tasks N on the command line, max_tasks= or SolveOptions.limits.max_tasks in Python",
          "options": "SolveOptions.limits.max_options, or max_options= in Python",
          "points": "SolveOptions.limits.max_curve_points in Python"}


def check_tasks(n_tasks: int, max_tasks: int | None, what: str = "problem") -> None:
    """Raise :class:`ProblemTooLargeError` when ``n_tasks`` is over ``max_tasks`` (None: no
    limit). One line, naming how to raise the limit."""
    if max_tasks is not None and n_tasks > max_tasks:
        raise ProblemTooLargeError(
            f"{what}: {n_tasks:,} tasks, over the limit of {max_tasks:,} (raise it with "
            f"{_RAISE['tasks']})", n_tasks, max_tasks)


def check_options(n_options: int, max_options: int | None, what: str = "problem") -> None:
    """Raise :class:`ProblemTooLargeError` when the options of all tasks together are over
    ``max_options`` (None: no limit)."""
    if max_options is not None and n_options > max_options:
        raise ProblemTooLargeError(
            f"{what}: {n_options:,} options over all tasks, over the limit of {max_options:,} "
            f"(raise it with {_RAISE['options']})", n_options, max_options)


def check_points(n_points: int, max_points: int | None, what: str = "curve") -> None:
    """Raise :class:`ProblemTooLargeError` when a curve asks for more than ``max_points``
    deadlines."""
    if max_points is not None and n_points > max_points:
        raise ProblemTooLargeError(
            f"{what}: {n_points:,} deadlines, over the limit of {max_points:,} (raise it with "
            f"{_RAISE['points']})", n_points, max_points)


def check_problem(p, limits: LimitOptions, what: str | None = None) -> None:
    """A built problem against ``limits`` (tasks and options): before a solver allocates."""
    name = what or p.name
    check_tasks(p.n_tasks, limits.max_tasks, name)
    check_options(sum(len(t.options) for t in p.tasks), limits.max_options, name)


class NetFired(Exception):
    """The wall-clock safety net ran out inside a guarded solver call (the call was stopped
    and its child process, if any, killed). Internal: methods catch it and set
    ``time_capped``."""


@contextmanager
def wall_net(seconds: float | None) -> Iterator[None]:
    """Within the block, the safety net ends ``seconds`` from now (None: no new net), or at
    the end of an enclosing net when that comes first."""
    end = None if seconds is None else time.perf_counter() + max(float(seconds), 0.0)
    outer = _END.get()
    if outer is not None and (end is None or outer < end):
        end = outer
    token = _END.set(end)
    try:
        yield
    finally:
        _END.reset(token)


def net_end() -> float | None:
    """The innermost net's end (``time.perf_counter()`` clock), or None without a net."""
    return _END.get()


def net_left() -> float | None:
    """Seconds left of the innermost net (may be ≤ 0), or None without a net."""
    end = _END.get()
    return None if end is None else end - time.perf_counter()


def net_passed() -> bool:
    """Whether the innermost net has run out (False without a net)."""
    left = net_left()
    return left is not None and left <= 0


def cap_seconds(seconds: float | None) -> float | None:
    """``seconds``, made no longer than what is left of the net (at least 0)."""
    left = net_left()
    if left is None:
        return seconds
    left = max(left, 0.0)
    return left if seconds is None else min(float(seconds), left)
