"""A plan's σ is the algebra's σ on the chosen signatures (issue 19, "Plans carry the algebra's
uncertainty").

``make_plan`` propagates error over the distinct measured leaves behind the chosen options
(:attr:`solvers.model.Option.terms`), so a leaf shared by several options is correlated exactly
as ``frontier`` correlates it. The counterpart of a plan in the algebra, compared here:

* a chain on one device is ``frontier.compose.seq`` of the chosen signatures (T, E, σ_T, σ_E);
* in general (several devices, cross-device edges, idle power, ω_dev switches) it is
  ``frontier.dag.dag_schedule`` of the chosen signatures, each placed on its task's device,
  with deps = the same-device order edges *first*, then the problem's edges, and
  ``idle_power_w`` = the problem's idle power of every device, and the problem's transition
  rule. Listing the device-order edges first makes the DAG break exact ties between a
  device predecessor and a cross-device predecessor the way the plan's critical-path walk
  does (device predecessor first); at a tie the max is not differentiable and either path is
  a valid linearisation, so this is the only place the two could otherwise differ.

Scope of the comparison: the delta method at the realised ASAP schedule (both linearise each
max at its dominant argument; Clark's non-linear remainder of ⊕ options is added along the
critical path for T and over all tasks for E, as ``frontier.dag`` does). Options without
terms (Problem JSON files, Perseus CSV rows, (T, E) pairs) are each their own leaf, exactly as
before; that is checked bit for bit against the former key-based formula.
"""

from __future__ import annotations

import dataclasses
import math
import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frontier.compose import par, repeat, seq
from frontier.dag import dag, dag_schedule
from frontier.errors import FormatError
from frontier.operating_point import OperatingPoint
from frontier.signature import Signature
from solvers.io import problem_from_dict, problem_to_dict
from solvers.model import ConstantTransition, LeafTerms, Option, Problem
from solvers.pipeline import one_f_one_b
from solvers.plan import make_plan

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CLOCKS = (1000.0, 1500.0)


def _plan(problem: Problem, choice):
    return make_plan(problem, choice, 1e9, method="test", lower_bound_j=0.0, wall_s=0.0)


# -- the issue's example ------------------------------------------------------------------------

def _issue_example():
    """a⊕send and b⊕send, σ_E 1, 1 and 2 J (times exact): each composite has σ²_E = 5 J²."""
    a = Signature("a", s_w=50.0, time_s=1.0, d_j=10.0, var_energy_j2=1.0)
    b = Signature("b", s_w=50.0, time_s=1.2, d_j=12.0, var_energy_j2=1.0)
    send = Signature("send", s_w=50.0, time_s=0.5, d_j=3.0, var_energy_j2=4.0)
    return par(a, send, name="a+send"), par(b, send, name="b+send")


def test_issue_example_plan_sigma_equals_dag():
    sa, sb = _issue_example()
    p = Problem.build({"A": ("gpu0", [sa]), "B": ("gpu0", [sb])}, idle_power_w={"gpu0": 50.0})
    plan = _plan(p, [0, 0])
    alg = dag({"A": sa, "B": sb}, [("A", "B")], idle_power_w={"gpu0": 50.0})
    # send is shared: (2 + 2)² + 1 + 1 = 18 J², not 5 + 5 = 10 J².
    assert alg.sd_energy_j == pytest.approx(math.sqrt(18.0), rel=1e-12)
    assert plan.sd_energy_j == pytest.approx(alg.sd_energy_j, rel=1e-12)
    assert plan.sd_energy_j == pytest.approx(seq(sa, sb).sd_energy_j, rel=1e-12)
    # What the plan reported before: each option its own leaf (its total variances and key).
    flat = Problem.build({"A": ("gpu0", [dataclasses.replace(Option.from_signature(sa), terms=LeafTerms())]),
                          "B": ("gpu0", [dataclasses.replace(Option.from_signature(sb), terms=LeafTerms())])},
                         idle_power_w={"gpu0": 50.0})
    assert _plan(flat, [0, 0]).sd_energy_j == pytest.approx(math.sqrt(10.0), rel=1e-12)   # 3.16 J


def test_near_tie_follows_the_predecessor_that_binds():
    """c waits for a (gpu0, ends at 0.3) and for b2 (gpu1, ends at 0.1 + 0.2 =
    0.30000000000000004): b2 binds, by a rounding error. The plan's σ_T must follow the same
    chain as frontier.dag_schedule (hypothesis found the two disagreeing: 0.62 vs 0.88)."""
    def leaf(name, t, var_t):
        return Signature(name, s_w=10.0, time_s=t, d_j=1.0, var_time_s2=var_t, var_energy_j2=0.1)

    a, b1, b2, c = leaf("a", 0.3, 1e-6), leaf("b1", 0.1, 4e-4), leaf("b2", 0.2, 4e-4), leaf("c", 0.1, 1e-6)
    p = Problem.build({"a": ("gpu0", [a]), "c": ("gpu0", [c]), "b1": ("gpu1", [b1]),
                       "b2": ("gpu1", [b2])}, edges=[("b2", "c")],
                      idle_power_w={"gpu0": 0.0, "gpu1": 0.0})
    plan = _plan(p, [0, 0, 0, 0])
    sch = dag_schedule({"a": a.with_(devices={"gpu0"}), "c": c.with_(devices={"gpu0"}),
                        "b1": b1.with_(devices={"gpu1"}), "b2": b2.with_(devices={"gpu1"})},
                       [("a", "c"), ("b1", "b2"), ("b2", "c")], idle_power_w={"gpu0": 0.0, "gpu1": 0.0})
    assert sch.critical_path == ("b1", "b2", "c")
    assert plan.sd_makespan_s == pytest.approx(sch.signature.sd_time_s, rel=1e-9)
    assert plan.sd_makespan_s == pytest.approx(math.sqrt(4e-4 + 4e-4 + 1e-6), rel=1e-9)


def test_issue_example_across_two_devices():
    """The same composites on two GPUs with a cross-device edge: send is still one leaf."""
    sa, sb = _issue_example()
    sb1 = dataclasses.replace(sb, devices=frozenset({"gpu1"}))
    idle = {"gpu0": 40.0, "gpu1": 40.0}
    p = Problem.build({"A": ("gpu0", [sa]), "B": ("gpu1", [sb])}, [("A", "B")], idle)
    plan = _plan(p, [0, 0])
    sch = dag_schedule({"A": sa, "B": sb1}, [("A", "B")], idle_power_w=idle)
    assert plan.energy_j == pytest.approx(sch.energy_j, rel=1e-12)
    assert plan.sd_energy_j == pytest.approx(sch.signature.sd_energy_j, rel=1e-12)
    assert plan.sd_energy_j > math.sqrt(10.0) + 0.5


# -- random composites sharing leaves ----------------------------------------------------------------

@st.composite
def leaf_pool(draw):
    """2–5 measured leaves at one of two clocks (same s per clock, so ⊕ is allowed)."""
    n = draw(st.integers(2, 5))
    s_by_clock = {c: draw(st.floats(10.0, 120.0)) for c in CLOCKS}
    out = []
    for i in range(n):
        clock = draw(st.sampled_from(CLOCKS))
        s = s_by_clock[clock]
        var_t = draw(st.floats(0.0, 1e-2))
        var_d = draw(st.floats(0.0, 4.0))
        out.append(Signature(f"l{i}", s_w=s, time_s=draw(st.floats(0.05, 2.0)), d_j=draw(st.floats(0.0, 60.0)),
                             var_time_s2=var_t, var_energy_j2=s * s * var_t + var_d,
                             omega=OperatingPoint(sm_clock_mhz=clock)))
    return out


@st.composite
def option_sig(draw, pool):
    """A leaf, or leaf ⊗ leaf, leaf ⊕ leaf (dominant or Clark), or a leaf repeated."""
    x = draw(st.sampled_from(pool))
    same = [y for y in pool if y.omega.dev == x.omega.dev]
    y = draw(st.sampled_from(same))
    kind = draw(st.sampled_from(["leaf", "seq", "par", "clark", "repeat"]))
    if kind == "seq":
        return seq(x, y)
    if kind == "par":
        return par(x, y)
    if kind == "clark":
        return par(x, y, max_method="clark")
    if kind == "repeat":
        return repeat(x, draw(st.integers(2, 3)))
    return x


def _on(sig: Signature, device: str) -> Signature:
    # Same leaves (replace keeps the terms and their keys), placed on the task's device.
    return dataclasses.replace(sig, devices=frozenset({device}))


def _counterpart(problem: Problem, sigs: dict[str, Signature]):
    """frontier.dag_schedule of the chosen signatures, composed as the plan composes them."""
    ix = problem.index
    dev_edges = [(ix.names[a], ix.names[b]) for s in ix.dev_seq.values() for a, b in zip(s, s[1:])]
    tasks = {t.name: _on(sigs[t.name], t.device) for t in problem.tasks}
    rule = problem.transitions
    return dag_schedule(tasks, dev_edges + list(problem.edges), idle_power_w=dict(ix.power),
                        transitions=rule)


def _assert_same(plan, sch):
    sig = sch.signature
    assert plan.makespan_s == pytest.approx(sch.makespan_s, rel=1e-9)
    assert plan.energy_j == pytest.approx(sch.energy_j, rel=1e-9)
    assert plan.sd_makespan_s == pytest.approx(sig.sd_time_s, rel=1e-7, abs=1e-12)
    assert plan.sd_energy_j == pytest.approx(sig.sd_energy_j, rel=1e-7, abs=1e-9)


@SETTINGS
@given(data=st.data())
def test_chain_on_one_device_is_seq(data):
    pool = data.draw(leaf_pool())
    n = data.draw(st.integers(1, 6))
    sigs = [data.draw(option_sig(pool)) for _ in range(n)]
    idle = data.draw(st.floats(0.0, 100.0))
    p = Problem.build([(f"t{i}", "gpu0", [s]) for i, s in enumerate(sigs)], idle_power_w={"gpu0": idle})
    plan = _plan(p, [0] * n)
    alg = seq(*[_on(s, "gpu0") for s in sigs])
    assert plan.makespan_s == pytest.approx(alg.time_s, rel=1e-12)
    assert plan.energy_j == pytest.approx(alg.energy_j, rel=1e-9)
    assert plan.sd_makespan_s == pytest.approx(alg.sd_time_s, rel=1e-9, abs=1e-12)
    assert plan.sd_energy_j == pytest.approx(alg.sd_energy_j, rel=1e-9, abs=1e-9)


@SETTINGS
@given(data=st.data())
def test_random_dag_equals_frontier_dag(data):
    pool = data.draw(leaf_pool())
    n = data.draw(st.integers(1, 7))
    n_dev = data.draw(st.integers(1, 3))
    tasks, chosen, choice = [], {}, []
    for i in range(n):
        opts = [data.draw(option_sig(pool)) for _ in range(data.draw(st.integers(1, 3)))]
        j = data.draw(st.integers(0, len(opts) - 1))
        dev = f"gpu{data.draw(st.integers(0, n_dev - 1))}"
        tasks.append((f"t{i}", dev, opts))
        chosen[f"t{i}"] = opts[j]
        choice.append(j)
    edges = [(f"t{i}", f"t{j}") for i in range(n) for j in range(i + 1, n) if data.draw(st.booleans())]
    idle = {f"gpu{k}": data.draw(st.floats(0.0, 100.0)) for k in range(n_dev)}
    rule = data.draw(st.sampled_from([None, ConstantTransition(0.05, 1.0), ConstantTransition(0.0, 2.0)]))
    p = Problem.build(tasks, edges, idle, rule)
    _assert_same(_plan(p, choice), _counterpart(p, chosen))


@SETTINGS
@given(data=st.data())
def test_one_f_one_b_equals_frontier_dag(data):
    """1F1B: every microbatch of (stage, instruction) shares the option list (and leaves), and
    composites share leaves across stages (a common send)."""
    pool = data.draw(leaf_pool())
    n_st = data.draw(st.integers(1, 3))
    n_mb = data.draw(st.integers(1, 4))
    opts = {(s, i): [data.draw(option_sig(pool)) for _ in range(data.draw(st.integers(1, 2)))]
            for s in range(n_st) for i in ("forward", "backward")}
    idle = data.draw(st.floats(0.0, 100.0))
    rule = data.draw(st.sampled_from([None, ConstantTransition(0.02, 0.5)]))
    p = one_f_one_b(n_st, n_mb, opts, idle_power_w=idle, transitions=rule)
    pick = {k: data.draw(st.integers(0, len(v) - 1)) for k, v in opts.items()}
    choice, chosen = [], {}
    for t in p.tasks:
        s, inst, _ = t.name.split("/")
        j = pick[(int(s[1:]), inst)]
        choice.append(j)
        chosen[t.name] = opts[(int(s[1:]), inst)][j]
    _assert_same(_plan(p, choice), _counterpart(p, chosen))


# -- options without terms: exactly as before ---------------------------------------------------

def _old_sigma(problem: Problem, choice, crit):
    """The former key-based formula of make_plan (each option its own leaf)."""
    ix = problem.index
    d_t, d_e_t, d_e_d, var = {}, {}, {}, {}
    for i in range(ix.n):
        o = problem.tasks[i].options[choice[i]]
        k = o.key
        var[k] = (o.var_time_s2, o.var_d_j2)
        d_e_d[k] = d_e_d.get(k, 0.0) + 1.0
        d_e_t[k] = d_e_t.get(k, 0.0) + (o.s_w - ix.power[ix.device[i]])
        if crit[i]:
            d_t[k] = d_t.get(k, 0.0) + 1.0
            d_e_t[k] += ix.p_total
    var_t = sum(d_t.get(k, 0.0) ** 2 * v[0] for k, v in var.items())
    var_e = sum(d_e_t[k] ** 2 * v[0] + d_e_d[k] ** 2 * v[1] for k, v in var.items())
    return math.sqrt(var_t), math.sqrt(var_e)


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_options_without_terms_are_unchanged(data):
    n_st = data.draw(st.integers(1, 3))
    n_mb = data.draw(st.integers(1, 4))
    num = st.floats(0.01, 2.0)
    opts = {(s, i): [{"time_s": data.draw(num), "energy_j": 100.0 + data.draw(num),
                      "s_w": data.draw(st.floats(0.0, 40.0)), "sd_time_s": data.draw(st.floats(0, 0.1)),
                      "sd_energy_j": data.draw(st.floats(0, 2.0))} for _ in range(2)]
            for s in range(n_st) for i in ("forward", "backward")}
    p = one_f_one_b(n_st, n_mb, opts, idle_power_w=data.draw(st.floats(0.0, 60.0)))
    choice = [data.draw(st.integers(0, 1)) for _ in p.tasks]
    assert all(not o.terms for t in p.tasks for o in t.options)
    plan = _plan(p, choice)
    start, end, _ = p.index.schedule(choice)
    crit = [False] * p.index.n   # the critical-path walk both formulas share
    for v in p.index.critical_chain(start, end, p.index.switch_tau(choice)):
        crit[v] = True
    assert (plan.sd_makespan_s, plan.sd_energy_j) == _old_sigma(p, choice, crit)


# -- the terms travel -------------------------------------------------------------------------------

def _shared_problem() -> Problem:
    sa, sb = _issue_example()
    clark = par(sa, sb, max_method="clark")
    return Problem.build({"A": ("gpu0", [sa, clark]), "B": ("gpu1", [sb, (1.0, 80.0)])}, [("A", "B")],
                         {"gpu0": 30.0, "gpu1": 30.0})


@pytest.mark.parametrize("choice", [[0, 0], [1, 0], [1, 1]])
def test_problem_json_round_trip_keeps_terms(choice):
    p = _shared_problem()
    back = problem_from_dict(problem_to_dict(p))
    assert [o.terms for t in back.tasks for o in t.options] == [o.terms for t in p.tasks for o in t.options]
    assert _plan(back, choice).sd_energy_j == _plan(p, choice).sd_energy_j
    assert _plan(back, choice).sd_makespan_s == _plan(p, choice).sd_makespan_s


def test_problem_with_terms_pickles():
    p = _shared_problem()
    back = pickle.loads(pickle.dumps(p))
    assert _plan(back, [1, 0]).sd_energy_j == _plan(p, [1, 0]).sd_energy_j


@pytest.mark.parametrize("bad, where", [
    ({"k": {"var_time_s2": 0.0, "var_d_j2": 1.0, "dT_dT": 1.0, "dE_dT": 1.0}}, "tasks[0].options[0].terms.k"),
    ({"k": {"var_time_s2": -1.0, "var_d_j2": 1.0, "dT_dT": 1.0, "dE_dT": 1.0, "dE_dd": 1.0}},
     "tasks[0].options[0].terms.k.var_time_s2"),
    ({}, "tasks[0].options[0].terms"),
])
def test_bad_terms_name_the_field(bad, where):
    d = {"schema_version": "ecal.problem/1",
         "tasks": [{"name": "a", "device": "gpu0", "options": [{"time_s": 1.0, "energy_j": 2.0, "terms": bad}]}]}
    with pytest.raises(FormatError) as exc:
        problem_from_dict(d, "p.json")
    assert where in str(exc.value)


def test_demo_style_option_keeps_terms_through_replace():
    """ecal.demo relabels options with dataclasses.replace: the leaf terms survive."""
    sa, _ = _issue_example()
    o = dataclasses.replace(Option.from_signature(sa), label="x", omega=OperatingPoint(sm_clock_mhz=990.0))
    assert set(o.terms) == set(sa.terms)
