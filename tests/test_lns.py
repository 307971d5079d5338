"""Path re-planning (solvers.lns): windows, the chain DP against brute force, dependency paths,
and the iterated search never losing feasibility or energy."""

import itertools

import numpy as np
import pytest
from test_solvers_exact import TR, random_dag

from solvers import ConstantTransition, Plan, one_f_one_b
from solvers.fast import solve_fast
from solvers.lns import chain_dp, dependency_paths, iterated_polish, neighbourhoods, path_window
from solvers.options import SearchOptions, SolveOptions
from solvers.search import final_polish


def _clock_opts(clocks, scale=1.0):
    table = {1980: (1.0, 30.0), 1600: (1.2, 26.0), 1200: (1.5, 24.0)}
    return [dict(time_s=scale * table[c][0], energy_j=scale * table[c][1], s_w=10.0, sm_clock_mhz=c)
            for c in clocks]


def _opts(scale):
    return _clock_opts((1980, 1600, 1200), scale)


def pipeline(tr=TR, stages=3, mb=4):
    return one_f_one_b(stages, mb, lambda s, i: _opts((1 + 0.1 * s) * (2 if i == "backward" else 1)),
                       10.0, tr)


def test_dependency_paths_cover_1f1b_microbatches():
    p = pipeline()
    ix = p.index
    paths = dependency_paths(p)
    names = [[ix.names[v] for v in q] for q in paths]
    # a microbatch's forwards down the stages, the last stage's backward, backwards back up
    # (then on along device order while that keeps the path valid)
    first = next(q for q in names if q[0] == "s0/forward/0")
    assert first[:6] == ["s0/forward/0", "s1/forward/0", "s2/forward/0", "s2/backward/0",
                         "s1/backward/0", "s0/backward/0"]
    covered = sorted(v for q in paths for v in q)
    assert covered == sorted(set(covered))                 # disjoint
    assert len(covered) == ix.n
    assert len(neighbourhoods(p)) == len(paths) + 3        # + one chain per device


def _brute_path(p, path, ch, S, dur, D):
    """Cheapest feasible option sequence for ``path`` with everything else fixed, by enumeration."""
    ix = p.index
    best, arg = np.inf, None
    for combo in itertools.product(*(range(ix.k[v]) for v in path)):
        new = ch.copy()
        new[path] = combo
        d = ix.durations(new)
        tau = ix.switch_tau(new)
        st = S.copy()
        ok = True
        # path tasks as early as possible, in path order; fixed tasks stay at S
        for v in path:
            s = 0.0
            for u in ix.preds[v]:
                s = max(s, st[u] + d[u])
            u = ix.dev_prev[v]
            if u >= 0:
                s = max(s, st[u] + d[u] + tau[v])
            st[v] = s
        for v in range(ix.n):
            for u in ix.preds[v]:
                ok &= st[v] >= st[u] + d[u] - 1e-12
            u = ix.dev_prev[v]
            if u >= 0:
                ok &= st[v] >= st[u] + d[u] + tau[v] - 1e-12
            ok &= st[v] + d[v] <= D + 1e-12
        if not ok:
            continue
        c = sum(ix.cost[v][new[v]] for v in range(ix.n)) + ix.switch_extra(new)[0]
        if c < best - 1e-12:
            best, arg = c, np.array(combo)
    return best, arg


@pytest.mark.parametrize("which", [0, 2, 3])
@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_chain_dp_matches_brute_force_on_a_window(which, alpha):
    p = pipeline(mb=2)
    ix = p.index
    D = p.fastest_makespan_s() * 1.3
    ch = solve_fast(p, D, search_work=0.0).choice
    start, end, _ = ix.schedule(ch)
    dur = end - start
    S = alpha * start + (1 - alpha) * (ix.latest(ch, D) - dur)
    path = neighbourhoods(p)[which]
    assert len(path) <= 8
    best, arg = _brute_path(p, path, ch, S, dur, D)
    got = chain_dp(path_window(p, path, ch, S, dur, D, tol_s=1e-12 * D), cap=10**6, gcap=10**6)
    assert arg is not None and got is not None
    new = ch.copy()
    new[path] = got
    cost = lambda c: sum(ix.cost[v][c[v]] for v in range(ix.n)) + ix.switch_extra(c)[0]  # noqa: E731
    assert cost(new) == pytest.approx(best, rel=1e-12, abs=1e-9)
    assert ix.makespan(new) <= D * (1 + 1e-9)


def test_path_window_rejects_split_device_neighbours():
    p = pipeline()
    ix = p.index
    seq = ix.dev_seq["stage0"]
    other = ix.dev_seq["stage1"][0]
    ch = ix.fastest_choice()
    start, end, _ = ix.schedule(ch)
    with pytest.raises(ValueError, match="device neighbour"):
        path_window(p, [seq[0], other, seq[1]], ch, start, end - start, 100.0)


@pytest.mark.parametrize("seed", range(6))
def test_iterated_polish_keeps_deadline_never_worsens_and_is_reproducible(seed):
    rng = np.random.default_rng(900 + seed)
    p = random_dag(rng, int(rng.integers(6, 10)), 3, int(rng.integers(2, 4)), ConstantTransition(0.1, 2.0))
    D = p.fastest_makespan_s() * rng.uniform(1.05, 1.5)
    start = solve_fast(p, D, search_work=0.0).choice
    ix = p.index
    a = iterated_polish(p, start, D, work=500.0, seed=seed)
    assert ix.makespan(a) <= D * (1 + 1e-9)
    assert ix.objective(a) <= ix.objective(start) * (1 + 1e-12)
    assert np.array_equal(a, iterated_polish(p, start, D, work=500.0, seed=seed))   # work, not time


@pytest.mark.parametrize("seed", range(4))
def test_final_polish_starts_from_the_cheapest_plan_that_meets_the_deadline(seed):
    from solvers.lns import Budget

    rng = np.random.default_rng(950 + seed)
    p = random_dag(rng, int(rng.integers(6, 10)), 3, int(rng.integers(2, 4)), ConstantTransition(0.1, 2.0))
    ix = p.index
    fastest = ix.fastest_choice()
    slowest = np.array([int(np.argmax(ix.time[v])) for v in range(ix.n)])
    D = 0.5 * (ix.makespan(fastest) + ix.makespan(slowest))    # the slowest plan is late
    good = solve_fast(p, D, search_work=0.0).choice
    out = final_polish(p, [fastest, slowest, good], D, Budget.of(10_000, 5.0))
    assert ix.makespan(out) <= D * (1 + 1e-9)
    assert ix.objective(out) <= min(ix.objective(good), ix.objective(fastest)) * (1 + 1e-12)
    late = final_polish(p, [slowest], D, Budget.of(10_000, 5.0))
    assert np.array_equal(late, slowest)     # nothing meets the deadline: returned untouched


@pytest.mark.parametrize("deadline", ["1.05x", "1.3x"])
def test_later_final_stages_only_lower_the_energy(deadline):
    """The search and the first final stage give the plan they gave alone; the wider stage
    after them starts from it and keeps it unless it finds a cheaper one."""
    from dataclasses import replace

    from solvers.fast import polish_budget
    from solvers.feasibility import plan_meets_deadline
    from solvers.portfolio import portfolio_members
    from solvers.rounding import switch_starts
    from solvers.search import run_member

    p = pipeline(stages=4, mb=6)
    D = p.deadline_s(deadline)
    starts = switch_starts(p, *_flow_and_lp(p, D), D, [D])
    work, _ = polish_budget(p.n_tasks)
    cap = 120.0                           # work alone stops both runs, however busy the machine
    opts = SolveOptions()
    member = portfolio_members(p.n_tasks, opts)[0]
    both = run_member(p, starts, D, work, cap, member, opts)
    one = replace(opts, search=replace(opts.search, final_stages=opts.search.final_stages[:1]))
    first = run_member(p, starts, D, work, cap, member, one)
    ix = p.index
    assert plan_meets_deadline(p, both.choice, D)
    assert ix.objective(both.choice) <= ix.objective(first.choice) * (1 + 1e-12)
    assert both.work_units >= first.work_units and not (both.capped_by_time or first.capped_by_time)


def _flow_and_lp(p, D):
    from solvers.hull_lp import HullLP
    from solvers.lagrangian import flow_from_duals

    lp = HullLP(p)
    res = lp.solve(D)
    return flow_from_duals(p, lp, res.duals, D), res


@pytest.mark.parametrize("seed", range(6))
def test_lockstep_viterbi_equals_the_per_device_loop_bit_for_bit(seed):
    """Devices stepped together with O(options) switches give the per-device loop's value
    and choice exactly, ties included (prices rounded so that many options tie)."""
    from solvers.lagrangian import device_viterbi, lockstep_layout

    p = pipeline(stages=3, mb=5)
    ix = p.index
    assert lockstep_layout(ix) is not None              # 1F1B: one constant switch, equal lengths
    rng = np.random.default_rng(2100 + seed)
    for _ in range(10):
        f = rng.random(ix.n) * rng.choice([0.0, 1.0, 30.0])
        mu = rng.random(ix.n) * rng.choice([0.0, 5.0, 100.0])
        if seed % 2:
            f, mu = np.round(f), np.round(mu)
        fast = device_viterbi(p, f, mu)
        slow = device_viterbi(p, f, mu, lockstep=False)     # the per-device loop
        assert fast[0] == slow[0] and np.array_equal(fast[1], slow[1])


def test_lockstep_needs_equal_devices_and_constant_switches():
    from test_solvers_exact import TR_PAIR

    from solvers.lagrangian import lockstep_layout

    assert lockstep_layout(pipeline(tr=TR_PAIR).index) is None      # cost depends on the pair
    rng = np.random.default_rng(5)
    uneven = random_dag(rng, 7, 3, 2, ConstantTransition(0.1, 1.0))  # 4 and 3 tasks per device
    assert lockstep_layout(uneven.index) is None


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("share", [0.2, 1.0])
def test_surrogate_duals_give_a_valid_bound(seed, share):
    from solvers.brute import brute_force
    from solvers.hull_lp import HullLP
    from solvers.lagrangian import lagrangian_bound, switch_surrogate_duals

    rng = np.random.default_rng(1200 + seed)
    p = random_dag(rng, int(rng.integers(4, 8)), 3, int(rng.integers(1, 3)), ConstantTransition(0.3, 3.0))
    D = p.fastest_makespan_s() * rng.uniform(1.0, 1.4)
    _, e_opt = brute_force(p, D)
    lp = HullLP(p)
    mu = switch_surrogate_duals(p, lp, D, share)
    if mu is None:
        pytest.skip("surrogate LP infeasible at this deadline")
    assert lagrangian_bound(p, lp, mu, D)[0] <= e_opt * (1 + 1e-9)


def test_budget_counts_work_and_charges_parents():
    from solvers.lns import Budget

    b = Budget.of(work=100, seconds=60.0)
    b.spend(40)
    assert b.left == 60 and not b.done()
    child = b.part(work=80, seconds=10.0)
    assert child.work == 60                      # never more than the parent has left
    child.spend(60)
    assert child.done() and b.done() and b.used == 100
    assert Budget.of(seconds=0.0).done()         # the wall-clock cap alone also ends a search


def test_polish_without_work_changes_nothing_and_work_bounds_it():
    from solvers.lns import Budget, polish

    p = pipeline(stages=3, mb=6)
    D = p.fastest_makespan_s() * 1.2
    start = solve_fast(p, D, search_work=0.0).choice
    assert np.array_equal(polish(p, start, D, work=0.0), start)
    b = Budget.of(work=5.0)
    polish(p, start, D, budget=b)
    assert 5.0 <= b.used < 5.0 + 50.0            # stops right after the path that crosses it


@pytest.mark.parametrize("seed", range(8))
def test_windowed_rounding_meets_the_deadline(seed):
    from solvers.hull_lp import HullLP
    from solvers.lns import windowed_rounding

    rng = np.random.default_rng(1500 + seed)
    p = random_dag(rng, int(rng.integers(5, 10)), 3, int(rng.integers(1, 4)), ConstantTransition(0.1, 1.0))
    D = p.fastest_makespan_s() * rng.uniform(1.0, 1.5)
    res = HullLP(p).solve(D)
    ch = windowed_rounding(p, res.time_s, D)
    if ch is not None:
        assert p.index.makespan(ch) <= D * (1 + 1e-9)
    slow = np.array([t.max() for t in p.index.time])
    assert windowed_rounding(p, slow * 10, D) is None       # the fractional schedule misses D


def test_windowed_rounding_on_1f1b_is_feasible_and_holds_clocks():
    from solvers.hull_lp import HullLP
    from solvers.lns import windowed_rounding

    p = pipeline(stages=3, mb=6)
    D = p.fastest_makespan_s() * 1.15
    ch = windowed_rounding(p, HullLP(p).solve(D).time_s, D)
    assert ch is not None and p.index.makespan(ch) <= D * (1 + 1e-9)


_REPRO = """
import hashlib, sys
sys.path.insert(0, {tests!r})
import numpy as np
from test_lns import pipeline
from test_hold import EXAMPLE
from solvers import ConstantTransition, load_perseus_profile
from solvers.fast import solve_fast
p = {problem}
r = solve_fast(p, p.fastest_makespan_s() * 1.1)
print(repr(r.energy_j), hashlib.md5(np.asarray(r.choice).tobytes()).hexdigest())
"""


@pytest.mark.parametrize("problem", [
    "pipeline(stages=3, mb=5)",
    # long enough for a held re-plan (solvers.search.replan_hold)
    "load_perseus_profile(EXAMPLE, 75.0, 16, transitions=ConstantTransition(1e-3, 0.075))"])
def test_fast_search_is_reproducible_across_processes(problem):
    # work budgets, not seconds, end the search; nothing may depend on str hashing order
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    code = _REPRO.format(tests=str(here), problem=problem)
    outs = []
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                           cwd=here.parent, timeout=300)
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout.strip())
    assert outs[0] == outs[1]


def test_fast_plan_reports_its_search_and_a_time_cap():
    from solvers import solve

    p = pipeline(stages=3, mb=4)
    plan = solve(p, "1.2x", method="fast")
    s = plan.meta["search"]
    # The search is budgeted by work alone: it spends its work (the final polish may stop
    # earlier, when it finds nothing); the default safety net is far out of reach.
    assert not s["capped_by_time"] and not plan.time_capped
    assert s["work_units"] >= s["work_budget"] / (1 + SearchOptions().final_shares())
    assert "note:" not in plan.summary()
    tiny = solve(p, "1.2x", method="fast", time_limit_s=1e-9)       # the safety net fires at once
    assert tiny.meta["search"]["capped_by_time"] and tiny.time_capped
    assert "safety net" in tiny.summary() and tiny.makespan_s <= tiny.deadline_s * (1 + 1e-9)
    assert Plan.from_dict(tiny.to_dict()).time_capped
    assert "search" not in solve(pipeline(tr=None), "1.2x", method="fast").meta   # no switch costs


def test_switch_cost_curve_shares_one_search_and_is_reproducible():
    from solvers import pareto

    # Reproducible means: the same work gives the same curve (no wall-clock budget).
    p = pipeline(stages=3, mb=4)
    a = pareto(p, n_points=6, method="fast")
    b = pareto(p, n_points=6, method="fast")
    assert [pl.energy_j for pl in a.plans] == [pl.energy_j for pl in b.plans]
    assert not a.time_capped and not any(pl.time_capped for pl in a.plans)
    capped = pareto(p, n_points=4, method="fast", time_limit_s=1e-9)   # every point says so
    assert capped.time_capped and all(pl.time_capped for pl in capped.plans)
    assert "time-capped" in capped.summary()
    energies = [pl.energy_j for pl in a.plans]
    assert all(x >= y - 1e-9 for x, y in zip(energies, energies[1:]))     # non-increasing
    assert all(pl.makespan_s <= pl.deadline_s * (1 + 1e-9) for pl in a.plans)
    assert all(pl.lower_bound_j <= pl.energy_j + 1e-9 for pl in a.plans)


def test_curve_with_energy_only_switch_costs_claims_only_achievable_energy():
    # Switches that cost energy but no time: the curve must still count them. Interpolated
    # (dense) points price options without switch costs, so such a curve has none, and every
    # energy it reports is at least the true optimum at that deadline (by enumeration).
    from solvers import pareto

    p = pipeline(tr=ConstantTransition(0.0, 3.0), stages=2, mb=2)
    ix = p.index
    every = [(ix.makespan(ch), ix.objective(ch)) for ch in itertools.product(*(range(k) for k in ix.k))]
    mk, e = np.array(every).T

    def optimum(D):
        return float(e[mk <= D * (1 + 1e-12)].min())

    c = pareto(p, n_points=8, method="fast")
    assert c.dense == ()
    for pl in c.plans:
        assert pl.energy_j >= optimum(pl.deadline_s) - 1e-9
    for D in np.linspace(c.deadlines_s[0], c.deadlines_s[-1], 23):
        assert c.energy_at(float(D)) >= optimum(D) - 1e-9


@pytest.mark.parametrize("slack", [1.0, 1.15, 1.4])
def test_device_neighbours_with_different_option_lists(slack):
    """Consecutive tasks on a device may list different clocks, in other orders: the chain DP
    must match options by their switch cost, not by index (this crashed when a task with one
    option followed one with three)."""
    from solvers import Problem, solve

    tasks = [("a", "gpu0", _clock_opts([1980, 1600, 1200])),
             ("b", "gpu0", _clock_opts([1600], 2.0)),
             ("c", "gpu0", _clock_opts([1200, 1980, 1600])),
             ("d", "gpu0", _clock_opts([1980, 1200])),
             ("x", "gpu1", _clock_opts([1980, 1200], 3.0))]
    p = Problem.build(tasks, [("a", "b"), ("b", "c"), ("c", "d"), ("x", "d")], {"gpu0": 5.0, "gpu1": 5.0},
                      ConstantTransition(0.05, 1.0))
    ix = p.index
    D = p.fastest_makespan_s() * slack
    best = solve(p, D, method="brute")
    fast = solve(p, D, method="fast")
    assert fast.makespan_s <= D * (1 + 1e-9)
    assert fast.lower_bound_j <= best.energy_j * (1 + 1e-9) <= fast.energy_j * (1 + 2e-9)
    # the device chain's window against enumeration, from the fastest plan's schedule
    ch = ix.fastest_choice()
    start, end, _ = ix.schedule(ch)
    path = ix.dev_seq["gpu0"]
    want, arg = _brute_path(p, path, ch, start, end - start, D)
    got = chain_dp(path_window(p, path, ch, start, end - start, D, tol_s=1e-12 * D), cap=10**6, gcap=10**6)
    assert (got is None) == (arg is None)
    if got is not None:
        new = ch.copy()
        new[path] = got
        cost = lambda c: sum(ix.cost[v][c[v]] for v in range(ix.n)) + ix.switch_extra(c)[0]  # noqa: E731
        assert cost(new) == pytest.approx(want, rel=1e-12, abs=1e-9)


def _device_windows(p, D):
    """Every device chain's window with the rest of the plan at its fastest, held ASAP."""
    ix = p.index
    ch = np.array([int(np.argmin(ix.time[v])) for v in range(ix.n)])
    start, end, _ = ix.schedule(ch)
    # a device chain alone: its own tasks' neighbours on other devices fix its window
    return [path_window(p, seq, ch, start, end - start, D) for seq in ix.dev_seq.values()]


@pytest.mark.parametrize("broken", [False, True])
def test_windowed_rounding_split_over_a_worker_gives_the_same_plans(monkeypatch, caplog, broken):
    """Half of the device DPs go to a worker process; its answer, or (worker not started) the
    same DPs run here, equal the serial ones."""
    import sys

    from solvers import lns

    p = pipeline(stages=4, mb=6)
    D = 1.1 * p.fastest_makespan_s()
    wins = _device_windows(p, D)
    serial = lns.chain_dps(wins, 48, 160)
    assert all(s is not None for s in serial)
    monkeypatch.setattr(lns, "available_cpus", lambda: 2)
    if broken:
        monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    with caplog.at_level("INFO", logger="solvers.lns"):
        split = lns._chain_dps_split(wins, 48, 160, parallel=True)
    assert [s.tolist() for s in split] == [s.tolist() for s in serial]
    # the worker answered, or the fallback said why it did not
    assert ("worker not started" in caplog.text) == broken
