"""Per-device prediction of a plan: each device's finish time and energy with delta-method σ.

E_dev = Σ its tasks' E + P_dev·(M − busy − switch time) + its switches' energy (these sum to
``plan.energy_j``); σ by the plan's delta method restricted to the device (shared
measurements and the makespan's critical path counted as in ``solvers.plan.make_plan``).
Per-device T is the end of the device's last task.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from solvers.calibration import Offset, combined_sd
from solvers.model import Problem
from solvers.plan import Plan, plan_terms

from .work import ExecutionError


@dataclass(frozen=True)
class DevicePrediction:
    """What a plan predicts for one device (or the step): finish time and energy, with σ."""

    time_s: float
    sd_time_s: float
    energy_j: float
    sd_energy_j: float


def chosen_options(plan: Plan, problem: Problem) -> list[int]:
    """The plan's option per task in problem order, checked against the problem."""
    ix = problem.index
    by_name = {t.name: t for t in plan.tasks}
    if set(by_name) != set(ix.names) or len(plan.tasks) != ix.n:
        extra = sorted(set(by_name) - set(ix.names))[:3]
        missing = sorted(set(ix.names) - set(by_name))[:3]
        raise ExecutionError(f"plan {plan.problem!r} does not match problem {problem.name!r}: "
                             f"tasks only in the plan {extra}, only in the problem {missing}")
    choice = []
    for t in problem.tasks:
        tp = by_name[t.name]
        if tp.device != t.device:
            raise ExecutionError(f"task {t.name!r}: the plan puts it on {tp.device!r}, the problem "
                                 f"on {t.device!r}")
        j = int(tp.option)
        if not 0 <= j < len(t.options):
            raise ExecutionError(f"task {t.name!r}: plan option {j} does not exist (the problem has "
                                 f"{len(t.options)}); was the plan made for another problem?")
        o = t.options[j]
        same = (o.label == tp.label and math.isclose(o.time_s, tp.time_s, rel_tol=1e-9)
                and math.isclose(o.energy_j, tp.energy_j, rel_tol=1e-9))
        if not same:
            raise ExecutionError(f"task {t.name!r}: plan option {j} is {tp.label!r} "
                                 f"(T {tp.time_s:.6g} s, E {tp.energy_j:.6g} J) but the problem's is "
                                 f"{o.label!r} (T {o.time_s:.6g} s, E {o.energy_j:.6g} J); was the "
                                 "plan made for another problem (e.g. a sub-problem)?")
        choice.append(j)
    return choice


def predict_devices(plan: Plan, problem: Problem) -> dict[str, DevicePrediction]:
    """Per-device predicted (finish time, energy) with delta-method σ (see module docstring).
    The energies sum to ``plan.energy_j`` (checked)."""
    ix = problem.index
    choice = chosen_options(plan, problem)
    start, end, mk = ix.schedule(choice)
    tau = ix.switch_tau(choice)
    n = ix.n
    crit = [False] * n
    # the problem's own critical-path walk and the plan's delta method: shared leaves are
    # correlated exactly as in the plan's σ
    for i in ix.critical_chain(start, end, tau):
        crit[i] = True
    # each device's share of the plan's energy, by the problem's own accounting
    energies = ix.device_energies_j(choice, mk)
    out = {}
    for d in ix.devices:
        seq = ix.dev_seq.get(d, [])
        energy = energies[d]
        var_e = plan_terms(problem, choice, crit, devices=[d]).variances()[1]
        if seq:
            last = max(seq, key=lambda i: end[i])
            fin = float(end[last])
            chain = [False] * n
            for i in ix.critical_chain(start, end, tau, last):
                chain[i] = True
            var_t = plan_terms(problem, choice, chain, devices=[]).variances()[0]
        else:
            fin, var_t = 0.0, 0.0
        out[d] = DevicePrediction(fin, math.sqrt(var_t), float(energy), math.sqrt(var_e))
    total = sum(p.energy_j for p in out.values())
    if not math.isclose(total, plan.energy_j, rel_tol=1e-9, abs_tol=1e-9):
        raise ExecutionError(f"plan {plan.problem!r}: its energy {plan.energy_j:.6g} J is not what "
                             f"the problem gives for its choices ({total:.6g} J); another problem?")
    return out


def calibrated(pred: DevicePrediction, off: Offset) -> DevicePrediction:
    """``pred`` plus a measured offset (:mod:`solvers.calibration`), σ of both combined."""
    return DevicePrediction(pred.time_s + off.time_s, combined_sd(pred.sd_time_s, off.sd_time_s),
                            pred.energy_j + off.energy_j, combined_sd(pred.sd_energy_j, off.sd_energy_j))
