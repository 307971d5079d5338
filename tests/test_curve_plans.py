"""Every point a Pareto curve reports is a Plan the user can get back and apply (issue 22):
grid plans and the plans interpolated between them, in memory, through the curve file and
through ``ecal pareto --plan-at``; ``energy_at`` reports only the energy of such plans."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from frontier.errors import FormatError
from solvers import InfeasibleError, ParetoCurve, Plan, Problem, load_perseus_profile, pareto
from solvers.feasibility import meets_deadline
from solvers.ilp import available_solvers
from solvers.plan import INTERPOLATED, make_plan

ROOT = Path(__file__).resolve().parents[1]
PIPE = ROOT / "ecal" / "examples" / "pipeline_4x8.csv"
REL = 1e-9


def _options(rng, k, w=1.0):
    f = np.sort(rng.choice(np.linspace(0.4, 1.0, 9), k, replace=False))
    t = w * (0.3 + 0.7 / f)
    return [dict(time_s=float(ti), energy_j=float(ti * (5 + 12 * fi**3) + w), s_w=5.0,
                 sm_clock_mhz=float(round(fi * 1000))) for ti, fi in zip(t, f)]


def chain(rng, n=5, k=4):
    tasks = [(f"t{i}", "g0", _options(rng, k, rng.uniform(0.5, 1.5))) for i in range(n)]
    return Problem.build(tasks, [(f"t{i}", f"t{i + 1}") for i in range(n - 1)], {"g0": 3.0})


def fork_join(rng, k=4):
    tasks = [("a", "g0", _options(rng, k)), ("b", "g0", _options(rng, k)),
             ("c", "g1", _options(rng, k)), ("d", "g1", _options(rng, k))]
    return Problem.build(tasks, [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")],
                         {"g0": 3.0, "g1": 4.0})


def random_dag(rng, n=7, k=4, n_dev=3):
    tasks = [(f"t{i}", f"g{i % n_dev}", _options(rng, k, rng.uniform(0.5, 1.5))) for i in range(n)]
    edges = [(f"t{i}", f"t{j}") for i in range(n) for j in range(i + 1, n) if rng.random() < 0.35]
    return Problem.build(tasks, edges, {f"g{j}": 3.0 for j in range(n_dev)})


def reported(curve: ParetoCurve, i: int) -> tuple[float, float, float, float]:
    """(deadline, makespan, energy, bound) the curve reports for point i."""
    if i < len(curve.plans):
        p = curve.plans[i]
        return p.deadline_s, p.makespan_s, p.energy_j, p.lower_bound_j
    mk, e, b = curve.dense[i - len(curve.plans)]
    return mk, mk, e, b


def close(a: float, b: float) -> bool:
    return abs(a - b) <= REL * max(abs(a), abs(b), 1.0)


def assert_every_point_is_a_plan(problem: Problem, curve: ParetoCurve) -> None:
    """Each point round-trips to a Plan that meets its deadline at the reported energy, and
    rebuilding that Plan from its choice alone gives the same energy and makespan."""
    assert curve.n_points == len(curve.plans) + len(curve.dense) > 0
    for i, pl in enumerate(curve.all_plans(problem)):
        d, mk, e, b = reported(curve, i)
        assert isinstance(pl, Plan)
        assert pl.deadline_s == d and pl.lower_bound_j == b
        assert close(pl.energy_j, e) and close(pl.makespan_s, mk)
        assert meets_deadline(pl.makespan_s, pl.deadline_s)
        assert len(pl.tasks) == problem.n_tasks
        again = make_plan(problem, [pl.choice[n] for n in problem.index.names], pl.deadline_s,
                          method="check", lower_bound_j=-np.inf, wall_s=0.0)
        assert close(again.energy_j, e) and again.makespan_s == pl.makespan_s


def assert_energy_at_is_plan_at(problem: Problem, curve: ParetoCurve, n: int = 40) -> None:
    """At any deadline, energy_at is the energy of the plan plan_at hands out, which meets it."""
    lo = min(p.makespan_s for p in curve.plans)
    hi = max(p.deadline_s for p in curve.plans) * 1.1
    for D in np.linspace(lo, hi, n):
        pl = curve.plan_at(float(D), problem)
        assert meets_deadline(pl.makespan_s, D)
        assert pl.energy_j == pytest.approx(curve.energy_at(D), rel=REL, abs=0)


def fast_pipeline_curve(n_points: int = 8) -> tuple[Problem, ParetoCurve]:
    p = load_perseus_profile(PIPE, n_microbatches=4)
    return p, pareto(p, n_points=n_points, method="fast")


# -- fast method: grid plans and interpolated plans -----------------------------------------

def test_fast_curve_points_are_plans():
    p, c = fast_pipeline_curve()
    assert c.dense, "the fast method interpolates between grid plans without switch costs"
    assert c.dense_choices.shape == (len(c.dense), p.n_tasks)
    assert c.dense_choices.dtype == np.uint8        # ≤ 256 options: one byte a task
    assert_every_point_is_a_plan(p, c)
    assert_energy_at_is_plan_at(p, c)
    dense_plan = c.point_plan(len(c.plans))
    assert dense_plan.method == INTERPOLATED and dense_plan.meta["curve_point"] == len(c.plans)


@pytest.mark.parametrize("seed", range(4))
def test_fast_curve_points_are_plans_on_random_dags(seed):
    p = random_dag(np.random.default_rng(seed), n=9, k=5)
    c = pareto(p, n_points=10, method="fast")
    assert_every_point_is_a_plan(p, c)
    assert_energy_at_is_plan_at(p, c)


def test_choices_are_read_only():
    _, c = fast_pipeline_curve(6)
    with pytest.raises(ValueError):
        c.dense_choices[0, 0] = 1


def test_curve_file_keeps_every_point(tmp_path):
    p, c = fast_pipeline_curve()
    c.save(tmp_path / "curve.json")
    back = ParetoCurve.load(tmp_path / "curve.json")
    assert back == c and back.source is None
    assert np.array_equal(back.dense_choices, c.dense_choices)
    doc = json.loads((tmp_path / "curve.json").read_text())
    assert all(len(x["choice"]) == p.n_tasks for x in doc["dense"])
    for i in range(c.n_points):
        assert back.point_plan(i, p).to_dict() == c.point_plan(i).to_dict()
    assert_every_point_is_a_plan(p, back)


def test_an_interpolated_point_needs_its_problem_and_its_choices(tmp_path):
    p, c = fast_pipeline_curve(6)
    c.save(tmp_path / "curve.json")
    back = ParetoCurve.load(tmp_path / "curve.json")
    j = len(c.plans)
    with pytest.raises(ValueError, match="problem"):
        back.point_plan(j)
    assert back.point_plan(0) == c.plans[0]              # a grid point is a whole plan already
    doc = json.loads((tmp_path / "curve.json").read_text())
    for x in doc["dense"]:
        del x["choice"]                                  # a file from before choices were kept
    old = ParetoCurve.from_dict(doc)
    assert old.dense == c.dense and old.dense_choices is None
    with pytest.raises(ValueError, match="compute the curve again"):
        old.point_plan(j, p)
    del doc["plans"]
    doc["dense"][0]["choice"] = [0]
    with pytest.raises(FormatError):
        ParetoCurve.from_dict(doc)
    other = load_perseus_profile(PIPE, n_microbatches=3)
    with pytest.raises(ValueError, match="tasks"):
        c.plan_at(c.plans[-1].deadline_s, other)


def test_plan_at_below_the_fastest_point_is_infeasible():
    p, c = fast_pipeline_curve(6)
    with pytest.raises(InfeasibleError, match="fastest"):
        c.plan_at(0.5 * p.fastest_makespan_s())
    assert c.energy_at(0.5 * p.fastest_makespan_s()) == np.inf
    assert c.plan_at("1.07x").energy_j == c.energy_at(p.deadline_s("1.07x"))


# -- exact methods ----------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("kind,method", [("chain", "dp"), ("chain", "brute"), ("sp", "sp"),
                                         ("sp", "auto"), ("dag", "ilp"), ("dag", "brute")])
def test_exact_curve_points_are_plans(seed, kind, method):
    if method == "ilp" and not available_solvers():
        pytest.skip("no MILP solver (pip install highspy)")
    rng = np.random.default_rng(100 + seed)
    p = {"chain": chain, "sp": fork_join, "dag": random_dag}[kind](rng)
    c = pareto(p, n_points=6, method=method)
    assert c.dense == () and c.dense_choices is None
    assert_every_point_is_a_plan(p, c)
    assert_energy_at_is_plan_at(p, c)


# -- the command line -------------------------------------------------------------------------

def ecal(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, MPLBACKEND="Agg")
    return subprocess.run([sys.executable, "-m", "ecal", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_cli_plan_at_gives_back_a_point_of_the_curve(tmp_path):
    common = ["pareto", str(PIPE), "--microbatches", "4", "--method", "fast", "--points", "6"]
    r = ecal(*common, "-o", "curve.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    curve = ParetoCurve.load(tmp_path / "curve.json")
    assert curve.dense and curve.dense_choices is not None
    p = load_perseus_profile(PIPE, n_microbatches=4)
    # a deadline just above an interpolated point's makespan: that point is the answer
    mk, e, _ = curve.dense[len(curve.dense) // 2]
    want = curve.plan_at(mk, p)
    r = ecal(*common, "--curve", "curve.json", "--plan-at", repr(mk), "-o", "plan.json",
             "--schedule", "schedule.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plan = Plan.load(tmp_path / "plan.json")
    # the same point; its meta adds the confidence asked (σ_T is 0 here: P is 1) and that
    # the profile gives no switch costs
    assert plan.meta["confidence"]["p_meets_deadline"] == 1.0 and plan.meta["assumptions"]
    assert dataclasses.replace(plan, meta=want.meta) == want
    assert plan.energy_j == pytest.approx(e, rel=REL, abs=0)
    assert plan.method == INTERPOLATED and meets_deadline(plan.makespan_s, mk)
    assert json.loads((tmp_path / "schedule.json").read_text())["devices"]
    # without --curve the curve is computed again: the same point (plans depend on input alone)
    r = ecal(*common, "--plan-at", "1.07x", "-o", "plan2.json", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plan2 = Plan.load(tmp_path / "plan2.json")
    assert plan2.energy_j == pytest.approx(curve.energy_at(p.deadline_s("1.07x")), rel=REL, abs=0)
    assert json.loads(r.stdout)["format"] == "ecal.plan/1"


@pytest.mark.parametrize("extra,needle", [
    (["--curve", "curve.json"], "--plan-at"),
    (["--plan-at", "0.5x"], "fastest"),
    (["--plan-at", "soon"], "--plan-at"),
])
def test_cli_plan_at_errors_are_one_line_and_write_nothing(tmp_path, extra, needle):
    (tmp_path / "curve.json").write_text("{}")
    r = ecal("pareto", str(PIPE), "--microbatches", "4", "--points", "4", *extra,
             "-o", "plan.json", cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert not (tmp_path / "plan.json").exists()


def test_cli_curve_of_another_workload_is_refused(tmp_path):
    r = ecal("pareto", str(PIPE), "--microbatches", "4", "--points", "4", "--method", "fast",
             "-o", "curve.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = ecal("pareto", str(PIPE), "--microbatches", "3", "--curve", "curve.json", "--plan-at",
             "1.2x", "-o", "plan.json", cwd=tmp_path)
    assert r.returncode == 2 and "curve of" in r.stderr, r.stderr
    # same tasks, other costs (idle power): the point's energy gives it away
    r = ecal("pareto", str(PIPE), "--microbatches", "4", "--p2p-power-w", "60", "--curve",
             "curve.json", "--plan-at", "1.2x", "-o", "plan.json", cwd=tmp_path)
    assert r.returncode == 2 and "compute the curve again" in r.stderr, r.stderr
    assert not (tmp_path / "plan.json").exists()


def test_steady_state_curve_with_switch_costs_meets_every_deadline():
    """The bundled steady-state workload (switches cost time): carrying a tighter plan forward
    once overshot a deadline (CertificateError); every point is now a plan that meets it."""
    from execution.workload import load_workload

    p = load_workload(ROOT / "ecal" / "examples" / "workload_1f1b.json").problem
    assert p.has_transitions
    c = pareto(p, n_points=20, method="fast")
    assert c.dense == ()                 # interpolation prices no switches: none with them
    assert_every_point_is_a_plan(p, c)
