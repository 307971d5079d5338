"""Hold starts (solvers.hold): what they change, what they keep, and when there are none."""

from pathlib import Path

import numpy as np
import pytest
from test_lns import pipeline
from test_solvers_exact import TR

from solvers import ConstantTransition, load_perseus_profile, one_f_one_b
from solvers.hold import HOLD_WINDOWS, best_hold_start, hold_start
from solvers.relax import solve_fast

EXAMPLE = Path(__file__).resolve().parents[1] / "ecal" / "examples" / "pipeline_4x8.csv"


@pytest.fixture(scope="module")
def example():
    """The bundled 4x8 profile (60 clocks) with 1 ms switches at 1.2x and a searched plan."""
    p = load_perseus_profile(EXAMPLE, 75.0, 8, transitions=ConstantTransition(1e-3, 0.075))
    D = p.deadline_s("1.2x")
    return p, D, solve_fast(p, D, polish_s=0.5).choice


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
    from test_solvers_exact import ClockDistance, random_dag

    rng = np.random.default_rng(seed)
    p = random_dag(rng, 30, 4, 3, [TR, ClockDistance()][seed % 2])
    for fac in ("1.05x", "1.5x"):
        D = p.deadline_s(fac)
        held = best_hold_start(p, p.index.fastest_choice(), D)
        assert held is None or p.index.makespan(held) <= D * (1 + 1e-9)
        fr = solve_fast(p, D, polish_s=0.2)
        assert p.index.makespan(fr.choice) <= D * (1 + 1e-9)
        assert fr.lower_bound_j <= fr.energy_j + 1e-9
