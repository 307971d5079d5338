"""One feasibility predicate and one bound check for every solver.

Every solver, the plan builder and the brute-force oracle decide "does this plan meet the
deadline?" with :func:`meets_deadline`, and check every lower bound they report against a
feasible plan with :func:`check_bound`. One tolerance each, stated here:

* :data:`DEADLINE_REL_TOL` (1e-9): a makespan may exceed the deadline by one part in 10⁹
  (1 ns per second). Summing 10⁵ float durations rounds by about 10⁵ · 1.1e-16 ≈ 1e-11
  relative, so a plan that meets the deadline in exact arithmetic is never refused, and 1 ns
  per second is far below anything a GPU timer resolves. A method that optimises over
  makespans up to :func:`latest_makespan_s` (the chain DP) solves exactly the problem this
  predicate defines.
* :data:`BOUND_REL_TOL` (1e-6): a reported lower bound may exceed a feasible plan's energy by
  one part in 10⁶ (LP solvers work to a 1e-7 feasibility tolerance, and plans may use the
  deadline's 1e-9 tolerance); beyond that the bound is wrong, and :func:`check_bound` raises
  :class:`CertificateError` rather than reporting a false "optimal".
"""

from __future__ import annotations

import math
from statistics import NormalDist

from frontier.errors import InternalError

#: A makespan meets deadline D when it is at most D·(1 + DEADLINE_REL_TOL).
DEADLINE_REL_TOL = 1e-9
#: A lower bound may exceed a feasible plan's energy E by at most BOUND_REL_TOL·max(|E|, 1 J).
BOUND_REL_TOL = 1e-6
#: A plan is reported optimal from a bound (rather than a method's own proof) when the bound
#: is within this relative distance of its energy: the gap prints as 0.000 %.
PROOF_REL_TOL = 1e-9


class CertificateError(InternalError):
    """A solver's result contradicts its certificate: a plan late for its deadline, or a
    lower bound above a feasible plan's energy. Always an internal error (a bug), never bad
    input."""


def latest_makespan_s(deadline_s: float) -> float:
    """The largest makespan that meets ``deadline_s`` (:func:`meets_deadline`)."""
    return float(deadline_s) * (1.0 + DEADLINE_REL_TOL)


def meets_deadline(makespan_s: float, deadline_s: float) -> bool:
    """Whether a plan of ``makespan_s`` meets ``deadline_s`` (within :data:`DEADLINE_REL_TOL`)."""
    return makespan_s <= latest_makespan_s(deadline_s)


def plan_meets_deadline(problem, choice, deadline_s: float) -> bool:
    """:func:`meets_deadline` for ``choice`` (option per task) on ``problem``."""
    return meets_deadline(problem.index.makespan(choice), deadline_s)


def check_bound(lower_bound_j: float, energy_j: float, what: str = "plan") -> None:
    """Raise :class:`CertificateError` when ``lower_bound_j`` exceeds the feasible
    ``energy_j`` by more than :data:`BOUND_REL_TOL`."""
    if math.isfinite(energy_j) and lower_bound_j > energy_j + BOUND_REL_TOL * max(abs(energy_j), 1.0):
        raise CertificateError(f"{what}: lower bound {lower_bound_j!r} J exceeds the energy "
                               f"{energy_j!r} J of a feasible plan (internal error)")


def bound_proves(lower_bound_j: float, energy_j: float) -> bool:
    """Whether a valid lower bound closes the gap to ``energy_j`` (within :data:`PROOF_REL_TOL`)."""
    return math.isfinite(lower_bound_j) and lower_bound_j >= energy_j - PROOF_REL_TOL * max(abs(energy_j), 1.0)


def p_meets(deadline_s: float, makespan_s: float, sd_makespan_s: float) -> float:
    """P(T ≤ D) = Φ((D − T)/σ_T) for a makespan predicted as ``makespan_s`` ± ``sd_makespan_s``;
    σ_T = 0: 1.0 when the makespan meets the deadline (:func:`meets_deadline`), else 0.0."""
    if not sd_makespan_s > 0:
        return 1.0 if meets_deadline(makespan_s, deadline_s) else 0.0
    return NormalDist().cdf((deadline_s - makespan_s) / sd_makespan_s)
