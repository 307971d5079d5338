"""solvers.workers (a call in a fresh worker process, with a fallback here) and the fast
method's portfolio of searches built on it."""

import os
import pickle
import time

import numpy as np
import pytest

from solvers import ConstantTransition, Problem
from solvers.fast import solve_fast
from solvers.options import PortfolioOptions, SearchSettings, SolveOptions
from solvers.workers import start


def where_am_i(parent_pid: int, mode: str = "pid") -> object:
    """Runs in the worker (importable by name): its pid, or a failure of the kind ``mode`` says
    there and only there."""
    if os.getpid() == parent_pid:
        return "here"
    if mode == "raise":
        raise RuntimeError("boom in the worker")
    if mode == "sleep":
        time.sleep(60)
    if mode == "exit":
        os._exit(3)
    return os.getpid()


def test_a_call_runs_in_another_process_and_comes_back():
    with start(where_am_i, os.getpid(), parallel=True) as job:
        assert job.in_worker
        pid = job.result()
    assert isinstance(pid, int) and pid != os.getpid() and job.fallback is None


def test_without_parallel_the_call_runs_here_when_asked():
    job = start(where_am_i, os.getpid(), parallel=False)
    assert not job.in_worker and job.result() == "here" and job.fallback is None


@pytest.mark.parametrize("mode, why", [("raise", "RuntimeError: boom in the worker"),
                                       ("exit", "exited with 3")])
def test_a_failed_worker_falls_back_to_this_process(mode, why):
    with start(where_am_i, os.getpid(), mode, parallel=True) as job:
        assert job.result() == "here"
    assert why in job.fallback


def test_a_worker_past_its_timeout_is_killed_and_the_call_runs_here():
    t0 = time.perf_counter()
    with start(where_am_i, os.getpid(), "sleep", parallel=True, timeout_s=1.0) as job:
        assert job.result() == "here"
    assert "timed out" in job.fallback and time.perf_counter() - t0 < 30


def test_an_unpicklable_call_runs_here():
    with start(lambda x: x + 1, 41, parallel=True) as job:
        assert not job.in_worker and "not started" in job.fallback
        assert job.result() == 42


def test_leaving_the_block_stops_the_worker_and_removes_its_files():
    with start(where_am_i, os.getpid(), "sleep", parallel=True) as job:
        proc, folder = job.proc, job.dir
        assert folder.exists()
    assert proc.poll() is not None and not folder.exists()


def test_a_problem_pickles_as_its_fields_and_is_validated_again():
    p = Problem.build({"a": ("g0", [(1.0, 10.0), (2.0, 6.0)]), "b": ("g1", [(1.5, 8.0)])},
                      [("a", "b")], {"g0": 30.0, "g1": 20.0},
                      {"g0": ConstantTransition(1e-3, 0.05), "g1": None}, name="tiny")
    q = pickle.loads(pickle.dumps(p))
    assert q == p and q.name == "tiny" and dict(q.transitions) == dict(p.transitions)
    assert all(np.array_equal(x, y) for x, y in zip(q.index.cost, p.index.cost))
    assert q.index is not p.index                          # rebuilt on load, not shipped
    assert len(pickle.dumps(p)) < 2000


def test_the_portfolio_gives_the_same_plan_in_parallel_or_not():
    from test_lns import pipeline

    opts = SolveOptions(portfolio=PortfolioOptions(members=(SearchSettings((24, 96), 0, 1.3),), min_tasks=0))
    port = opts.portfolio.members
    # work alone ends each search, here and in the worker (no wall-clock budget)
    p = pipeline(stages=3, mb=4)
    D = p.deadline_s("1.2x")
    par = solve_fast(p, D, parallel=True, options=opts)
    seq = solve_fast(p, D, parallel=False, options=opts)
    one = solve_fast(p, D, portfolio=False, options=opts)
    assert np.array_equal(par.choice, seq.choice) and par.energy_j == seq.energy_j
    m = par.search["members"]
    assert [x["ran"] for x in m] == ["here", "worker"] and seq.search["members"][1]["ran"].startswith("here")
    assert [x["caps"] for x in m] == [list(opts.search.caps)] + [list(s.caps) for s in port]
    assert par.energy_j == pytest.approx(min(x["energy_j"] for x in m), abs=1e-3)
    shares = 1 + sum(s.work_share for s in port)
    assert par.search["work_budget"] == pytest.approx(shares * one.search["work_budget"], abs=0.2)
    assert [x["work_share"] for x in m] == [1.0] + [s.work_share for s in port]
    assert len(one.search["members"]) == 1 and one.energy_j >= par.energy_j - 1e-9
    small = SolveOptions(portfolio=PortfolioOptions(members=port))                   # from 500 tasks on
    assert np.array_equal(one.choice, solve_fast(p, D, portfolio=True, options=small).choice)   # 12 tasks: one search
    assert len(solve_fast(p, D).search["members"]) == 1          # the shipped method runs one search
