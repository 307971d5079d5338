"""Plans composed with the entry context (issue 29, solvers.context): hand-worked values, the
null reduction (hypothesis), the confidence search against brute force, what a plan records,
and ``ecal plan --contexts`` then ``ecal run`` on the simulator."""

from __future__ import annotations

import itertools
import json
import math
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ecal.cli import main
from execution.context_plan import plan_context
from execution.reorder import Characterized, contexts_document
from execution.workload import load_workload
from frontier.context import ContextualSignature, ThermalMechanism
from frontier.errors import InputError
from frontier.signature import Signature
from solvers.confidence import holds, solve_at_confidence, z_of
from solvers.context import (
    PlanContext,
    context_record,
    evaluate_in_context,
    in_context_plan,
    record_shifts,
    shifted_problem,
    with_context,
)
from solvers.model import Problem
from solvers.plan import Plan, make_plan

EXAMPLES = Path(__file__).resolve().parents[1] / "ecal" / "examples"
MECH = ThermalMechanism(ambient_c=30.0, r_th_c_per_w=0.1, tau_s=1.0)


def _warmer(name: str, t_s: float, e_j: float, dt: float, de: float, lo: float = 40.0,
            hi: float = 60.0) -> ContextualSignature:
    """A contextual signature: T, E at ``lo`` °C and T + dt, E + de at ``hi`` °C (s = 0)."""
    return ContextualSignature(name, {lo: Signature(name, 0.0, t_s, e_j),
                                      hi: Signature(name, 0.0, t_s + dt, e_j + de)})


def _chain(idle_w: float = 100.0) -> Problem:
    return Problem.build([("a", "gpu0", [(1.0, 300.0)]), ("b", "gpu0", [(1.0, 100.0)])],
                         idle_power_w={"gpu0": idle_w})


# -- hand-worked -----------------------------------------------------------------------------

def test_a_chain_at_a_given_entry_hand_worked() -> None:
    # a enters at 40 °C and runs 1 s at 300 W: Θ∞ = 30 + 0.1·300 = 60, exit 60 − 20·e^-1 = 52.642;
    # b's signature moves +0.1 s, +10 J from 40 to 60 °C: at 52.642, w = 0.6321
    ctx = PlanContext({"gpu0": MECH}, {"b": {0: _warmer("b", 1.0, 100.0, 0.1, 10.0)}}, entry=40.0)
    ev = evaluate_in_context(_chain(), [0, 0], ctx)
    w = (60.0 - 20.0 * math.exp(-1.0) - 40.0) / 20.0
    assert ev.entry_temps_c["a"] is None                       # no contextual signature: null
    assert ev.entry_temps_c["b"] == pytest.approx(60.0 - 20.0 * math.exp(-1.0))
    assert ev.shifts["b"] == pytest.approx((0.1 * w, 10.0 * w))
    assert ev.makespan_s == pytest.approx(2.0 + 0.1 * w)
    assert ev.in_context == ["b"] and ev.device_entry_c == {"gpu0": 40.0}
    opt = ev.problem.tasks[1].options[0]
    assert opt.time_s == pytest.approx(1.0 + 0.1 * w) and opt.energy_j == pytest.approx(100.0 + 10.0 * w)
    assert ev.problem.tasks[0].options[0] == _chain().tasks[0].options[0]


def test_the_shifts_error_is_its_points_error() -> None:
    # b's shift at weight w is w·(p60 − p40): its variance w²·(σ²_40 + σ²_60), in the plan's σ_T
    cs = ContextualSignature("b", {40.0: Signature("b", 0.0, 1.0, 100.0, var_time_s2=4e-4),
                                   60.0: Signature("b", 0.0, 1.1, 110.0, var_time_s2=9e-4)})
    ctx = PlanContext({"gpu0": MECH}, {"b": {0: cs}}, entry=40.0)
    p = _chain()
    ev = evaluate_in_context(p, [0, 0], ctx)
    w = (60.0 - 20.0 * math.exp(-1.0) - 40.0) / 20.0
    assert set(ev.leaves["b"]) == {"context:b@40C", "context:b@60C"}
    plan = make_plan(ev.problem, [0, 0], ev.makespan_s, method="given", lower_bound_j=0.0, wall_s=0.0)
    assert plan.sd_makespan_s == pytest.approx(math.sqrt(w * w * (4e-4 + 9e-4)))
    rebuilt, _ = in_context_plan(with_context(make_plan(p, [0, 0], 3.0, method="given", lower_bound_j=0.0,
                                                        wall_s=0.0), p, ctx), p)
    assert rebuilt.sd_makespan_s == pytest.approx(plan.sd_makespan_s)


def test_cold_entry_is_the_idle_steady_state() -> None:
    ctx = PlanContext({"gpu0": MECH}, {"a": {0: _warmer("a", 1.0, 300.0, 0.2, 0.0)}}, entry="cold")
    ev = evaluate_in_context(_chain(idle_w=100.0), [0, 0], ctx)
    assert ev.device_entry_c["gpu0"] == pytest.approx(30.0 + 0.1 * 100.0)     # 40 °C: the null
    assert ev.shifts["a"] == pytest.approx((0.0, 0.0))


def test_periodic_entry_is_the_fixed_point_of_a_step() -> None:
    # a step leaves the die as it found it: walking the schedule from the periodic entry
    # (bubbles at idle power, tasks at their own power) comes back to it
    p = Problem.build([("a", "gpu0", [(1.0, 300.0)]), ("b", "gpu1", [(0.5, 100.0)]),
                       ("c", "gpu0", [(0.7, 140.0)])], edges=[("a", "b"), ("b", "c")],
                      idle_power_w={"gpu0": 80.0, "gpu1": 80.0})
    ctx = PlanContext({"gpu0": MECH}, {"c": {0: _warmer("c", 0.7, 140.0, 0.07, 7.0)}})
    ev = evaluate_in_context(p, [0, 0, 0], ctx)
    s, e, mk = ev.problem.index.schedule(ev.choice)
    th = ev.device_entry_c["gpu0"]
    temp = th
    temp = MECH.exit_temp_c(temp, e[0] - s[0], 300.0)                     # a
    assert temp == pytest.approx(ev.entry_temps_c["a"] or temp)           # (a has no signature)
    temp = MECH.idle_temp_c(temp, s[2] - e[0], 80.0)                      # the bubble while b runs
    assert ev.entry_temps_c["c"] == pytest.approx(temp, abs=1e-6)
    temp = MECH.exit_temp_c(temp, e[2] - s[2], ev.problem.tasks[2].options[0].energy_j)
    temp = MECH.idle_temp_c(temp, mk - e[2], 80.0)
    assert temp == pytest.approx(th, abs=1e-6)
    assert ev.makespan_s == pytest.approx(mk) and ev.walks >= 2


def test_the_reference_temperature_is_where_the_option_was_measured() -> None:
    # an option measured at 50 °C (its windows' temperatures) shifts from there, not from 40
    cs = _warmer("b", 1.0, 100.0, 0.1, 10.0)
    base = PlanContext({"gpu0": MECH}, {"b": {0: cs}}, entry=40.0)
    ref = PlanContext({"gpu0": MECH}, {"b": {0: cs}}, entry=40.0, reference_c={"b": {0: 50.0}})
    a, b = evaluate_in_context(_chain(), [0, 0], base), evaluate_in_context(_chain(), [0, 0], ref)
    assert b.shifts["b"][0] == pytest.approx(a.shifts["b"][0] - 0.05)
    assert b.shifts["b"][1] == pytest.approx(a.shifts["b"][1] - 5.0)


def test_bad_context_is_one_clear_error() -> None:
    with pytest.raises(InputError, match="context entry 'warm'"):
        PlanContext({}, {}, entry="warm")
    with pytest.raises(InputError, match="not finite"):
        PlanContext({}, {}, entry=float("nan"))
    with pytest.raises(InputError, match="unknown tasks"):
        evaluate_in_context(_chain(), [0, 0], PlanContext({"gpu0": MECH}, {"zz": {0: _warmer("z", 1, 1, 0, 0)}}))
    # a signature that would make the task take no time is not of this option
    shrink = PlanContext({"gpu0": MECH}, {"b": {0: _warmer("b", 3.0, 100.0, -2.5, 0.0)}}, entry=60.0)
    with pytest.raises(InputError, match="shortens it"):
        evaluate_in_context(_chain(), [0, 0], shrink)
    with pytest.raises(InputError, match="meta.context.tasks.b"):
        record_shifts({"tasks": {"b": {"time_s": "x"}}})


# -- the null context is the default: reduction (hypothesis) ---------------------------------

problems = st.lists(st.tuples(st.floats(0.1, 2.0), st.floats(10.0, 500.0)), min_size=1, max_size=5)


@settings(max_examples=40, deadline=None)
@given(problems, st.sampled_from(["periodic", "cold", 45.0]), st.booleans())
def test_without_a_dependence_the_context_changes_nothing(tasks, entry, mechanism) -> None:
    p = Problem.build([(f"t{i}", f"gpu{i % 2}", [(t, e)]) for i, (t, e) in enumerate(tasks)],
                      edges=[(f"t{i}", f"t{i + 1}") for i in range(len(tasks) - 1)],
                      idle_power_w={"gpu0": 90.0, "gpu1": 90.0})
    flat = {f"t{i}": {0: _warmer(f"t{i}", t, e, 0.0, 0.0)} for i, (t, e) in enumerate(tasks)}
    ctx = PlanContext({"gpu0": MECH, "gpu1": MECH} if mechanism else {}, flat, entry)
    choice = [0] * len(tasks)
    ev = evaluate_in_context(p, choice, ctx)
    _s, _e, mk = p.index.schedule(choice)
    assert ev.makespan_s == pytest.approx(mk, rel=1e-12)
    assert all(v == pytest.approx((0.0, 0.0), abs=1e-12) for v in ev.shifts.values())
    plan = make_plan(p, choice, mk, method="given", lower_bound_j=0.0, wall_s=0.0)
    again = make_plan(ev.problem, choice, mk, method="given", lower_bound_j=0.0, wall_s=0.0)
    assert again.energy_j == pytest.approx(plan.energy_j, rel=1e-12)
    if not mechanism:                                      # no mechanism: every task at null
        assert all(v is None for v in ev.entry_temps_c.values())


# -- the deadline kept in context, against brute force ---------------------------------------

def _two_device_problem() -> tuple[Problem, PlanContext]:
    """Three tasks per device, two options each (fast and hot, slow and cool); the fast
    options run slower when they enter warm."""
    fast, slow = (1.0, 400.0), (1.4, 250.0)
    rows = [(f"{d}{k}", d, [fast, slow]) for d in ("g0", "g1") for k in range(3)]
    p = Problem.build(rows, edges=[("g00", "g10"), ("g01", "g11"), ("g02", "g12")],
                      idle_power_w={"g0": 100.0, "g1": 100.0})
    tasks = {r[0]: {0: _warmer(r[0], 1.0, 400.0, 0.12, 30.0, 40.0, 70.0)} for r in rows}
    return p, PlanContext({"g0": MECH, "g1": MECH}, tasks)


def test_the_plan_keeps_the_deadline_in_context_and_brute_force_agrees() -> None:
    p, ctx = _two_device_problem()
    D = p.deadline_s("1.3x")
    plan = solve_at_confidence(p, D, 0.5, method="brute", context=ctx)
    t_ctx, _sd = plan.in_context_makespan_s
    assert t_ctx <= D * (1 + 1e-12) and holds(plan, D, z_of(0.5))
    # every choice, composed in context: the least energy among those that keep D in context
    best = math.inf
    for choice in itertools.product((0, 1), repeat=p.n_tasks):
        ev = evaluate_in_context(p, choice, ctx)
        if ev.makespan_s <= D * (1 + 1e-12):
            e = make_plan(ev.problem, choice, ev.makespan_s, method="bf", lower_bound_j=0.0, wall_s=0.0).energy_j
            best = min(best, e)
    assert plan.context is not None
    assert plan.context["energy_j"] == pytest.approx(best, rel=1e-9) or plan.context["energy_j"] >= best
    # the null-context plan at D misses D in context: the context is what the search paid for
    null = solve_at_confidence(p, D, 0.5, method="brute")
    ev = evaluate_in_context(p, [null.choice[t.name] for t in p.tasks], ctx)
    assert ev.makespan_s > D and plan.deadline_s < D


def test_a_plan_records_its_context_and_run_rebuilds_it(tmp_path) -> None:
    p, ctx = _two_device_problem()
    plan = with_context(solve_at_confidence(p, "1.4x", 0.5, method="brute"), p, ctx)
    rec = plan.context
    assert rec is not None and rec["mechanism"] == "thermal" and rec["entry"] == "periodic"
    assert rec["in_context"] + rec["at_null"] == p.n_tasks
    for name, v in rec["tasks"].items():
        chosen = plan.choice[name]
        assert (v is None) == (chosen != 0)               # only the fast options are contextual
    path = tmp_path / "plan.json"
    plan.save(path)
    back = Plan.load(path)
    again, shifted = in_context_plan(back, p)
    assert again.makespan_s == pytest.approx(rec["makespan_s"]) and again.energy_j == pytest.approx(rec["energy_j"])
    assert shifted == shifted_problem(p, [plan.choice[t.name] for t in p.tasks], record_shifts(rec))
    assert "in context" in back.summary() and back.in_context_makespan_s[0] == rec["makespan_s"]
    ev = evaluate_in_context(p, [plan.choice[t.name] for t in p.tasks], ctx)
    assert context_record(ev, again)["tasks"] == rec["tasks"]


# -- ecal plan --contexts, then ecal run, on the simulator -----------------------------------

@pytest.fixture(scope="module")
def bundled(tmp_path_factory) -> tuple[Path, Path]:
    """The bundled workload (copied) and a contexts file of it: every element@ω at 40 °C as
    measured and at 60 °C 1.5 % slower and 1 % costlier (a synthetic dependence)."""
    d = tmp_path_factory.mktemp("ctx")
    for f in ("workload_1f1b.json", "workload_fwd.json", "workload_bwd.json"):
        shutil.copy(EXAMPLES / f, d / f)
    wl = load_workload(d / "workload_1f1b.json")
    chars = {}
    for dev in wl.problem.index.devices:
        ctx = {}
        for t in wl.problem.tasks:
            if t.device != dev:
                continue
            for o in t.options:
                key = f"{wl.task_elements[t.name]}@{o.omega.dev.label()}"
                s = Signature(key, o.s_w, o.time_s, o.d_j)
                ctx[key] = ContextualSignature(key, {40.0: s, 60.0: s.with_(time_s=o.time_s * 1.015,
                                                                           d_j=o.d_j * 1.01)})
        chars[dev] = Characterized(ctx, ThermalMechanism(28.0, 0.052, 1.1), 0.5, ())
    path = d / "contexts.json"
    path.write_text(json.dumps(contexts_document(chars, "synthetic", True)))
    return d / "workload_1f1b.json", path


def test_plan_context_matches_every_option_with_its_reference(bundled) -> None:
    wl_file, ctx_file = bundled
    wl = load_workload(wl_file)
    ctx = plan_context(wl, ctx_file)
    assert set(ctx.tasks) == {t.name for t in wl.problem.tasks}
    assert all(len(v) == len(wl.problem.tasks[0].options) for v in ctx.tasks.values())
    # the bundled signatures record their windows' temperatures: the shift starts there
    assert ctx.reference_c and all(30.0 < r < 70.0 for v in ctx.reference_c.values() for r in v.values())


def test_ecal_plan_with_contexts_then_ecal_run(bundled, tmp_path, capsys) -> None:
    wl_file, ctx_file = bundled
    out = tmp_path / "plan.json"
    assert main(["plan", str(wl_file), "--deadline", "1.05x", "--contexts", str(ctx_file),
                 "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "in context" in text and "tasks composed with their entry temperature" in text
    plan = Plan.load(out)
    rec = plan.context
    assert rec is not None and rec["in_context"] == len(rec["tasks"])
    assert rec["makespan_s"] > plan.makespan_s                  # warm entries: slower
    assert rec["makespan_s"] <= plan.target_deadline_s
    assert main(["run", str(out), "--workload", str(wl_file), "--json"]) in (0, 1)
    res = json.loads(capsys.readouterr().out)["plan"]
    assert res["step"]["predicted_time_s"] == pytest.approx(rec["makespan_s"])
    assert res["step"]["predicted_energy_j"] == pytest.approx(rec["energy_j"])


@pytest.mark.parametrize("args, why", [
    (["--contexts", "missing.json"], "missing.json"),
    (["--contexts", "{ctx}", "--context-entry", "warm"], "--context-entry 'warm'"),
])
def test_bad_context_arguments_exit_2(bundled, tmp_path, capsys, args, why) -> None:
    wl_file, ctx_file = bundled
    args = [a.replace("{ctx}", str(ctx_file)) for a in args]
    assert main(["plan", str(wl_file), "--deadline", "1.05x", *args]) == 2
    assert why in capsys.readouterr().err


def test_a_contexts_file_of_another_workload_is_refused(bundled, tmp_path, capsys) -> None:
    wl_file, _ = bundled
    other = tmp_path / "other.json"
    chars = {"gpu9": Characterized({"x@1MHz": _warmer("x", 1.0, 1.0, 0.0, 0.0)}, MECH, 0.5, ())}
    other.write_text(json.dumps(contexts_document(chars)))
    assert main(["plan", str(wl_file), "--deadline", "1.05x", "--contexts", str(other)]) == 2
    err = capsys.readouterr().err
    assert "none of" in err and "ecal contexts" in err


def test_ecal_tune_with_contexts_records_them(bundled, tmp_path, capsys) -> None:
    wl_file, ctx_file = bundled
    out = tmp_path / "tuned.json"
    rc = main(["tune", str(wl_file), "--deadline", "1.1x", "--microbatches", "2", "--rounds", "1",
               "--runs", "2", "--contexts", str(ctx_file), "--context-entry", "cold",
               "--warmup-steps", "2", "-o", str(out)])
    assert rc in (0, 1)
    assert "in context" in capsys.readouterr().out
    plan = Plan.load(out)
    assert plan.context is not None and plan.context["entry"] == "cold"
    assert plan.meta["tune"]["rounds"][0]["predicted_time_s"] == pytest.approx(plan.context["makespan_s"])
    assert main(["tune", str(wl_file), "--deadline", "1.1x", "--warmup-steps", "-2"]) == 2
    assert "--warmup-steps must be >= 0" in capsys.readouterr().err


def test_only_options_that_change_beyond_their_error_are_composed_in_context(bundled, caplog) -> None:
    from execution.context_plan import sensitive

    def cs(dt, de, var_t, var_e):
        return ContextualSignature("x", {40.0: Signature("x", 0.0, 1.0, 100.0, var_time_s2=var_t,
                                                         var_energy_j2=var_e),
                                         60.0: Signature("x", 0.0, 1.0 + dt, 100.0 + de,
                                                         var_time_s2=var_t, var_energy_j2=var_e)})
    # |Δ| against sqrt(σ²_cold + σ²_warm) = sqrt(2)·σ, on time or on energy
    assert not sensitive(cs(0.01, 1.0, 1e-4, 1.0))          # z 0.71 and 0.71
    assert sensitive(cs(0.03, 0.0, 1e-4, 1.0))              # time: z 2.12
    assert sensitive(cs(0.0, 3.0, 1e-4, 1.0))               # energy: z 2.12
    assert sensitive(cs(0.0, 3.0, 1e-4, 1.0), 2.0) and not sensitive(cs(0.0, 3.0, 1e-4, 1.0), 2.2)
    assert sensitive(cs(0.01, 0.0, 0.0, 0.0)) and not sensitive(cs(0.0, 0.0, 0.0, 0.0))
    # a contexts file in which nothing changes with the entry: every task at the null context
    wl_file, ctx_file = bundled
    doc = json.loads(ctx_file.read_text())
    for dev in doc["devices"].values():
        for pts in dev["elements"].values():
            pts[1]["signature"] = pts[0]["signature"]
    flat = ctx_file.with_name("flat.json")
    flat.write_text(json.dumps(doc))
    with caplog.at_level("WARNING"):
        ctx = plan_context(load_workload(wl_file), flat)
    assert ctx.tasks == {} and "beyond its error" in caplog.text
    assert plan_context(load_workload(wl_file), ctx_file).tasks    # the synthetic change is exact


def test_ecal_run_warms_up_to_the_steady_state_a_context_plan_assumes(bundled, tmp_path, capsys) -> None:
    wl_file, ctx_file = bundled
    out = tmp_path / "plan.json"
    assert main(["plan", str(wl_file), "--deadline", "1.05x", "--contexts", str(ctx_file),
                 "--microbatches", "2", "-o", str(out)]) == 0
    capsys.readouterr()
    temps = {}
    for n in (1, 6):
        main(["run", str(out), "--no-baselines", "--warmup-steps", str(n), "--json"])
        doc = json.loads(capsys.readouterr().out)
        doc = doc.get("plan", doc) if "step" not in doc else doc
        assert doc["warmup_steps"] == n
        t = doc["meta"]["task_temperature_c"]
        temps[n] = sum(t.values()) / len(t)
    assert temps[6] > temps[1] + 1.0                  # more warm-up: a warmer die at the tasks
    assert main(["run", str(out), "--warmup-steps", "-1"]) == 2
    assert "--warmup-steps must be >= 0" in capsys.readouterr().err
