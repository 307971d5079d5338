"""Entry point: :func:`solve` (one deadline); curves are :func:`solvers.curve.pareto`.

``method="auto"`` picks by structure and size:

* a chain (total precedence order) → ``dp`` (exact chain DP, solver-notes §5.2);
* a series–parallel order without switch costs → ``sp`` (exact frontier DP, §5.1; falls back
  when a frontier grows past its cap);
* a small general DAG (≤ ``IlpOptions.max_binaries`` option variables after fixing and
  ≤ ``IlpOptions.max_tasks`` tasks) → ``ilp`` (PuLP MILP, warm-started and bounded by the
  fast method);
* otherwise → ``fast`` (hull LP / Lagrangian bound + rounding and repair).

Every plan states its method, its lower bound (as the method computed it) and gap, its wall
time, and whether a wall-clock safety net fired (``time_capped``); all search is budgeted by
work, so without that flag the plan depends on the input and the options alone. Curves:
:func:`solvers.curve.pareto`.
"""

from __future__ import annotations

import math
import time

from .brute import brute_force
from .dp import chain_order, solve_chain
from .fast import solve_fast
from .feasibility import bound_proves
from .hull_lp import HullLP
from .ilp import allowed_options, solve_ilp
from .limits import check_problem, net_left, wall_net
from .model import InfeasibleError, Problem, ProblemError
from .options import SolveOptions
from .plan import Plan, make_plan
from .spdp import solve_sp, sp_tree

METHODS = ("auto", "dp", "sp", "ilp", "fast", "brute")


def _sp(p: Problem):
    """The series–parallel tree of ``p`` (cached on its index), or None."""
    cache = p.index.__dict__
    if "_sp_tree" not in cache:
        cache["_sp_tree"] = None if p.has_transitions else sp_tree(p)
    return cache["_sp_tree"]


def pick_method(p: Problem, deadline_s: float, options: SolveOptions | None = None) -> str:
    """The method ``auto`` would use for ``p`` at ``deadline_s``."""
    options = options or SolveOptions()
    if chain_order(p, options.dp) is not None:
        return "dp"
    if _sp(p) is not None:
        return "sp"
    n_bin = sum(len(a) for a in allowed_options(p, deadline_s))
    ilp = options.ilp
    return "ilp" if n_bin <= ilp.max_binaries and p.n_tasks <= ilp.max_tasks else "fast"


def solve(problem: Problem, deadline: float | str, method: str = "auto",
          time_limit_s: float | None = None, *, options: SolveOptions | None = None,
          _lp: HullLP | None = None) -> Plan:
    """Minimum-energy plan meeting ``deadline`` (seconds or ``"1.05x"`` of the fastest makespan).

    Every search is budgeted by work (DP labels, MILP nodes, search moves), so the same input
    and ``options`` (default :class:`solvers.options.SolveOptions`, the shipped tuning) give
    the same plan on any machine and under any load. ``time_limit_s`` is only the call's
    wall-clock safety net, never a budget (default: ``options.ilp.safety_net_s`` for the
    MILP, whose backend gets what is left of it after the warm start;
    :func:`solvers.fast.safety_net_s` for the fast method); it bounds the whole call, LP and
    MILP back ends included (they are stopped, their processes killed and their temp files
    removed), and when it fires the plan says so (``Plan.time_capped``). Ctrl-C (or any
    exception a signal handler raises) stops a running LP or MILP within a fraction of a
    second. The plan's ``lower_bound_j`` is the method's bound, unclamped; status ``optimal``
    only when the method proved it.

    Raises :class:`~solvers.model.ProblemTooLargeError` before anything is allocated when ``problem`` is
    over ``options.limits`` (tasks, options), :class:`InfeasibleError` (with the fastest
    achievable makespan) when the deadline cannot be met, :class:`ProblemError` for an
    unknown method or a method that does not apply.
    """
    if method not in METHODS:
        raise ProblemError(f"unknown method {method!r}; choose from {METHODS}")
    options = options or SolveOptions()
    check_problem(problem, options.limits)
    t0 = time.perf_counter()
    D = problem.deadline_s(deadline)
    problem.check_feasible(D)
    if method == "auto":
        method = pick_method(problem, D, options)
    if method == "dp":
        order = chain_order(problem, options.dp)
        if order is None:
            raise ProblemError(f"{problem.name}: method 'dp' needs a chain (a total precedence "
                               f"order with switches only between neighbours)")
        r = solve_chain(problem, D, order, options.dp)
        return make_plan(problem, r.choice, D, method="dp", lower_bound_j=r.lower_bound_j,
                         wall_s=time.perf_counter() - t0, proven=r.exact,
                         meta={"labels": r.labels})
    if method == "sp":
        tree = _sp(problem)
        if tree is None:
            raise ProblemError(f"{problem.name}: method 'sp' needs a series-parallel order without "
                               f"switch costs")
        got = solve_sp(problem, D, tree)
        if got is not None:
            # the SP DP is exhaustive over undominated partial plans: its optimum is its proof
            return make_plan(problem, got[0], D, method="sp", lower_bound_j=got[1],
                             wall_s=time.perf_counter() - t0, proven=True)
        method = "ilp" if problem.n_tasks <= options.ilp.max_tasks else "fast"   # frontier cap hit: fall back
    if method == "brute":
        ch, e = brute_force(problem, D)
        if ch is None:
            raise InfeasibleError(f"{problem.name}: no assignment meets {D:.6g} s",
                                  problem.fastest_makespan_s())
        return make_plan(problem, ch, D, method="brute", lower_bound_j=e,
                         wall_s=time.perf_counter() - t0, proven=True)
    if method == "fast":
        fast = solve_fast(problem, D, _lp, time_limit_s=time_limit_s, options=options)
        return make_plan(problem, fast.choice, D, method="fast", lower_bound_j=fast.lower_bound_j,
                         wall_s=time.perf_counter() - t0,
                         proven=bound_proves(fast.lower_bound_j, fast.energy_j),
                         meta={"search": fast.search} if fast.search else None,
                         time_capped=fast.time_capped)
    # time_limit_s is the whole call's safety net: the warm start, then the MILP with what it left
    net_s = options.ilp.safety_net_s if time_limit_s is None else float(time_limit_s)
    with wall_net(net_s):
        # the MILP's warm start and fallback
        fast = solve_fast(problem, D, _lp, time_limit_s=time_limit_s, options=options)
        r = solve_ilp(problem, D, backend_time_limit_s=max(net_left(), 0.0), warm_start=fast.choice,
                      fallback_bound_j=fast.lower_bound_j, opts=options.ilp)
    use_ilp = r.choice is not None and r.energy_j <= fast.energy_j
    ch = r.choice if use_ilp else fast.choice
    bound = max(r.lower_bound_j, fast.lower_bound_j) if math.isfinite(r.lower_bound_j) else fast.lower_bound_j
    energy = r.energy_j if use_ilp else fast.energy_j
    proven = (r.optimal and use_ilp) or bound_proves(bound, energy)
    capped = r.time_capped or fast.time_capped
    return make_plan(problem, ch, D, method=f"ilp[{r.solver}]", lower_bound_j=bound,
                     wall_s=time.perf_counter() - t0, proven=proven,
                     status=None if proven else ("time_limit" if capped else "feasible"),
                     meta={"milp_status": r.status,
                           # which one produced the plan: the MILP back end, or its warm start
                           "plan_from": r.solver if use_ilp else "fast"},
                     time_capped=capped)
