"""Inputs that cannot run away, solves that stop when told (issue 27), and a planner that does
what its docs say (issue 32).

* A problem over the task limit is refused before anything is built for it (arithmetic on the
  shape), in the library and on the command line (one line naming ``--max-tasks``, exit 2).
* With the limit raised, Ctrl-C (SIGINT) and SIGTERM stop ``ecal plan`` with exit 130, also
  while the hull LP runs in its child process, and no solver process or temp file is left.
* The safety net bounds the whole call: a small ``time_limit_s`` on a large problem sets
  ``time_capped`` and leaves no child process or temp file (the wall time itself is measured
  in ``docs/solver.md``, never asserted here).
* A hull-LP solve followed by a MILP with HiGHS in one process gives a HiGHS plan.
* ``auto`` on a 40-task, 4-GPU DAG gives the same plan beside two busy loops: the MILP is
  budgeted by nodes, not seconds.

The only wall-clock bound asserted is the interrupt's, generously (10 s; measured 0.3–0.5 s).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from solvers import ConstantTransition, Problem, ProblemTooLargeError, SolveOptions, pareto, solve
from solvers.guarded import CHILD_TAG, ChildServer
from solvers.hull_lp import HullLP
from solvers.options import DEFAULT_MAX_TASKS, LimitOptions
from solvers.perseus import load_perseus_profile
from solvers.pipeline import one_f_one_b
from tests.procs import BusyLoops, alive, children

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "ecal" / "examples"
PROFILE = EXAMPLES / "pipeline_4x8.csv"
WORKLOAD = EXAMPLES / "workload_1f1b.json"


# -- helpers ---------------------------------------------------------------------------------

def _solver_children() -> list[tuple[int, str]]:
    """This process's children that are solvers: the LP child, CBC, a HiGHS binary."""
    return [(p, c) for p, c in children(os.getpid())
            if CHILD_TAG in c or "cbc" in c.lower() or "highs" in c.lower()]


def dag40(seed: int = 0, k: int = 6) -> Problem:
    """A 40-task DAG on 4 GPUs (10 tasks each, cross-device edges), ``k`` clocks per task and
    a 10 ms / 2 J switch: not a chain and not series-parallel, so ``auto`` takes the MILP."""
    rng = np.random.default_rng(seed)
    clocks = np.linspace(1.0, 0.5, k)
    tasks, names = [], []
    for i in range(40):
        base, power = rng.uniform(0.5, 2.0), rng.uniform(150, 300)
        opts = [{"time_s": float(base / c * rng.uniform(0.98, 1.02)),
                 "energy_j": float(power * base * (0.35 + 0.65 * c * c) * rng.uniform(0.97, 1.03)),
                 "omega": {"sm_clock_mhz": int(1980 * c)}} for c in clocks]
        tasks.append((f"t{i}", f"g{i % 4}", opts))
        names.append(f"t{i}")
    edges = [(names[i], names[j]) for i in range(40) for j in range(i + 1, min(i + 12, 40))
             if j % 4 != i % 4 and rng.random() < 0.08]
    return Problem.build(tasks, edges, {f"g{d}": 80.0 for d in range(4)}, ConstantTransition(0.01, 2.0),
                         name="dag40")


def _fingerprint(plan) -> tuple:
    return (tuple(t.option for t in plan.tasks), plan.energy_j, plan.lower_bound_j, plan.status,
            plan.method, plan.time_capped, plan.meta.get("milp_status"))


def _ecal(*args: str, tmp: Path, **kw) -> subprocess.Popen:
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "ecal", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """A private temp folder for this process's solvers (checked empty afterwards)."""
    d = tmp_path / "solver-tmp"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


# -- sizes refused before allocation -------------------------------------------------------------

def test_a_runaway_pipeline_is_refused_before_anything_is_built():
    opts = {(s, i): [(1.0, 10.0), (2.0, 6.0)] for s in range(4) for i in ("forward", "backward")}
    tracemalloc.start()
    t0 = time.process_time()
    try:
        with pytest.raises(ProblemTooLargeError, match="--max-tasks") as info:
            one_f_one_b(4, 10_000_000, opts)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.process_time() - t0 < 1.0
    assert peak < 2_000_000                       # bytes: 80 M tasks were never made
    assert info.value.size == 80_000_000 and info.value.limit == DEFAULT_MAX_TASKS
    assert "\n" not in str(info.value)


def test_every_loader_takes_max_tasks(tmp_path):
    with pytest.raises(ProblemTooLargeError, match="800,000 tasks"):
        load_perseus_profile(PROFILE, 75.0, 100_000)
    from solvers.io import load_problem, problem_from_dict, problem_to_dict
    with pytest.raises(ProblemTooLargeError):
        load_problem(PROFILE, n_microbatches=100_000)
    p = load_perseus_profile(PROFILE, 75.0, 4, max_tasks=32)          # exactly at the limit
    assert p.n_tasks == 32
    with pytest.raises(ProblemTooLargeError):
        load_perseus_profile(PROFILE, 75.0, 5, max_tasks=32)
    assert load_perseus_profile(PROFILE, 75.0, 5, max_tasks=None).n_tasks == 40
    with pytest.raises(ProblemTooLargeError, match="40 tasks"):
        problem_from_dict(problem_to_dict(load_perseus_profile(PROFILE, 75.0, 5)), "p.json", max_tasks=39)
    with pytest.raises(ProblemTooLargeError):
        Problem.build([(f"t{i}", "g", [(1.0, 1.0)]) for i in range(10)], max_tasks=9)


def test_a_workload_file_over_the_limit_is_refused_before_its_tasks_are_made():
    from execution.workload import load_workload

    t0 = time.process_time()
    with pytest.raises(ProblemTooLargeError, match="--max-tasks"):
        load_workload(WORKLOAD, microbatches=100_000)
    assert time.process_time() - t0 < 1.0
    assert load_workload(WORKLOAD, microbatches=16, max_tasks=128).problem.n_tasks == 128
    with pytest.raises(ProblemTooLargeError):
        load_workload(WORKLOAD, microbatches=16, max_tasks=127)


def test_solve_and_pareto_check_their_limits_before_solving(monkeypatch):
    p = load_perseus_profile(PROFILE, 75.0, 4)
    small = SolveOptions(limits=LimitOptions(max_tasks=16))
    monkeypatch.setattr("solvers.fast.HullLP", None)              # never reached
    with pytest.raises(ProblemTooLargeError):
        solve(p, "1.1x", method="fast", options=small)
    with pytest.raises(ProblemTooLargeError):
        pareto(p, method="fast", options=small)
    with pytest.raises(ProblemTooLargeError, match="deadlines"):
        pareto(p, n_points=10_000, method="fast")
    with pytest.raises(ProblemTooLargeError, match="options"):
        solve(p, "1.1x", options=SolveOptions(limits=LimitOptions(max_options=10)))


def test_cli_refuses_800k_tasks_in_one_line_naming_max_tasks(tmp_path):
    for path in (WORKLOAD, PROFILE):
        proc = _ecal("plan", str(path), "--microbatches", "100000", "--deadline", "1.05x", tmp=tmp_path)
        out, err = proc.communicate(timeout=120)
        lines = err.decode().strip().splitlines()
        assert proc.returncode == 2, err
        assert len(lines) == 1 and "--max-tasks" in lines[0] and "800,000 tasks" in lines[0]
    proc = _ecal("pareto", str(WORKLOAD), "--microbatches", "100000", tmp=tmp_path)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "--max-tasks" in err.decode()
    proc = _ecal("plan", str(PROFILE), "--microbatches", "8", "--max-tasks", "63", "--deadline", "1.1x",
                 tmp=tmp_path)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "64 tasks, over the limit of 63" in err.decode()


# -- signals ---------------------------------------------------------------------------------

def _interrupt(proc: subprocess.Popen, sig: int) -> tuple[float, bytes]:
    """Send ``sig``; (seconds until it exited, stderr)."""
    t0 = time.perf_counter()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    return time.perf_counter() - t0, err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigint_stops_an_800k_task_plan_with_the_limit_raised(tmp_path):
    proc = _ecal("plan", str(WORKLOAD), "--microbatches", "100000", "--max-tasks", "1000000",
                 "--deadline", "1.05x", tmp=tmp_path)
    time.sleep(3.0)
    assert proc.poll() is None, proc.communicate()[1]
    kids = [p for p, _ in children(proc.pid)]
    waited, err = _interrupt(proc, signal.SIGINT)
    assert proc.returncode == 130, err
    assert b"interrupted (SIGINT)" in err
    assert waited < 10.0                                   # measured 0.5-1.2 s
    time.sleep(0.5)
    assert not [p for p in kids if alive(p)]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_the_hull_lp_kills_its_child_process(tmp_path, sig):
    # 8,192 tasks: the hull LP runs in a child process (LimitOptions.lp_process_min_tasks)
    proc = _ecal("plan", str(WORKLOAD), "--microbatches", "1024", "--deadline", "1.05x",
                 "--method", "fast", tmp=tmp_path)
    child, t0 = None, time.perf_counter()
    while child is None and proc.poll() is None and time.perf_counter() - t0 < 120:
        child = next((p for p, c in children(proc.pid) if CHILD_TAG in c), None)
        time.sleep(0.05)
    assert child is not None, proc.communicate()[1]
    time.sleep(0.5)                                        # it is reading or solving the LP
    waited, err = _interrupt(proc, sig)
    assert proc.returncode == 130, err
    assert f"interrupted ({signal.Signals(sig).name})".encode() in err
    assert waited < 10.0                                   # measured 0.3-0.5 s
    time.sleep(0.5)
    assert not alive(child)
    assert list(tmp_path.iterdir()) == []


def test_an_exception_raised_while_waiting_kills_the_child_and_a_later_call_restarts_it():
    p = load_perseus_profile(PROFILE, 75.0, 8)
    D = p.deadline_s("1.05x")
    here, there = HullLP(p), HullLP(p, process_min_tasks=0)
    assert there.in_child and not here.in_child
    a, b = here.solve(D), there.solve(D)
    assert a.bound_j == b.bound_j and np.array_equal(a.time_s, b.time_s) and np.array_equal(a.duals, b.duals)
    pid = there._child.pid
    from solvers.limits import NetFired, wall_net

    with wall_net(0.0), pytest.raises(NetFired):
        there.solve(D * 1.1)
    assert there._child.pid is None and not alive(pid)
    assert there.solve(D * 1.1).bound_j == here.solve(D * 1.1).bound_j     # a new child
    la = here.linprog(D, np.full(len(here.rows), 1e-4))
    lb = there.linprog(D, np.full(len(there.rows), 1e-4))
    assert la.status == lb.status == 0 and la.fun == lb.fun
    there.close()
    assert not _solver_children()


def test_a_child_reraises_the_methods_exception_and_lives_on():
    srv = ChildServer(dict, ((("a", 1),),))
    try:
        assert srv.call("get", "a") == 1
        pid = srv.pid
        with pytest.raises(TypeError):
            srv.call("get")
        assert srv.pid == pid and srv.call("__len__") == 1
    finally:
        srv.close()
    assert not alive(pid)


# -- the safety net bounds the whole call ----------------------------------------------------------

@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_small_time_limit_on_a_large_problem_is_reported_and_leaves_nothing(private_tmp):
    p = load_perseus_profile(PROFILE, 75.0, 512, transitions=ConstantTransition(1e-3, 0.075))  # 4,096 tasks
    plan = solve(p, "1.05x", method="fast", time_limit_s=0.3)
    assert plan.time_capped
    assert plan.makespan_s <= plan.deadline_s * (1 + 1e-9) and plan.lower_bound_j <= plan.energy_j
    assert not _solver_children()
    assert list(private_tmp.iterdir()) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_small_time_limit_stops_the_milp_and_removes_its_files(private_tmp):
    plan = solve(dag40(0, k=12), "1.1x", method="ilp", time_limit_s=2.0)    # measured: 3.1 s
    assert plan.time_capped and plan.status != "optimal"
    assert plan.meta["milp_status"] == "time_limit"
    assert plan.makespan_s <= plan.deadline_s * (1 + 1e-9)
    assert not _solver_children()
    assert list(private_tmp.iterdir()) == []


def test_a_net_spent_before_the_milp_skips_it():
    from solvers.ilp import solve_ilp
    from solvers.limits import wall_net

    p = dag40(0)
    with wall_net(0.0):
        r = solve_ilp(p, p.deadline_s("1.1x"), backend_time_limit_s=30.0)
    assert r.choice is None and r.time_capped and r.status == "time_limit"


# -- HiGHS really used, and the same plan under load --------------------------------------------

@pytest.mark.highs
def test_hull_lp_then_milp_with_highs_in_one_process_gives_a_highs_plan():
    pytest.importorskip("highspy", reason="highspy not installed (the optional .[highs] extra)")
    from solvers.ilp import available_solvers, solve_ilp

    assert "HiGHS" in available_solvers()
    p = load_perseus_profile(PROFILE, 75.0, 2)
    D = p.deadline_s("1.1x")
    HullLP(p).solve(D)                      # its warm highspy model sets up HiGHS' scheduler
    r = solve_ilp(p, D, backend_time_limit_s=20, solver="HiGHS")
    assert r.solver == "HiGHS" and r.choice is not None and r.status == "optimal"
    plan = solve(p, "1.1x", method="ilp")          # the hull LP first, then the MILP
    assert plan.method == "ilp[HiGHS]" and plan.meta["plan_from"] == "HiGHS"


@pytest.mark.highs
def test_highs_node_limit_is_read_not_a_key_error():
    pytest.importorskip("highspy", reason="highspy not installed (the optional .[highs] extra)")
    from solvers.ilp import solve_ilp
    from solvers.options import IlpOptions

    p = dag40(0)
    r = solve_ilp(p, p.deadline_s("1.1x"), backend_time_limit_s=60, solver="HiGHS",
                  opts=IlpOptions(max_nodes=1, min_nodes=1))
    assert r.solver == "HiGHS" and r.status in ("node_limit", "optimal")


@pytest.mark.highs
def test_auto_on_a_40_task_dag_is_the_same_plan_beside_two_busy_loops():
    p = dag40(0)
    quiet = solve(p, "1.1x")
    assert quiet.method.startswith("ilp[")
    with BusyLoops():
        loaded = solve(p, "1.1x")
    assert _fingerprint(loaded) == _fingerprint(quiet)
    assert not quiet.time_capped and not loaded.time_capped


# -- curves stay bounded ------------------------------------------------------------------------

def test_blocked_prefix_evaluation_equals_one_batch():
    from solvers.curve import _prefixes, interpolate

    p = load_perseus_profile(PROFILE, 75.0, 8)
    ix = p.index
    fast, slow = ix.fastest_choice(), np.array([k - 1 for k in ix.k])
    ch, mk, e = interpolate(p, fast, slow)
    diff, mk2, e2 = _prefixes(p, fast, slow, "ratio", max_cells=3 * ix.n)     # blocks of 3 rows
    assert np.array_equal(mk, mk2) and np.array_equal(e, e2)
    assert ch.shape == (len(diff) + 1, ix.n)


def test_a_curve_keeps_at_most_max_dense_cells_choices():
    p = load_perseus_profile(PROFILE, 75.0, 8)
    full = pareto(p, n_points=4, method="fast")
    assert full.dense_choices is not None and len(full.dense_choices) > 10
    cap = 10 * p.n_tasks
    thin = pareto(p, n_points=4, method="fast", options=SolveOptions(limits=LimitOptions(max_dense_cells=cap)))
    assert 0 < len(thin.dense_choices) <= 10
    assert [x.energy_j for x in thin.plans] == [x.energy_j for x in full.plans]
    assert set(thin.dense) <= set(full.dense)
