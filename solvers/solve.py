"""Entry points: :func:`solve` (one deadline) and :func:`pareto` (the energy-vs-deadline curve).

``method="auto"`` picks by structure and size:

* a chain (total precedence order) → ``dp`` (exact chain DP, solver-notes §5.2);
* a series–parallel order without switch costs → ``sp`` (exact frontier DP, §5.1; falls back
  when a frontier grows past its cap);
* a small general DAG (≤ ``ILP_MAX_BINARIES`` option variables after fixing) → ``ilp``
  (PuLP MILP, warm-started and bounded by the fast method);
* otherwise → ``fast`` (hull LP / Lagrangian bound + rounding and repair).

Every plan states its method, its lower bound (as the method computed it) and gap, its wall
time, and whether a wall-clock safety net fired (``time_capped``); all search is budgeted by
work, so without that flag the plan depends on the input alone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from .brute import brute_force
from .dp import chain_order, solve_chain
from .feasibility import bound_proves, check_bound, plan_meets_deadline
from .ilp import allowed_options, solve_ilp
from .model import InfeasibleError, Problem, ProblemError
from .plan import ParetoCurve, Plan, choice_dtype, make_plan
from .relax import HullLP, interpolate, polish_budget, relax_repeatedly, solve_fast
from .spdp import solve_sp, sp_tree

METHODS = ("auto", "dp", "sp", "ilp", "fast", "brute")

#: Above this many binary option variables (after variable fixing) ``auto`` avoids the MILP.
ILP_MAX_BINARIES = 3000

#: The same limit per point of a curve (``pareto``), where many deadlines are solved.
ILP_CURVE_MAX_BINARIES = 800

#: The MILP's default wall-clock safety net per solve, s (its work budget is its node limit,
#: :data:`solvers.ilp.ILP_MAX_NODES`); per point of a curve ``ILP_CURVE_TIME_LIMIT_S``.
ILP_TIME_LIMIT_S = 30.0
ILP_CURVE_TIME_LIMIT_S = 10.0


def _sp(p: Problem):
    """The series–parallel tree of ``p`` (cached on its index), or None."""
    cache = p.index.__dict__
    if "_sp_tree" not in cache:
        cache["_sp_tree"] = None if p.has_transitions else sp_tree(p)
    return cache["_sp_tree"]


def pick_method(p: Problem, deadline_s: float) -> str:
    """The method ``auto`` would use for ``p`` at ``deadline_s``."""
    if chain_order(p) is not None:
        return "dp"
    if _sp(p) is not None:
        return "sp"
    n_bin = sum(len(a) for a in allowed_options(p, deadline_s))
    return "ilp" if n_bin <= ILP_MAX_BINARIES and p.n_tasks <= 400 else "fast"


def solve(problem: Problem, deadline: float | str, method: str = "auto",
          time_limit_s: float | None = None, *, _lp: HullLP | None = None) -> Plan:
    """Minimum-energy plan meeting ``deadline`` (seconds or ``"1.05x"`` of the fastest makespan).

    Every search is budgeted by work (DP labels, MILP nodes, search moves), so the same input
    gives the same plan on any machine and under any load. ``time_limit_s`` is only a
    wall-clock safety net (default: ``ILP_TIME_LIMIT_S`` for the MILP,
    :func:`solvers.relax.safety_net_s` for the fast method); when it fires, the plan says so
    (``Plan.time_capped``). The plan's ``lower_bound_j`` is the method's bound, unclamped;
    status ``optimal`` only when the method proved it.

    Raises :class:`InfeasibleError` (with the fastest achievable makespan) when the deadline
    cannot be met, :class:`ProblemError` for an unknown method or a method that does not apply.
    """
    if method not in METHODS:
        raise ProblemError(f"unknown method {method!r}; choose from {METHODS}")
    t0 = time.perf_counter()
    D = problem.deadline_s(deadline)
    problem.check_feasible(D)
    if method == "auto":
        method = pick_method(problem, D)
    if method == "dp":
        order = chain_order(problem)
        if order is None:
            raise ProblemError(f"{problem.name}: method 'dp' needs a chain (a total precedence "
                               f"order with switches only between neighbours)")
        r = solve_chain(problem, D, order)
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
        method = "ilp" if problem.n_tasks <= 400 else "fast"     # frontier cap hit: fall back
    if method == "brute":
        ch, e = brute_force(problem, D)
        if ch is None:
            raise InfeasibleError(f"{problem.name}: no assignment meets {D:.6g} s",
                                  problem.fastest_makespan_s())
        return make_plan(problem, ch, D, method="brute", lower_bound_j=e,
                         wall_s=time.perf_counter() - t0, proven=True)
    # the MILP's warm start and fallback; time_limit_s is the whole call's safety net
    fast = solve_fast(problem, D, _lp, time_limit_s=time_limit_s)
    if method == "fast":
        return make_plan(problem, fast.choice, D, method="fast", lower_bound_j=fast.lower_bound_j,
                         wall_s=time.perf_counter() - t0,
                         proven=bound_proves(fast.lower_bound_j, fast.energy_j),
                         meta={"search": fast.search} if fast.search else None,
                         time_capped=fast.time_capped)
    limit = ILP_TIME_LIMIT_S if time_limit_s is None else float(time_limit_s)
    limit = max(limit - (time.perf_counter() - t0), 1.0)
    r = solve_ilp(problem, D, time_limit_s=limit, warm_start=fast.choice,
                  fallback_bound_j=fast.lower_bound_j)
    use_ilp = r.choice is not None and r.energy_j <= fast.energy_j
    ch = r.choice if use_ilp else fast.choice
    bound = max(r.lower_bound_j, fast.lower_bound_j) if math.isfinite(r.lower_bound_j) else fast.lower_bound_j
    energy = r.energy_j if use_ilp else fast.energy_j
    proven = (r.optimal and use_ilp) or bound_proves(bound, energy)
    capped = r.time_capped or fast.time_capped
    return make_plan(problem, ch, D, method=f"ilp[{r.solver}]", lower_bound_j=bound,
                     wall_s=time.perf_counter() - t0, proven=proven,
                     status=None if proven else ("time_limit" if capped else "feasible"),
                     meta={"milp_status": r.status}, time_capped=capped)


def free_makespan_s(p: Problem) -> float:
    """An upper bound on any useful deadline: all tasks at their slowest option, in series."""
    ix = p.index
    tau = sum(float(m.max()) for m in ix.tau + ix.wrap_tau if m is not None)   # wraps too
    return float(sum(t.max() for t in ix.time) + tau)


def pareto(problem: Problem, deadlines: Sequence[float | str] | None = None, n_points: int = 20,
           method: str = "auto", time_limit_s: float | None = None, dense: bool = True) -> ParetoCurve:
    """Energy-vs-deadline curve: a plan at each deadline (a grid from the fastest makespan to the
    makespan of the unconstrained optimum when ``deadlines`` is None), each with its gap.

    A plan found at a smaller deadline also meets a larger one, so the curve is made
    non-increasing by carrying the better plan forward. With the fast method and no switch
    costs (``dense``), plans interpolated between neighbouring grid plans fill the curve
    in between (``ParetoCurve.dense``), each bounded by the LP's tangents and keeping its
    choice (``ParetoCurve.dense_choices``): every point the curve reports comes back as a
    Plan (``curve.plan_at(deadline)``, ``curve.point_plan(i)``). With switch costs
    the fast method's search (:func:`solvers.relax.polish_budget`) is shared by the grid
    points: a curve spends about one single plan's search in all. ``time_limit_s`` is the
    wall-clock safety net of each point (default ``ILP_CURVE_TIME_LIMIT_S`` for MILP points,
    :func:`solvers.relax.safety_net_s` for fast ones); a point it cut short says so
    (``Plan.time_capped``, and ``ParetoCurve.time_capped`` for the curve).
    """
    t0 = time.perf_counter()
    fm = problem.fastest_makespan_s()
    lp = None
    chain = chain_order(problem) is not None
    if method in ("fast", "ilp") or (method == "auto" and not chain):
        lp = HullLP(problem)
    limit = ILP_CURVE_TIME_LIMIT_S if time_limit_s is None else time_limit_s

    def pick(D: float) -> str:
        if method != "auto":
            return method
        m = pick_method(problem, D)
        # A curve solves many deadlines: the MILP only where it is small enough to finish fast.
        if m == "ilp" and sum(len(a) for a in allowed_options(problem, D)) > ILP_CURVE_MAX_BINARIES:
            return "fast"
        return m

    if deadlines is None:
        free = free_makespan_s(problem)
        m_free = pick(free)
        if m_free == "fast":
            # only its makespan is used: no search (a plan there would take a full budget)
            hi = max(problem.index.makespan(solve_fast(problem, free, lp, search_work=0.0).choice), fm)
        else:
            hi = max(solve(problem, free, m_free, limit, _lp=lp).makespan_s, fm)
        # Quadratic spacing: the curve is steepest near the fastest makespan, so put more
        # deadlines there (measured: fewer points where a denser curve would be cheaper).
        u = np.linspace(0.0, 1.0, max(int(n_points), 2))
        ds = list(fm + (hi - fm) * u**1.5) if hi > fm else [fm]
    else:
        ds = sorted(problem.deadline_s(d) for d in deadlines)
    # Interpolated plans and their refinement price options without switch costs, and a
    # plan with switch costs (time or energy) needs the search: one test decides both.
    switch_free = not problem.has_transitions
    refine = 0
    if deadlines is None and dense and switch_free and method == "fast" and len(ds) >= 8:
        # Part of the grid goes where the curve is loosest (see _refine_deadlines).
        refine = int(len(ds) * REFINE_SHARE)
        u = np.linspace(0.0, 1.0, len(ds) - refine)
        ds = list(fm + (ds[-1] - fm) * u**1.5)
    solved: dict[float, tuple[object, float]] = {}

    def fast_at(D: float):
        t1 = time.perf_counter()
        # Curves: more grid points beat extra roundings per point (measured, 8x32). With
        # switch costs the whole curve gets one single plan's search (work), shared by its
        # points, and one search per point (no portfolio: that would double the curve's time).
        search = 0.0 if switch_free else polish_budget(problem.n_tasks)[0] / max(len(ds), 1)
        fr = solve_fast(problem, D, lp, slacks=(), search_work=search, time_limit_s=time_limit_s,
                        surrogate_bound=False, portfolio=False)
        below = [d for d in solved if d < D]
        if below:
            fr = _reuse_previous(problem, solved[max(below)][0], fr, D)
        solved[D] = (fr, time.perf_counter() - t1)
        return fr

    if refine:
        for D in ds:
            fast_at(D)
        fr_list = sorted((D, r) for D, (r, _) in solved.items())
        for D in _refine_deadlines(problem, fr_list, refine):
            fast_at(D)
        ds = sorted(solved)
    plans: list[Plan] = []
    fast_res = []
    for D in ds:
        try:
            m_d = pick(D)
            if m_d == "fast":
                fr, w = solved[D] if D in solved else (fast_at(D), solved[D][1])
                fast_res.append((D, fr))
                pl = make_plan(problem, fr.choice, D, method="fast", lower_bound_j=fr.lower_bound_j,
                               wall_s=w, proven=bound_proves(fr.lower_bound_j, fr.energy_j),
                               time_capped=fr.time_capped)
            else:
                pl = solve(problem, D, m_d, limit, _lp=lp)
        except InfeasibleError:
            continue
        if plans and plans[-1].energy_j < pl.energy_j:
            prev = plans[-1]
            pl = make_plan(problem, [t.option for t in prev.tasks], D, method=prev.method,
                           lower_bound_j=pl.lower_bound_j, wall_s=pl.wall_s,
                           proven=bound_proves(pl.lower_bound_j, prev.energy_j),
                           meta={"carried_from_s": prev.deadline_s},
                           time_capped=pl.time_capped or prev.time_capped)
        plans.append(pl)
    extra: tuple[tuple[float, float, float], ...] = ()
    extra_choices = None
    if dense and len(fast_res) >= 2 and switch_free:
        extra, extra_choices = _densify(problem, fast_res, DENSIFY_ORDERS)
    exact = bool(plans) and all(p.status == "optimal" for p in plans) and not extra
    used = sorted({p.method for p in plans})
    return ParetoCurve(problem.name, "+".join(used) or method, tuple(plans), time.perf_counter() - t0,
                       exact, extra, extra_choices, source=problem)


#: Share of a default curve's grid placed by :func:`_refine_deadlines` (measured on 8x32 1F1B
#: against lowtime: fewer deadlines where lowtime's plan beats our curve at equal total count).
REFINE_SHARE = 0.1


def _refine_deadlines(problem: Problem, fast_res, k: int) -> list[float]:
    """Midpoints of the ``k`` grid intervals where the curve (grid plans and the plans
    interpolated between them) lies furthest above the LP's tangent bounds."""
    if len(fast_res) < 2 or k <= 0:
        return []
    pts = _densify(problem, fast_res)[0]
    Ds = np.array([D for D, _ in fast_res])
    score = np.array([max(r.energy_j - r.lower_bound_j, 0.0) / r.energy_j for _, r in fast_res])
    score = np.maximum(score[:-1], score[1:])
    if pts:
        mk, e, b = (np.array(x) for x in zip(*pts))
        rel = (e - b) / e
        pos = np.clip(np.searchsorted(Ds, mk, side="right") - 1, 0, len(Ds) - 2)
        np.maximum.at(score, pos, rel)
    top = np.argsort(-score, kind="stable")[:k]
    return [float(0.5 * (Ds[i] + Ds[i + 1])) for i in sorted(top)]


def _reuse_previous(problem: Problem, prev, cur, D: float):
    """The previous (tighter-deadline) plan, relaxed into the extra time, when that beats the
    plan found at ``D``: consecutive grid plans then share structure."""
    ch = relax_repeatedly(problem, prev.choice, D)
    if not plan_meets_deadline(problem, ch, D):
        # relax_repeatedly can overshoot D when switches cost time (seen on the steady-state
        # workload_1f1b example): keep the plan found at D
        return cur
    e = problem.index.objective(ch)
    if e < cur.energy_j:
        return replace(cur, choice=ch, energy_j=float(e))      # the bound stays raw
    return cur


#: Orders in which the final :func:`_densify` of a curve switches tasks between neighbouring
#: grid plans (the start order: a prefix speeds up the schedule's early part as a whole;
#: measured on 8x32 1F1B vs lowtime: 3 -> 0 deadlines where lowtime is cheaper, mean saving
#: 0.37 -> 0.42 %). Placing refined deadlines uses the Δcost/Δtime order only.
DENSIFY_ORDERS: tuple[str, ...] = ("ratio", "start")


def _densify(problem: Problem, fast_res, orders: tuple[str, ...] = ("ratio",)
             ) -> tuple[tuple[tuple[float, float, float], ...], np.ndarray]:
    """Interpolated plans between consecutive grid plans (switching tasks in each of
    ``orders``, see :func:`interpolate`), non-dominated, with tangent bounds: their
    (makespan_s, energy_j, bound_j) and their choices (one row of option indices each, in
    the smallest integer type that holds them: a user gets each back as a Plan, see
    :meth:`ParetoCurve.plan_at`)."""
    tangents = np.array([(D, r.lp_bound_j, r.slope_j_per_s) for D, r in fast_res])
    ix = problem.index
    dtype = choice_dtype(problem)
    mks, es, chs = [], [], []
    for (_, a), (_, b) in zip(fast_res, fast_res[1:]):
        for order in orders:
            ch, mk, e = interpolate(problem, a.choice, b.choice, order=order)
            # what one pair's own plans dominate cannot survive the whole curve's filter below
            # (same order, same ties): dropping it here keeps the choices held small
            o = np.lexsort((e, mk))
            live = np.ones(len(e), dtype=bool)
            live[1:] = e[o][1:] < np.minimum.accumulate(e[o])[:-1]
            rows = np.sort(o[live])
            chs.append(ch[rows].astype(dtype))
            mks.append(mk[rows])
            es.append(e[rows])
    grid_mk = np.array([ix.makespan(r.choice) for _, r in fast_res])
    grid_e = np.array([r.energy_j for _, r in fast_res])
    mk = np.concatenate(mks + [grid_mk])
    e = np.concatenate(es + [grid_e])
    n_cand = len(mk) - len(grid_mk)
    is_grid = np.r_[np.zeros(n_cand, dtype=bool), np.ones(len(grid_mk), dtype=bool)]
    o = np.lexsort((~is_grid, e, mk))      # ties: the grid plan first, so it wins
    mk, e, is_grid = mk[o], e[o], is_grid[o]
    keep = np.ones(len(e), dtype=bool)
    keep[1:] = e[1:] < np.minimum.accumulate(e)[:-1]
    keep &= ~is_grid                       # grid plans are in ParetoCurve.plans already
    rows = o[keep]                         # candidates' row numbers (all < n_cand)
    mk, e = mk[keep], e[keep]
    choices = (np.concatenate(chs)[rows] if chs else np.zeros((0, ix.n), dtype=dtype))
    bound = np.max(tangents[:, 1][None, :] + tangents[:, 2][None, :] * (mk[:, None] - tangents[:, 0][None, :]),
                   axis=1)
    for x, b in zip(e, bound):
        check_bound(float(b), float(x), f"{problem.name}: interpolated plan")
    pts = tuple((float(m), float(x), float(b)) for m, x, b in zip(mk, e, bound))   # bounds raw
    return pts, choices
