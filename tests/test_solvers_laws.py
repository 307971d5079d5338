"""Metamorphic laws of the planners."""

import numpy as np
import pytest
from test_solvers_exact import TR, chain, random_dag

from solvers import ConstantTransition, InfeasibleError, Problem, solve
from solvers.brute import brute_force


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("method", ["dp", "ilp", "fast"])
def test_energy_non_increasing_in_deadline(seed, method):
    rng = np.random.default_rng(seed)
    p = chain(rng, 6, 3, TR) if method == "dp" else random_dag(rng, 6, 3, 2, TR)
    fm = p.fastest_makespan_s()
    prev = np.inf
    for f in np.linspace(1.0, 1.6, 7):
        pl = solve(p, fm * f, method=method)
        if method != "fast":     # exact methods: monotone exactly
            assert pl.energy_j <= prev * (1 + 1e-9)
        prev = min(prev, pl.energy_j)


@pytest.mark.parametrize("seed", range(4))
def test_infeasible_iff_below_fastest_makespan(seed):
    rng = np.random.default_rng(seed)
    p = random_dag(rng, 6, 3, 2)
    fm = p.fastest_makespan_s()
    with pytest.raises(InfeasibleError) as ei:
        solve(p, fm * 0.999)
    assert ei.value.fastest_makespan_s == pytest.approx(fm)
    assert "fastest" in str(ei.value)
    assert solve(p, fm).makespan_s <= fm * (1 + 1e-9)
    ch, _ = brute_force(p, fm * 0.999)
    assert ch is None


@pytest.mark.parametrize("seed", range(4))
def test_zero_switch_costs_equal_no_transitions(seed):
    rng = np.random.default_rng(seed)
    p = random_dag(rng, 6, 3, 2)
    p0 = p.with_(transitions=ConstantTransition(0.0, 0.0))
    D = p.fastest_makespan_s() * 1.2
    for m in ("ilp", "fast"):
        assert solve(p0, D, m).energy_j == pytest.approx(solve(p, D, m).energy_j, rel=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_dominated_option_changes_nothing(seed):
    rng = np.random.default_rng(seed)
    p = random_dag(rng, 6, 3, 2)
    D = p.fastest_makespan_s() * 1.2
    base = solve(p, D, "ilp").energy_j
    t0 = p.tasks[0]
    worst = max(t0.options, key=lambda o: o.time_s)
    dom = dict(time_s=worst.time_s * 1.1, d_j=worst.d_j * 1.1 + 1.0, s_w=worst.s_w, sm_clock_mhz=333)
    tasks = [(t.name, t.device, list(t.options) + ([dom] if t is t0 else [])) for t in p.tasks]
    p2 = Problem.build(tasks, p.edges, dict(p.idle_power_w))
    assert solve(p2, D, "ilp").energy_j == pytest.approx(base, rel=1e-9)
    assert solve(p2, D, "brute").energy_j == pytest.approx(base, rel=1e-9)


def test_expensive_transitions_hold_one_clock():
    rng = np.random.default_rng(7)
    clocks = (600.0, 800.0, 1000.0)

    def opts(w):
        return [dict(time_s=w * (0.3 + 700 / f), energy_j=w * (0.3 + 700 / f) * (5 + 12 * (f / 1000) ** 3) + w,
                     s_w=5.0, sm_clock_mhz=f) for f in clocks]

    tasks = [(f"t{i}", "g0", opts(rng.uniform(0.3, 3.0))) for i in range(8)]
    p = Problem.build(tasks, [(f"t{i}", f"t{i + 1}") for i in range(7)], {"g0": 3.0},
                      ConstantTransition(0.0, 1e4))
    D = p.fastest_makespan_s() * 1.3
    pl = solve(p, D)
    assert pl.n_switches == 0
    assert len({t.label for t in pl.tasks}) == 1
    cheap = solve(p.with_(transitions=None), D)
    assert cheap.energy_j <= pl.energy_j
    assert cheap.n_switches > 0      # without switching costs the plan does mix clocks


def test_scaling_energies_scales_optimum():
    rng = np.random.default_rng(3)
    p = random_dag(rng, 5, 3, 2)
    D = p.fastest_makespan_s() * 1.25
    tasks = [(t.name, t.device, [dict(time_s=o.time_s, d_j=2 * o.d_j, s_w=2 * o.s_w,
                                      sm_clock_mhz=o.omega.sm_clock_mhz) for o in t.options])
             for t in p.tasks]
    p2 = Problem.build(tasks, p.edges, {k: 2 * v for k, v in p.idle_power_w.items()})
    assert solve(p2, D, "ilp").energy_j == pytest.approx(2 * solve(p, D, "ilp").energy_j, rel=1e-7)
