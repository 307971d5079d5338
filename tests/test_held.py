"""The switch-cost search against a held schedule (solvers.held): a move's window keeps the
schedule feasible and prices itself exactly, the searches never lose the deadline or energy
and repeat by seed, and which problems use it.

The held search applies from 6,144 tasks on; here ``MIN_TASKS`` is lowered so that a small
1F1B pipeline takes the same code path (what differs at scale is only how much it costs)."""

from __future__ import annotations

import numpy as np
import pytest
from test_lns import pipeline

import solvers.fast as fast
from solvers import held, lns, rounding
from solvers.feasibility import meets_deadline
from solvers.lns import Budget, dependency_paths, neighbourhoods, path_window


def _problem(stages: int = 3, mb: int = 6):
    p = pipeline(stages=stages, mb=mb)
    return p, 1.08 * p.fastest_makespan_s()


def _start(p, D):
    """A feasible plan with slack left to use: everyone at the fastest clock."""
    ch = np.array([int(np.argmin(p.index.time[v])) for v in range(p.index.n)])
    assert meets_deadline(p.index.makespan(ch), D)
    return ch


def _violations(p, h) -> list[str]:
    """Every constraint the held schedule breaks: dependencies, device order with the switch
    latency between the options held, the deadline, and durations that are not the options'."""
    ix = p.index
    eps = 1e-9 * h.deadline_s
    tau = ix.switch_tau(h.choice)
    dur = ix.durations(h.choice)
    bad = []
    for v in range(ix.n):
        if abs(h.dur_s[v] - dur[v]) > eps:
            bad.append(f"{ix.names[v]}: duration {h.dur_s[v]} is not its option's {dur[v]}")
        for u in ix.preds[v]:
            if h.start_s[v] < h.start_s[u] + h.dur_s[u] - eps:
                bad.append(f"{ix.names[v]} starts before its predecessor {ix.names[u]} ends")
        u = ix.dev_prev[v]
        if u >= 0 and h.start_s[v] < h.start_s[u] + h.dur_s[u] + tau[v] - eps:
            bad.append(f"{ix.names[v]} starts before {ix.names[u]} ends and the switch is done")
        if h.start_s[v] + h.dur_s[v] > h.deadline_s + eps:
            bad.append(f"{ix.names[v]} ends after the deadline")
        if h.start_s[v] < -eps:
            bad.append(f"{ix.names[v]} starts before 0")
    return bad


@pytest.fixture
def held_everywhere(monkeypatch):
    """Make every problem without a steady-state wrap use held schedules."""
    monkeypatch.setattr(held, "MIN_TASKS", 1)


def test_applies_by_size_and_not_to_steady_state(monkeypatch):
    p, _ = _problem()
    assert not held.applies(p)                       # 36 tasks < MIN_TASKS
    monkeypatch.setattr(held, "MIN_TASKS", p.index.n)
    assert held.applies(p)
    assert not held.applies(p.with_(steady_state=True))   # the wrap switch no window prices


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_hold_schedule_is_feasible_at_any_alpha(alpha):
    p, D = _problem()
    h = held.hold_schedule(p, _start(p, D), D, alpha)
    assert _violations(p, h) == []
    assert h.energy_j == pytest.approx(p.index.objective(h.choice))


def test_moves_keep_the_schedule_feasible_and_price_themselves_exactly():
    """After every accepted move: no constraint broken, and the tracked energy equals the plan's
    exact energy at the first makespan (the idle term is what a move leaves out)."""
    p, D = _problem()
    ix = p.index
    h = held.hold_schedule(p, _start(p, D), D, 0.5)
    mk0 = ix.makespan(h.choice)
    e0 = ix.objective(h.choice, mk0)
    budget = Budget.of(1e9, 600.0)
    moved = 0
    for _ in range(3):
        for path in neighbourhoods(p):
            d = held.try_path(p, h, path, 48, 160, budget)
            assert d <= 0.0
            moved += d < 0
            assert _violations(p, h) == []
            assert ix.objective(h.choice, mk0) - e0 == pytest.approx(h.energy_j - e0, abs=1e-6)
    assert moved > 0                                 # the test moved something
    assert h.since > 0


def test_window_value_and_starts_agree_with_the_chain_dp():
    """``window_value`` is the objective the chain DP minimizes (its sequence is never dearer than
    the held one) and ``window_starts`` schedules the DP's sequence inside the window."""
    p, D = _problem()
    h = held.hold_schedule(p, _start(p, D), D, 0.5)
    for path in dependency_paths(p):
        win = path_window(p, path, h.choice, h.start_s, h.dur_s, D, tol_s=1e-13 * D)
        sub = lns.chain_dp(win)
        assert sub is not None                       # the held sequence itself fits
        assert held.window_value(win, sub) <= held.window_value(win, h.choice[path]) + 1e-9
        starts = held.window_starts(win, sub)
        assert starts is not None
        assert (np.diff(starts) > 0).all()           # a path's tasks follow one another
        assert held.window_starts(win, h.choice[path]) is not None


def test_window_starts_rejects_a_sequence_that_misses_its_window():
    p, D = _problem()
    ix = p.index
    h = held.hold_schedule(p, _start(p, D), 1.0 * p.fastest_makespan_s(), 1.0)
    path = dependency_paths(p)[0]
    win = path_window(p, path, h.choice, h.start_s, h.dur_s, h.deadline_s)
    slowest = np.array([int(np.argmax(ix.time[v])) for v in path])
    assert held.window_starts(win, slowest) is None  # no slack at the fastest makespan


@pytest.mark.parametrize("stages,mb", [(3, 6), (4, 8)])
def test_polish_held_never_worse_and_meets_the_deadline(stages, mb):
    p, D = _problem(stages, mb)
    ix = p.index
    ch = _start(p, D)
    out = held.polish_held(p, ch, D, (0.5, 1.0, 0.0), neighbourhoods(p), 48, 160, Budget.of(1e9, 600.0))
    assert meets_deadline(ix.makespan(out), D)
    assert ix.objective(out) < ix.objective(ch)      # the start has slack to use
    # it ends on "a whole cycle found nothing", so a second run finds nothing more
    again = held.polish_held(p, out, D, (0.5, 1.0, 0.0), neighbourhoods(p), 48, 160,
                             Budget.of(1e9, 600.0))
    assert ix.objective(again) == pytest.approx(ix.objective(out), rel=1e-3)


def test_polish_held_spends_its_budget_and_stops():
    p, D = _problem(4, 8)
    b = Budget.of(5.0, 600.0)
    out = held.polish_held(p, _start(p, D), D, (0.5,), neighbourhoods(p), 48, 160, b)
    assert b.done()
    assert meets_deadline(p.index.makespan(out), D)


def test_iterated_polish_held_is_deterministic_by_seed_and_never_worse():
    p, D = _problem(4, 8)
    ix = p.index
    ch = _start(p, D)
    runs = [held.iterated_polish_held(p, ch, D, seed, 8, (16, 64), Budget.of(400.0, 600.0))
            for seed in (0, 0, 1)]
    assert np.array_equal(runs[0], runs[1])
    for out in runs:
        assert meets_deadline(ix.makespan(out), D)
        assert ix.objective(out) <= ix.objective(ch)


def test_searches_dispatch_to_held_schedules(held_everywhere, monkeypatch):
    p, D = _problem()
    calls = []
    real_p, real_i = held.polish_held, held.iterated_polish_held
    monkeypatch.setattr(held, "polish_held", lambda *a: calls.append("polish") or real_p(*a))
    monkeypatch.setattr(held, "iterated_polish_held", lambda *a: calls.append("iterated") or real_i(*a))
    ch = _start(p, D)
    held.polish(p, ch, D, work=50.0)
    held.iterated_polish(p, ch, D, work=50.0)
    assert calls == ["polish", "iterated"]
    calls.clear()
    held.polish(p.with_(steady_state=True), ch, D, work=50.0)
    held.iterated_polish(p.with_(steady_state=True), ch, D, work=50.0)
    assert calls == []                               # steady state keeps the exact moves
    # the search calls the dispatching ones
    from solvers import search
    assert search.polish is held.polish and search.iterated_polish is held.iterated_polish


def test_fast_solve_with_held_schedules_makes_four_starts_and_keeps_the_deadline(held_everywhere, monkeypatch):
    p, D = _problem(4, 8)
    made = []
    real = rounding.switch_starts

    def counted(*a):
        out = real(*a)
        made.append(len(out))
        return out

    monkeypatch.setattr(fast, "switch_starts", counted)
    res = fast.solve_fast(p, D)
    assert made and made[0] <= 4
    assert meets_deadline(p.index.makespan(res.choice), D)
    assert res.lower_bound_j <= p.index.objective(res.choice) + 1e-6
