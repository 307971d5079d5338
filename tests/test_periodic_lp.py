"""The hull LP of a long pipeline through its periodic restriction and dual (solvers.periodic):
the same bound as the full LP on 1F1B and GPipe at several deadlines (interleaved 1F1B, which
repeats per group of microbatches, through the full LP), a
schedule that keeps every precedence and the deadline, a bound that is valid for any flow,
and the full LP whenever the two small LPs do not certify each other."""

import numpy as np
import pytest

import solvers.periodic as periodic
from solvers import one_f_one_b
from solvers.hull_lp import HullLP
from solvers.periodic import PeriodicHullLP, hull_lagrangian, periodic_classes
from solvers.pipeline import pipeline

REL = 1e-7     # the LPs' own tolerances


def _opts(stage: int, inst: str, chunk: int = 0) -> list[dict]:
    """Five clocks of a convex-ish time–energy curve, different per stage and instruction."""
    scale = (1 + 0.13 * stage + 0.05 * chunk) * (2.1 if inst == "backward" else 1.0)
    rng = np.random.default_rng(7 * stage + (inst == "backward") + 3 * chunk)
    out = []
    for k, f in enumerate((1980, 1700, 1400, 1100, 800)):
        t = scale * 1980 / f
        e = scale * (30.0 - 3.5 * k + 0.6 * k * k) * (1 + 0.02 * rng.random())
        out.append(dict(time_s=t, energy_j=e, s_w=10.0, sm_clock_mhz=f))
    return out


def _problem(schedule: str = "1f1b", stages: int = 4, mb: int = 28, **kw):
    if schedule == "interleaved-1f1b":
        return pipeline(schedule, stages, mb, lambda s, c, i: _opts(s, i, c), n_chunks=2,
                        idle_power_w=60.0, **kw)
    return pipeline(schedule, stages, mb, lambda s, i: _opts(s, i), idle_power_w=60.0, **kw)


def _full(p, D):
    return HullLP(p, process_min_tasks=10**9, periodic_min_tasks=None).solve(D)


def _feasible(p, res, D):
    ix = p.index
    fast = np.array([t.min() for t in ix.time])
    slow = np.array([t.max() for t in ix.time])
    assert np.all(res.time_s >= fast - 1e-9) and np.all(res.time_s <= slow + 1e-9)
    assert res.makespan_s <= D * (1 + 1e-12)
    _, end = ix.earliest(res.time_s)
    assert max(end) <= res.makespan_s * (1 + 1e-9)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "interleaved-1f1b"])
@pytest.mark.parametrize("factor", [1.0, 1.05, 1.3, 2.5])
def test_periodic_solve_equals_the_full_lp(schedule, factor):
    p = _problem(schedule)
    D = p.deadline_s(f"{factor}x")
    lp = HullLP(p, process_min_tasks=10**9, periodic_min_tasks=0)
    res = lp.solve(D)
    # interleaved 1F1B repeats every group of microbatches, not every microbatch: its
    # restriction is infeasible and the full LP answers (the same bound either way)
    taken = isinstance(lp._periodic, PeriodicHullLP)
    assert taken == (schedule != "interleaved-1f1b")
    full = _full(p, D)
    assert res.bound_j == pytest.approx(full.bound_j, rel=REL)
    assert res.bound_j <= full.bound_j * (1 + 1e-9)          # a valid bound, never above
    _feasible(p, res, D)
    # the duals conserve flow: their Lagrangian is the bound, charged nothing
    value, slope = hull_lagrangian(lp, res.duals, D)
    assert value == pytest.approx(res.bound_j, rel=1e-12)
    assert slope == pytest.approx(res.slope_j_per_s, rel=1e-9, abs=1e-9)
    lp.close()


def test_the_bound_is_valid_for_any_flow():
    """hull_lagrangian is a lower bound for every μ ≥ 0, and reaches the LP at its duals."""
    p = _problem(mb=12)
    D = p.deadline_s("1.1x")
    lp = HullLP(p, process_min_tasks=10**9, periodic_min_tasks=None)
    full = lp.solve(D)
    value, _ = hull_lagrangian(lp, full.duals, D)
    assert value == pytest.approx(full.bound_j, rel=1e-7)
    rng = np.random.default_rng(0)
    for _ in range(20):
        mu = np.maximum(full.duals * rng.uniform(0.5, 1.5, len(full.duals))
                        + rng.exponential(1.0, len(full.duals)) * (rng.random(len(full.duals)) < 0.1), 0)
        assert hull_lagrangian(lp, mu, D)[0] <= full.bound_j * (1 + 1e-9)


def test_classes_of_a_pipeline():
    p = _problem(stages=4, mb=28)              # margin 1.5 x 4 + 2 = 8: microbatches 8..19
    pc = periodic_classes(p)
    assert pc is not None and pc.n_classes == 8 and pc.margin == 8
    assert list(pc.count) == [12] * 8
    names = p.index.names
    assert all(names[int(r)].endswith("/8") for r in pc.rep)


def test_nothing_to_compress():
    assert periodic_classes(_problem(mb=14)) is None           # a middle of 14 − 16 < 4
    p = one_f_one_b(2, 3, lambda s, i: _opts(s, i), 10.0)
    assert periodic_classes(p) is None
    from test_solvers_exact import random_dag
    assert periodic_classes(random_dag(np.random.default_rng(0), 8, 3, 2)) is None   # other names


def _edited(p, name, factor):
    """``p`` with task ``name``'s times scaled by ``factor`` (options as (time, energy) pairs)."""
    from solvers.model import Problem
    tasks = [(t.name, t.device, [(o.time_s * (factor if t.name == name else 1.0), o.energy_j)
                                 for o in t.options]) for t in p.tasks]
    return Problem.build(tasks, p.edges, dict(p.idle_power_w), None, name="edited")


def test_a_middle_task_with_its_own_options_keeps_its_variables():
    q = _edited(_problem(), "s1/forward/13", 1.3)
    pc = periodic_classes(q)
    k = q.index.pos["s1/forward/13"]
    assert pc is not None and pc.cls[k] == -1 and pc.compressed == 8 * 12 - 1
    D = q.deadline_s("1.1x")
    res = HullLP(q, process_min_tasks=10**9, periodic_min_tasks=0).solve(D)
    assert res.bound_j == pytest.approx(_full(q, D).bound_j, rel=REL)


def test_not_certified_falls_back_to_the_full_lp(monkeypatch):
    p = _problem(mb=40)          # a middle left at twice the margin (16): 40 − 32 = 8
    D = p.deadline_s("1.05x")
    monkeypatch.setattr(periodic, "CERTIFY_REL_TOL", -1.0)       # never meets
    lp = HullLP(p, process_min_tasks=10**9, periodic_min_tasks=0)
    res = lp.solve(D)
    assert isinstance(lp._periodic, PeriodicHullLP) and lp._periodic.retried   # wider margin tried
    full = _full(p, D)
    assert res.bound_j == pytest.approx(full.bound_j, rel=1e-12)
    assert np.allclose(res.time_s, full.time_s)


def test_changed_options_turn_the_periodic_path_off():
    q = _edited(_problem(), "s0/forward/0", 1.0)
    single = _edited(q, "", 1.0)
    from solvers.model import Problem
    tasks = [(t.name, t.device, [(o.time_s, o.energy_j) for o in t.options][:1 if t.name.startswith("s3/") else None])
             for t in single.tasks]
    p = Problem.build(tasks, q.edges, dict(q.idle_power_w), None, name="single")
    lp = HullLP(p, process_min_tasks=10**9, periodic_min_tasks=0)
    D = p.deadline_s("1.1x")
    lp.solve(D)
    assert isinstance(lp._periodic, PeriodicHullLP)
    v = p.index.pos["s3/forward/12"]
    lp.set_single_options({v: (float(p.index.time[v][0]) * 1.2, float(p.index.cost[v][0]))})
    assert lp._periodic is False
    lp.solve(D)          # the full LP, which now describes the changed task


def test_guarded_solve_runs_in_a_child_and_gives_the_same_answer():
    p = _problem()
    D = p.deadline_s("1.05x")
    lp = HullLP(p, process_min_tasks=0, periodic_min_tasks=0)
    res = lp.solve(D)
    pl = lp._periodic
    assert isinstance(pl, PeriodicHullLP) and pl._child is not None and pl._child.pid is not None
    assert res.bound_j == pytest.approx(_full(p, D).bound_j, rel=REL)
    lp.close()
    assert pl._child.pid is None


def test_tasks_sharing_option_objects_are_checked_once_and_share_the_converted_options():
    """A pipeline's microbatches share their stage's option objects: Problem converts them
    once (131,072 tasks x 60 options took 31 s), and a bad one is still refused."""
    from solvers.errors import ProblemError
    from solvers.model import Problem
    shared = [dict(time_s=1.0, energy_j=30.0, s_w=10.0), dict(time_s=1.5, energy_j=24.0, s_w=10.0)]
    p = Problem.build([(f"t{i}", "gpu0", shared) for i in range(4)], idle_power_w={"gpu0": 10.0})
    assert all(t.options is p.tasks[0].options for t in p.tasks)
    assert p.tasks[3].options[1].time_s == 1.5
    other = [dict(time_s=1.0, energy_j=30.0, s_w=10.0), dict(time_s=1.5, energy_j=24.0, s_w=10.0)]
    q = Problem.build([("a", "gpu0", shared), ("b", "gpu0", other)], idle_power_w={"gpu0": 10.0})
    assert q.tasks[0].options is not q.tasks[1].options      # equal, not the same objects
    bad = [dict(time_s=-1.0, energy_j=30.0)]
    with pytest.raises(ProblemError, match="'t0'"):
        Problem.build([(f"t{i}", "gpu0", bad) for i in range(3)])


def test_a_stage_s_microbatches_share_read_only_option_arrays():
    """The index keeps one copy of a stage's option arrays for all its microbatches (memory at
    10^5 tasks), read-only so that no caller can change one task's through another's."""
    p = _problem(stages=2, mb=6)
    ix = p.index
    a, b = ix.pos["s1/forward/2"], ix.pos["s1/forward/5"]
    assert ix.time[a] is ix.time[b] and ix.cost[a] is ix.cost[b] and ix.stairs[a] is ix.stairs[b]
    assert ix.time[a] is not ix.time[ix.pos["s0/forward/2"]]
    with pytest.raises(ValueError):
        ix.time[a][0] = 0.0
