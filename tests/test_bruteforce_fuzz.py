"""Every method's plan and bound against brute-force optima on random small instances (issue 22).

Instances are drawn by hypothesis (derandomized: the same instances on every run): chains,
fork–joins and general DAGs of up to 6 tasks, each with its own option list (1–4 clocks out
of 7, so neighbours' lists differ in length and order), switch costs that are none, time
only, energy only, both, or pair-dependent (growing with the clock step), and deadlines from
1.0× to 1.5× the fastest makespan. The oracle enumerates every assignment with numpy under
the one feasibility predicate (:func:`solvers.feasibility.latest_makespan_s`). For each
method: its plan meets the deadline and costs at least the optimum, its lower bound is at
most the optimum, and "optimal" means the optimum. ``experiments/fuzz_exact.py`` runs the
same checks on many more instances.
"""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from switch_costs import PairCost

from solvers import ConstantTransition, Problem, solve
from solvers.brute import brute_force
from solvers.dp import chain_order
from solvers.fast import solve_fast
from solvers.feasibility import BOUND_REL_TOL, latest_makespan_s

CLOCKS = (400, 500, 600, 700, 800, 900, 1000)     # MHz; a task lists some of them



SWITCHES = {
    "none": None,
    "time": ConstantTransition(0.15, 0.0),
    "energy": ConstantTransition(0.0, 2.5),
    "both": ConstantTransition(0.15, 2.5),
    "pair": PairCost(),
}

#: Relative tolerance of exact methods against the oracle (float sums in another order).
EXACT_REL = 1e-9


def options(mask: int, turn: int, w: float) -> list[dict]:
    """The options of a task: the clocks of ``mask``'s set bits (at most 4), the list rotated
    by ``turn`` (neighbours' lists differ in length and order), work scaled by ``w``."""
    clocks = [c for i, c in enumerate(CLOCKS) if mask >> i & 1][:4]
    clocks = clocks[turn % len(clocks):] + clocks[:turn % len(clocks)]
    out = []
    for c in clocks:
        f = c / 1000.0
        t = w * (0.3 + 0.7 / f)
        out.append(dict(time_s=t, energy_j=t * (5 + 12 * f**3) + w, s_w=5.0, sm_clock_mhz=float(c)))
    return out


#: One task's draw: (clock mask, rotation, work scale); few draws per task keep hypothesis fast.
TASK = st.tuples(st.integers(1, 2 ** len(CLOCKS) - 1), st.integers(0, 3), st.floats(0.5, 1.5))


@st.composite
def instance(draw, shape: str, switch_kinds: tuple[str, ...] = tuple(SWITCHES)):
    """(problem, deadline s, switch kind) of a ``shape`` (chain, forkjoin or dag)."""
    kind = draw(st.sampled_from(switch_kinds))
    n = {"chain": draw(st.integers(2, 6)), "forkjoin": 4, "dag": draw(st.integers(3, 6))}[shape]
    opts = [options(*t) for t in draw(st.lists(TASK, min_size=n, max_size=n))]
    if shape == "chain":
        tasks = [(f"t{i}", "g0", opts[i]) for i in range(n)]
        edges = [(f"t{i}", f"t{i + 1}") for i in range(n - 1)]
        power = {"g0": 3.0}
    elif shape == "forkjoin":
        tasks = [(x, f"g{i % 2}", opts[i]) for i, x in enumerate("abcd")]
        edges = [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]
        power = {"g0": 3.0, "g1": 4.0}
    else:
        tasks = [(f"t{i}", f"g{i % 2}", opts[i]) for i in range(n)]
        pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
        mask = draw(st.integers(0, 2 ** len(pairs) - 1))
        edges = [(f"t{i}", f"t{j}") for k, (i, j) in enumerate(pairs) if mask >> k & 1]
        power = {"g0": 3.0, "g1": 3.5}
    p = Problem.build(tasks, edges, power, SWITCHES[kind])
    factor = draw(st.one_of(st.just(1.0), st.floats(1.0, 1.5)))
    return p, p.fastest_makespan_s() * factor, kind


def optimum(p: Problem, deadline_s: float) -> float:
    """The least energy over every assignment whose makespan meets ``deadline_s``, by numpy
    enumeration (an oracle written apart from the solvers and from ``solvers.brute``)."""
    ix = p.index
    a = np.array(list(itertools.product(*(range(k) for k in ix.k))))
    end = np.zeros(a.shape)
    energy = np.zeros(len(a))
    for v in ix.order:
        s = np.zeros(len(a))
        for u in ix.preds[v]:
            s = np.maximum(s, end[:, u])
        u = ix.dev_prev[v]
        if u >= 0:
            lat = ix.tau[v][a[:, u], a[:, v]] if ix.tau[v] is not None else 0.0
            s = np.maximum(s, end[:, u] + lat)
            if ix.extra[v] is not None:
                energy += ix.extra[v][a[:, u], a[:, v]]
        end[:, v] = s + ix.time[v][a[:, v]]
        energy += ix.cost[v][a[:, v]]
    mk = end.max(axis=1)
    energy += ix.p_total * mk
    ok = mk <= latest_makespan_s(deadline_s)
    assert ok.any()
    return float(energy[ok].min())


def check(plan_energy: float, makespan: float, bound: float, opt: float, D: float,
          optimal: bool, bound_tol: float = EXACT_REL) -> None:
    """The plan meets D and costs ≥ the optimum; the bound is ≤ it; optimal means equal."""
    scale = max(abs(opt), 1.0)
    assert makespan <= latest_makespan_s(D)
    assert plan_energy >= opt - EXACT_REL * scale
    assert bound <= opt + bound_tol * scale
    if optimal:
        assert abs(plan_energy - opt) <= EXACT_REL * scale


FUZZ = settings(deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@settings(FUZZ, max_examples=1100)
@given(instance("chain"))
def test_chain_dp_against_brute_force(case):
    p, D, _ = case
    assert chain_order(p) is not None
    opt = optimum(p, D)
    plan = solve(p, D, method="dp")
    check(plan.energy_j, plan.makespan_s, plan.lower_bound_j, opt, D, plan.status == "optimal")
    assert plan.status == "optimal"          # the DP is exact below its label cap


@settings(FUZZ, max_examples=400)
@given(instance("forkjoin", ("none",)))
def test_series_parallel_dp_against_brute_force(case):
    p, D, _ = case
    opt = optimum(p, D)
    plan = solve(p, D, method="sp")
    check(plan.energy_j, plan.makespan_s, plan.lower_bound_j, opt, D, plan.status == "optimal")
    assert plan.method == "sp" and plan.status == "optimal"


@settings(FUZZ, max_examples=260)
@given(st.one_of(instance("dag"), instance("forkjoin"), instance("chain")))
def test_fast_method_bound_and_plan_against_brute_force(case):
    # the bound and the starts without the search (quick); a few instances search below
    p, D, _ = case
    opt = optimum(p, D)
    r = solve_fast(p, D, search_work=0.0)
    mk = p.index.makespan(r.choice)
    check(r.energy_j, mk, r.lower_bound_j, opt, D, False, BOUND_REL_TOL)


@settings(FUZZ, max_examples=30)
@given(st.one_of(instance("dag"), instance("chain", ("time", "energy", "pair"))))
def test_fast_method_with_search_and_switch_bound_against_brute_force(case):
    p, D, _ = case
    opt = optimum(p, D)
    plan = solve(p, D, method="fast")
    check(plan.energy_j, plan.makespan_s, plan.lower_bound_j, opt, D, plan.status == "optimal",
          BOUND_REL_TOL)
    assert not plan.time_capped


@settings(FUZZ, max_examples=40)
@given(st.one_of(instance("dag"), instance("forkjoin")))
def test_milp_against_brute_force(case):
    p, D, _ = case
    opt = optimum(p, D)
    plan = solve(p, D, method="ilp")
    check(plan.energy_j, plan.makespan_s, plan.lower_bound_j, opt, D, plan.status == "optimal",
          BOUND_REL_TOL)


@settings(FUZZ, max_examples=200)
@given(st.one_of(instance("dag"), instance("chain")))
def test_solvers_brute_force_agrees_with_the_oracle(case):
    p, D, _ = case
    ch, e = brute_force(p, D)
    assert abs(e - optimum(p, D)) <= EXACT_REL * max(abs(e), 1.0)
    plan = solve(p, D, method="brute")
    assert plan.status == "optimal" and plan.lower_bound_j == e
