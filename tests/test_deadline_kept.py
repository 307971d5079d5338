"""Plans that keep their deadline when they run (issue 29, first part).

* Switches are never free by accident: a workload without ``transitions`` is refused with one
  line naming the ways to give them; ``"transitions": "free"`` plans them free and every plan
  says so; ``ecal transitions`` measures them.
* A deadline with a stated confidence: the plan's makespan + z_P·σ_T meets the deadline
  (:mod:`solvers.confidence`), checked against brute force over every choice of small
  instances; every plan states P(makespan ≤ deadline).
* ``ecal run`` says what happened: ``deadline met`` / ``deadline MISSED by X ms (Y %)`` and
  exit 1 when the deadline is missed or an Eq. 23 test of the plan flags, 0 otherwise,
  through the real CLI in a subprocess on the simulator.
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ecal.cli import main
from execution.workload import MISSING_TRANSITIONS, WORKLOAD_FORMAT, load_workload
from frontier.errors import FormatError
from frontier.transition import TransitionTable
from solvers import InfeasibleError, Problem, solve
from solvers.confidence import solve_at_confidence, z_of
from solvers.feasibility import meets_deadline, p_meets
from solvers.plan import Plan, make_plan

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "ecal" / "examples"


def _workload(tmp_path: Path, name: str = "w.json", **over) -> Path:
    """A chain of the bundled (simulated) stage elements on one GPU, without transitions
    unless ``over`` gives them."""
    doc = {"format": WORKLOAD_FORMAT, "name": "chain-sim",
           "elements": {"fwd": {"source": str(EXAMPLES / "workload_fwd.json"), "element": "stage_forward"},
                        "bwd": {"source": str(EXAMPLES / "workload_bwd.json"), "element": "stage_backward"}},
           "shape": {"kind": "chain", "tasks": ["fwd", "fwd", "bwd", "bwd", "fwd", "bwd"]},
           "idle_power_w": 122.0}
    doc.update(over)
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


# -- switches are never free by accident --------------------------------------------------------

def test_a_workload_without_transitions_is_refused_in_one_line(tmp_path):
    path = _workload(tmp_path)
    with pytest.raises(FormatError) as ei:
        load_workload(path)
    msg = str(ei.value)
    assert "\n" not in msg and str(path) in msg and "transitions: missing" in msg
    # the three ways: measured on the device (the command), a fitted rule / constant, "free"
    for way in (f"ecal transitions {path}", '"file"', '"rule"', '"constant"', '"transitions": "free"'):
        assert way in msg, way
    assert MISSING_TRANSITIONS.split(":")[0] == "missing"


def test_cli_refuses_it_with_exit_2_and_writes_nothing(tmp_path, capsys):
    path = _workload(tmp_path)
    rc = main(["plan", str(path), "--deadline", "1.2x", "-o", str(tmp_path / "p.json")])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(err) == 1 and "ecal transitions" in err[0] and '"free"' in err[0]
    assert not (tmp_path / "p.json").exists()
    # a transition cost given on the command line is a way to give them
    rc = main(["plan", str(path), "--deadline", "1.2x", "--transition-time-s", "0.004"])
    assert rc == 0, capsys.readouterr().err


def test_free_is_an_assumption_every_plan_prints(tmp_path, capsys):
    path = _workload(tmp_path, transitions="free")
    wl = load_workload(path)
    assert not wl.problem.has_transitions
    assert wl.assumptions == (f"switches are free (transitions: free in {path})",)
    rc = main(["plan", str(path), "--deadline", "1.2x", "-o", str(tmp_path / "p.json")])
    out = capsys.readouterr().out
    assert rc == 0
    assert f"assumption: switches are free (transitions: free in {path})" in out
    assert json.loads((tmp_path / "p.json").read_text())["meta"]["assumptions"] == list(wl.assumptions)
    rc = main(["pareto", str(path), "--points", "3"])
    assert rc == 0 and "assumption: switches are free" in capsys.readouterr().out


def test_free_per_device_and_a_device_left_out(tmp_path):
    two = {"kind": "dag", "tasks": [{"name": "a", "element": "fwd", "device": "g0"},
                                    {"name": "b", "element": "bwd", "device": "g1"}],
           "edges": [["a", "b"]]}
    ok = load_workload(_workload(tmp_path, shape=two, devices={
        "g0": {"transitions": "free"}, "g1": {"transitions": {"constant": {"time_s": 0.004}}}}))
    assert ok.assumptions == (f"switches on g0 are free (devices.g0.transitions: free in {tmp_path / 'w.json'})",)
    with pytest.raises(FormatError, match=r"transitions: missing"):
        load_workload(_workload(tmp_path, shape=two, devices={"g0": {"transitions": "free"}}))
    with pytest.raises(FormatError, match=r'transitions: must be a transition rule .* or "free"'):
        load_workload(_workload(tmp_path, transitions="none"))
    with pytest.raises(FormatError, match=r"transitions: missing"):
        load_workload(_workload(tmp_path, transitions=None))


def test_every_bundled_workload_gives_its_transitions():
    for f in sorted(EXAMPLES.glob("*.json")):
        doc = json.loads(f.read_text())
        if isinstance(doc, dict) and doc.get("format") == WORKLOAD_FORMAT:
            wl = load_workload(f)
            assert wl.problem.has_transitions and not wl.assumptions, f.name


def test_ecal_transitions_measures_the_workloads_switches(tmp_path, capsys):
    """``ecal transitions`` on the simulator: every ordered pair of the workload's operating
    points measured, a rule fitted for the rest; the workload then plans with them. The
    bundled table (ecal/examples/transitions_sim_h200.json) is this command's output."""
    path = _workload(tmp_path)
    out = tmp_path / "t.json"
    rc = main(["transitions", str(path), "--device", "sim", "--repeats", "1", "-o", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and "SIMULATED" in text and '"transitions": {"file": "t.json"}' in text
    table = TransitionTable.from_dict(json.loads(out.read_text()), str(out))
    n = len({o.omega.dev for t in load_workload(path, require_transitions=False).problem.tasks
             for o in t.options})
    assert len(table.pairs) == n * (n - 1) and table.rule is not None
    bundled = TransitionTable.from_dict(json.loads((EXAMPLES / "transitions_sim_h200.json").read_text()))
    for pair, cost in table.pairs:                    # the simulator's own switches
        assert dict(bundled.pairs)[pair] == pytest.approx(cost)
    wl = load_workload(_workload(tmp_path, transitions={"file": "t.json"}))
    assert wl.problem.has_transitions and not wl.assumptions


# -- the confidence wrapper against brute force ----------------------------------------------------

def _brute(problem: Problem, D: float, z: float) -> tuple[float, list[int] | None]:
    """Least energy over every choice whose makespan + z·σ_T meets D (inf, None if none)."""
    best, arg = math.inf, None
    for ch in itertools.product(*(range(len(t.options)) for t in problem.tasks)):
        p = make_plan(problem, ch, 1e9, method="enum", lower_bound_j=0.0, wall_s=0.0)
        if meets_deadline(p.makespan_s + z * p.sd_makespan_s, D) and p.energy_j < best:
            best, arg = p.energy_j, list(ch)
    return best, arg


def _option(rng, t0: float, sd: float | None = None) -> dict:
    t = t0 * rng.uniform(1.0, 1.6)
    return {"time_s": t, "energy_j": 40.0 / t + rng.uniform(0, 5), "s_w": 20.0,
            "sd_time_s": rng.uniform(0.0, 0.03) if sd is None else sd,
            "sd_energy_j": rng.uniform(0.0, 0.5)}


def _chain(rng) -> Problem:
    """A chain on one GPU whose options of each task share one σ_T: every plan's σ_T is the
    same (all tasks are on the critical path), so T + zσ ≤ D is T ≤ D − zσ exactly."""
    tasks = []
    for i in range(int(rng.integers(2, 5))):
        sd = float(rng.uniform(0.0, 0.03))
        tasks.append((f"t{i}", "gpu0", [_option(rng, 0.2, sd) for _ in range(int(rng.integers(2, 4)))]))
    return Problem.build(tasks, idle_power_w={"gpu0": 15.0})


def _dag(rng) -> Problem:
    """Two GPUs, a few edges, σ_T different per option: the tightening is conservative."""
    n = int(rng.integers(2, 5))
    tasks = [(f"t{i}", f"gpu{int(rng.integers(0, 2))}", [_option(rng, 0.2) for _ in range(int(rng.integers(2, 4)))])
             for i in range(n)]
    edges = [(f"t{i}", f"t{j}") for i in range(n) for j in range(i + 1, n) if rng.random() < 0.4]
    return Problem.build(tasks, edges, idle_power_w={"gpu0": 15.0, "gpu1": 10.0})


@pytest.mark.parametrize("kind", ["chain", "dag"])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_confidence_against_brute_force(kind, confidence):
    rng = np.random.default_rng([int(confidence * 100), kind == "dag"])
    z = z_of(confidence)
    exact = worse = refused = 0
    for _ in range(60):
        p = _chain(rng) if kind == "chain" else _dag(rng)
        D = p.fastest_makespan_s() * rng.uniform(1.0, 1.4)
        best, _ = _brute(p, D, z)
        for method in ("brute", "auto"):
            try:
                plan = solve_at_confidence(p, D, confidence, method=method)
            except InfeasibleError as exc:
                # none meets D at P, or (σ varies) none the tightening reaches
                assert math.isinf(best) or kind == "dag", (method, best)
                assert "no plan meets" in str(exc) or "below the fastest" in str(exc)
                refused += not math.isinf(best)
                continue
            # always: the plan keeps D at P, and no choice that does is cheaper
            assert meets_deadline(plan.makespan_s + z * plan.sd_makespan_s, D)
            assert plan.p_meets_deadline >= confidence - 1e-9 or plan.sd_makespan_s == 0
            assert plan.energy_j >= best * (1 - 1e-9)
            c = plan.meta["confidence"]
            assert c["deadline_s"] == D and plan.target_deadline_s == D
            assert plan.deadline_s == c["solved_deadline_s"] <= D
            assert meets_deadline(plan.makespan_s, plan.deadline_s)
            if kind == "chain":          # σ_T the same for every plan: exactly optimal
                assert plan.energy_j == pytest.approx(best, rel=1e-9)
                exact += 1
            else:
                worse += plan.energy_j > best * (1 + 1e-9)
    if kind == "chain":
        assert exact > 40
    else:       # σ varies: feasible always, optimal not promised (docs/loop.md gives the figures)
        assert worse + refused < 60


def _one_task(*opts: tuple[float, float, float]) -> Problem:
    """One task whose options are (T, σ_T, E)."""
    return Problem.build({"a": ("gpu0", [{"time_s": t, "sd_time_s": sd, "energy_j": e, "s_w": 0.0}
                                         for t, sd, e in opts])}, idle_power_w={"gpu0": 0.0})


def test_tightening_rounds_and_the_fallback():
    # C fails (1.2 + 1.645·0.05 > 1.25), so D' = 1.168 gives B (σ 0): two rounds
    p = _one_task((1.0, 0.01, 10.0), (1.1, 0.0, 8.0), (1.2, 0.05, 6.0))
    plan = solve_at_confidence(p, 1.25, 0.95, method="brute")
    rounds = plan.meta["confidence"]["rounds"]
    assert plan.tasks[0].option == 1 and rounds[1]["deadline_s"] == pytest.approx(1.25 - z_of(0.95) * 0.05)
    assert 1.1 <= plan.deadline_s < 1.2 and len(rounds) == 2 + 2        # + the refining steps
    assert "solved at" in plan.summary() and "P(makespan <= deadline)" in plan.summary()
    # B's σ pushes the next deadline below the fastest: the fallback finds A by bisection
    p = _one_task((1.0, 0.01, 10.0), (1.1, 0.2, 8.0), (1.2, 0.05, 6.0))
    plan = solve_at_confidence(p, 1.25, 0.95, method="brute")
    assert plan.tasks[0].option == 0 and _brute(p, 1.25, z_of(0.95))[1] == [0]
    assert 1.0 <= plan.deadline_s < 1.1
    # nothing meets it: one clear error with the fastest plan's makespan and σ
    p = _one_task((1.0, 0.2, 10.0), (1.1, 0.2, 8.0))
    with pytest.raises(InfeasibleError, match=r"no plan meets 1250\.000 ms at confidence 0\.95; "
                                              r"the fastest plan's makespan is 1000\.000 ± 200\.000 ms"):
        solve_at_confidence(p, 1.25, 0.95, method="brute")


def test_p_meets_deadline_is_in_every_plan():
    assert z_of(0.95) == pytest.approx(1.6448536, rel=1e-6) and z_of(0.5) == 0.0
    for bad in (0.4, 1.0, float("nan")):
        with pytest.raises(ValueError):
            z_of(bad)
    assert p_meets(1.0, 1.0, 0.0) == 1.0 and p_meets(1.0, 1.1, 0.0) == 0.0
    assert p_meets(1.0, 1.0, 0.1) == pytest.approx(0.5)
    p = _one_task((1.0, 0.01, 10.0), (1.2, 0.05, 6.0))
    plain = solve(p, 1.3, method="brute")            # no wrapper: P of its own deadline
    assert plain.to_dict()["p_meets_deadline"] == pytest.approx(p_meets(1.3, 1.2, 0.05))
    assert "P(makespan <= deadline) 0.9772" in plain.summary()
    back = Plan.from_dict(json.loads(json.dumps(plain.to_dict())))
    assert back == plain
    # at confidence 0.5 the wrapper is the plain solve
    half = solve_at_confidence(p, 1.3, 0.5, method="brute")
    assert half.choice == plain.choice and half.deadline_s == plain.deadline_s


def test_pareto_plan_at_keeps_the_deadline_at_confidence(tmp_path, capsys):
    path = _workload(tmp_path, transitions={"file": str(EXAMPLES / "transitions_sim_h200.json")})
    rc = main(["pareto", str(path), "--points", "4", "--confidence", "0.95"])
    out = capsys.readouterr().out
    assert rc == 0 and "at confidence 0.95 (z 1.645)" in out and "P(<=deadline)" in out
    rc = main(["pareto", str(path), "--points", "4", "--plan-at", "1.1x", "-o", str(tmp_path / "p.json")])
    assert rc == 0, capsys.readouterr().err
    plan = Plan.load(tmp_path / "p.json")
    D = load_workload(path).problem.deadline_s("1.1x")
    assert plan.target_deadline_s == pytest.approx(D)
    assert plan.makespan_s + z_of(0.95) * plan.sd_makespan_s <= D * (1 + 1e-9)
    assert main(["plan", str(path), "--deadline", "1.1x", "--confidence", "1"]) == 2
    assert "--confidence" in capsys.readouterr().err


# -- ecal run says what happened (the real CLI, in a subprocess, on the simulator) ----------------

def _ecal(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ecal", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The chain workload with the simulator's measured switches, and with free switches."""
    d = tmp_path_factory.mktemp("runs")
    measured = _workload(d, "measured.json", transitions={"file": str(EXAMPLES / "transitions_sim_h200.json")})
    free = _workload(d, "free.json", transitions="free")
    return d, measured, free


def test_run_of_a_plan_that_keeps_its_deadline_exits_0(runs):
    d, measured, _ = runs
    r = _ecal("plan", str(measured), "--deadline", "1.2x", "-o", "ok.json", cwd=d)
    assert r.returncode == 0, r.stderr
    r = _ecal("run", "ok.json", "--workload", str(measured), "--no-baselines", cwd=d)
    assert r.returncode == 0, r.stdout + r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith("deadline "))
    assert ": met, " in line and "0 of " in line and "P(makespan <= deadline)" in line
    assert r.stdout.rstrip().splitlines()[-1] == "result: deadline met, prediction confirmed (Eq. 23): exit 0"


def test_run_of_a_plan_whose_deadline_is_too_tight_exits_1(runs):
    """At 1.0x with switches assumed free, the run pays the settle time and misses; a plan
    whose deadline was edited below its makespan misses too. Both: a MISSED line, exit 1."""
    d, measured, free = runs
    r = _ecal("plan", str(free), "--deadline", "1.0x", "--confidence", "0.5", "-o", "tight.json", cwd=d)
    assert r.returncode == 0 and "assumption: switches are free" in r.stdout, r.stderr
    r = _ecal("run", "tight.json", "--workload", str(free), "--no-baselines", "--json", cwd=d)
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["deadline"]["met"] is False and doc["deadline"]["missed_by_s"] > 0
    assert doc["problems"][0].startswith("deadline MISSED by ")
    assert sum(doc["switches_s"]["gpu0"]) > 0 and doc["planned_switch_s"]["gpu0"] == 0
    # a hand-edited deadline 1 % under the plan's makespan (measured switches, 1.2x)
    r = _ecal("plan", str(measured), "--deadline", "1.2x", "-o", "edit.json", cwd=d)
    assert r.returncode == 0, r.stderr
    doc = json.loads((d / "edit.json").read_text())
    doc["deadline_s"] = doc["makespan_s"] * 0.99
    doc["meta"].pop("confidence")
    (d / "edit.json").write_text(json.dumps(doc))
    r = _ecal("run", "edit.json", "--workload", str(measured), "--no-baselines", cwd=d)
    assert r.returncode == 1, r.stdout + r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith("deadline "))
    assert "MISSED by" in line and "%)" in line
    assert r.stdout.rstrip().splitlines()[-1].startswith("result: deadline MISSED by ")
    assert r.stdout.rstrip().endswith("exit 1")
