"""The fast method's effort past 2,048 tasks: work shrinks as 1/tasks and the ascent's steps
likewise (solvers.options; holds above 4,096 tasks: tests/test_hold.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from solvers import SolveOptions
from solvers.fast import polish_budget


def test_work_budget_is_flat_to_2048_tasks_then_shrinks_as_one_over_tasks():
    assert polish_budget(512)[0] == 64_000
    assert polish_budget(2048)[0] == 92_160
    assert polish_budget(4096)[0] == 46_080
    assert polish_budget(8192)[0] == 23_040
    # the rule is an option: a larger product keeps the cap
    opts = SolveOptions()
    big = replace(opts, budget=replace(opts.budget, work_task_product=1e12))
    assert polish_budget(8192, options=big)[0] == 92_160


def test_ascent_takes_at_most_max_task_steps_over_tasks_steps():
    """Counted through the bound's evaluations: one per step, plus the last; where the rule leaves
    fewer than ``min_steps`` steps, none."""
    from pathlib import Path

    from solvers import ConstantTransition, load_perseus_profile
    from solvers.ascent import flow_ascent_capped
    from solvers.hull_lp import HullLP
    from solvers.lagrangian import lagrangian_bound
    from solvers.options import AscentOptions

    csv = Path(__file__).resolve().parents[1] / "ecal" / "examples" / "pipeline_4x8.csv"
    p = load_perseus_profile(csv, 75.0, 8, transitions=ConstantTransition(1e-3, 0.075))
    D = p.deadline_s("1.2x")
    lp = HullLP(p)
    calls = []

    def evaluate(mu):
        calls.append(1)
        return lagrangian_bound(p, lp, mu, D)

    for opts, steps in ((AscentOptions(iters=12), 12),
                        (AscentOptions(iters=12, max_task_steps=5 * p.n_tasks, min_steps=0), 5),
                        # fewer steps than min_steps left by the rule: none
                        (AscentOptions(iters=150, max_task_steps=9 * p.n_tasks), 0),
                        # the rule asks for no fewer than iters itself: iters
                        (AscentOptions(iters=8, max_task_steps=9 * p.n_tasks), 8)):
        calls.clear()
        flow_ascent_capped(p, lp.rows, lp.solve(D).duals, D, evaluate, opts)
        assert len(calls) == steps + 1


def test_work_grows_with_tasks_again_where_moves_are_held():
    """From solvers.held.MIN_TASKS tasks on a unit's moves cost the same at any size, so the work
    is held_work_per_task per task at 32,768 tasks, growing as the square root of the tasks,
    when that is more than the 1/tasks rule."""
    from solvers import held

    assert held.MIN_TASKS == 6144
    assert polish_budget(6143)[0] == 188_743_680 / 6143       # below: the 1/tasks rule
    assert polish_budget(8192)[0] == 23_040                    # the rule is still more
    assert polish_budget(16384)[0] == pytest.approx(2.0 * 16384 * 0.5 ** 0.5)
    assert polish_budget(32768)[0] == 2.0 * 32768
    assert polish_budget(131072)[0] == 4.0 * 131072
    opts = SolveOptions()
    more = replace(opts, budget=replace(opts.budget, held_work_per_task=4.0))
    assert polish_budget(32768, options=more)[0] == 4.0 * 32768
