"""The exact chain DP against brute force for every kind of switch cost, and at the float edge
of feasibility (issue 22: energy-only switches made `dp` claim a wrong optimum)."""

import numpy as np
import pytest

from solvers import ConstantTransition, Problem, solve
from solvers.brute import brute_force
from solvers.dp import chain_order, solve_chain


class PairCost:
    """Switch cost from a per-pair table: (τ, ε) grow with the clock step, scaled per kind."""

    def __init__(self, tau_scale: float, eps_scale: float):
        self.tau_scale, self.eps_scale = tau_scale, eps_scale

    def cost(self, frm, to):
        if frm is None or frm == to:
            return (0.0, 0.0)
        df = abs(frm.sm_clock_mhz - to.sm_clock_mhz) / 1000.0
        return (self.tau_scale * (0.02 + 0.3 * df), self.eps_scale * (0.5 + 8.0 * df))


KINDS = {
    "time_only": ConstantTransition(0.15, 0.0),
    "energy_only": ConstantTransition(0.0, 3.0),
    "both": ConstantTransition(0.15, 3.0),
    "pair_energy_only": PairCost(0.0, 1.0),
    "pair_both": PairCost(1.0, 1.0),
}


def _chain(rng: np.random.Generator, tr) -> Problem:
    n = int(rng.integers(2, 7))
    tasks = []
    for i in range(n):
        k = int(rng.integers(2, 5))          # unequal option lists
        f = np.sort(rng.choice(np.linspace(0.4, 1.0, 13), k, replace=False))
        w = rng.uniform(0.5, 1.5)
        t = w * (0.3 + 0.7 / f)
        opts = [dict(time_s=float(ti), energy_j=float(ti * (5 + 12 * fi**3) + w), s_w=5.0,
                     sm_clock_mhz=float(round(fi * 1000))) for ti, fi in zip(t, f)]
        tasks.append((f"t{i}", "g0", opts))
    edges = [(f"t{i}", f"t{i + 1}") for i in range(n - 1)]
    return Problem.build(tasks, edges, {"g0": 3.0}, tr)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_chain_dp_equals_brute_force_for_every_switch_kind(kind):
    rng = np.random.default_rng(sum(map(ord, kind)))
    wrong = []
    for trial in range(120):
        p = _chain(rng, KINDS[kind])
        D = p.fastest_makespan_s() * rng.uniform(1.0, 1.5)
        _, e_opt = brute_force(p, D)
        r = solve_chain(p, D, chain_order(p))
        assert p.index.makespan(r.choice) <= D * (1 + 1e-9)
        assert r.lower_bound_j <= e_opt * (1 + 1e-9) + 1e-12      # a bound never above the optimum
        if not (r.exact and r.energy_j == pytest.approx(e_opt, rel=1e-9)):
            wrong.append((trial, r.exact, r.energy_j, e_opt))
    assert not wrong, f"{kind}: {len(wrong)} of 120 chains not solved to the brute-force optimum: {wrong[:3]}"


def test_chain_dp_accepts_a_deadline_ulps_below_the_fastest_sum():
    rng = np.random.default_rng(7)
    p = _chain(rng, KINDS["both"])
    fm = p.fastest_makespan_s()
    for d in (fm, fm - 3e-14 * fm, np.nextafter(fm, 0.0)):
        p.check_feasible(d)                   # the model accepts it ...
        plan = solve(p, d, method="dp")       # ... so the exact method must solve it
        assert plan.makespan_s <= d * (1 + 1e-9)
