"""Brute force = chain DP = ILP on small instances; the fast method brackets the optimum."""

import numpy as np
import pytest
from switch_costs import PairCost

from solvers import ConstantTransition, Problem, solve
from solvers.brute import brute_force
from solvers.dp import chain_order, solve_chain
from solvers.fast import solve_fast
from solvers.ilp import solve_ilp


def _options(rng, k, w=1.0):
    f = np.sort(rng.choice(np.linspace(0.4, 1.0, 9), k, replace=False))
    t = w * (0.3 + 0.7 / f)
    return [dict(time_s=float(ti), energy_j=float(ti * (5 + 12 * fi**3) + w), s_w=5.0,
                 sm_clock_mhz=float(round(fi * 1000))) for ti, fi in zip(t, f)]


def chain(rng, n, k, tr=None, n_dev=1):
    tasks = [(f"t{i}", f"g{i % n_dev}", _options(rng, k, rng.uniform(0.5, 1.5))) for i in range(n)]
    edges = [(f"t{i}", f"t{i + 1}") for i in range(n - 1)]
    return Problem.build(tasks, edges, {f"g{j}": 3.0 for j in range(n_dev)}, tr)


def sp_dag(rng, k, tr=None):
    """Fork–join: a → (b ‖ c) → d, with b and c on two devices (series–parallel)."""
    tasks = [("a", "g0", _options(rng, k)), ("b", "g0", _options(rng, k)),
             ("c", "g1", _options(rng, k)), ("d", "g1", _options(rng, k))]
    return Problem.build(tasks, [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")],
                         {"g0": 3.0, "g1": 4.0}, tr)


def random_dag(rng, n, k, n_dev, tr=None):
    """Random DAG (generally not series–parallel, e.g. it contains N-shaped subgraphs)."""
    tasks = [(f"t{i}", f"g{i % n_dev}", _options(rng, k, rng.uniform(0.5, 1.5))) for i in range(n)]
    edges = [(f"t{i}", f"t{j}") for i in range(n) for j in range(i + 1, n) if rng.random() < 0.35]
    return Problem.build(tasks, edges, {f"g{j}": 3.0 for j in range(n_dev)}, tr)


def n_shape(rng, k, tr=None):
    """The smallest non-series–parallel DAG: a→c, a→d, b→d (the 'N')."""
    tasks = [(x, f"g{i % 2}", _options(rng, k)) for i, x in enumerate("abcd")]
    return Problem.build(tasks, [("a", "c"), ("a", "d"), ("b", "d")], {"g0": 3.0, "g1": 3.0}, tr)


TR = ConstantTransition(0.2, 4.0)


TR_PAIR = PairCost(0.05, 0.4, 1.0, 6.0)   # grows with the clock change


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("tr", [None, TR])
def test_chain_dp_equals_brute_force(seed, tr):
    rng = np.random.default_rng(seed)
    p = chain(rng, int(rng.integers(2, 7)), int(rng.integers(2, 4)), tr)
    D = p.fastest_makespan_s() * rng.uniform(1.0, 1.5)
    _, e = brute_force(p, D)
    r = solve_chain(p, D, chain_order(p))
    assert r.exact
    assert r.energy_j == pytest.approx(e, rel=1e-9)
    assert p.index.objective(r.choice) == pytest.approx(e, rel=1e-9)
    plan = solve(p, D)
    assert plan.method == "dp" and plan.gap == 0.0 and plan.energy_j == pytest.approx(e, rel=1e-9)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("tr", [None, TR, TR_PAIR], ids=["free", "constant", "pair"])
@pytest.mark.parametrize("kind", ["chain", "sp", "n", "random"])
def test_ilp_and_fast_against_brute_force(seed, tr, kind):
    rng = np.random.default_rng(100 + seed)
    k = int(rng.integers(2, 4))
    p = {"chain": lambda: chain(rng, 5, k, tr, n_dev=2), "sp": lambda: sp_dag(rng, k, tr),
         "n": lambda: n_shape(rng, k, tr),
         "random": lambda: random_dag(rng, int(rng.integers(4, 7)), k, int(rng.integers(1, 4)), tr)}[kind]()
    D = p.fastest_makespan_s() * rng.uniform(1.0, 1.5)
    ch, e = brute_force(p, D)
    assert ch is not None
    r = solve_ilp(p, D)
    assert r.optimal and r.energy_j == pytest.approx(e, rel=1e-7)
    f = solve_fast(p, D)
    assert f.lower_bound_j <= e * (1 + 1e-9)
    assert f.energy_j >= e * (1 - 1e-9)
    assert p.index.makespan(f.choice) <= D * (1 + 1e-9)
    plan = solve(p, D, method="ilp")
    # HiGHS' dual bound is raw: below the energy by its feasibility tolerance (~1e-8)
    assert plan.gap <= 1e-6 and plan.status == "optimal"
    assert plan.energy_j == pytest.approx(e, rel=1e-7)
    assert plan.makespan_s <= D * (1 + 1e-9)


def nested_sp(rng, k):
    """((a ; (b ‖ c)) ; d) ‖ (e ; f) on three devices."""
    tasks = [(x, f"g{i // 2}", _options(rng, k)) for i, x in enumerate("abcdef")]
    return Problem.build(tasks, [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")],
                         {"g0": 3.0, "g1": 3.0, "g2": 2.0})


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("kind", ["sp", "nested", "chain2"])
def test_sp_dp_equals_brute_force(seed, kind):
    from solvers.spdp import solve_sp, sp_tree

    rng = np.random.default_rng(200 + seed)
    k = int(rng.integers(2, 4))
    p = {"sp": lambda: sp_dag(rng, k), "nested": lambda: nested_sp(rng, k),
         "chain2": lambda: chain(rng, 5, k, None, n_dev=2)}[kind]()
    assert sp_tree(p) is not None
    D = p.fastest_makespan_s() * rng.uniform(1.0, 1.5)
    _, e = brute_force(p, D)
    ch, got = solve_sp(p, D)
    assert got == pytest.approx(e, rel=1e-9)
    assert p.index.makespan(ch) <= D * (1 + 1e-12)
    if kind != "chain2":
        plan = solve(p, D)
        assert plan.method == "sp" and plan.gap == 0.0


def test_n_shape_is_not_series_parallel():
    from solvers.spdp import sp_tree

    assert sp_tree(n_shape(np.random.default_rng(0), 2)) is None


def test_pulp_status_reading():
    """sol_status 2 (integer feasible, e.g. a time limit) is never reported as optimal."""
    import pulp

    from solvers.ilp import read_status

    class P:
        status, sol_status = pulp.LpStatusOptimal, pulp.LpSolutionIntegerFeasible

    st = read_status(P(), 1)
    assert st.has_solution and not st.optimal

    class R:          # PuLP 4 LpSolveStats look-alike
        class status:
            name = "TimeLimit"
        has_solution = True
        best_bound = 12.5

    st = read_status(None, R())
    assert st.has_solution and not st.optimal and st.best_bound == 12.5


def test_no_solver_fails_clearly(monkeypatch):
    import pulp

    from solvers import SolverUnavailableError
    from solvers.ilp import make_solver

    monkeypatch.setattr(pulp, "listSolvers", lambda onlyAvailable=False: [])
    with pytest.raises(SolverUnavailableError, match="pulp\\[cbc\\]"):
        make_solver()


def test_ilp_time_limit_reports_bound_not_optimal():
    rng = np.random.default_rng(5)
    p = random_dag(rng, 40, 6, 4, TR)
    D = p.fastest_makespan_s() * 1.2
    plan = solve(p, D, method="ilp", time_limit_s=1.0)
    assert plan.makespan_s <= D * (1 + 1e-9)
    assert plan.lower_bound_j <= plan.energy_j * (1 + 1e-9)     # raw: the solver's own bound
    if plan.status == "time_limit":
        assert plan.time_capped                                # the safety net says so
    if plan.status != "optimal":
        assert plan.gap > 0


@pytest.mark.parametrize("seed", range(10))
def test_polish_keeps_deadline_and_never_worsens(seed):
    from solvers.lns import polish

    rng = np.random.default_rng(500 + seed)
    p = random_dag(rng, int(rng.integers(5, 9)), int(rng.integers(2, 4)), int(rng.integers(1, 4)), TR)
    D = p.fastest_makespan_s() * rng.uniform(1.0, 1.5)
    _, e_opt = brute_force(p, D)
    start = solve_fast(p, D, search_work=0.0).choice
    ch = polish(p, start, D, work=2_000.0)
    ix = p.index
    assert ix.makespan(ch) <= D * (1 + 1e-9)
    assert ix.objective(ch) <= ix.objective(start) * (1 + 1e-12)
    assert ix.objective(ch) >= e_opt * (1 - 1e-9)


def test_constant_switch_is_detected_only_for_constant_costs():
    from solvers.index import constant_switch

    rng = np.random.default_rng(3)
    for tr, want in ((TR, (0.2, 4.0 - 3.0 * 0.2)), (TR_PAIR, None)):
        p = chain(rng, 3, 3, tr)
        got = constant_switch(p, 0, 1)
        if want is None:
            assert got is None
        else:
            tau, extra, groups_u, groups_w = got
            assert (tau, extra) == pytest.approx(want)      # extra = energy beyond idle power
            assert sorted(a for aa in groups_u.values() for a in aa) == [0, 1, 2]
            assert set(groups_u) == {o.omega.dev for o in p.tasks[0].options}
            assert set(groups_w) == {o.omega.dev for o in p.tasks[1].options}
    assert constant_switch(chain(rng, 3, 3, None), 0, 1) is None


@pytest.mark.parametrize("seed", range(6))
def test_constant_switch_linearisation_has_the_transport_lp_bound(seed):
    """Per-ω z rows and the transport matrix give the same LP relaxation (both charge a
    switch c·Σ_ω max(0, X_u,ω − X_w,ω)), and the same MILP optimum."""
    import pulp

    from solvers.ilp import build_model, make_solver

    rng = np.random.default_rng(700 + seed)
    tr = ConstantTransition(0.0, 4.0) if seed % 2 else TR           # energy-only switches too
    p = random_dag(rng, int(rng.integers(5, 9)), 4, int(rng.integers(1, 3)), tr)
    D = p.fastest_makespan_s() * rng.uniform(1.05, 1.4)
    values = {}
    for relaxed in (True, False):
        for transport in (False, True):
            prob = build_model(p, D, relaxed=relaxed, transport=transport)[0]
            prob.solve(make_solver())
            assert prob.status == pulp.LpStatusOptimal
            values[relaxed, transport] = pulp.value(prob.objective)
    assert values[True, False] == pytest.approx(values[True, True], rel=1e-7)
    assert values[False, False] == pytest.approx(values[False, True], rel=1e-7)
    assert values[False, False] == pytest.approx(brute_force(p, D)[1], rel=1e-7)


@pytest.mark.parametrize("seed", range(24))
def test_every_method_brackets_brute_force_when_tasks_list_different_clocks(seed):
    """Tasks with 1–4 of 9 clocks each (so device neighbours differ in option count and
    order), chains and random DAGs, no, constant and clock-distance switch costs: every method
    meets the deadline, its bound is below the optimum and its plan not below it; the exact ones
    find it. (Unequal option lists used to crash the fast method's path search and the MILP
    it warm-starts.)"""
    rng = np.random.default_rng(1000 + seed)
    n, n_dev = int(rng.integers(2, 7)), int(rng.integers(1, 3))
    tasks = [(f"t{i}", f"g{i % n_dev}", _options(rng, int(rng.integers(1, 5)), rng.uniform(0.5, 1.5)))
             for i in range(n)]
    if seed % 3 == 0:
        edges = [(f"t{i}", f"t{i + 1}") for i in range(n - 1)]
    else:
        edges = [(f"t{i}", f"t{j}") for i in range(n) for j in range(i + 1, n) if rng.random() < 0.35]
    p = Problem.build(tasks, edges, {f"g{j}": 3.0 for j in range(n_dev)}, [None, TR, TR_PAIR][seed % 3])
    D = p.fastest_makespan_s() * rng.uniform(1.0, 1.5)
    _, best = brute_force(p, D)
    for method in ("auto", "fast", "ilp"):
        plan = solve(p, D, method=method)
        assert plan.makespan_s <= D * (1 + 1e-9)
        assert plan.lower_bound_j <= best * (1 + 1e-9) <= plan.energy_j * (1 + 2e-9)
        if method == "ilp":
            assert plan.energy_j == pytest.approx(best, rel=1e-6)
