"""Steady-state iterations (issue 20, contract A): a plan for a step that repeats charges each
device's switch from its last task (iteration k) to its first (iteration k + 1)."""

import pickle

import numpy as np
import pytest
from switch_costs import PairCost

from frontier.operating_point import OperatingPoint
from solvers import ConstantTransition, Problem, solve
from solvers.brute import brute_force
from solvers.dp import chain_order, solve_chain
from solvers.io import problem_from_dict, problem_to_dict
from solvers.model import ProblemError

pulp = pytest.importorskip("pulp")


def _have_milp() -> bool:
    from solvers.ilp import available_solvers
    return bool(available_solvers())


RULES = {"constant": ConstantTransition(0.15, 3.0), "pair": PairCost(),
         "energy_only": ConstantTransition(0.0, 3.0)}


def _opts(rng, k: int) -> list[dict]:
    f = np.sort(rng.choice(np.linspace(0.4, 1.0, 13), k, replace=False))
    w = rng.uniform(0.5, 1.5)
    t = w * (0.3 + 0.7 / f)
    return [dict(time_s=float(ti), energy_j=float(ti * (5 + 12 * fi**3) + w), s_w=5.0,
                 sm_clock_mhz=float(round(fi * 1000))) for ti, fi in zip(t, f)]


def _chain(rng, rule, steady=True) -> Problem:
    n = int(rng.integers(2, 6))
    tasks = [(f"t{i}", "g0", _opts(rng, int(rng.integers(2, 4)))) for i in range(n)]
    edges = [(f"t{i}", f"t{i + 1}") for i in range(n - 1)]
    return Problem.build(tasks, edges, {"g0": 3.0}, rule, steady_state=steady)


def _dag(rng, rule, steady=True) -> Problem:
    """Two devices, a small pipeline-like DAG with cross edges."""
    n0, n1 = int(rng.integers(2, 4)), int(rng.integers(2, 4))
    tasks = [(f"a{i}", "g0", _opts(rng, 2 + int(rng.integers(0, 2)))) for i in range(n0)]
    tasks += [(f"b{i}", "g1", _opts(rng, 2)) for i in range(n1)]
    edges = [("a0", "b0")]
    if n0 > 1 and n1 > 1:
        edges.append(("b1", f"a{n0 - 1}") if rng.uniform() < 0.5 else ("a1", "b1"))
    return Problem.build(tasks, edges, {"g0": 3.0, "g1": 2.0}, rule, steady_state=steady)


def _check_against_brute(p: Problem, D: float, methods: list[str]) -> None:
    ch_b, e_opt = brute_force(p, D)
    assert ch_b is not None
    for m in methods:
        # a short search budget for the fast method keeps the test quick (work, not time)
        pl = solve(p, D, m, time_limit_s=0.05 if m in ("fast", "auto") else None)
        ix = p.index
        ch = [t.option for t in pl.tasks]
        # the plan reports the index's evaluation (wrap included)
        assert pl.energy_j == pytest.approx(ix.objective(ch), rel=1e-9, abs=1e-12)
        assert pl.makespan_s == pytest.approx(ix.makespan(ch), rel=1e-12, abs=1e-15)
        assert pl.makespan_s <= D * (1 + 1e-9)
        assert pl.energy_j >= e_opt * (1 - 1e-9) - 1e-12, m            # never beats brute force
        assert pl.lower_bound_j <= e_opt * (1 + 1e-6) + 1e-9, m
        assert pl.n_switches == sum(ix.switch_counts(ch).values())
        if m in ("dp", "ilp", "brute"):                 # the exact methods prove the optimum
            assert pl.status == "optimal", m
        if pl.status == "optimal":
            assert pl.energy_j == pytest.approx(e_opt, rel=1e-7, abs=1e-9), m


def test_hand_worked_two_tasks():
    """One device, tasks a then b, each at 1000 or 500 MHz; a switch costs 0.1 s and 2 J.
    a@1000 (1 s, 10 J), a@500 (2 s, 6 J); b@1000 (1 s, 10 J), b@500 (2 s, 6 J); idle 1 W.
    a@1000, b@500: one switch inside the iteration, and one back (b@500 -> a@1000)."""
    hi, lo = OperatingPoint(sm_clock_mhz=1000), OperatingPoint(sm_clock_mhz=500)
    opts = [dict(time_s=1.0, energy_j=10.0, omega=hi), dict(time_s=2.0, energy_j=6.0, omega=lo)]
    tr = ConstantTransition(0.1, 2.0)
    tasks = [("a", "g", opts), ("b", "g", opts)]
    free = Problem.build(tasks, [("a", "b")], {"g": 1.0}, tr)
    ss = Problem.build(tasks, [("a", "b")], {"g": 1.0}, tr, steady_state=True)
    ch = [0, 1]
    # not steady: start at a@1000 for free; a [0, 1], switch 0.1 s, b [1.1, 3.1]
    assert free.index.makespan(ch) == pytest.approx(3.1)
    # energy: 10 + 6 + switch max(2, 1 W·0.1 s) = 18 J; no idle time
    assert free.index.objective(ch) == pytest.approx(18.0)
    assert free.index.switch_counts(ch) == {"g": 1}
    # steady: the wrap b@500 -> a@1000 comes first: a [0.1, 1.1], b [1.2, 3.2]; 20 J
    start, end, mk = ss.index.schedule(ch)
    assert list(start) == pytest.approx([0.1, 1.2])
    assert mk == pytest.approx(3.2)
    assert ss.index.objective(ch) == pytest.approx(20.0)
    assert ss.index.switch_counts(ch) == {"g": 2}
    assert ss.index.switch_extra(ch) == (pytest.approx(2 * (2.0 - 0.1)), 2)
    # holding one clock pays nothing, steady or not
    assert ss.index.switch_counts([1, 1]) == {"g": 0}
    assert ss.index.objective([1, 1]) == pytest.approx(12.0)
    # at D = 3.15 s the mixed plan fits only without the wrap; with it, a@1000 b@1000 (2 s, 20 J)
    # (energy is over the plan's own makespan: no idle time in any of these plans)
    pl = solve(free, 3.15, "dp")
    assert pl.choice in ({"a": 0, "b": 1}, {"a": 1, "b": 0}) and pl.energy_j == pytest.approx(18.0)
    pl = solve(ss, 3.15, "dp")
    assert pl.choice == {"a": 0, "b": 0} and pl.energy_j == pytest.approx(20.0)
    assert pl.n_switches == 0 and pl.status == "optimal"


def test_switch_counts_by_hand():
    rng = np.random.default_rng(7)
    for _ in range(40):
        p = _dag(rng, RULES["pair"])
        ix = p.index
        ch = [int(rng.integers(0, k)) for k in ix.k]
        by_dev: dict[str, list[OperatingPoint]] = {}
        for t, c in zip(p.tasks, ch):
            by_dev.setdefault(t.device, []).append(t.options[c].omega.dev)
        want = {}
        for d, om in by_dev.items():
            n = sum(a != b for a, b in zip(om, om[1:]))
            want[d] = n + (len(om) > 1 and om[-1] != om[0])
        assert ix.switch_counts(ch) == want
        assert p.with_(steady_state=False).index.switch_counts(ch) == {
            d: sum(a != b for a, b in zip(om, om[1:])) for d, om in by_dev.items()}


@pytest.mark.parametrize("kind", sorted(RULES))
def test_chains_all_methods_against_brute_force(kind):
    rng = np.random.default_rng(sum(map(ord, kind)))
    methods = ["dp", "fast", "auto", "brute"] + (["ilp"] if _have_milp() else [])
    for _ in range(10):
        p = _chain(rng, RULES[kind])
        assert chain_order(p) is not None
        D = p.fastest_makespan_s() * rng.uniform(1.0, 1.5)
        _check_against_brute(p, D, methods)
        r = solve_chain(p, D, chain_order(p))
        _, e_opt = brute_force(p, D)
        assert r.exact and r.energy_j == pytest.approx(e_opt, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("kind", sorted(RULES))
def test_two_device_dags_against_brute_force(kind):
    rng = np.random.default_rng(1 + sum(map(ord, kind)))
    methods = ["fast", "auto"] + (["ilp"] if _have_milp() else [])
    for _ in range(6):
        p = _dag(rng, RULES[kind])
        D = p.fastest_makespan_s() * rng.uniform(1.0, 1.4)
        _check_against_brute(p, D, methods)


def test_chain_dp_declines_a_wrap_latency_off_the_first_position():
    """Two devices in a chain: the second device's wrap latency may overlap the first's
    work, so the makespan is not a sum; dp declines and auto picks another exact method."""
    rng = np.random.default_rng(3)
    tasks = [("a0", "g0", _opts(rng, 2)), ("a1", "g0", _opts(rng, 2)),
             ("b0", "g1", _opts(rng, 2)), ("b1", "g1", _opts(rng, 2))]
    edges = [("a0", "a1"), ("a1", "b0"), ("b0", "b1")]
    p = Problem.build(tasks, edges, {"g0": 1.0, "g1": 1.0}, ConstantTransition(0.2, 1.0),
                      steady_state=True)
    assert chain_order(p.with_(steady_state=False)) is not None
    assert chain_order(p) is None
    D = p.fastest_makespan_s() * 1.2
    with pytest.raises(ProblemError):
        solve(p, D, "dp")
    if _have_milp():
        _check_against_brute(p, D, ["auto", "ilp", "fast"])


def test_steady_state_false_is_unchanged_and_field_round_trips():
    rng = np.random.default_rng(11)
    p = _dag(rng, RULES["constant"], steady=False)      # a rule the JSON format writes
    ss = p.with_(steady_state=True)
    assert not p.steady_state and ss.steady_state
    ix = p.index
    assert all(w < 0 for w in ix.wrap_prev) and all(m is None for m in ix.wrap_tau)
    # pickling and the JSON problem format keep the flag
    assert pickle.loads(pickle.dumps(ss)).steady_state
    assert not pickle.loads(pickle.dumps(p)).steady_state
    d = problem_to_dict(ss)
    assert d["steady_state"] is True
    back = problem_from_dict(d)
    assert back.steady_state
    assert "steady_state" not in problem_to_dict(p)          # files as before
    assert not problem_from_dict(problem_to_dict(p)).steady_state
    ch = [int(rng.integers(0, k)) for k in ix.k]
    assert back.index.objective(ch) == pytest.approx(ss.index.objective(ch))
    assert ss.index.objective(ch) >= p.index.objective(ch) - 1e-12
    with pytest.raises(ProblemError):
        Problem.build({"a": ("g", [(1.0, 1.0)])}, steady_state="yes")


def test_single_task_devices_and_no_rule_pay_nothing():
    p = Problem.build({"a": ("g0", [(1.0, 2.0)]), "b": ("g1", [(1.0, 2.0)])},
                      [("a", "b")], {"g0": 1.0}, ConstantTransition(0.5, 1.0), steady_state=True)
    assert not p.has_transitions
    assert p.index.makespan([0, 0]) == pytest.approx(2.0)


def test_wrap_polish_and_fastest_plan_choice():
    from solvers.hold import wrap_polish

    rng = np.random.default_rng(5)
    for _ in range(10):
        p = _dag(rng, RULES["constant"])
        ix = p.index
        fc = p.fastest_plan_choice()
        assert ix.makespan(fc) == pytest.approx(p.fastest_makespan_s())
        D = p.fastest_makespan_s() * 1.2
        ch = wrap_polish(p, fc, D)
        assert ix.makespan(ch) <= D * (1 + 1e-9)
        assert ix.objective(ch) <= ix.objective(fc) + 1e-12
    # nothing to do without a steady state
    q = p.with_(steady_state=False)
    assert list(wrap_polish(q, fc, D)) == list(fc)


@pytest.mark.parametrize("kind", sorted(RULES))
def test_device_energies_sum_to_the_plan_energy(kind):
    """Each device's share (idle power over the makespan, its tasks beyond idle, its switches'
    extra energy, wraps included) sums to the objective and to make_plan's energy."""
    from solvers.plan import make_plan

    rng = np.random.default_rng(7)
    for steady in (True, False):
        for _ in range(20):
            p = _dag(rng, RULES[kind], steady)
            ix = p.index
            choice = [int(rng.integers(len(t.options))) for t in p.tasks]
            shares = ix.device_energies_j(choice)
            assert set(shares) == set(ix.devices)
            assert sum(shares.values()) == pytest.approx(ix.objective(choice), rel=1e-12)
            plan = make_plan(p, choice, ix.makespan(choice), method="t", lower_bound_j=0.0,
                             wall_s=0.0)
            assert sum(shares.values()) == pytest.approx(plan.energy_j, rel=1e-12)


@pytest.mark.parametrize("steady", [True, False])
@pytest.mark.parametrize("kind", ["constant", "pair"])
def test_relax_never_exceeds_its_horizon_with_switch_latencies(steady, kind):
    """A plan that meets a horizon still meets it after relax (issue 22: in a steady state
    the relax pass ignored the wrap switch into a device's first task and could overshoot).
    Random DAGs with switch latencies, random plans, horizons up to 1.3x their makespan."""
    from solvers.repair import relax, relax_repeatedly

    rng = np.random.default_rng(4200 + 2 * steady + (kind == "pair"))
    for _ in range(60):
        p = _dag(rng, RULES[kind], steady)
        ix = p.index
        for _ in range(4):
            ch = np.array([int(rng.integers(k)) for k in ix.k])
            H = ix.makespan(ch) * rng.uniform(1.0, 1.3)
            for out in (relax(p, ch, H), relax_repeatedly(p, ch, H)):
                assert ix.makespan(out) <= H * (1 + 1e-9)
