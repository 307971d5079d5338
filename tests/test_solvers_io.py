"""Plans and problems round-trip through JSON; bad input gives clear errors; 1F1B and Perseus."""

import json
import math

import numpy as np
import pytest

from frontier.errors import EnergyCalculusError, FormatError
from frontier.operating_point import OperatingPoint
from frontier.signature import Signature
from frontier.transition import TransitionTable
from solvers import (
    ConstantTransition,
    ParetoCurve,
    Plan,
    Problem,
    ProblemError,
    load_perseus_profile,
    load_problem,
    one_f_one_b,
    pareto,
    problem_to_dict,
    save_problem,
    solve,
    stage_order,
)
from solvers.perseus import read_perseus_profile
from solvers.plan import make_plan

EXAMPLE = "ecal/examples/pipeline_4x8.csv"


def small():
    a = [(1.0, 10.0), (2.0, 6.0)]
    return Problem.build({"a": ("g0", a), "b": ("g1", a), "c": ("g0", a)},
                         [("a", "b"), ("b", "c")], {"g0": 1.0, "g1": 1.0})


def test_plan_json_round_trip(tmp_path):
    p = small()
    pl = solve(p, "1.5x")
    pl.save(tmp_path / "plan.json")
    back = Plan.load(tmp_path / "plan.json")
    assert back == pl
    assert "energy" in pl.summary() and "gap" in pl.summary()
    curve = pareto(p, n_points=4)
    curve.save(tmp_path / "curve.json")
    back = ParetoCurve.from_dict(json.loads((tmp_path / "curve.json").read_text()))
    assert back == curve
    assert "points" in curve.summary()


def test_energy_breakdown_adds_up_and_matches_frontier_dag():
    from frontier.dag import dag_schedule

    sigs = {k: Signature(k, s_w=50.0, time_s=t, d_j=d, var_time_s2=1e-4, var_energy_j2=4.0,
                         devices={dev}, omega=OperatingPoint(sm_clock_mhz=f))
            for k, dev, t, d, f in [("a", "g0", 1.0, 30.0, 1000), ("b", "g1", 2.0, 20.0, 900),
                                   ("c", "g0", 0.5, 10.0, 1100)]}
    idle = {"g0": 40.0, "g1": 30.0}
    tr = TransitionTable.constant(0.1, 3.0)
    p = Problem.build({k: (next(iter(s.devices)), [s]) for k, s in sigs.items()}, [("a", "b"), ("b", "c")],
                      idle, tr)
    pl = make_plan(p, [0, 0, 0], 10.0, method="given", lower_bound_j=0.0, wall_s=0.0)
    assert pl.energy_j == pytest.approx(pl.static_busy_j + pl.idle_j + pl.dynamic_j + pl.transition_j)
    ref = dag_schedule(sigs, [("a", "b"), ("b", "c")], idle, transitions=tr)
    assert pl.makespan_s == pytest.approx(ref.makespan_s)
    assert pl.energy_j == pytest.approx(ref.energy_j)
    assert pl.sd_energy_j == pytest.approx(ref.signature.sd_energy_j, rel=1e-6)
    assert pl.sd_makespan_s == pytest.approx(ref.signature.sd_time_s, rel=1e-6)
    assert pl.n_switches == 1


def test_shared_measurement_counts_k_squared():
    s = Signature("x", s_w=10.0, time_s=1.0, d_j=5.0, var_energy_j2=1.0)
    p = Problem.build({f"t{i}": ("g0", [s]) for i in range(4)}, [], {"g0": 10.0})
    pl = solve(p, 10.0)
    assert pl.sd_energy_j == pytest.approx(4 * math.sqrt(1.0), rel=1e-9)   # k·σ, not √k·σ


@pytest.mark.parametrize("bad, match", [
    (lambda: Problem.build({"a": ("g0", [])}), "no options"),
    (lambda: Problem.build({"a": ("g0", [(float("nan"), 1.0)])}), "nan"),
    (lambda: Problem.build({"a": ("g0", [(-1.0, 1.0)])}), "negative"),
    (lambda: Problem.build({"a": ("g0", [(1.0, 1.0)])}, [("a", "zz")]), "unknown task 'zz'"),
    (lambda: Problem.build({"a": ("g0", [(1.0, 1.0)])}, transitions={"gpu9": ConstantTransition(1.0)}),
     "unknown device 'gpu9'"),
    (lambda: Problem.build({"a": ("g0", [(1.0, 1.0)]), "b": ("g1", [(1.0, 1.0)])},
                           [("a", "b"), ("b", "a")]), "cycle: a -> b -> a|cycle: b -> a -> b"),
    (lambda: Problem.build({"a": ("g0", [(1.0, 1.0)]), "b": ("g0", [(1.0, 1.0)])}, [("b", "a")]),
     "cycle"),
    (lambda: solve(small(), "fast please"), "deadline"),
    (lambda: solve(small(), 1.0, method="magic"), "unknown method"),
    (lambda: solve(small().with_(edges=[("a", "b")]), 100.0, method="dp"), "chain"),
])
def test_bad_input_errors(bad, match):
    with pytest.raises(EnergyCalculusError, match=match):
        bad()


def test_problem_json_round_trip_and_errors(tmp_path):
    p = small().with_(transitions={"g0": ConstantTransition(0.1, 2.0)})
    save_problem(p, tmp_path / "p.json")
    q = load_problem(tmp_path / "p.json")
    D = p.fastest_makespan_s() * 1.3
    assert solve(q, D, "ilp").energy_j == pytest.approx(solve(p, D, "ilp").energy_j)
    d = problem_to_dict(p)
    d["tasks"][1]["options"][0]["time_s"] = "slow"
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(FormatError, match=r"bad.json: tasks\[1\]\.options\[0\]\.time_s: .*number.*slow"):
        load_problem(tmp_path / "bad.json")
    d["tasks"][1]["options"][0]["time_s"] = -1.0
    (tmp_path / "neg.json").write_text(json.dumps(d))
    with pytest.raises(FormatError, match=r"neg.json: tasks\[1\]\.options\[0\]\.time_s: .*-1"):
        load_problem(tmp_path / "neg.json")
    d["tasks"][1]["options"][0]["time_s"] = 1.0
    del d["format"]
    (tmp_path / "bad2.json").write_text(json.dumps(d))
    with pytest.raises(FormatError, match="format"):
        load_problem(tmp_path / "bad2.json")


def test_one_f_one_b_structure():
    assert stage_order(0, 4, 8)[:4] == [("forward", 0), ("forward", 1), ("forward", 2), ("forward", 3)]
    assert stage_order(3, 4, 8)[:3] == [("forward", 0), ("backward", 0), ("forward", 1)]
    for s in range(4):
        order = stage_order(s, 4, 8)
        assert sorted(order) == sorted([(i, m) for i in ("forward", "backward") for m in range(8)])
    opts = {(s, i): [(0.01 * (1 + s), 1.0), (0.02 * (1 + s), 0.6)] for s in range(3) for i in ("forward", "backward")}
    p = one_f_one_b(3, 5, opts, idle_power_w=10.0)
    assert p.n_tasks == 30 and len(p.index.dev_seq) == 3
    # all-fast makespan of 1F1B with equal F/B times t per stage equals (N + S - 1)·(t_F + t_B) on
    # a uniform pipeline; here just check it's at least the critical chain F0..F2 B2..B0
    assert p.fastest_makespan_s() >= 2 * sum(0.01 * (1 + s) for s in range(3))


def test_perseus_profile_import():
    prof = read_perseus_profile(EXAMPLE)
    assert len(prof) == 8 and all(len(v) == 60 for v in prof.values())
    o = prof[(0, "forward")][0]
    assert o.s_w == 75.0 and o.omega.sm_clock_mhz == 1980
    p = load_perseus_profile(EXAMPLE)
    assert p.n_tasks == 4 * 8 * 2
    assert p.index.power["stage0"] == 75.0
    # effective energy = E − 75·T = d (Perseus' cost)
    i = p.index.pos["s0/forward/0"]
    assert np.allclose(p.index.cost[i], [x.d_j for x in p.tasks[i].options])


def test_perseus_profile_errors(tmp_path):
    f = tmp_path / "bad.csv"
    f.write_text("stage,instruction,frequency,time\n0,forward,1980,0.1\n")
    with pytest.raises(FormatError, match="bad.csv.*energy"):
        load_problem(f)
    f.write_text("stage,instruction,frequency,time,energy\n0,forward,1980,abc,1\n")
    with pytest.raises(FormatError, match="line 2"):
        load_problem(f)


def test_plots(tmp_path):
    import solvers

    p = load_perseus_profile(EXAMPLE)
    pl = solve(p, "1.1x", method="fast")
    assert pl.gap <= 0.01
    solvers.plot_timeline(pl, tmp_path / "t.png")
    c = pareto(p, n_points=3, method="fast")
    solvers.plot_pareto(c, tmp_path / "c.png")
    assert (tmp_path / "t.png").stat().st_size > 1000 and (tmp_path / "c.png").stat().st_size > 1000


def test_problem_error_is_energy_calculus_error():
    assert issubclass(ProblemError, EnergyCalculusError)


def test_pipeline_with_switches_fast_plan_is_feasible_and_bounded():
    p = load_perseus_profile(EXAMPLE, n_microbatches=4, transitions=ConstantTransition(0.002, 0.5))
    D = p.deadline_s("1.1x")
    pl = solve(p, D, method="fast")
    assert pl.makespan_s <= D * (1 + 1e-9)
    assert pl.lower_bound_j <= pl.energy_j
    assert pl.gap < 0.05


def test_dense_curve_is_consistent():
    p = load_perseus_profile(EXAMPLE, n_microbatches=4)
    c = pareto(p, n_points=6, method="fast")
    assert c.dense
    for mk, e, b in c.dense:
        assert b <= e and mk >= p.fastest_makespan_s() * (1 - 1e-12)
    grid = c.deadlines_s
    e_at = [c.energy_at(d) for d in np.linspace(grid[0], grid[-1], 25)]
    assert all(x >= y - 1e-9 for x, y in zip(e_at, e_at[1:]))     # non-increasing
    # every grid plan's energy is an upper bound of the curve at its deadline
    assert all(c.energy_at(pl.deadline_s) <= pl.energy_j + 1e-9 for pl in c.plans)


@pytest.mark.parametrize("order", ["ratio", "start"])
def test_interpolate_prefixes_run_from_slow_to_fast(order):
    from solvers.curve import interpolate

    p = load_perseus_profile(EXAMPLE, n_microbatches=4)
    ix = p.index
    fast = ix.fastest_choice()
    slow = np.array([int(np.argmin(c)) for c in ix.cost])
    ch, mk, e = interpolate(p, fast, slow, order=order)
    assert np.array_equal(ch[0], slow) and np.array_equal(ch[-1], fast)
    assert len(ch) == int((fast != slow).sum()) + 1
    for row, m, x in zip(ch, mk, e):
        assert m == pytest.approx(ix.makespan(row)) and x == pytest.approx(ix.objective(row))
    with pytest.raises(ValueError):
        interpolate(p, fast, slow, order="nope")


def test_hull_lp_warm_highs_and_linprog_agree():
    from solvers.hull_lp import HullLP

    p = load_perseus_profile(EXAMPLE, n_microbatches=4)
    warm, cold = HullLP(p), HullLP(p, warm=False)     # cold: scipy.optimize.linprog
    for f in (1.0, 1.1, 1.3):
        D = p.fastest_makespan_s() * f
        a, b = warm.solve(D), cold.solve(D)
        assert a.bound_j == pytest.approx(b.bound_j, rel=1e-7)
        assert a.slope_j_per_s == pytest.approx(b.slope_j_per_s, rel=1e-5, abs=1e-6)
