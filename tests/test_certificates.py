"""Honest certificates (issue 22): one feasibility predicate, raw bounds, and a bound above a
feasible plan's energy is an internal error, never "optimal, gap 0"."""

from __future__ import annotations

import numpy as np
import pytest
from test_dp_switch_kinds import _chain

from solvers import CertificateError, ConstantTransition, Plan, meets_deadline, solve
from solvers.feasibility import (
    BOUND_REL_TOL,
    DEADLINE_REL_TOL,
    check_bound,
    latest_makespan_s,
    plan_meets_deadline,
)
from solvers.ilp import available_solvers
from solvers.plan import make_plan


def _problem(seed: int = 0):
    return _chain(np.random.default_rng(seed), ConstantTransition(0.1, 1.0))


def test_the_feasibility_predicate_and_its_tolerance():
    D = 2.0
    assert meets_deadline(D, D) and meets_deadline(D * (1 + DEADLINE_REL_TOL), D)
    assert not meets_deadline(D * (1 + 2 * DEADLINE_REL_TOL), D)
    assert latest_makespan_s(D) == D * (1 + DEADLINE_REL_TOL)
    p = _problem()
    fast = p.index.fastest_choice()
    assert plan_meets_deadline(p, fast, p.fastest_makespan_s())


@pytest.mark.parametrize("method", ["dp", "fast", "ilp", "brute"])
def test_every_method_accepts_a_deadline_within_the_tolerance_below_the_fastest(method):
    p = _problem(1)
    D = p.fastest_makespan_s() * (1 - 0.5 * DEADLINE_REL_TOL)
    plan = solve(p, D, method=method)
    assert meets_deadline(plan.makespan_s, D) and plan.lower_bound_j <= plan.energy_j * (1 + 1e-9)
    with pytest.raises(Exception, match="below the fastest"):
        solve(p, p.fastest_makespan_s() * (1 - 3 * DEADLINE_REL_TOL), method=method)


def test_make_plan_refuses_a_late_plan_and_a_bound_above_the_energy():
    p = _problem(2)
    D = p.fastest_makespan_s() * 1.2
    plan = solve(p, D, method="dp")
    ch = [t.option for t in plan.tasks]
    slow = [int(np.argmax(t)) for t in p.index.time]
    if not plan_meets_deadline(p, slow, p.fastest_makespan_s()):
        with pytest.raises(CertificateError, match="misses its deadline"):
            make_plan(p, slow, p.fastest_makespan_s(), method="x", lower_bound_j=0.0, wall_s=0.0)
    with pytest.raises(CertificateError, match="exceeds the energy"):
        make_plan(p, ch, D, method="x", lower_bound_j=plan.energy_j * (1 + 10 * BOUND_REL_TOL), wall_s=0.0)
    # a bound within the tolerance is reported raw, and the gap is 0, not negative
    near = make_plan(p, ch, D, method="x", lower_bound_j=plan.energy_j * (1 + 1e-8), wall_s=0.0)
    assert near.lower_bound_j > near.energy_j and near.gap == 0.0
    # a loose bound stays loose: nothing clamps it to the energy, and no proof is claimed
    loose = make_plan(p, ch, D, method="x", lower_bound_j=0.5 * plan.energy_j, wall_s=0.0)
    assert loose.status == "feasible" and loose.lower_bound_j == 0.5 * plan.energy_j
    assert loose.gap == pytest.approx(0.5)
    with pytest.raises(CertificateError):
        check_bound(2.0, 1.0)


def test_plans_round_trip_the_time_capped_flag_and_read_older_files():
    p = _problem(3)
    plan = solve(p, "1.1x", method="dp")
    d = plan.to_dict()
    assert d["time_capped"] is False and Plan.from_dict(d) == plan
    del d["time_capped"]                      # written before the flag existed
    assert Plan.from_dict(d).time_capped is False


def test_highs_is_the_milp_back_end_wherever_highspy_is_installed(monkeypatch):
    import pulp

    monkeypatch.setattr(pulp, "listSolvers", lambda onlyAvailable=False: ["PULP_CBC_CMD", "HiGHS"])
    assert available_solvers() == ["HiGHS", "PULP_CBC_CMD"]
    monkeypatch.setattr(pulp, "listSolvers", lambda onlyAvailable=False: ["PULP_CBC_CMD"])
    assert available_solvers() == ["PULP_CBC_CMD"]            # CBC: the fallback


def test_the_milp_reports_its_solver_bound_raw():
    p = _problem(4)
    plan = solve(p, "1.15x", method="ilp")
    best = solve(p, "1.15x", method="brute")
    assert plan.method.startswith("ilp[") and plan.status == "optimal"
    assert plan.energy_j == pytest.approx(best.energy_j, rel=1e-9)
    assert plan.lower_bound_j <= best.energy_j * (1 + BOUND_REL_TOL)
