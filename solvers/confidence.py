"""A deadline kept with a stated confidence (issue 29).

A plan's makespan T is a prediction with a propagated standard deviation σ_T: the algebra's σ
over the measured leaves behind the chosen options (:func:`solvers.plan.make_plan`). A plan
made for a deadline D sits at or just under D, so on its own σ it meets D with a probability
of about one half. At confidence P the plan must satisfy

    T + z_P·σ_T ≤ D        (z_P = Φ⁻¹(P): 1.645 at 0.95; P = 0.5: the makespan alone)

and every plan states P(T ≤ D) = Φ((D − T)/σ_T) (σ_T = 0: 1 when T meets D, else 0).

σ_T depends on the choice, so this is not a constraint the solvers take directly.
:func:`solve_at_confidence` wraps :func:`solvers.solve.solve`: solve at D; while the plan has
T + z·σ_T > D, solve again at the tightened deadline D' = D − z·σ_T of the last plan (each
round's D' is below the one before: a plan that failed at D'_k has T ≤ D'_k, so its σ_T is
larger than the previous plan's) until a plan satisfies it; then a few bisection steps between
that deadline and the last one that failed keep the plan of least energy that satisfies it
(:data:`REFINE_STEPS`). When a round is infeasible or the rounds run out, the fastest plan is
tried, then deadlines between it and the last failing D' by bisection; when even the fastest
plan fails, no plan meets D at P and :class:`~solvers.model.InfeasibleError` says by how much.

What is exact, and for what: the plan returned is the method's plan for the tightened
deadline D' (its ``deadline_s``), so its bound, gap and ``optimal`` certify least energy
subject to T ≤ D', not subject to T + z·σ_T ≤ D. The two constraints are the same when σ_T is
the same for every plan that meets D' (one option per task, or one σ for every option on the
critical path); otherwise the tightening is conservative: a plan with a smaller σ_T may meet D
at confidence with a makespan above D' and is not searched. ``meta["confidence"]`` records D,
P, z, D' and every round.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from statistics import NormalDist
from typing import Any

from frontier.errors import InputError

from .calibration import Calibration, combined_sd
from .feasibility import meets_deadline, p_meets
from .model import InfeasibleError, Problem
from .plan import Plan, format_probability

#: The default confidence of ``ecal plan`` and ``ecal pareto``.
DEFAULT_CONFIDENCE = 0.95
#: Tightening rounds before the fallback (fastest plan, then bisection) is tried.
MAX_ROUNDS = 8
#: Bisection steps of the fallback between the fastest plan and the last failing deadline.
BISECT_STEPS = 8
#: Bisection steps between the first tightened deadline that keeps D and the last that did
#: not, keeping the plan of least energy that keeps D; each is one more solve. Against brute
#: force on 53 random 2-GPU DAGs of 2-4 tasks at 0.95 (tests/test_deadline_kept.py's
#: instances), the excess over the constrained optimum: 0 steps max 5.2 %, mean 0.43 %
#: (7 of 53 worse); 2 steps max 3.6 %, mean 0.07 % (1 worse); 4 steps max 2.2 %, mean 0.04 %.
REFINE_STEPS = 2


def z_of(confidence: float) -> float:
    """z_P = Φ⁻¹(P) of the standard normal; P must be in [0.5, 1)."""
    p = float(confidence)
    if not (0.5 <= p < 1.0) or math.isnan(p):
        raise InputError(f"confidence must be in [0.5, 1), got {confidence!r}")
    return 0.0 if p == 0.5 else NormalDist().inv_cdf(p)


def holds(plan: Plan, deadline_s: float, z: float, calibration: Calibration | None = None) -> bool:
    """Whether ``plan``'s makespan + z·σ_T meets ``deadline_s``; with a ``calibration``, its
    calibrated makespan T + b_T + z·sqrt(σ_T² + σ_b²) (:mod:`solvers.calibration`)."""
    b = calibration.step if calibration is not None else None
    t, sd = plan.in_context_makespan_s          # in its entry context, if composed with one
    if b is None:
        return meets_deadline(t + z * sd, deadline_s)
    return meets_deadline(t + b.time_s + z * combined_sd(sd, b.sd_time_s), deadline_s)


def keep_deadline(plan_at: Callable[[float], Plan], deadline_s: float, confidence: float, *,
                  fastest_s: float, name: str = "problem", max_rounds: int = MAX_ROUNDS,
                  calibration: Calibration | None = None) -> Plan:
    """The first plan ``plan_at(D')`` gives, over tightening D', whose makespan + z·σ_T meets
    ``deadline_s`` (see the module docstring). ``plan_at`` makes a plan meeting D' or raises
    :class:`InfeasibleError`; ``fastest_s`` is the problem's fastest makespan (the fallback's
    deadline). The plan comes back with ``meta["confidence"]`` and the rounds' total wall
    time; raises :class:`InfeasibleError` when no plan tried meets ``deadline_s`` at
    ``confidence``. With a ``calibration`` (measured offsets, :mod:`solvers.calibration`) the
    calibrated makespan must meet it, the first D' is ``deadline_s`` less the measured
    makespan offset, and the plan records the calibration in ``meta["calibration"]``."""
    z = z_of(confidence)
    D = float(deadline_s)
    cal = calibration if calibration is not None and not calibration.is_null else None
    b, sd_b = (cal.step.time_s, cal.step.sd_time_s) if cal is not None else (0.0, 0.0)
    rounds: list[dict[str, float]] = []

    def attempt(d: float) -> Plan | None:
        try:
            p = plan_at(d)
        except InfeasibleError:
            rounds.append({"deadline_s": d, "infeasible": True})
            return None
        t, sd = p.in_context_makespan_s
        rounds.append({"deadline_s": d, "makespan_s": t,
                       "sd_makespan_s": sd, "energy_j": p.energy_j, "wall_s": p.wall_s})
        return p

    d = D - b
    plan = attempt(d)
    if plan is None:      # D (less the measured offset) is infeasible
        return _infeasible(name, D, confidence, z, None, fastest_s, cal)
    failed_at = d
    while True:
        if holds(plan, D, z, cal):
            if failed_at > d:     # tightened: a deadline between may keep D with less energy
                plan, d = _refine(attempt, plan, d, failed_at, D, z, cal=cal)
            return _done(plan, D, confidence, z, d, rounds, cal)
        failed_at = d
        # plan has T <= d, so D - b - z·σ <= d - (T + b + z·σ - D) < d: strictly tighter;
        # in context the plan takes its context delay (T_ctx - T) longer as well
        t_ctx, sd_ctx = plan.in_context_makespan_s
        nxt = D - b - z * combined_sd(sd_ctx, sd_b) - max(t_ctx - plan.makespan_s, 0.0)
        if len(rounds) > max_rounds or not nxt < d or not meets_deadline(fastest_s, nxt):
            break
        d = nxt
        plan = attempt(d)
        if plan is None:
            break
    # fallback: the fastest plan, then the largest deadline between it and the last failure
    fast = attempt(fastest_s)
    if fast is None or not holds(fast, D, z, cal):
        return _infeasible(name, D, confidence, z, fast, fastest_s, cal)
    best, best_d = _refine(attempt, fast, fastest_s, failed_at, D, z, BISECT_STEPS, cal)
    return _done(best, D, confidence, z, best_d, rounds, cal)


def _refine(attempt: Callable[[float], Plan | None], plan: Plan, ok_s: float, failed_s: float,
            D: float, z: float, steps: int | None = None, cal: Calibration | None = None
            ) -> tuple[Plan, float]:
    """Bisect between a deadline whose plan keeps D at confidence (``ok_s``) and a looser one
    whose plan did not (``failed_s``): the plan of least energy that keeps D, and its deadline."""
    best, best_d = plan, ok_s
    lo, hi = ok_s, failed_s
    for _ in range(REFINE_STEPS if steps is None else steps):
        mid = 0.5 * (lo + hi)
        p = attempt(mid)
        if p is not None and holds(p, D, z, cal):
            lo = mid
            if p.energy_j < best.energy_j:
                best, best_d = p, mid
        else:
            hi = mid
    return best, best_d


def _done(plan: Plan, D: float, confidence: float, z: float, solved_s: float,
          rounds: list[dict[str, float]], cal: Calibration | None = None) -> Plan:
    meta = dict(plan.meta)
    if cal is not None:
        meta["calibration"] = cal.to_dict()
    else:
        meta.pop("calibration", None)
    info = {"confidence": float(confidence), "z": z, "deadline_s": D, "solved_deadline_s": solved_s,
            "p_meets_deadline": _p_meets(plan, D, cal),
            "exact_for": "the solved (tightened) deadline: makespan <= solved_deadline_s",
            "rounds": rounds}
    meta["confidence"] = info
    # wall time: every round's method together (a curve's points took none)
    return dataclasses.replace(plan, wall_s=float(sum(r.get("wall_s", 0.0) for r in rounds)),
                               meta=meta)


def _p_meets(plan: Plan, D: float, cal: Calibration | None) -> float:
    """P(the plan's makespan, in its entry context and offset by ``cal``, meets ``D``)."""
    b, sd_b = (cal.step.time_s, cal.step.sd_time_s) if cal is not None else (0.0, 0.0)
    t, sd = plan.in_context_makespan_s
    return p_meets(D - b, t, combined_sd(sd, sd_b))


def recalibrated(plan: Plan, cal: Calibration, measured_on: str) -> Plan:
    """``plan`` recording ``cal`` instead of the calibration it was solved with: its
    ``meta["calibration"]`` and ``meta["confidence"]["p_meets_deadline"]`` (at the recorded
    deadline) come from ``cal``, and ``meta["confidence"]["calibration_measured_on"]`` says
    where ``cal`` was measured. The plan's choices are unchanged. ``ecal tune`` uses it to
    give the plan it writes the offsets measured on its own runs: the offset moves with the
    plan, so the plan's own runs predict its next run better than the earlier plans did."""
    meta = dict(plan.meta)
    info = dict(meta.get("confidence") or {})
    if cal.is_null:
        meta.pop("calibration", None)
    else:
        meta["calibration"] = cal.to_dict()
    D = info.get("deadline_s", plan.target_deadline_s)
    if D is not None:
        info["p_meets_deadline"] = _p_meets(plan, float(D), cal)
    info["calibration_measured_on"] = measured_on
    meta["confidence"] = info
    return dataclasses.replace(plan, meta=meta)


def _infeasible(name: str, D: float, confidence: float, z: float, fast: Plan | None,
                fastest_s: float, cal: Calibration | None = None) -> Plan:
    b, sd_b = (cal.step.time_s, cal.step.sd_time_s) if cal is not None else (0.0, 0.0)
    measured = (f" with the makespan offset measured on {cal.runs} run(s), "
                f"{b * 1e3:+.3f} ± {sd_b * 1e3:.3f} ms" if cal is not None else "")
    if fast is None:
        raise InfeasibleError(f"{name}: no plan meets {D * 1e3:.3f} ms at confidence {confidence:g}"
                              f"{measured}; the fastest makespan is {fastest_s * 1e3:.3f} ms", fastest_s)
    t_fast, sd_fast = fast.in_context_makespan_s
    need = t_fast + b + z * combined_sd(sd_fast, sd_b)
    raise InfeasibleError(
        f"{name}: no plan meets {D * 1e3:.3f} ms at confidence {confidence:g}{measured}; the "
        f"fastest plan's makespan is {t_fast * 1e3:.3f} ± {sd_fast * 1e3:.3f} ms"
        f"{' in its entry context' if fast.context is not None else ''} "
        f"(needs {need * 1e3:.3f} ms at z = {z:.3f})",
        fast.makespan_s)


def solve_at_confidence(problem: Problem, deadline: float | str,
                        confidence: float = DEFAULT_CONFIDENCE, method: str = "auto",
                        time_limit_s: float | None = None, *, options: Any = None,
                        max_rounds: int = MAX_ROUNDS, calibration: Calibration | None = None,
                        context: Any = None) -> Plan:
    """The least-energy plan :func:`solvers.solve.solve` finds whose makespan + z_P·σ_T meets
    ``deadline`` (seconds or ``"1.05x"``) at ``confidence`` P (module docstring). Each round
    is one ``solve`` call with ``method``, ``time_limit_s`` and ``options``. The plan's
    ``deadline_s`` is the deadline its method solved (D', at most ``deadline``); its
    ``target_deadline_s`` and ``meta["confidence"]`` say the rest. ``calibration``: offsets
    measured on a run of this workload (``ecal tune``), see :func:`keep_deadline`.
    ``context`` (a :class:`solvers.context.PlanContext`): every plan tried is composed with
    its entry context (:func:`solvers.context.with_context`) and must keep the deadline
    there; the method solves the null-context problem at a deadline tightened by what the
    context adds (the search over that deadline is this function's)."""
    from .solve import solve

    D = problem.deadline_s(deadline)
    problem.check_feasible(D)

    def plan_at(d: float) -> Plan:
        plan = solve(problem, d, method, time_limit_s, options=options)
        if context is None:
            return plan
        from .context import with_context

        return with_context(plan, problem, context)

    return keep_deadline(plan_at,
                         D, confidence, fastest_s=problem.fastest_makespan_s(), name=problem.name,
                         max_rounds=max_rounds, calibration=calibration)


def curve_rows(curve: Any, confidence: float) -> list[dict[str, float]]:
    """Per grid plan of a curve: its deadline, makespan ± σ_T, the deadline it meets at
    ``confidence`` (makespan + z·σ_T) and P(makespan ≤ its deadline)."""
    z = z_of(confidence)
    return [{"deadline_s": p.deadline_s, "makespan_s": p.makespan_s, "sd_makespan_s": p.sd_makespan_s,
             "deadline_at_confidence_s": p.makespan_s + z * p.sd_makespan_s,
             "p_meets_deadline": p.p_meets_deadline, "energy_j": p.energy_j} for p in curve.plans]


def curve_lines(curve: Any, confidence: float, max_rows: int = 12) -> list[str]:
    """The curve's grid plans with σ_T, the deadline each meets at ``confidence`` and P."""
    rows = curve_rows(curve, confidence)
    n = len(rows)
    if not n:
        return []
    import numpy as np

    idx = sorted(set(np.linspace(0, n - 1, min(n, max_rows)).round().astype(int)))
    out = [f"  at confidence {confidence:g} (z {z_of(confidence):.3f}): the deadline each plan meets "
           "is makespan + z·σ_T",
           f"  {'makespan ms':>12} {'σ_T ms':>8} {'meets ms':>12} {'P(<=deadline)':>14}"]
    for i in idx:
        r = rows[i]
        out.append(f"  {r['makespan_s'] * 1e3:12.3f} {r['sd_makespan_s'] * 1e3:8.3f} "
                   f"{r['deadline_at_confidence_s'] * 1e3:12.3f} {format_probability(r['p_meets_deadline'], r['sd_makespan_s']):>14}")
    return out


__all__ = ["DEFAULT_CONFIDENCE", "z_of", "holds", "keep_deadline", "solve_at_confidence", "recalibrated",
           "curve_rows", "curve_lines"]
