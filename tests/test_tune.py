"""``ecal tune``: plan, run, calibrate, plan again until a run keeps its deadline (issue 29).

* A calibration (measured offsets, :mod:`solvers.calibration`) enters the deadline at a
  confidence exactly as the module says: T + b_T + z·sqrt(σ_T² + σ_b²) ≤ D, against
  hand-worked one-task instances; the null calibration changes nothing; a plan records it and
  reads it back; a bad one in a file is one line naming the field.
* The stop rule's two checks (the deadline at the confidence, measured over k runs; energy
  within σ) and the pooled calibration, against hand-worked values.
* On the simulator, through the library and the real CLI: the bundled route example misses
  its deadline when planned from the model alone, ``ecal tune`` converges, and its plan,
  run again with other seeds by ``ecal run``, keeps the deadline.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ecal.cli import main
from execution.runnable import run_plan_with_workload
from execution.tune import calibration_of, energy_check, loop_seed, round_checks, tune, two_sided_z
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

# -- the stop rule and the pooled calibration, hand-worked ------------------------------------------

class _C:
    """A stand-in for a run's step or device comparison (the fields the checks read)."""

    def __init__(self, name: str, pt: float, mt: float, pe: float, me: float, *, sd_pt: float = 0.0,
                 sd_mt: float = 0.0, sd_pe: float = 0.0, sd_me: float = 0.0, flagged: bool = False):
        self.name, self.flagged = name, flagged
        self.predicted_time_s, self.measured_time_s = pt, mt
        self.predicted_energy_j, self.measured_energy_j = pe, me
        self.sd_predicted_time_s, self.sd_measured_time_s = sd_pt, sd_mt
        self.sd_predicted_energy_j, self.sd_measured_energy_j = sd_pe, sd_me


class _Run:
    def __init__(self, step: _C, devices: tuple[_C, ...] = (), seed: int = 0):
        self.step, self.devices, self.seed = step, devices, seed


def test_energy_within_sigma_is_two_sided_at_the_confidence():
    assert two_sided_z(0.95) == pytest.approx(1.959964, abs=1e-6)
    # σ = sqrt(3² + 4²) = 5 J; 9.7 J off is z 1.94 (within), 10 J is z 2.0 (off)
    ok = energy_check(_Run(_C("step", 1.0, 1.0, 100.0, 109.7, sd_pe=3.0, sd_me=4.0)))
    assert ok.sd_j == pytest.approx(5.0) and ok.within and ok.label() == "within (z +1.9 ≤ 1.96)"
    off = energy_check(_Run(_C("step", 1.0, 1.0, 100.0, 90.0, sd_pe=3.0, sd_me=4.0)))
    assert not off.within and off.label() == "OFF (z -2.0 > 1.96)"
    assert energy_check(_Run(_C("step", 1.0, 1.0, 100.0, 109.7, sd_pe=3.0, sd_me=4.0)), 0.99).limit_z \
        == pytest.approx(2.575829, abs=1e-6)


def test_the_deadline_check_bounds_the_next_run_from_the_k_runs():
    # steps 1.00, 1.02, 1.04 s: mean 1.02, sample σ 0.02 (df 2, t 2.919986);
    # bound 1.02 + 2.919986·0.02·sqrt(4/3) = 1.087434
    runs = [_Run(_C("step", 1.0, t, 100.0, 100.0, sd_pe=1.0)) for t in (1.00, 1.02, 1.04)]
    c = round_checks(runs, 1.09)
    assert (c.mean_time_s, c.sd_time_s, c.df) == (pytest.approx(1.02), pytest.approx(0.02), 2)
    assert c.z == pytest.approx(2.919986, abs=1e-6)
    assert c.time_bound_s == pytest.approx(1.087434, abs=1e-6)
    assert c.deadline_kept and c.runs_met == 3 and c.passed
    tight = round_checks(runs, 1.08)          # every run met 1.08 s, the bound does not
    assert tight.runs_met == 3 and not tight.deadline_kept and not tight.passed
    assert tight.deadline_label().startswith("MISSED (bound +0.69%, 3/3 runs met")
    # an earlier round's spread about its own mean pools in: 1.10, 1.12 adds 2e-4 to the sum of
    # squares (8e-4) and one degree of freedom: σ sqrt(1e-3/3), t 2.353363 (df 3)
    pooled = round_checks(runs, 1.08, earlier=[[_Run(_C("step", 1.1, t, 1.0, 1.0)) for t in (1.10, 1.12)]])
    assert pooled.df == 3 and pooled.sd_time_s == pytest.approx(math.sqrt(1e-3 / 3))
    assert pooled.time_bound_s == pytest.approx(1.02 + 2.353363 * math.sqrt(1e-3 / 3) * math.sqrt(4 / 3),
                                                abs=1e-6)
    assert pooled.deadline_kept
    # one run a round and none before: its own σ of its mean step, and z_P
    one = round_checks([_Run(_C("step", 1.0, 1.0, 1.0, 1.0, sd_mt=0.01))], 1.05)
    assert one.df == 0 and one.time_bound_s == pytest.approx(1.0 + 1.6448536 * 0.01 * math.sqrt(2))
    # the energy check is on the runs' mean: σ = sqrt(1² + (sample σ/sqrt(k))²)
    hot = [_Run(_C("step", 1.0, 1.0, 100.0, e, sd_pe=1.0)) for e in (101.0, 103.0, 105.0)]
    c = round_checks(hot, 1.06)
    assert c.energy.measured_j == pytest.approx(103.0)
    assert c.energy.sd_j == pytest.approx(math.hypot(1.0, 2.0 / math.sqrt(3)))
    assert not c.energy.within and c.deadline_kept and not c.passed


def test_the_calibration_is_the_latest_plans_offset_with_the_spread_of_all():
    # round 1, a model-alone plan: one run, offset 0.03 s, 4 J; round 2, a plan made with
    # offset +10 ms, 2 J (predicted = model + offset): two runs, model offsets 0.02 and 0.04 s,
    # 5 and 7 J
    used = Calibration(Offset(0.01, 0.0, 2.0, 0.0), {"gpu0": Offset(0.01, 0.0, 2.0, 0.0)}, runs=1)

    def run(pt: float, mt: float, pe: float, me: float, sd_mt: float) -> _Run:
        return _Run(_C("step", pt, mt, pe, me, sd_mt=sd_mt, sd_me=1.0),
                    (_C("gpu0", pt, mt, pe, me, sd_mt=sd_mt, sd_me=1.0),))

    rounds = [([run(1.00, 1.03, 50.0, 54.0, 0.0)], Calibration()),
              ([run(1.01, 1.02, 52.0, 55.0, 0.003), run(1.01, 1.04, 52.0, 57.0, 0.004)], used)]
    cal = calibration_of(rounds)
    assert cal.runs == 3 and cal.step.time_s == pytest.approx(0.03)      # round 2's mean
    # run-to-run variance: within round 2, (1e-4 + 1e-4)/1 = 2e-4 (> the runs' own, 8.3e-6),
    # times 1 + 1/2; the rounds' means 0.03 and 0.03 do not spread
    assert cal.step.sd_time_s == pytest.approx(math.sqrt(2e-4 * 1.5))
    # energy: round 2's mean 6 J; within variance 2 (> own 1) times 1.5, plus pvar(4, 6) = 1
    assert cal.step.energy_j == pytest.approx(6.0)
    assert cal.step.sd_energy_j == pytest.approx(2.0)
    assert cal.device("gpu0") == cal.step
    assert calibration_of([]) == Calibration()


def test_each_run_of_the_loop_has_its_own_seed_and_none_is_held_out():
    seeds = [loop_seed(0, i) for i in range(20)]
    assert seeds[:3] == [0, 1009, 2018] and len(set(seeds)) == 20
    assert not set(seeds) & set(range(1, 1009))


# -- the loop on the simulator ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def tuned():
    return tune(WORKLOAD, "1.05x", microbatches=MICROBATCHES, seed=0)


def test_tune_converges_where_the_model_alone_misses(tuned):
    first = tuned.rounds[0]
    assert first.calibration.is_null and first.problems            # the model alone: a miss or off
    assert tuned.converged and 2 <= len(tuned.rounds) <= 6, tuned.summary()
    last = tuned.rounds[-1]
    assert last.passed and last.checks.deadline_kept and last.checks.energy.within
    assert last.checks.time_bound_s <= tuned.deadline_s
    # every run has its own seed; each round's calibration pools every run before it
    seeds = [r.seed for rnd in tuned.rounds for r in rnd.runs]
    assert seeds == [loop_seed(0, i) for i in range(len(seeds))]
    done = []
    for before, after in zip(tuned.rounds, tuned.rounds[1:]):
        done.append((before.runs, before.calibration))
        assert after.calibration == calibration_of(done)
        assert after.calibration.runs == sum(len(r) for r, _ in done)
    # the plan kept records the offsets measured on its own runs too (not only those it was
    # solved with): every run of the loop, the last round's plan's mean
    done.append((last.runs, last.calibration))
    assert plan_calibration(tuned.plan) == calibration_of(done) != last.calibration
    assert plan_calibration(tuned.plan).runs == len(seeds)
    assert tuned.plan.meta["confidence"]["calibration_measured_on"].startswith(
        f"round {len(tuned.rounds)}'s {len(last.runs)} run(s) of this plan")
    t = tuned.plan.meta["tune"]
    assert t["converged"] is True and len(t["rounds"]) == len(tuned.rounds)
    assert t["rounds"][-1]["deadline_kept"] is True and t["rounds"][-1]["energy_within"] is True
    text = tuned.summary()
    assert "converged: deadline met at confidence 0.95 (measured), energy within σ" in text
    assert "kept (bound" in text and "within (z" in text


def test_the_tuned_plan_keeps_its_deadline_on_seeds_it_was_not_tuned_on(tuned, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(tuned.plan_dict()))
    for seed in (1, 2):
        res = run_plan_with_workload(path, seed=seed, baselines=False)
        assert res.deadline_met, (seed, res.deadline_line())
        assert energy_check(res).within, res.summary()
        assert res.meta["calibration"] == tuned.plan.meta["calibration"]


def test_ecal_tune_then_ecal_run(tmp_path, capsys):
    out = tmp_path / "plan.json"
    rc = main(["tune", str(WORKLOAD), "--deadline", "1.05x", "--microbatches", str(MICROBATCHES),
               "-o", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "converged: deadline met at confidence 0.95" in text and "calibrated" in text
    rc = main(["run", str(out), "--seed", "3", "--no-baselines"])
    text = capsys.readouterr().out
    assert "deadline" in text and "met" in text


@pytest.mark.parametrize("args, why", [
    (["--rounds", "0"], "--rounds must be >= 1"),
    (["--runs", "0"], "--runs must be >= 1"),
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
