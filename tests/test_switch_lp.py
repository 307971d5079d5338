"""The LP with constant switch costs (solvers.switch_lp): its duals give the transport LP's
bound, which is valid (≤ brute force) and at least the hull LP's."""

import numpy as np
import pytest
from test_lns import pipeline
from test_solvers_exact import TR, TR_PAIR, random_dag

from solvers import ConstantTransition
from solvers.brute import brute_force
from solvers.fast import solve_fast
from solvers.hull_lp import HullLP
from solvers.lagrangian import lagrangian_bound
from solvers.switch_lp import switch_lp_duals


def _transport_lp_value(p, D):
    """The MILP's LP relaxation with the full transport matrix over every option (PuLP)."""
    import pulp

    from solvers.ilp import build_model, make_solver

    allowed = [list(range(k)) for k in p.index.k]
    prob = build_model(p, D, allowed=allowed, relaxed=True, transport=True)[0]
    prob.solve(make_solver())
    assert prob.status == pulp.LpStatusOptimal
    return pulp.value(prob.objective)


@pytest.mark.parametrize("seed", range(8))
def test_bound_equals_transport_lp_and_is_valid(seed):
    rng = np.random.default_rng(900 + seed)
    tr = ConstantTransition(0.0, 4.0) if seed % 2 else TR           # energy-only switches too
    p = random_dag(rng, int(rng.integers(5, 9)), 4, int(rng.integers(1, 3)), tr)
    D = p.fastest_makespan_s() * rng.uniform(1.05, 1.4)
    lp = HullLP(p)
    mu = switch_lp_duals(p, lp.rows, D)
    assert mu is not None and mu.shape == (len(lp.rows),) and (mu >= 0).all()
    bound = lagrangian_bound(p, lp, mu, D)[0]
    assert bound == pytest.approx(_transport_lp_value(p, D), rel=1e-6)
    assert bound <= brute_force(p, D)[1] * (1 + 1e-9)
    assert bound >= lp.solve(D).bound_j * (1 - 1e-9)


def test_energy_only_switches_raise_the_fast_bound():
    """The hull LP's duals do not see switches that cost energy but no time; these do."""
    p = pipeline(tr=ConstantTransition(0.0, 3.0), stages=3, mb=4)
    D = p.deadline_s("1.1x")
    lp = HullLP(p)
    res = lp.solve(D)
    old = lagrangian_bound(p, lp, res.duals, D)[0]
    new = lagrangian_bound(p, lp, switch_lp_duals(p, lp.rows, D), D)[0]
    assert new > old * (1 + 1e-3)
    fr = solve_fast(p, D)
    assert fr.lower_bound_j >= new * (1 - 1e-12)
    assert fr.lower_bound_j <= fr.energy_j


def test_not_used_where_it_does_not_apply():
    rng = np.random.default_rng(3)
    for tr in (None, TR_PAIR):           # no switch costs; costs that depend on the pair
        p = random_dag(rng, 6, 3, 2, tr)
        assert switch_lp_duals(p, HullLP(p).rows, p.deadline_s("1.2x")) is None
    p = random_dag(rng, 6, 3, 2, TR)
    rows = HullLP(p).rows
    assert switch_lp_duals(p, rows, p.deadline_s("1.2x"), max_columns=10) is None
    assert switch_lp_duals(p, rows, p.deadline_s("1.2x")) is not None
