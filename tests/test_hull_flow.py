"""The hull LP through its dual min-cost flow (solvers.hull_flow): the same bound, makespan
and d bound / d D as the LP, a primal that keeps every precedence and the deadline, duals
that conserve flow and give Lagrangian bounds no higher than the LP, the same error for an
infeasible deadline."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_lns import pipeline
from test_solvers_exact import TR, random_dag

from frontier.errors import InputError
from solvers.brute import brute_force
from solvers.hull_flow import flow_available, flow_net, solve_hull_flow
from solvers.hull_lp import HullLP
from solvers.lagrangian import flow_from_duals, lagrangian_bound
from solvers.model import Problem

pytestmark = pytest.mark.skipif(not flow_available(), reason="needs OR-Tools (ortools)")

REL = 1e-7      # the LP's own tolerances; the flow's duality gap is checked at 1e-9


def _both(p, D):
    lp = HullLP(p, method="lp", process_min_tasks=10**9)
    fl = HullLP(p, method="flow", process_min_tasks=10**9)
    return lp, lp.solve(D), fl, fl.solve(D)


def _check_schedule(p, lp, res, D):
    """The flow's primal: every task within its hull, precedence kept, makespan ≤ D, and the
    bound equal to the primal's value (the hull cost of its times plus P·M)."""
    ix = p.index
    T = res.time_s
    fast = np.array([t.min() for t in ix.time])
    slow = np.array([t[h].max() for t, h in zip(ix.time, lp.hulls)])
    assert np.all(T >= fast - 1e-12) and np.all(T <= slow + 1e-12)
    assert res.makespan_s <= D * (1 + 1e-12)
    _, end = ix.earliest(T)
    assert max(end) <= res.makespan_s * (1 + 1e-9) + 1e-12


def _hull_cost(lp, v, t):
    ix = lp.p.index
    h = lp.hulls[v]
    return float(np.interp(t, ix.time[v][h], ix.cost[v][h]))     # hull: increasing time


def _assert_same(p, D):
    lp, r_lp, fl, r_fl = _both(p, D)
    assert r_fl.bound_j == pytest.approx(r_lp.bound_j, rel=REL, abs=1e-9)
    # the makespan is not compared: where the optimum is not unique (the deadline slack, a
    # flat hull segment) the two codes may return different optimal schedules (3x4 1F1B at
    # 1.2x: 23.90 s and 24.32 s, same bound); the flow's is checked feasible and optimal below
    _check_schedule(p, fl, r_fl, D)
    primal = sum(_hull_cost(fl, v, t) for v, t in enumerate(r_fl.time_s)) + p.index.p_total * r_fl.makespan_s
    assert primal == pytest.approx(r_fl.bound_j, rel=1e-8, abs=1e-9)
    return lp, r_lp, fl, r_fl


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 9), k=st.integers(1, 5),
       n_dev=st.integers(1, 3), factor=st.floats(1.0, 2.5))
def test_random_dags_match_the_lp(seed, n, k, n_dev, factor):
    rng = np.random.default_rng(seed)
    p = random_dag(rng, n, k, n_dev)
    _assert_same(p, p.fastest_makespan_s() * factor)


@pytest.mark.parametrize("stages,mb", [(2, 3), (3, 4), (4, 8)])
@pytest.mark.parametrize("factor", [1.0, 1.05, 1.2, 3.0])
def test_pipelines_match_the_lp(stages, mb, factor):
    p = pipeline(None, stages, mb)
    _assert_same(p, p.fastest_makespan_s() * factor)


def test_slope_is_the_lp_value_change_away_from_the_ends():
    p = pipeline(None, 3, 4)
    D = p.fastest_makespan_s() * 1.1
    lp, r_lp, fl, r_fl = _both(p, D)
    assert r_fl.slope_j_per_s == pytest.approx(r_lp.slope_j_per_s, rel=1e-6, abs=1e-9)
    # a supergradient of the convex value: the tangent stays below the value nearby
    for D2 in (D * 0.97, D * 1.03):
        assert fl.solve(D2).bound_j >= r_fl.bound_j + r_fl.slope_j_per_s * (D2 - D) - 1e-7


def test_hand_worked_single_task():
    # options (1 s, 10 J), (2 s, 6 J), (4 s, 5 J); idle 1 W: costs 9, 4, 1 J (energy − P·t).
    # D = 1.5 s: the hull's fast segment (1→2 s) at 5 J/s: T = 1.5, cost 6.5, + P·M = 1.5.
    p = Problem.build({"a": ("g", [(1.0, 10.0), (2.0, 6.0), (4.0, 5.0)])}, idle_power_w={"g": 1.0})
    r = HullLP(p, method="flow").solve(1.5)
    assert r.bound_j == pytest.approx(8.0, rel=1e-9)
    assert r.time_s[0] == pytest.approx(1.5, rel=1e-9)
    assert r.makespan_s == pytest.approx(1.5, rel=1e-9)
    assert r.slope_j_per_s == pytest.approx(-(5.0 - 1.0), rel=1e-9)   # 5 J/s saved, 1 W idle more


def test_duals_conserve_flow_and_price_a_valid_lagrangian_bound():
    for seed in range(8):
        rng = np.random.default_rng(900 + seed)
        p = random_dag(rng, int(rng.integers(3, 7)), 3, 2, TR)
        D = p.fastest_makespan_s() * rng.uniform(1.0, 1.5)
        fl = HullLP(p, method="flow")
        res = fl.solve(D)
        assert np.all(res.duals >= 0)
        ix = p.index
        net = np.zeros(ix.n)
        for k, (u, w) in enumerate(fl.rows):
            net[u] += res.duals[k]
            if w >= 0:
                net[w] -= res.duals[k]
        assert np.all(net >= -1e-9 * max(1.0, res.duals.max()))    # sources only supply
        f = flow_from_duals(p, fl, res.duals, D)
        assert np.all(f.f >= 0)
        bound, _ = lagrangian_bound(p, fl, res.duals, D)
        _, best = brute_force(p, D)
        assert bound <= best * (1 + 1e-9) + 1e-9
        # without switches the Lagrangian of optimal duals is the LP value
        q = random_dag(np.random.default_rng(900 + seed), int(rng.integers(3, 7)), 3, 2)
        flq = HullLP(q, method="flow")
        Dq = q.fastest_makespan_s() * 1.2
        rq = flq.solve(Dq)
        assert lagrangian_bound(q, flq, rq.duals, Dq)[0] == pytest.approx(rq.bound_j, rel=1e-7, abs=1e-9)


def test_infeasible_deadline_raises_as_the_lp_does():
    p = pipeline(None, 2, 3)
    D = p.fastest_makespan_s() * 0.9
    for method in ("lp", "flow"):
        with pytest.raises(RuntimeError):
            HullLP(p, method=method).solve(D)


def test_single_option_changes_reach_the_flow():
    # set_single_options rewrites t_slow in the rows; the flow reads it from there
    p = Problem.build({"a": ("g", [(1.0, 3.0)]), "b": ("g", [(1.0, 4.0), (2.0, 2.0)])},
                      [("a", "b")], {"g": 0.5})
    lp, fl = HullLP(p, method="lp"), HullLP(p, method="flow")
    for h in (lp, fl):
        h.set_single_options({0: (1.5, 2.0)})
    assert fl.solve(3.2).bound_j == pytest.approx(lp.solve(3.2).bound_j, rel=1e-9)


def test_unknown_method_and_cycles_are_input_errors():
    p = pipeline(None, 2, 2)
    with pytest.raises(InputError):
        HullLP(p, method="simplex")
    with pytest.raises(InputError):
        flow_net(2, [(0, 1), (1, 0)], np.zeros(3, dtype=int))


def test_flow_solve_needs_no_lp():
    # the flow module on its own, on a chain: buys the cheapest seconds first
    net = flow_net(2, [(0, 1), (1, -1)], np.array([0, 1, 2]))
    sol = solve_hull_flow(net, np.array([2.0, 2.0]), np.array([1.0, 1.0]), np.array([3.0, 1.0]),
                          0.0, 3.0)
    # 1 s to buy: task 1's segment at 1 J/s
    assert sol.value_j == pytest.approx(1.0, rel=1e-9)
    assert sol.primal_j == pytest.approx(1.0, rel=1e-9)
    assert sol.x[-2:] == pytest.approx([0.0, 1.0])


def test_flow_in_a_child_process_gives_the_same_answer():
    p = pipeline(None, 3, 4)
    D = p.fastest_makespan_s() * 1.05
    here = HullLP(p, method="flow", process_min_tasks=10**9)
    there = HullLP(p, method="flow", process_min_tasks=0)
    try:
        assert there.in_child
        a, b = here.solve(D), there.solve(D)
        assert a.bound_j == b.bound_j and a.makespan_s == b.makespan_s
        assert np.array_equal(a.duals, b.duals) and np.array_equal(a.time_s, b.time_s)
    finally:
        there.close()
