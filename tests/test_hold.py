"""Hold starts (solvers.hold): what they change, what they keep, and when there are none."""

from pathlib import Path

import numpy as np
import pytest
from test_lns import pipeline
from test_solvers_exact import TR

from solvers import ConstantTransition, load_perseus_profile, one_f_one_b
from solvers.fast import solve_fast
from solvers.hold import (
    best_hold_start,
    held_problem,
    held_problem_values,
    hold_start,
    replan_levels,
)
from solvers.hull_lp import HullLP
from solvers.lns import Budget
from solvers.options import HoldOptions, SearchOptions
from solvers.search import replan_hold

HOLD_WINDOWS = HoldOptions().windows
REPLAN_WINDOW = HoldOptions().replan_window
FIRST_SEARCH = SearchOptions().settings

EXAMPLE = Path(__file__).resolve().parents[1] / "ecal" / "examples" / "pipeline_4x8.csv"


@pytest.fixture(scope="module")
def example():
    """The bundled 4x8 profile (60 clocks) with 1 ms switches at 1.2x and the fast method's
    plan before its search (a searched plan leaves some windows nothing to hold, and which
    ones moves with the search's tuning)."""
    p = load_perseus_profile(EXAMPLE, 75.0, 8, transitions=ConstantTransition(1e-3, 0.075))
    D = p.deadline_s("1.2x")
    return p, D, solve_fast(p, D, search_work=0.0).choice


def test_hold_start_holds_at_most_two_clocks_per_device_inside_its_window(example):
    p, D, base = example
    ix = p.index
    found = [(w, hold_start(p, base, D, w)) for w in HOLD_WINDOWS]
    found = [(w, h) for w, h in found if h is not None]
    assert found, "the bundled example has a steady middle in some window"
    start, _, m = ix.schedule(base)
    for (lo, hi), (energy_j, ch) in found:
        assert ix.makespan(ch) <= D * (1 + 1e-9)
        assert energy_j == pytest.approx(ix.objective(ch))
        inside = (start >= lo * m) & (start <= hi * m)
        assert np.array_equal(ch[~inside], base[~inside])          # the ramps are kept
        for seq in ix.dev_seq.values():
            held = [v for v in seq if inside[v]]
            omegas = [p.tasks[v].options[ch[v]].omega.dev for v in held]
            switches = sum(a != b for a, b in zip(omegas, omegas[1:]))
            assert switches <= 1                              # one level, or slow then fast


def test_best_hold_start_is_the_cheapest_window(example):
    p, D, base = example
    found = [h for h in (hold_start(p, base, D, w) for w in HOLD_WINDOWS) if h is not None]
    best = best_hold_start(p, base, D)
    assert p.index.objective(best) == pytest.approx(min(e for e, _ in found))


def test_no_hold_start_without_switch_costs_or_a_steady_middle():
    p = pipeline(tr=None)                       # no switch costs: nothing to hold
    D = p.deadline_s("1.2x")
    assert best_hold_start(p, p.index.fastest_choice(), D) is None
    short = one_f_one_b(1, 1, lambda s, i: [dict(time_s=1.0, energy_j=5.0, sm_clock_mhz=1980),
                                           dict(time_s=2.0, energy_j=4.0, sm_clock_mhz=990)],
                        1.0, TR)                # F starts at 0: at most one task in any window
    assert best_hold_start(short, short.index.fastest_choice(), short.deadline_s("1.5x")) is None


def test_a_deadline_no_level_meets_gives_none(example):
    p, _, base = example
    fastest = p.fastest_makespan_s()
    assert hold_start(p, base, fastest * 0.999) is None


@pytest.mark.parametrize("seed", range(8))
def test_hold_starts_on_random_dags_meet_the_deadline(seed):
    # generic DAGs, constant and pair-dependent switch costs: a start, when there is one,
    # is feasible, and the fast method's plan stays feasible and above its bound
    from test_solvers_exact import TR_PAIR, random_dag

    rng = np.random.default_rng(seed)
    p = random_dag(rng, 30, 4, 3, [TR, TR_PAIR][seed % 2])
    for fac in ("1.05x", "1.5x"):
        D = p.deadline_s(fac)
        held = best_hold_start(p, p.index.fastest_choice(), D)
        assert held is None or p.index.makespan(held) <= D * (1 + 1e-9)
        fr = solve_fast(p, D, search_work=750.0)
        assert p.index.makespan(fr.choice) <= D * (1 + 1e-9)
        assert fr.lower_bound_j <= fr.energy_j + 1e-9


@pytest.fixture(scope="module")
def longer():
    """The bundled profile with 16 microbatches (a longer steady middle) at 1.05x, 1 ms switches,
    the fast method's plan without its search (the same on any machine) and the levels a
    re-plan screens."""
    p = load_perseus_profile(EXAMPLE, 75.0, 16, transitions=ConstantTransition(1e-3, 0.075))
    D = p.deadline_s("1.05x")
    base = solve_fast(p, D, search_work=0.0).choice
    cores, levels = replan_levels(p, base, D, REPLAN_WINDOW)
    return p, D, base, cores, levels


def test_held_problem_keeps_order_and_expands_to_the_held_options(longer):
    p, D, base, cores, levels = longer
    assert len(levels) >= 2 and cores
    hp = held_problem(p, cores, levels[1])
    q = hp.problem
    assert [t.name for t in q.tasks] == [t.name for t in p.tasks]
    assert hp.fixed == held_problem_values(p, cores, levels[1])
    for v, k in hp.fixed.items():
        assert q.tasks[v].options == (p.tasks[v].options[k],)
    ch = hp.expand(np.zeros(q.index.n, dtype=int))
    assert all(ch[v] == k for v, k in hp.fixed.items())
    assert q.index.objective(np.zeros(q.index.n, dtype=int)) == pytest.approx(p.index.objective(ch))


def test_screening_lp_updated_in_place_equals_a_fresh_one(longer):
    p, D, base, cores, levels = longer
    ix = p.index
    lp = HullLP(held_problem(p, cores, levels[0]).problem)
    lp.solve(D)
    feasible = 0
    for level in levels[1:4] + levels[:1]:
        lp.set_single_options({v: (ix.time[v][k], ix.cost[v][k])
                               for v, k in held_problem_values(p, cores, level).items()})
        try:
            fresh = HullLP(held_problem(p, cores, level).problem).solve(D).bound_j
        except RuntimeError:                    # a level too slow for any ramps: both say so
            with pytest.raises(RuntimeError, match="infeasible"):
                lp.solve(D)
            lp = HullLP(held_problem(p, cores, levels[0]).problem)   # its warm model is gone
            continue
        assert lp.solve(D).bound_j == pytest.approx(fresh, rel=1e-9)
        feasible += 1
    assert feasible >= 2
    free = next(v for v in range(ix.n) if v not in held_problem_values(p, cores, levels[0]) and ix.k[v] > 1)
    with pytest.raises(ValueError, match="more than one"):
        lp.set_single_options({free: (1.0, 1.0)})


def test_replan_meets_the_deadline_and_holds_one_clock_per_device_in_its_window(longer):
    p, D, base, cores, levels = longer
    ix = p.index
    ch = replan_hold(p, base, D, REPLAN_WINDOW, Budget.of(2000, 30), FIRST_SEARCH)
    assert ch is not None
    assert ix.makespan(ch) <= D * (1 + 1e-9)
    assert ix.objective(ch) < ix.objective(base)     # measured: 3268.8 J against 3284.6 J
    held = held_problem_values(p, cores, levels[0])
    for seq in ix.dev_seq.values():
        omegas = {p.tasks[v].options[ch[v]].omega.dev for v in seq if v in held}
        assert len(omegas) <= 1


def test_replan_spends_nothing_when_the_held_lp_cannot_beat_the_plan(example):
    p, D, base = example            # 4x8 at 1.2x: every held problem's LP is above the plan
    budget = Budget.of(2000, 30)
    assert replan_hold(p, base, D, REPLAN_WINDOW, budget, FIRST_SEARCH) is None
    assert budget.used == 0


def test_no_hold_start_above_max_tasks(example):
    """Holds are tried up to ``HoldOptions.max_tasks`` tasks only (costly at 8,192 tasks)."""
    p, D, base = example
    assert best_hold_start(p, base, D) is not None
    assert best_hold_start(p, base, D, HoldOptions(max_tasks=p.n_tasks)) is not None
    assert best_hold_start(p, base, D, HoldOptions(max_tasks=p.n_tasks - 1)) is None
