"""The planner's errors: a malformed problem, an infeasible deadline, a problem over a size
limit, no MILP solver. Here, below every other module of ``solvers``, so that any of them can
raise these without importing the problem model."""

from __future__ import annotations

from frontier.errors import EnergyCalculusError, InputError


class ProblemError(InputError):
    """The problem is malformed (cycle, unknown task or device, empty options, NaN, ...)."""


class InfeasibleError(InputError):
    """No assignment meets the deadline. ``fastest_makespan_s`` says what is achievable."""

    def __init__(self, message: str, fastest_makespan_s: float):
        self.fastest_makespan_s = fastest_makespan_s
        super().__init__(message)


class ProblemTooLargeError(InputError):
    """A problem (or a curve) is over a size limit (:class:`solvers.options.LimitOptions`),
    found before anything is allocated for it. ``size`` and ``limit`` say by how much; the
    message names ``--max-tasks`` (the command line) and ``max_tasks=`` (Python), which raise
    the limit."""

    def __init__(self, message: str, size: int = 0, limit: int = 0):
        self.size, self.limit = size, limit
        super().__init__(message)


class SolverUnavailableError(EnergyCalculusError):
    """No MILP solver is available to PuLP (PuLP 4 ships none: ``pip install 'pulp[cbc]'`` or
    ``highspy``)."""
