"""``ecal tune``: plan, run, calibrate, plan again until a run keeps its deadline (issue 29).

* A calibration (measured offsets, :mod:`solvers.calibration`) enters the deadline at a
  confidence exactly as the module says: T + b_T + z·sqrt(σ_T² + σ_b²) ≤ D, against
  hand-worked one-task instances; the null calibration changes nothing; a plan records it and
  reads it back; a bad one in a file is one line naming the field.
* On the simulator, through the library and the real CLI: the bundled route example misses
  its deadline when planned from the model alone, ``ecal tune`` converges, and its plan,
  run again with other seeds by ``ecal run``, keeps the deadline with its prediction confirmed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ecal.cli import main
from execution.runnable import run_plan_with_workload
from execution.tune import offsets_of, tune
from frontier.errors import FormatError
from solvers import InfeasibleError, Problem
from solvers.calibration import Calibration, Offset, plan_calibration
from solvers.confidence import solve_at_confidence, z_of
from solvers.feasibility import p_meets
from solvers.plan import Plan

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "ecal" / "examples" / "workload_1f1b.json"
#: the bundled 1F1B example with fewer microbatches: the same physics, a quicker run
MICROBATCHES = 4


def _one_task(*opts: tuple[float, float, float]) -> Problem:
    """One task whose options are (T, σ_T, E)."""
    return Problem.build({"a": ("gpu0", [{"time_s": t, "sd_time_s": sd, "energy_j": e, "s_w": 0.0}
                                         for t, sd, e in opts])}, idle_power_w={"gpu0": 0.0})


def _cal(b_s: float, sd_s: float = 0.0) -> Calibration:
    return Calibration(Offset(b_s, sd_s, 5.0, 1.0), {"gpu0": Offset(b_s, sd_s, 5.0, 1.0)}, runs=1)


# -- the calibrated deadline, hand-worked ---------------------------------------------------------

def test_a_measured_offset_tightens_the_deadline_by_itself():
    p = _one_task((1.0, 0.01, 10.0), (1.1, 0.0, 8.0), (1.2, 0.0, 6.0))
    assert solve_at_confidence(p, 1.25, 0.95, method="brute").choice == {"a": 2}   # the model alone
    # runs take 80 ms longer than predicted: T + 0.08 <= 1.25 rules C out, B keeps it (σ 0)
    plan = solve_at_confidence(p, 1.25, 0.95, method="brute", calibration=_cal(0.08))
    assert plan.choice == {"a": 1} and plan.deadline_s == pytest.approx(1.17)
    assert plan.target_deadline_s == 1.25
    assert plan.calibrated_makespan_s == pytest.approx((1.18, 0.0))
    assert plan.p_meets_deadline == 1.0 and plan_calibration(plan) == _cal(0.08)
    assert "calibrated   1180.000 ms ± 0.000" in plan.summary()


def test_the_offsets_sigma_adds_to_the_plans():
    p = _one_task((1.0, 0.01, 10.0), (1.1, 0.0, 8.0), (1.2, 0.0, 6.0))
    # B: 1.1 + 0.08 + 1.645·0.05 = 1.262 > 1.25, so D' = 1.25 - 0.08 - 1.645·0.05 gives A
    plan = solve_at_confidence(p, 1.25, 0.95, method="brute", calibration=_cal(0.08, 0.05))
    rounds = plan.meta["confidence"]["rounds"]
    assert rounds[1]["deadline_s"] == pytest.approx(1.25 - 0.08 - z_of(0.95) * 0.05)
    assert plan.choice == {"a": 0}
    sd = math.hypot(0.01, 0.05)
    assert plan.p_meets_deadline == pytest.approx(p_meets(1.25, 1.08, sd)) == pytest.approx(0.99957, abs=1e-5)
    assert plan.meta["confidence"]["p_meets_deadline"] == pytest.approx(plan.p_meets_deadline)


def test_no_plan_absorbs_a_large_offset_and_the_error_says_why():
    p = _one_task((1.0, 0.01, 10.0), (1.2, 0.0, 6.0))
    with pytest.raises(InfeasibleError, match=r"no plan meets 1250\.000 ms at confidence 0\.95 with "
                                              r"the makespan offset measured on 1 run\(s\), \+300\.000 "):
        solve_at_confidence(p, 1.25, 0.95, method="brute", calibration=_cal(0.3))


def test_the_null_calibration_changes_nothing():
    p = _one_task((1.0, 0.01, 10.0), (1.1, 0.0, 8.0), (1.2, 0.05, 6.0))
    plain = solve_at_confidence(p, 1.25, 0.95, method="brute")
    null = solve_at_confidence(p, 1.25, 0.95, method="brute", calibration=Calibration())
    assert (null.choice, null.deadline_s, null.p_meets_deadline) == (plain.choice, plain.deadline_s,
                                                                     plain.p_meets_deadline)
    assert [r["deadline_s"] for r in null.meta["confidence"]["rounds"]] == \
        [r["deadline_s"] for r in plain.meta["confidence"]["rounds"]]
    assert "calibration" not in plain.meta and plain.calibrated_makespan_s == (plain.makespan_s, plain.sd_makespan_s)


def test_a_plan_keeps_its_calibration_and_a_bad_one_is_one_line():
    p = _one_task((1.0, 0.01, 10.0), (1.1, 0.0, 8.0))
    plan = solve_at_confidence(p, 1.25, 0.95, method="brute", calibration=_cal(0.02, 0.01))
    doc = json.loads(json.dumps(plan.to_dict()))
    assert Plan.from_dict(doc) == plan
    doc["meta"]["calibration"]["step"]["sd_time_s"] = -1.0
    with pytest.raises(FormatError, match=r"p\.json: meta\.calibration\.step\.sd_time_s: must be a "
                                          r"non-negative number \(got -1\.0\)"):
        Plan.from_dict(doc, "p.json")
    doc["meta"]["calibration"] = {"step": {"time_s": float("nan")}}
    with pytest.raises(FormatError, match="meta.calibration.step.time_s"):
        Plan.from_dict(doc, "p.json")


# -- the loop on the simulator ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def tuned():
    return tune(WORKLOAD, "1.05x", microbatches=MICROBATCHES, seed=0)


def test_tune_converges_where_the_model_alone_misses(tuned):
    first = tuned.rounds[0]
    assert first.calibration.is_null and first.problems            # the model alone: a miss or a flag
    assert tuned.converged and 2 <= len(tuned.rounds) <= 4
    last = tuned.last_run
    assert last.deadline_met and not last.flagged and not last.problems()
    assert last.step.measured_time_s <= tuned.deadline_s
    # each round's calibration is what the run before it measured (measured - model)
    for before, after in zip(tuned.rounds, tuned.rounds[1:]):
        assert after.calibration == offsets_of(before.run, before.calibration)
        assert after.calibration.runs == before.calibration.runs + 1
    t = tuned.plan.meta["tune"]
    assert t["converged"] is True and len(t["rounds"]) == len(tuned.rounds)
    assert "converged: the last run kept the deadline" in tuned.summary()


def test_the_tuned_plan_keeps_its_deadline_on_seeds_it_was_not_tuned_on(tuned, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(tuned.plan_dict()))
    for seed in (1, 2):
        res = run_plan_with_workload(path, seed=seed, baselines=False)
        assert res.deadline_met, (seed, res.deadline_line())
        assert res.meta["calibration"] == tuned.plan.meta["calibration"]


def test_ecal_tune_then_ecal_run(tmp_path, capsys):
    out = tmp_path / "plan.json"
    rc = main(["tune", str(WORKLOAD), "--deadline", "1.05x", "--microbatches", str(MICROBATCHES),
               "-o", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "converged: the last run kept the deadline" in text and "calibrated" in text
    rc = main(["run", str(out), "--seed", "3", "--no-baselines"])
    text = capsys.readouterr().out
    assert "deadline" in text and "met" in text


@pytest.mark.parametrize("args, why", [
    (["--rounds", "0"], "--rounds must be >= 1"),
    (["--target-rse", "0"], "--target-rse must be in (0, 1)"),
    (["--device", "gpu0"], "use sim (simulated H200s) or nvml:INDEX"),
    (["--confidence", "1.0"], "--confidence must be in [0.5, 1)"),
    (["--deadline", "0.5x"], "is below the fastest achievable makespan"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, why):
    base = ["tune", str(WORKLOAD), "--microbatches", str(MICROBATCHES), "-o", str(tmp_path / "p.json")]
    if "--deadline" not in args:
        base += ["--deadline", "1.05x"]
    assert main(base + args) == 2
    err = capsys.readouterr().err
    assert why in err and err.count("\n") == 1, err
    assert not (tmp_path / "p.json").exists()
