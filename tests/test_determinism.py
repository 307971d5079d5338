"""The same input gives the same plan under any load (issue 22).

Every search of the fast method is budgeted by work, never by seconds: a plan made while two
child processes spin on this 2-core machine must equal, bit for bit, the plan made without
them — here and in the portfolio's worker process — and neither may report a fired safety net.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from solvers import ConstantTransition, SolveOptions, load_perseus_profile, pareto, solve
from solvers.options import PortfolioOptions, SearchSettings
from tests.procs import BusyLoops

EXAMPLE = Path(__file__).resolve().parents[1] / "ecal" / "examples" / "pipeline_4x8.csv"


def _fingerprint(plan) -> tuple:
    """Everything a plan's user sees except its wall time and where its searches ran."""
    return (tuple(t.option for t in plan.tasks), plan.energy_j, plan.lower_bound_j,
            plan.makespan_s, plan.status, plan.gap, plan.time_capped,
            plan.meta.get("search", {}).get("work_units"))


def _problem(microbatches: int):
    return load_perseus_profile(EXAMPLE, 75.0, microbatches,
                                transitions=ConstantTransition(1e-3, 0.075))


@pytest.mark.skipif(not EXAMPLE.exists(), reason="bundled example profile missing")
def test_fast_plans_are_bit_identical_beside_two_busy_loops():
    # the portfolio's second search runs in a worker process (solvers.workers) here too
    opts = SolveOptions(portfolio=PortfolioOptions(members=(SearchSettings((24, 96), 0, 1.3),), min_tasks=0))
    p = _problem(4)
    quiet = solve(p, "1.1x", method="fast", options=opts)
    with BusyLoops():
        loaded = solve(p, "1.1x", method="fast", options=opts)
    assert _fingerprint(loaded) == _fingerprint(quiet)
    assert not quiet.time_capped and not loaded.time_capped
    ran = [m["ran"] for m in quiet.meta["search"]["members"]]
    assert len(ran) == 2          # in a worker, or here after a worker failure: the same plan


@pytest.mark.skipif(not EXAMPLE.exists(), reason="bundled example profile missing")
def test_fast_curve_is_bit_identical_beside_two_busy_loops():
    # issue 22: three runs of this curve on a loaded machine gave three different curves
    p = _problem(8)
    quiet = pareto(p, n_points=4, method="fast")
    with BusyLoops():
        loaded = pareto(p, n_points=4, method="fast")
    assert [_fingerprint(x) for x in loaded.plans] == [_fingerprint(x) for x in quiet.plans]
    assert not quiet.time_capped and not loaded.time_capped


def test_a_fired_safety_net_is_reported_on_the_plan():
    p = _problem(2)
    plan = solve(p, "1.2x", method="fast", time_limit_s=1e-9)
    assert plan.time_capped and plan.meta["search"]["capped_by_time"]
    assert np.isfinite(plan.energy_j) and plan.makespan_s <= plan.deadline_s * (1 + 1e-9)
