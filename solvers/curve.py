"""Energy-vs-deadline curves: plans on a grid of deadlines, and interpolated plans between them.

:func:`pareto` solves a grid of deadlines (quadratically spaced from the fastest makespan to
the unconstrained optimum's), carries a cheaper plan forward to later deadlines, and, with
the fast method and no switch costs, fills the curve between grid plans with interpolated
plans (:func:`interpolate`: tasks switched one by one from the slower plan's option to the
faster one's), each bounded by the LP's tangents. Every point comes back as a Plan
(``ParetoCurve.plan_at``). With switch costs the grid points share one plan's search budget.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from frontier.errors import InputError

from .dp import chain_order
from .fast import polish_budget, solve_fast
from .feasibility import bound_proves, check_bound
from .hull_lp import HullLP
from .ilp import allowed_options
from .limits import check_points, check_problem
from .model import InfeasibleError, Problem
from .options import SolveOptions
from .plan import ParetoCurve, Plan, choice_dtype, make_plan
from .repair import relax_repeatedly
from .solve import pick_method, solve


def free_makespan_s(p: Problem) -> float:
    """An upper bound on any useful deadline: all tasks at their slowest option, in series."""
    ix = p.index
    tau = sum(float(m.max()) for m in ix.tau + ix.wrap_tau if m is not None)   # wraps too
    return float(sum(t.max() for t in ix.time) + tau)


def pareto(problem: Problem, deadlines: Sequence[float | str] | None = None, n_points: int = 20,
           method: str = "auto", time_limit_s: float | None = None, dense: bool = True, *,
           options: SolveOptions | None = None) -> ParetoCurve:
    """Energy-vs-deadline curve: a plan at each deadline (a grid from the fastest makespan to the
    makespan of the unconstrained optimum when ``deadlines`` is None), each with its gap.

    A plan found at a smaller deadline also meets a larger one, so the curve is made
    non-increasing by carrying the better plan forward. With the fast method and no switch
    costs (``dense``), plans interpolated between neighbouring grid plans fill the curve
    in between (``ParetoCurve.dense``), each bounded by the LP's tangents and keeping its
    choice (``ParetoCurve.dense_choices``): every point the curve reports comes back as a
    Plan (``curve.plan_at(deadline)``, ``curve.point_plan(i)``). With switch costs
    the fast method's search (:func:`solvers.fast.polish_budget`) is shared by the grid
    points, but each point still solves its own LP, bound and rounding: a 20-point curve
    measured 4-7x one plan's time with 1 ms switches, 7-13x without (the interpolated plans),
    on 512-2,048 tasks (``experiments/bench_curve_cost.py``). ``auto`` gives a curve's points
    the MILP only without switch costs and up to ``options.ilp.curve_max_binaries`` binaries
    (the fast method otherwise: a curve is a map, and the point a user picks is re-planned
    exactly by :func:`solvers.solve.solve`). ``time_limit_s`` is only
    the wall-clock safety net of each point (default ``options.ilp.curve_safety_net_s`` for
    MILP points, :func:`solvers.fast.safety_net_s` for fast ones); a point it cut short says
    so (``Plan.time_capped``, and ``ParetoCurve.time_capped`` for the curve). A MILP point's
    work is ``options.ilp.curve_node_binaries``. ``options``: as for
    :func:`solvers.solve.solve` (``options.curve`` for the interpolation); a problem over
    ``options.limits`` (tasks, options, ``max_curve_points`` deadlines) raises
    :class:`~solvers.model.ProblemTooLargeError` before anything is solved.
    """
    options = options or SolveOptions()
    check_problem(problem, options.limits)
    check_points(int(n_points) if deadlines is None else len(deadlines), options.limits.max_curve_points)
    t0 = time.perf_counter()
    lp = None
    chain = chain_order(problem, options.dp) is not None
    if method in ("fast", "ilp") or (method == "auto" and not chain):
        lp = HullLP(problem, process_min_tasks=options.limits.lp_process_min_tasks)
    try:
        return _pareto(problem, deadlines, n_points, method, time_limit_s, dense, options, lp, t0)
    finally:
        if lp is not None:
            lp.close()              # its child process, if it has one


def _pareto(problem: Problem, deadlines, n_points: int, method: str, time_limit_s: float | None,
            dense: bool, options: SolveOptions, lp: HullLP | None, t0: float) -> ParetoCurve:
    """:func:`pareto` once its limits are checked, with its hull LP."""
    fm = problem.fastest_makespan_s()
    limit = options.ilp.curve_safety_net_s if time_limit_s is None else time_limit_s
    # a curve's MILP points get the curve's node budget (its work), per point
    point_options = replace(options, ilp=replace(options.ilp, node_binaries=options.ilp.curve_node_binaries))

    def pick(D: float) -> str:
        if method != "auto":
            return method
        m = pick_method(problem, D, options)
        # A curve solves many deadlines: the MILP only where it is small enough to finish
        # fast, and never with switch costs: on the bundled 4x8 workload a switch-cost MILP
        # point took ~20 s (a 20-point curve 7 min, loaded) where the fast method's whole curve
        # took 8 s, within 0.9 % of the MILP's energies, under the ~1 % energy is measured to.
        # A point chosen from the curve is re-planned exactly by `ecal plan --deadline D`.
        if m == "ilp" and (problem.has_transitions or sum(len(a) for a in allowed_options(problem, D))
                           > options.ilp.curve_max_binaries):
            return "fast"
        return m

    if deadlines is None:
        free = free_makespan_s(problem)
        m_free = pick(free)
        if m_free == "fast":
            # only its makespan is used: no search (a plan there would take a full budget)
            hi = max(problem.index.makespan(solve_fast(problem, free, lp, search_work=0.0,
                                                       options=options).choice), fm)
        else:
            hi = max(solve(problem, free, m_free, limit, options=point_options, _lp=lp).makespan_s, fm)
        # Quadratic spacing: the curve is steepest near the fastest makespan, so put more
        # deadlines there (measured: fewer points where a denser curve would be cheaper).
        u = np.linspace(0.0, 1.0, max(int(n_points), 2))
        ds = list(fm + (hi - fm) * u**1.5) if hi > fm else [fm]
    else:
        ds = sorted(problem.deadline_s(d) for d in deadlines)
    # Interpolated plans price options without switch costs, and a plan with switch costs
    # (time or energy) needs the search: one test decides both.
    switch_free = not problem.has_transitions
    solved: dict[float, tuple[object, float]] = {}

    def fast_at(D: float):
        """(the fast result at D, its wall time in s), solved once per deadline."""
        if D in solved:
            return solved[D]
        t1 = time.perf_counter()
        # With switch costs the whole curve gets one single plan's search (work), shared by its
        # points, and one search per point (no portfolio: that would double the curve's time).
        search = 0.0 if switch_free else polish_budget(problem.n_tasks, options=options)[0] / max(len(ds), 1)
        fr = solve_fast(problem, D, lp, search_work=search, time_limit_s=time_limit_s,
                        surrogate_bound=False, portfolio=False, options=options)
        below = [d for d in solved if d < D]
        if below:
            fr = _reuse_previous(problem, solved[max(below)][0], fr, D)
        solved[D] = (fr, time.perf_counter() - t1)
        return solved[D]

    plans: list[Plan] = []
    fast_res = []
    for D in ds:
        try:
            m_d = pick(D)
            if m_d == "fast":
                fr, w = fast_at(D)
                fast_res.append((D, fr))
                pl = make_plan(problem, fr.choice, D, method="fast", lower_bound_j=fr.lower_bound_j,
                               wall_s=w, proven=bound_proves(fr.lower_bound_j, fr.energy_j),
                               time_capped=fr.time_capped)
            else:
                pl = solve(problem, D, m_d, limit, options=point_options, _lp=lp)
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
        extra, extra_choices = _densify(problem, fast_res, options.curve.densify_orders,
                                        options.limits.max_dense_cells)
    exact = bool(plans) and all(p.status == "optimal" for p in plans) and not extra
    used = sorted({p.method for p in plans})
    return ParetoCurve(problem.name, "+".join(used) or method, tuple(plans), time.perf_counter() - t0,
                       exact, extra, extra_choices, source=problem)


def _rows_of(parts, rows: np.ndarray, n: int, dtype) -> np.ndarray:
    """The choices of candidate ``rows`` (numbered over all pairs' kept prefixes, in order),
    built only for those rows."""
    out = np.zeros((len(rows), n), dtype=dtype)
    if not len(rows):
        return out
    first = 0
    for slow, fast, diff, kept in parts:
        hit = np.flatnonzero((rows >= first) & (rows < first + len(kept)))
        if hit.size:
            out[hit] = _prefix_rows(slow, fast, diff, kept[rows[hit] - first], dtype)
        first += len(kept)
    return out


def _reuse_previous(problem: Problem, prev, cur, D: float):
    """The previous (tighter-deadline) plan, relaxed into the extra time, when that beats the
    plan found at ``D``: consecutive grid plans then share structure."""
    ch = relax_repeatedly(problem, prev.choice, D)     # meets D: prev meets a tighter deadline
    e = problem.index.objective(ch)
    if e < cur.energy_j:
        return replace(cur, choice=ch, energy_j=float(e))      # the bound stays raw
    return cur


def _densify(problem: Problem, fast_res, orders: tuple[str, ...] = ("ratio",),
             max_cells: int = 1 << 27) -> tuple[tuple[tuple[float, float, float], ...], np.ndarray]:
    """Interpolated plans between consecutive grid plans (switching tasks in each of
    ``orders``, see :func:`interpolate`), non-dominated, with tangent bounds: their
    (makespan_s, energy_j, bound_j) and their choices (one row of option indices each, in
    the smallest integer type that holds them: a user gets each back as a Plan, see
    :meth:`ParetoCurve.plan_at`). Prefixes are evaluated in blocks of at most ``max_cells``
    (prefix × task) cells, and when more than ``max_cells`` choice cells would be kept, the
    points kept are thinned evenly to fit (never below the curve's grid plans)."""
    tangents = np.array([(D, r.lp_bound_j, r.slope_j_per_s) for D, r in fast_res])
    ix = problem.index
    dtype = choice_dtype(problem)
    mks, es, chs = [], [], []
    for (_, a), (_, b) in zip(fast_res, fast_res[1:]):
        for order in orders:
            diff, mk, e = _prefixes(problem, a.choice, b.choice, order, max_cells)
            # what one pair's own plans dominate cannot survive the whole curve's filter below
            # (same order, same ties): dropping it here keeps the choices held small
            o = np.lexsort((e, mk))
            live = np.ones(len(e), dtype=bool)
            live[1:] = e[o][1:] < np.minimum.accumulate(e[o])[:-1]
            rows = np.sort(o[live])
            chs.append((b.choice, a.choice, diff, rows))
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
    most = max(int(max_cells) // max(ix.n, 1), 1)
    if len(rows) > most:                   # too many cells to keep: thin evenly, in order
        pick = np.unique(np.linspace(0, len(rows) - 1, most).round().astype(int))
        rows, mk, e = rows[pick], mk[pick], e[pick]
    choices = _rows_of(chs, rows, ix.n, dtype)
    bound = np.max(tangents[:, 1][None, :] + tangents[:, 2][None, :] * (mk[:, None] - tangents[:, 0][None, :]),
                   axis=1)
    for x, b in zip(e, bound):
        check_bound(float(b), float(x), f"{problem.name}: interpolated plan")
    pts = tuple((float(m), float(x), float(b)) for m, x, b in zip(mk, e, bound))   # bounds raw
    return pts, choices


def interpolate(p: Problem, fast: np.ndarray, slow: np.ndarray,
                order: str = "ratio") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Plans between two plans, switch costs not counted (callers use it only without them):
    starting from ``slow``, switch the tasks that differ to their ``fast`` option in order of
    Δcost/Δtime (``order="ratio"``) or of their start in ``slow``'s schedule (``"start"``);
    returns (choices [k × n], makespans, energies) of every prefix, evaluated in one batch."""
    diff, mk, e = _prefixes(p, fast, slow, order)
    return _prefix_rows(slow, fast, diff, np.arange(len(mk))), mk, e


def _prefix_rows(slow: np.ndarray, fast: np.ndarray, diff: np.ndarray, rows: np.ndarray,
                 dtype=None) -> np.ndarray:
    """The choices of prefixes ``rows`` (row j: the first j tasks of ``diff`` switched from
    ``slow`` to ``fast``), without building the others."""
    rows = np.asarray(rows, dtype=int)
    ch = np.tile(np.asarray(slow, dtype=dtype) if dtype is not None else slow, (len(rows), 1))
    if diff.size:
        later = rows[:, None] > np.arange(diff.size)[None, :]
        ch[:, diff] = np.where(later, fast[diff], slow[diff])
    return ch


def _prefixes(p: Problem, fast: np.ndarray, slow: np.ndarray, order: str,
              max_cells: int = 1 << 27) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the differing tasks in switch order, makespans, energies) of every prefix from
    ``slow`` toward ``fast`` (see :func:`interpolate`), evaluated in blocks of at most about
    ``max_cells`` (prefix × task) durations, so memory stays bounded on large problems."""
    ix = p.index
    diff = np.flatnonzero(fast != slow)
    if diff.size == 0:
        return diff, np.array([ix.makespan(slow)]), np.array([ix.objective(slow)])
    if order == "start":
        key = ix.schedule(slow)[0][diff]
    elif order == "ratio":
        dt = np.array([ix.time[v][slow[v]] - ix.time[v][fast[v]] for v in diff])
        dc = np.array([ix.cost[v][fast[v]] - ix.cost[v][slow[v]] for v in diff])
        key = np.where(dt > 0, dc / np.where(dt > 0, dt, 1.0), np.inf)
    else:
        raise InputError(f"unknown order {order!r}")
    diff = diff[np.argsort(key, kind="stable")]
    k = diff.size + 1
    base = ix.durations(slow)
    t_fast = np.array([ix.time[v][fast[v]] for v in diff])
    t_slow = base[diff]
    c_slow = np.array([ix.cost[v][slow[v]] for v in range(ix.n)])
    step = np.array([ix.cost[v][fast[v]] for v in diff]) - c_slow[diff]
    cost = float(c_slow.sum()) + np.r_[0.0, np.cumsum(step)]
    block = max(1, int(max_cells) // max(ix.n, 1))
    mk = np.empty(k)
    for r0 in range(0, k, block):
        r = np.arange(r0, min(k, r0 + block))
        dur = np.tile(base, (len(r), 1))
        dur[:, diff] = np.where(r[:, None] > np.arange(diff.size)[None, :], t_fast, t_slow)
        mk[r] = ix.batch_makespan(dur)
    return diff, mk, ix.p_total * mk + cost
