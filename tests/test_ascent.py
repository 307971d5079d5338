"""Supergradient ascent of the Lagrangian bound (solvers.ascent): valid at every step, never
below its start, flow-conserving, and close to the LP with switch costs."""

import numpy as np
import pytest
from test_lns import pipeline
from test_solvers_exact import TR, TR_PAIR, random_dag

from solvers import ConstantTransition
from solvers.ascent import flow_ascent
from solvers.brute import brute_force
from solvers.fast import solve_fast
from solvers.hull_lp import HullLP
from solvers.lagrangian import lagrangian_bound
from solvers.switch_lp import switch_lp_duals


def _setup(p, D):
    lp = HullLP(p)
    res = lp.solve(D)
    return lp, res, (lambda m: lagrangian_bound(p, lp, m, D))


@pytest.mark.parametrize("seed", range(10))
def test_bound_is_valid_and_never_below_its_start(seed):
    rng = np.random.default_rng(4100 + seed)
    tr = (TR, TR_PAIR, ConstantTransition(0.0, 3.0))[seed % 3]     # pair-dependent, energy-only
    p = random_dag(rng, int(rng.integers(4, 8)), 3, int(rng.integers(1, 3)), tr)
    D = p.fastest_makespan_s() * rng.uniform(1.0, 1.4)
    lp, res, ev = _setup(p, D)
    bound, mu = flow_ascent(p, lp.rows, res.duals, D, ev, iters=60)
    assert bound >= ev(res.duals)[0] - 1e-9
    assert bound == pytest.approx(ev(mu)[0], rel=1e-12)
    assert (mu >= 0).all()
    assert bound <= brute_force(p, D)[1] * (1 + 1e-9)


def test_steps_keep_every_task_net_flow():
    """The steps move flow along conserving directions: only the total into the makespan
    changes, and the start's conservation errors (charged in the bound) stay as they were."""
    p = pipeline(stages=3, mb=6)
    D = p.deadline_s("1.1x")
    lp, res, ev = _setup(p, D)
    _, mu = flow_ascent(p, lp.rows, res.duals, D, ev, iters=40)

    def net(m):
        out = np.zeros(p.index.n)
        for k, (u, w) in enumerate(lp.rows):
            out[u] += m[k]
            if w >= 0:
                out[w] -= m[k]
        return out

    inner = sorted({w for _, w in lp.rows if w >= 0})
    assert not np.allclose(mu, res.duals)                          # it moved
    assert net(mu)[inner] == pytest.approx(net(res.duals)[inner], abs=1e-6 * res.duals.max())


def test_closes_most_of_the_gap_to_the_lp_with_switch_costs():
    """From the hull LP's duals, which ignore switches, towards that LP's value (its own
    duals' bound; solvers.switch_lp)."""
    p = pipeline(stages=4, mb=8)
    D = p.deadline_s("1.1x")
    lp, res, ev = _setup(p, D)
    start = ev(res.duals)[0]
    target = ev(switch_lp_duals(p, lp.rows, D))[0]
    assert target > start * (1 + 1e-3)                             # there is a gap to close
    bound, _ = flow_ascent(p, lp.rows, res.duals, D, ev)
    assert bound <= target * (1 + 1e-9)
    assert target - bound <= 0.1 * (target - start)


def test_no_iterations_is_the_start():
    p = pipeline()
    D = p.deadline_s("1.2x")
    lp, res, ev = _setup(p, D)
    bound, mu = flow_ascent(p, lp.rows, res.duals, D, ev, iters=0)
    assert bound == ev(res.duals)[0]
    assert np.array_equal(mu, res.duals)


def test_fast_method_bound_includes_the_ascent():
    p = pipeline(stages=4, mb=8)
    D = p.deadline_s("1.1x")
    lp, res, ev = _setup(p, D)
    fr = solve_fast(p, D, lp=lp)
    assert fr.lower_bound_j >= flow_ascent(p, lp.rows, res.duals, D, ev)[0] * (1 - 1e-6)
    assert fr.lower_bound_j <= fr.energy_j


@pytest.mark.parametrize("seed", range(3))
def test_moves_on_dense_dags_where_many_rows_start_at_zero(seed):
    """Many rows at μ = 0 would block every step; the projection holds them until none does
    (with only six such passes per step, these stayed exactly at their start)."""
    rng = np.random.default_rng(seed)
    p = random_dag(rng, 60, 6, 4, TR_PAIR)
    D = p.fastest_makespan_s() * 1.15
    lp, res, ev = _setup(p, D)
    start = ev(res.duals)[0]
    bound, _ = flow_ascent(p, lp.rows, res.duals, D, ev)
    assert bound > start * (1 + 1e-3)
