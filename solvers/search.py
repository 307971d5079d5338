"""The switch-cost search of the fast method, budgeted in work units.

With switch costs, rounding alone leaves plans well above the bound. One search
(:func:`run_member`) takes the feasible starts (:func:`solvers.rounding.switch_starts`) and:

1. re-plans the first four path by path (:func:`solvers.held.polish`), each with a probe share
   of the work, goes on with the cheapest, then kicks it (:func:`solvers.held.iterated_polish`)
   with the rest (:func:`improve`);
2. where the plan has a steady middle (:mod:`solvers.hold`), spends part of the work on a
   hold start (every device's held clock moved at once, which path moves cannot do) and on a
   re-plan around a slower hold (:func:`replan_hold`), and goes on from the best of those
   (:func:`search`);
3. re-plans the best plan with wider DP caps in the final stages (:func:`final_polish`).

Every step spends work units (:class:`solvers.lns.Budget`), never seconds, so the same
problem and options give the same plan on any machine; the wall-clock safety net that comes
with the budget ends a search only when something is badly wrong, and the result says so.
All knobs come from :class:`solvers.options.SolveOptions` (``search``, ``hold``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .feasibility import plan_meets_deadline
from .held import iterated_polish, polish
from .hold import best_hold, held_problem, held_problem_values, replan_levels
from .hull_lp import HullLP
from .lagrangian import flow_from_duals
from .limits import NetFired
from .lns import Budget
from .model import Problem
from .options import SearchSettings, SolveOptions
from .repair import relax
from .rounding import switch_starts


def energy_if_meets(p: Problem, choice: np.ndarray, deadline_s: float) -> float:
    """The plan's energy in J, or inf when it misses the deadline."""
    return p.index.objective(choice) if plan_meets_deadline(p, choice, deadline_s) else math.inf


@dataclass(frozen=True)
class MemberRun:
    """What one search returned: its plan (``choice``), the work units it spent and whether
    its wall-clock safety net fired."""

    choice: np.ndarray
    work_units: float
    capped_by_time: bool


def run_member(p: Problem, plans: list[np.ndarray], deadline_s: float, work: float, cap_s: float,
               settings: SearchSettings, options: SolveOptions = SolveOptions()) -> MemberRun:
    """One search from the starts ``plans``: :func:`search` with ``work`` units, then
    :func:`final_polish` by each of ``options.search.final_stages`` with its share more, all
    times ``settings.work_share``; ``cap_s`` is the wall-clock safety net. Module level and
    deterministic under its work budget, so a worker process can run it
    (:mod:`solvers.workers`) and give the same plan."""
    stages = options.search.final_stages
    work = work * settings.work_share
    budget = Budget.of(work * (1 + options.search.final_shares()), cap_s)
    found = search(p, plans, deadline_s, budget.part(work), settings, options)
    for i, (caps, _) in enumerate(stages):
        later = work * options.search.final_shares(i + 1)     # kept for the stages after this one
        found = [final_polish(p, found, deadline_s, budget.part(budget.left - later), caps, options)]
    if len(found) > 1:                                        # no final stages: the cheapest that fits
        found = [found[int(np.argmin([energy_if_meets(p, c, deadline_s) for c in found]))]]
    return MemberRun(found[0], budget.used, budget.capped)


def final_polish(p: Problem, plans: list[np.ndarray], deadline_s: float, budget: Budget,
                 caps: tuple[int, int] | None = None,
                 options: SolveOptions = SolveOptions()) -> np.ndarray:
    """The cheapest of ``plans`` that meets the deadline, re-planned path by path
    (:func:`solvers.held.polish`) with DP caps ``caps`` (default: the first of
    ``options.search.final_stages``) until ``budget`` is spent or a whole cycle finds
    nothing; the cheapest plan itself when none meets the deadline."""
    caps = caps or options.search.final_stages[0][0]
    energies = [energy_if_meets(p, c, deadline_s) for c in plans]
    best = plans[int(np.argmin(energies))]
    if not np.isfinite(min(energies)):
        return best
    return polish(p, best, deadline_s, cap=caps[0], gcap=caps[1], budget=budget,
                  alphas=options.search.alphas)


def search(p: Problem, plans: list[np.ndarray], deadline_s: float, budget: Budget,
           settings: SearchSettings, options: SolveOptions = SolveOptions()) -> list[np.ndarray]:
    """:func:`improve` the starts; where the first has a hold start (a steady middle, see
    :mod:`solvers.hold`), only with ``1 − hold.share`` of the budget. Of the rest,
    ``hold.replan_share`` re-plans around a slower hold (:func:`replan_hold`, in
    ``hold.replan_window`` or else the best hold start's window), and the remainder goes on
    from the re-plan, the hold start (which moves every device's held clock at once; the
    path-by-path search cannot) and the plan. Short schedules with nothing to hold keep the
    whole budget for one search. ``settings``: the DP caps and kick seed. Returns the plans,
    best first."""
    hold = options.hold
    # (holds are work outside the units: skipped once the safety net has fired)
    if _out_of_time(budget) or best_hold(p, plans[0], deadline_s, hold) is None:
        return improve(p, plans, deadline_s, budget, settings, options)
    plans = improve(p, plans, deadline_s, budget.part((1 - hold.share) * budget.left), settings, options)
    found = None if _out_of_time(budget) else best_hold(p, plans[0], deadline_s, hold)
    if found is None:
        return [iterated_polish(p, plans[0], deadline_s, seed=settings.seed, budget=budget,
                                caps=settings.caps)] + plans
    held, window = found
    part = budget.part(hold.replan_share * budget.left)
    replanned = None
    for w in dict.fromkeys((hold.replan_window, window)):   # a window with nothing to re-plan spends nothing
        replanned = replan_hold(p, plans[0], deadline_s, w, part, settings, options)
        if replanned is not None:
            break
    starts = ([replanned] if replanned is not None else []) + [held, plans[0]]
    return improve(p, starts, deadline_s, budget, settings, options) + plans


def _out_of_time(budget: Budget) -> bool:
    """Whether ``budget``'s wall-clock safety net has passed (then it is marked capped)."""
    return budget.seconds_left() <= 0 and budget.done()


def replan_hold(p: Problem, choice: np.ndarray, deadline_s: float, window: tuple[float, float],
                budget: Budget, settings: SearchSettings,
                options: SolveOptions = SolveOptions()) -> np.ndarray | None:
    """Hold every device with switch costs at one level through ``window`` of ``choice``'s
    schedule, possibly slower than fits its ramps, and plan everything else again around it:
    the held tasks keep one option each, and the rest gets the hull LP, the feasible starts
    and the search (``budget``), as a problem of its own. The level is the one whose held
    problem has the smallest hull-LP value among :func:`solvers.hold.replan_levels`. A
    slower steady state costs makespan the ramps must win back, which the plan's own hold
    start cannot do (it keeps the ramps). Returns the re-plan (a choice for ``p``), or None,
    spending nothing, when even the best held problem's LP (a lower bound on its plans) is
    no cheaper than ``choice``, or no level gives a plan that meets the deadline."""
    cores, levels = replan_levels(p, choice, deadline_s, window, options.hold)
    if not levels:
        return None
    # one LP for every level: the held problems differ only in the held tasks' one option
    lp = HullLP(held_problem(p, cores, levels[0]).problem,
                process_min_tasks=options.limits.lp_process_min_tasks)
    try:
        return _replan_hold(p, choice, deadline_s, budget, settings, options, cores, levels, lp)
    except NetFired:                            # the call's safety net: no re-plan
        return None
    finally:
        lp.close()


def _replan_hold(p: Problem, choice: np.ndarray, deadline_s: float, budget: Budget,
                 settings: SearchSettings, options: SolveOptions, cores, levels,
                 lp: HullLP) -> np.ndarray | None:
    """:func:`replan_hold` with its levels and their LP."""
    ix = p.index
    now = 0                                     # the level lp describes

    def set_level(i: int) -> None:
        nonlocal now
        if i != now:
            lp.set_single_options({v: (ix.time[v][k], ix.cost[v][k])
                                   for v, k in held_problem_values(p, cores, levels[i]).items()})
            now = i

    best_v, pick = math.inf, -1
    for i in range(len(levels)):
        set_level(i)
        try:
            v = lp.solve(deadline_s).bound_j
        except RuntimeError:                    # infeasible: too slow, so are the slower ones
            break
        if v < best_v:
            best_v, pick = v, i
    if pick < 0 or best_v >= ix.objective(choice):
        return None                             # no held problem can beat the plan: its LP says so
    set_level(pick)
    best = held_problem(p, cores, levels[pick])
    q = best.problem                            # lp now describes q: same rows and columns
    res = lp.solve(deadline_s)
    fl = flow_from_duals(q, lp, res.duals, deadline_s)
    starts = switch_starts(q, fl, res, deadline_s, [res.makespan_s, deadline_s])
    if not starts:
        return None
    out = [best.expand(c) for c in improve(q, starts, deadline_s, budget, settings, options)]
    ok = [c for c in out if plan_meets_deadline(p, c, deadline_s)]
    return min(ok, key=ix.objective) if ok else None


def improve(p: Problem, plans: list[np.ndarray], deadline_s: float, budget: Budget,
            settings: SearchSettings, options: SolveOptions = SolveOptions()) -> list[np.ndarray]:
    """Re-plan the first four starts path by path (:func:`solvers.held.polish`) with
    ``search.probe_share`` of the budget each, go on with the better one until it settles or
    half of what is left is spent, then kick it (:func:`solvers.held.iterated_polish`) with the
    rest; also try :func:`solvers.repair.relax` on the result. Returns the improved plans
    (best first) and the other starts."""
    ix = p.index
    work = budget.left
    cap, gcap = settings.caps
    alphas = options.search.alphas
    probes = [polish(p, ch, deadline_s, cap=cap, gcap=gcap, alphas=alphas,
                     budget=budget.part(options.search.probe_share * work))
              for ch in plans[:4]]
    best = min(probes, key=ix.objective)
    best = polish(p, best, deadline_s, cap=cap, gcap=gcap, alphas=alphas,
                  budget=budget.part(budget.left / 2))
    if not budget.done():
        best = iterated_polish(p, best, deadline_s, seed=settings.seed, budget=budget, caps=settings.caps)
    relaxed = relax(p, best, deadline_s)
    return [best, relaxed] + probes + plans
