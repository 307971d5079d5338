"""The fast method: a plan and a proven lower bound for DAGs too large for the exact methods.

:func:`solve_fast` puts the pieces together (``docs/solver.md`` explains the method):

1. the hull LP (:mod:`solvers.hull_lp`) and the Lagrangian bound from its duals
   (:mod:`solvers.lagrangian`);
2. without switch costs, the LP rounding crashed to the deadline and relaxed
   (:mod:`solvers.rounding`, :mod:`solvers.repair`); with them, feasible starts improved by
   the switch-cost search (:mod:`solvers.search`; optionally a portfolio of searches,
   :mod:`solvers.portfolio`), and a stronger bound (:mod:`solvers.bound`);
3. every candidate re-checked against the deadline; the cheapest that meets it wins.

The search is budgeted in work units (:func:`polish_budget`), so the plan depends on the
input and the options alone. ``time_limit_s`` is only the wall-clock safety net of the whole
call (default :func:`safety_net_s`): the hull LP (killed in its child process on large
problems: :mod:`solvers.guarded`), the starts, the bound and the search; when it fires, the
result says so (``time_capped``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import held
from .bound import switch_bound_capped
from .feasibility import check_bound
from .hold import wrap_polish
from .hull_lp import HullLP
from .lagrangian import device_viterbi, flow_from_duals
from .limits import NetFired, cap_seconds, net_passed, wall_net
from .model import Problem
from .options import SearchSettings, SolveOptions
from .portfolio import portfolio_members, run_portfolio, search_record
from .repair import repaired
from .rounding import round_lp, switch_starts
from .search import MemberRun, energy_if_meets
from .workers import available_cpus


@dataclass(frozen=True)
class FastResult:
    """Plan choice, its energy, the best proven lower bound, and the LP's tangent
    (bound at D' ≥ ``lp_bound_j`` + ``slope_j_per_s``·(D' − D), by convexity in D)."""

    choice: np.ndarray
    energy_j: float
    lower_bound_j: float
    lp_bound_j: float = -math.inf
    slope_j_per_s: float = 0.0
    search: dict | None = None    # switch-cost search: work units spent, budget, time-capped
    time_capped: bool = False     # a wall-clock safety net fired (search or bound)


def safety_net_s(n_tasks: int, options: SolveOptions = SolveOptions()) -> float:
    """The default wall-clock safety net (s) of a fast solve of ``n_tasks`` tasks
    (``options.budget``)."""
    b = options.budget
    need = b.safety_net_s_per_unit * _work_units(n_tasks, options) + b.safety_net_s_per_task * n_tasks
    return min(b.safety_net_s_max, max(b.safety_net_s_min, need))


def _work_units(n_tasks: int, options: SolveOptions) -> float:
    """Work units of the switch-cost search for ``n_tasks`` tasks (``options.budget``):
    ``work_per_task`` each, at most ``max_work``, and past ``work_task_product`` / ``max_work``
    tasks shrinking as 1/tasks; from :data:`solvers.held.MIN_TASKS` tasks on, where a unit's
    moves no longer cost time ∝ tasks, at least ``held_work_per_task`` ×
    √(tasks / ``held_work_tasks``) per task."""
    b = options.budget
    work = min(b.max_work, b.work_per_task * n_tasks, b.work_task_product / max(n_tasks, 1))
    if n_tasks >= held.MIN_TASKS:            # moves against a held schedule: O(1) per unit
        work = max(work, b.held_work_per_task * n_tasks * math.sqrt(n_tasks / b.held_work_tasks))
    return work


def polish_budget(n_tasks: int, seconds: float | None = None,
                  options: SolveOptions | None = None) -> tuple[float, float]:
    """(work units, wall-clock safety net in s) of the search for ``n_tasks`` tasks. The work
    depends on the size alone (``options.budget``); ``seconds`` (a caller's ``time_limit_s``)
    replaces only the safety net (default :func:`safety_net_s`)."""
    options = options or SolveOptions()
    work = _work_units(n_tasks, options)
    return work, (safety_net_s(n_tasks, options) if seconds is None else float(seconds))


def solve_fast(p: Problem, deadline_s: float, lp: HullLP | None = None,
               search_work: float | None = None,
               time_limit_s: float | None = None, surrogate_bound: bool = True,
               portfolio: bool = True, parallel: bool | None = None,
               options: SolveOptions | None = None) -> FastResult:
    """LP/Lagrangian bound plus rounded-and-repaired plan at ``deadline_s``.

    Without switch costs the LP rounding is crashed to the deadline and relaxed. With switch costs,
    feasible starts that need no crash (:func:`solvers.rounding.switch_starts`) go through the
    search (:func:`solvers.search.run_member`): ``search_work`` units (default
    :func:`polish_budget`; 0 turns the search off), so the plan depends on the input alone.
    ``time_limit_s`` is only the wall-clock safety net of the whole call (default
    :func:`safety_net_s`); when it fires, the result says so (``time_capped``). When it fires
    before the hull LP is solved, the plan is every task's fastest option with
    :func:`trivial_bound` (:func:`net_fired_result`). When searching and ``surrogate_bound``, the
    bound is :func:`solvers.bound.switch_bound` (one more LP solve and the ascent, about 3.5 s
    on 16x64: curves skip it).

    With ``portfolio`` and at least ``options.portfolio.min_tasks`` tasks, every search of
    ``options.portfolio.members`` runs too, each with its ``work_share`` of that budget, and the
    cheapest plan wins; they run in worker processes while this one computes the bound and the
    first search, when ``parallel`` (default: when this process may use two CPUs or more).
    Parallel or not, the plan is the same.

    The bound is reported raw (``lower_bound_j``, never clamped to the plan's energy); one
    above the plan's energy beyond :data:`solvers.feasibility.BOUND_REL_TOL` raises
    :class:`solvers.feasibility.CertificateError`."""
    options = options or SolveOptions()
    ix = p.index
    work, net = polish_budget(ix.n, time_limit_s, options)
    if search_work is not None:
        work = float(search_work)
    own = lp is None
    with wall_net(net):               # the whole call's net: LPs and backends included
        lp = lp or HullLP(p, process_min_tasks=options.limits.lp_process_min_tasks)
        try:
            try:
                res = lp.solve(deadline_s)
            except NetFired:
                return net_fired_result(p, deadline_s)
            return _solve_fast(p, deadline_s, lp, res, work, net, surrogate_bound, portfolio,
                               parallel, options)
        finally:
            if own:
                lp.close()            # its child process, if it has one


def net_fired_result(p: Problem, deadline_s: float) -> FastResult:
    """What the fast method returns when the safety net fired before its hull LP was solved:
    every task at its fastest option (meets any deadline :meth:`Problem.check_feasible`
    accepts) and :func:`trivial_bound`, ``time_capped``."""
    fc = p.fastest_plan_choice()
    return FastResult(fc, float(p.index.objective(fc)), trivial_bound(p), time_capped=True)


def trivial_bound(p: Problem) -> float:
    """A lower bound on every plan, in O(options): each task's cheapest effective energy plus
    the idle power over the critical path at the fastest options without switch latencies
    (switches only add)."""
    ix = p.index
    fastest = np.array([float(t.min()) for t in ix.time])
    _, end = ix.earliest(fastest)
    return float(sum(float(c.min()) for c in ix.cost) + ix.p_total * float(np.max(end)))


def _solve_fast(p: Problem, deadline_s: float, lp: HullLP, res, work: float, net: float,
                surrogate_bound: bool, portfolio: bool, parallel: bool | None,
                options: SolveOptions) -> FastResult:
    """:func:`solve_fast` from the hull LP's solution ``res``, within the net."""
    ix = p.index
    bound = res.bound_j
    fl = flow_from_duals(p, lp, res.duals, deadline_s)
    lag_val, _ = device_viterbi(p, fl.f, fl.mu_dev)
    bound = max(bound, fl.const_j + lag_val)
    horizons = [res.makespan_s, deadline_s]
    if not ix.has_transitions:
        work = 0.0
        ch = repaired(p, round_lp(p, res.time_s), deadline_s, horizons)
        plans = [] if ch is None else [ch]
    else:
        plans = switch_starts(p, fl, res, deadline_s, horizons)
    if not plans:
        plans = [ix.fastest_choice()]
    runs: list[MemberRun] = []
    bound_capped = False
    members: list[SearchSettings] = []
    pending: list = []
    if work > 0:
        members = portfolio_members(ix.n, options)[:None if portfolio else 1]
        if parallel is None:
            parallel = available_cpus() >= 2

        def raise_bound() -> None:
            nonlocal bound, bound_capped
            if surrogate_bound:
                try:
                    sb, bound_capped = switch_bound_capped(p, lp, res, deadline_s, options.bound,
                                                           seconds=cap_seconds(net))
                except NetFired:                # its LP ran into the net: keep the bound so far
                    bound_capped = True
                    return
                bound = max(bound, sb)

        runs, pending = run_portfolio(p, plans, deadline_s, work, cap_seconds(net), members, parallel,
                                      options, raise_bound)
        plans = [r.choice for r in runs] + plans
    # every candidate is re-checked: the cheapest plan that meets the deadline is returned
    energies = [energy_if_meets(p, c, deadline_s) for c in plans]
    search = search_record(work, net, members, runs, energies[:len(runs)], pending, options) if runs else None
    if not np.isfinite(min(energies)):
        fc = p.fastest_plan_choice()           # meets any deadline check_feasible accepted
        plans, energies = [fc], [ix.objective(fc)]
    if ix.steady_state:                        # the searches price no wrap switch: polish it
        ch = wrap_polish(p, plans[int(np.argmin(energies))], deadline_s)
        plans, energies = plans + [ch], energies + [energy_if_meets(p, ch, deadline_s)]
    k = int(np.argmin(energies))
    best_ch, best_e = plans[k], energies[k]
    check_bound(bound, best_e, f"{p.name}: fast method")
    # the net fired anywhere (also in steps outside the search's work, such as the starts)
    capped = bound_capped or any(r.capped_by_time for r in runs) or net_passed()
    return FastResult(best_ch, float(best_e), float(bound), res.bound_j, res.slope_j_per_s,
                      search, capped)
