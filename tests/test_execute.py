"""execution (execution.run): a plan run on simulated H200s, measured, and held against Eq. 23.

Everything here is simulated (virtual time); the module fixture builds a small demo problem
(2 stages x 2 microbatches, 2 clocks, one SM split: ~4 s) and every run takes milliseconds.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from ecal.demo import DemoConfig, _problem, run_demo, task_options
from execution.baselines import all_max_plan as _all_max
from execution.pipeline import compute_sms, pipeline_work, stage_kernels
from execution.predict import predict_devices
from execution.run import run_plan
from execution.savings import run_with_baselines, savings
from execution.work import ExecutionError, TaskWork
from measure.sim import PRESETS, SimulatedGPU
from solvers.model import Problem
from solvers.plan import make_plan, plan_terms

SMALL = DemoConfig(n_stages=2, n_microbatches=2, clocks_mhz=(1980, 1440), power_limits_w=(700,),
                   comm_sms=(16,))


@pytest.fixture(scope="module")
def demo():
    r = run_demo(SMALL)
    # the demo's first plan: built from elements characterized alone, with a flat switch cost
    r = dataclasses.replace(r, problem=r.first.problem, plan=r.first.plan,
                            meta={**r.meta, "deadline_s": r.meta["deadline_round1_s"]})
    work = pipeline_work(r.problem, stage_kernels(SMALL.stage_sizes[:SMALL.n_stages]), PRESETS["p2p_send"])
    return r, work


@pytest.fixture(scope="module")
def executed(demo):
    r, work = demo
    return run_plan(r.plan, r.problem, work, seed=0)


def _alternating_plan(r):
    """stage1 alternates between the two clocks task after task: switches guaranteed."""
    p = r.problem
    choice, k = [], 0
    for t in p.tasks:
        if t.device == "stage1":
            choice.append(k % 2)
            k += 1
        else:
            choice.append(0)
    return make_plan(p, choice, p.deadline_s("2x"), method="test: alternating", lower_bound_j=0.0,
                     wall_s=0.0)


def _by_step(res):
    out: dict[int, dict[str, object]] = {}
    for t in res.tasks:
        out.setdefault(t.step, {})[t.name] = t
    return out


def test_pipeline_work_is_compute_par_send_at_the_option_split(demo):
    r, work = demo
    for t in r.problem.tasks:
        assert len(work[t.name]) == len(t.options)
        for o, w in zip(t.options, work[t.name]):
            (comp, n_comp), (send, n_send) = w.streams
            assert send is PRESETS["p2p_send"] and n_send == o.omega.sm_count
            assert n_comp == compute_sms(o.omega.sm_count)     # as granted beside the send
            assert comp.name == f"{t.name.split('/')[0]}_{t.name.split('/')[1]}"


def test_dependencies_and_device_order_are_honoured(demo, executed):
    r, _ = demo
    res = executed
    ix = r.problem.index
    assert res.n_steps >= 3
    for runs in _by_step(res).values():
        assert set(runs) == set(ix.names)
        for a, b in r.problem.edges:     # cross-device: the next stage waits for the send
            assert runs[b].start_s >= runs[a].end_s
        for seq in ix.dev_seq.values():
            for u, v in zip(seq, seq[1:]):
                ru, rv = runs[ix.names[u]], runs[ix.names[v]]
                assert rv.start_s >= ru.end_s + rv.switch_s
        # ASAP: a task starts as soon as its device and its predecessors allow, no later
        for v in range(ix.n):
            rv = runs[ix.names[v]]
            u = ix.dev_prev[v]
            dev_free = runs[ix.names[u]].end_s + rv.switch_s if u >= 0 else 0.0
            ready = max([runs[ix.names[p]].end_s for p in ix.preds[v]] + [dev_free])
            assert rv.start_s == pytest.approx(ready, abs=1e-9)
            assert rv.wait_s == pytest.approx(max(0.0, ready - dev_free), abs=1e-9)
    # stage1's first forward really waited for stage0's (a bubble at ready power)
    first = _by_step(res)[0]
    assert first["s1/forward/0"].wait_s > 0
    assert first["s1/forward/0"].start_s == first["s0/forward/0"].end_s


def test_switch_latency_charged_only_when_omega_dev_changes(demo):
    r, work = demo
    plan = _alternating_plan(r)
    res = run_plan(plan, r.problem, work, seed=1)
    ix = r.problem.index
    probe = SimulatedGPU()
    n_switch = n_stay = 0
    for t in res.tasks:
        v = ix.pos[t.name]
        u = ix.dev_prev[v]
        if u < 0:
            assert t.switch_s == 0.0      # the first task's ω is set before the window
            continue
        a = r.problem.tasks[u].options[plan.tasks[u].option].omega.dev
        b = r.problem.tasks[v].options[plan.tasks[v].option].omega.dev
        if a == b:
            n_stay += 1
            assert t.switch_s == 0.0
        else:
            n_switch += 1
            assert t.switch_s == pytest.approx(probe.switch_time_s(a, b), abs=1e-8)
            assert t.switch_s > 0.002   # the simulator's latency, not the plan's 2 ms
    assert n_switch >= 3 and n_stay >= 3
    assert sum(len(v) for v in res.switches_s.values()) == plan.n_switches


def test_a_steady_state_plan_pays_the_wrap_switch_inside_each_step(demo):
    """A steady-state plan charges each device's last -> first switch (the step repeats):
    the executor makes it inside the measured window, as the step's first switch, so the
    switches per step equal the plan's count (wrap included) and the first task of a device
    whose first and last ω differ pays the simulator's latency."""
    r, work = demo
    steady = r.problem.with_(steady_state=True)
    p = r.problem
    choice, k = [], 0
    for t in p.tasks:            # stage1 alternates, with first and last task on different ω
        if t.device == "stage1":
            choice.append(k % 2)
            k += 1
        else:
            choice.append(0)
    plan = make_plan(steady, choice, steady.deadline_s("2x"), method="test: wrap",
                     lower_bound_j=0.0, wall_s=0.0)
    ix = steady.index
    seq = ix.dev_seq["stage1"]
    first, last = seq[0], seq[-1]
    assert choice[first] != choice[last]
    counts = ix.switch_counts(choice)
    assert counts["stage1"] == plan.n_switches
    res = run_plan(plan, steady, work, seed=1)
    per_step: dict[int, int] = {}
    for t in res.tasks:
        per_step[t.step] = per_step.get(t.step, 0) + int(t.switch_s > 0)
        if ix.pos[t.name] == first:
            assert t.switch_s > 0.002          # the wrap switch, paid in the window
    assert set(per_step.values()) == {plan.n_switches}
    # and the same plan without steady state pays no switch before the first task
    plain = make_plan(p, choice, p.deadline_s("2x"), method="test", lower_bound_j=0.0, wall_s=0.0)
    assert plain.n_switches == plan.n_switches - 1
    res0 = run_plan(plain, p, work, seed=1)
    assert all(t.switch_s == 0.0 for t in res0.tasks if ix.pos[t.name] == first)


def test_energy_is_the_sum_of_the_counters(executed):
    res = executed
    per_step: dict[int, float] = {}
    for w in res.windows:
        assert w.energy_j == pytest.approx(w.counter_end_j - w.counter_start_j
                                           - w.ready_power_w * w.tail_s, abs=1e-9)
        assert 0.0 <= w.tail_s <= 0.13
        # the tick-aligned counter window agrees with the simulator's exact energy
        assert abs(w.energy_j - w.true_energy_j) < 2.5
        per_step[w.step] = per_step.get(w.step, 0.0) + w.energy_j
    steps = [per_step[k] for k in sorted(per_step)]
    assert steps == pytest.approx(res.meta["step_energies_j"], abs=1e-9)
    assert res.step.measured_energy_j == pytest.approx(sum(steps) / len(steps), rel=1e-12)
    dev_sum = sum(c.measured_energy_j for c in res.devices)
    assert dev_sum == pytest.approx(res.step.measured_energy_j, rel=1e-12)


def test_predicted_device_energies_sum_to_the_plan(demo, executed):
    r, _ = demo
    preds = predict_devices(r.plan, r.problem)
    assert sum(p.energy_j for p in preds.values()) == pytest.approx(r.plan.energy_j, rel=1e-12)
    assert max(p.time_s for p in preds.values()) == pytest.approx(r.plan.makespan_s, rel=1e-12)
    assert executed.step.predicted_energy_j == r.plan.energy_j
    assert executed.step.sd_predicted_energy_j == r.plan.sd_energy_j


def test_one_device_prediction_sigma_is_the_plans():
    opt = [{"time_s": 1.0, "s_w": 100.0, "d_j": 50.0, "sd_time_s": 0.01, "sd_energy_j": 2.0},
           {"time_s": 2.0, "s_w": 80.0, "d_j": 20.0, "sd_time_s": 0.02, "sd_energy_j": 1.0}]
    p = Problem.build([("a", "g", opt), ("b", "g", opt)], idle_power_w={"g": 60.0})
    plan = make_plan(p, [0, 1], 10.0, method="t", lower_bound_j=0.0, wall_s=0.0)
    (pred,) = predict_devices(plan, p).values()
    assert pred.energy_j == pytest.approx(plan.energy_j)
    assert pred.sd_energy_j == pytest.approx(plan.sd_energy_j, rel=1e-12)
    assert pred.sd_time_s == pytest.approx(plan.sd_makespan_s, rel=1e-12)


def test_device_sigma_counts_a_leaf_shared_by_composed_options_once():
    """Options a ⊕ send and b ⊕ send share the send leaf: on one device its error is counted
    with the summed sensitivity (k² var), as the plan and frontier.dag count it, not as two
    independent options (issue 19: 4.24 J, not 3.16 J)."""
    from frontier.compose import par
    from frontier.signature import Signature
    from solvers.model import Option

    a = Signature("a", s_w=100.0, time_s=1.0, d_j=50.0, var_time_s2=1e-6, var_energy_j2=4.0)
    b = Signature("b", s_w=100.0, time_s=1.0, d_j=50.0, var_time_s2=1e-6, var_energy_j2=4.0)
    send = Signature("send", s_w=100.0, time_s=0.5, d_j=10.0, var_time_s2=1e-6, var_energy_j2=9.0)
    opts_a = [Option.from_signature(par(a, send))]
    opts_b = [Option.from_signature(par(b, send))]
    p = Problem.build([("ta", "g", opts_a), ("tb", "g", opts_b)], idle_power_w={"g": 100.0})
    plan = make_plan(p, [0, 0], 10.0, method="t", lower_bound_j=0.0, wall_s=0.0)
    (pred,) = predict_devices(plan, p).values()
    assert pred.sd_energy_j == pytest.approx(plan.sd_energy_j, rel=1e-12)
    # send twice, correlated: sqrt(4 + 4 + 2² * 9) = 6.63 J, not sqrt(4 + 4 + 9 + 9) = 5.10 J
    assert pred.sd_energy_j == pytest.approx(math.sqrt(4 + 4 + 4 * 9), rel=1e-3)  # + T terms


def test_per_device_sigma_is_the_plans_delta_method_on_that_device(demo):
    r, _work = demo
    p, plan = r.problem, r.plan
    ix = p.index
    choice = [t.option for t in plan.tasks]
    start, end, _mk = ix.schedule(choice)
    crit = [False] * ix.n
    for i in ix.critical_chain(start, end, ix.switch_tau(choice)):
        crit[i] = True
    preds = predict_devices(plan, p)
    for d, pred in preds.items():
        want = math.sqrt(plan_terms(p, choice, crit, devices=[d]).variances()[1])
        assert pred.sd_energy_j == pytest.approx(want, rel=1e-12), d
        assert pred.sd_energy_j > 0


def test_deterministic_for_a_seed(demo, executed):
    r, work = demo
    again = run_plan(r.plan, r.problem, work, seed=0)
    assert json.dumps(again.to_dict(), sort_keys=True) == json.dumps(executed.to_dict(), sort_keys=True)
    other = run_plan(r.plan, r.problem, work, seed=7)
    assert other.meta["step_energies_j"] != executed.meta["step_energies_j"]


def test_demo_plan_is_flagged_when_run(executed):
    # The plan composes alone-characterized options (compute ⊕ send), a 2 ms switch and
    # top-clock idle power; the simulated run pays co-runs (memory pressure in the shared
    # HBM and L2, fitted to the H200's split co-runs), its own settle latencies and ready
    # power at the locked clock. Eq. 23 flags the step.
    res = executed
    assert res.flagged
    assert res.step.deviation.flagged_time or res.step.deviation.flagged_energy
    paid = sum(sum(v) for v in res.switches_s.values())
    if sum(len(v) for v in res.switches_s.values()):
        assert paid > sum(res.planned_switch_s.values())   # the simulator's latency exceeds 2 ms
    # the co-runs (compute ∥ send in disjoint partitions, sharing HBM and L2) run longer than
    # their ⊕ options planned
    assert res.attribution()["step"]["busy_s"] > 0
    assert res.flagged_devices


def test_repeats_until_the_target_rse(demo):
    r, work = demo
    from measure.protocol import Protocol

    loose = run_plan(r.plan, r.problem, work, protocol=Protocol(target_rse=0.5, min_windows=2))
    assert loose.n_steps == 2 and loose.converged
    tight = run_plan(r.plan, r.problem, work,
                     protocol=Protocol(target_rse=1e-9, min_windows=2, max_windows=4))
    assert tight.n_steps == 4 and not tight.converged
    assert "NOT reached" in tight.summary()


def test_baselines_and_measured_savings_with_sigma(demo):
    r, work = demo
    sub = r.best_single_problem
    sub_work = pipeline_work(sub, stage_kernels(SMALL.stage_sizes[:SMALL.n_stages]), PRESETS["p2p_send"])
    cmp = run_with_baselines(
        (r.plan, r.problem, work),
        {"all-max": (_all_max(r.problem, r.meta["deadline_s"]), r.problem, work),
         "best single ω": (r.best_single, sub, sub_work)}, seed=0)
    assert [s.baseline for s in cmp.savings] == ["all-max", "best single ω"]
    for s in cmp.savings:
        b = cmp.baselines[s.baseline].step
        p = cmp.plan.step
        ratio = p.measured_energy_j / b.measured_energy_j
        assert s.measured == pytest.approx(1 - ratio, rel=1e-12)
        sd = ratio * math.hypot(p.sd_measured_energy_j / p.measured_energy_j,
                                b.sd_measured_energy_j / b.measured_energy_j)
        assert s.sd_measured == pytest.approx(sd, rel=1e-12) and s.sd_measured > 0
        assert s.predicted == pytest.approx(1 - r.plan.energy_j / b.predicted_energy_j, rel=1e-12)
        assert s.sd_predicted > 0
    assert savings(cmp.plan, cmp.plan, "self").measured == 0.0
    text = cmp.summary()
    assert "SIMULATED" in text and "measured" in text
    d = json.loads(json.dumps(cmp.to_dict()))
    assert d["simulated"] is True and len(d["savings"]) == 2


def test_result_is_frozen_json_ready_and_says_simulated(executed):
    res = executed
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.n_steps = 1
    d = json.loads(json.dumps(res.to_dict()))
    assert d["simulated"] is True and "SIMULATED" in d["note"]
    assert d["format"] == "ecal.execution/1"
    assert {c["name"] for c in d["devices"]} == {"stage0", "stage1"}
    assert "flagged_energy" in d["step"]["deviation"]
    text = res.summary()
    assert "SIMULATED" in text and "step" in text and "stage1" in text
    at = res.attribution()["step"]
    assert at["tasks_j"] + at["rest_j"] == pytest.approx(at["error_j"], abs=1e-9)


def test_a_plan_for_another_problem_is_refused(demo):
    r, work = demo
    opts = task_options(SMALL, r.element_signatures)
    other = _problem(dataclasses.replace(SMALL, n_microbatches=1), opts, r.meta["idle_power_w"])
    with pytest.raises(ExecutionError, match="does not match problem"):
        run_plan(r.plan, other, work)
    # same tasks, an option index that points at another option
    t0 = r.plan.tasks[0]
    swapped = dataclasses.replace(t0, option=1 - t0.option)
    bad = dataclasses.replace(r.plan, tasks=(swapped, *r.plan.tasks[1:]))
    with pytest.raises(ExecutionError, match="another problem"):
        run_plan(bad, r.problem, work)
    gone = dataclasses.replace(t0, option=99)
    with pytest.raises(ExecutionError, match="does not exist"):
        run_plan(dataclasses.replace(r.plan, tasks=(gone, *r.plan.tasks[1:])), r.problem, work)


def test_a_task_with_no_work_is_refused(demo):
    r, work = demo
    missing = {k: v for k, v in work.items() if k != "s1/backward/1"}
    with pytest.raises(ExecutionError, match="s1/backward/1.*no work"):
        run_plan(r.plan, r.problem, missing)
    short = {**work, "s0/forward/0": work["s0/forward/0"][:1]}
    with pytest.raises(ExecutionError, match="entries for its 2 options"):
        run_plan(r.plan, r.problem, short)
    holes = {**work, "s0/forward/0": (None, None)}
    with pytest.raises(ExecutionError, match="has no work"):
        run_plan(r.plan, r.problem, holes)
    with pytest.raises(ExecutionError, match="at least one stream"):
        TaskWork(())
    with pytest.raises(ExecutionError, match="not a SimKernel"):
        TaskWork((("gemm", 8),))
    with pytest.raises(ExecutionError, match="not a 1F1B task"):
        pipeline_work(Problem.build([("x", "g", [(1.0, 2.0)])]), stage_kernels(SMALL.stage_sizes[:SMALL.n_stages]),
                      PRESETS["p2p_send"])


def test_devices_given_must_cover_the_plan_and_co_run(demo):
    r, work = demo
    with pytest.raises(ExecutionError, match="no device given"):
        run_plan(r.plan, r.problem, work, devices={"stage0": SimulatedGPU()})

    class NoCoRun:
        name = "a GPU without co-runs"

    with pytest.raises(ExecutionError, match="cannot co-run"):
        run_plan(r.plan, r.problem, work, devices={"stage0": SimulatedGPU(), "stage1": NoCoRun()})


def test_devices_are_left_as_found(demo):
    r, work = demo
    plan = _alternating_plan(r)
    devs = {d: SimulatedGPU(seed=3) for d in ("stage0", "stage1")}
    before = {d: g.get_operating_point() for d, g in devs.items()}
    res = run_plan(plan, r.problem, work, devices=devs)
    assert res.switches_s["stage1"]          # it did change stage1's clocks meanwhile
    assert {d: g.get_operating_point() for d, g in devs.items()} == before
