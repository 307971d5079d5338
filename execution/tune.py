"""``ecal tune``: plan, run, calibrate, plan again until the run keeps its deadline (issue 29).

A plan keeps its deadline in prediction; run, it can miss it by what the prediction leaves
out (switch settle times, the power of bubbles, each task's thermal entry context: on the
simulator 0.5–1.3 % at 1.05x). Measurement is authoritative, so :func:`tune` closes the loop
on it:

1. plan the workload at the deadline D and confidence P (round 1: the model alone);
2. run the plan on the device (the simulator or the user's GPU), step after step to the
   target relative standard error, and hold it against its prediction (Eq. 23);
3. stop when the run has no problem: the measured step meets D and Eq. 23 confirms the
   prediction for the step and every device; else
4. measure the offsets between what this plan predicted and what it measured, for the step
   and each device, pool them with the earlier rounds' (:func:`offsets_of`; a
   :class:`solvers.calibration.Calibration`), and plan again with them: the
   calibrated makespan T + b_T + z_P·sqrt(σ_T² + σ_b²) must meet D. The next run is the held-out
   check of that calibration (measured on one plan, tested on another).

At most ``max_rounds`` rounds; the result says whether it converged, with every round's
prediction and measurement. The plan it returns records its workload and its calibration:
``ecal run plan.json`` runs it again (any seed) and judges it with the same calibration.
The devices stay open across rounds (one warm GPU each), and are restored and closed at the end
whatever happens.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from frontier.errors import InputError
from measure.progress import ProgressEvent
from measure.protocol import Protocol
from solvers.calibration import Calibration, Offset
from solvers.confidence import DEFAULT_CONFIDENCE, solve_at_confidence
from solvers.plan import Plan

from .results import ExecutionResult
from .run import run_plan
from .runnable import WorkloadRef, open_run_devices, plan_with_workload, workload_work_table
from .workload import load_workload

log = logging.getLogger(__name__)

#: Rounds of ``ecal tune`` by default: the first plan, and up to three calibrated ones.
DEFAULT_ROUNDS = 4


@dataclass(frozen=True)
class TuneRound:
    """One round: the plan's deadline as solved, its (calibrated) prediction and the run."""

    round: int
    calibration: Calibration
    solved_deadline_s: float
    plan_energy_j: float
    run: ExecutionResult

    @property
    def problems(self) -> list[str]:
        """What the run found wrong (empty: deadline met and prediction confirmed)."""
        return self.run.problems()

    def to_dict(self) -> dict[str, Any]:
        """One row of the plan's ``meta["tune"]["rounds"]``."""
        s = self.run.step
        return {"round": self.round, "offset_time_s": self.calibration.step.time_s,
                "sd_offset_time_s": self.calibration.step.sd_time_s,
                "offset_energy_j": self.calibration.step.energy_j,
                "solved_deadline_s": self.solved_deadline_s,
                "predicted_time_s": s.predicted_time_s, "sd_predicted_time_s": s.sd_predicted_time_s,
                "measured_time_s": s.measured_time_s, "sd_measured_time_s": s.sd_measured_time_s,
                "predicted_energy_j": s.predicted_energy_j, "measured_energy_j": s.measured_energy_j,
                "sd_measured_energy_j": s.sd_measured_energy_j, "steps": s.n_steps,
                "deadline_met": bool(self.run.deadline_met), "problems": self.problems}


@dataclass(frozen=True)
class TuneResult:
    """What :func:`tune` did: the plan to keep (the last round's), every round, and whether
    the last run kept the deadline with its prediction confirmed (``converged``)."""

    plan: Plan
    deadline_s: float
    confidence: float
    rounds: tuple[TuneRound, ...]
    workload: WorkloadRef
    device: str
    seed: int

    @property
    def converged(self) -> bool:
        """The last run met the deadline and Eq. 23 confirmed its prediction."""
        return bool(self.rounds) and not self.rounds[-1].problems

    @property
    def last_run(self) -> ExecutionResult:
        """The last round's run."""
        return self.rounds[-1].run

    def plan_dict(self) -> dict[str, Any]:
        """The plan file ``ecal tune -o`` writes: runnable by ``ecal run`` (it records its
        workload), its calibration in ``meta["calibration"]`` and the rounds in ``meta["tune"]``."""
        return plan_with_workload(self.plan, self.workload)

    def summary(self) -> str:
        """Every round in a table, then the verdict."""
        D = self.deadline_s
        lines = [f"tune {self.plan.problem}: deadline {D * 1e3:.3f} ms at confidence "
                 f"{self.confidence:g}, {len(self.rounds)} round(s) on {self.device} (seed {self.seed})",
                 f"  {'round':>5} {'offset ms':>14} {'solved ms':>10} {'T pred ms':>16} "
                 f"{'T meas ms':>16} {'E pred J':>10} {'E meas J':>16}  result"]
        for r in self.rounds:
            s, c = r.run.step, r.calibration.step
            res = round_result(r.run)
            lines.append(f"  {r.round:>5} {c.time_s * 1e3:>+8.3f}±{c.sd_time_s * 1e3:<5.3f} "
                         f"{r.solved_deadline_s * 1e3:>10.3f} "
                         f"{s.predicted_time_s * 1e3:>9.2f}±{s.sd_predicted_time_s * 1e3:<6.2f} "
                         f"{s.measured_time_s * 1e3:>9.2f}±{s.sd_measured_time_s * 1e3:<6.2f} "
                         f"{s.predicted_energy_j:>10.2f} {s.measured_energy_j:>9.2f}±{s.sd_measured_energy_j:<6.2f}"
                         f"  {res}")
        dl = self.last_run.deadline_line()
        if dl:
            lines.append(f"  last run: {dl}")
        lines.append("converged: the last run kept the deadline and its prediction" if self.converged
                     else f"NOT converged after {len(self.rounds)} round(s): "
                          f"{'; '.join(self.rounds[-1].problems)}")
        return "\n".join(lines)


def round_result(run: ExecutionResult) -> str:
    """A round's verdict in a few words: ``met`` or ``MISSED +0.57%``, then what Eq. 23
    flagged, grouped by flag (``flagged T+E: step stage0 stage1``), or ``prediction confirmed``."""
    D = run.deadline_s
    head = ("met" if run.deadline_met or D is None
            else f"MISSED {run.step.measured_time_s / D - 1:+.2%}")
    groups: dict[str, list[str]] = {}
    for c in (run.step, *run.devices):
        dv = c.deviation
        if dv.flagged:
            key = "+".join(s for s, f in (("T", dv.flagged_time), ("E", dv.flagged_energy)) if f)
            groups.setdefault(key, []).append(c.name)
    if not groups:
        return f"{head}, prediction confirmed"
    return f"{head}; " + "; ".join(f"flagged {k}: {' '.join(v)}" for k, v in groups.items())


def offsets_of(run: ExecutionResult, used: Calibration) -> Calibration:
    """The offsets measured by ``run`` (measured minus the model's own prediction: the run's
    prediction less ``used``, the calibration its plan was made with), pooled with the
    ``used.runs`` runs before it: the mean offset, and a σ that covers both the measurements'
    own σ and the spread of the offsets between plans (its square is the mean squared σ plus
    the offsets' variance), so that it says where the next plan's offset will fall."""
    n = used.runs

    def pooled(x: float, sd_x: float, m: float, sd_m: float) -> tuple[float, float]:
        var = (n * sd_m * sd_m + sd_x * sd_x + n / (n + 1) * (x - m) ** 2) / (n + 1)
        return m + (x - m) / (n + 1), math.sqrt(var)

    def off(c: Any, prev: Offset) -> Offset:
        t, sd_t = pooled(prev.time_s + c.measured_time_s - c.predicted_time_s, c.sd_measured_time_s,
                         prev.time_s, prev.sd_time_s)
        e, sd_e = pooled(prev.energy_j + c.measured_energy_j - c.predicted_energy_j,
                         c.sd_measured_energy_j, prev.energy_j, prev.sd_energy_j)
        return Offset(t, sd_t, e, sd_e)

    return Calibration(off(run.step, used.step),
                       {c.name: off(c, used.device(c.name)) for c in run.devices}, n + 1)


def tune(workload_file: str | os.PathLike, deadline: float | str, *,
         confidence: float = DEFAULT_CONFIDENCE, max_rounds: int = DEFAULT_ROUNDS,
         device: str = "sim", seed: int = 0, target_rse: float = 0.01, method: str = "auto",
         microbatches: int | None = None, options: Any = None,
         progress: Callable[[ProgressEvent], None] | None = None) -> TuneResult:
    """Plan ``workload_file`` at ``deadline`` (seconds or ``"1.05x"``), run it on ``device``
    (``"sim"``: one simulated H200 per plan device; ``"nvml:N"``: a real GPU, single-device
    workloads) and re-plan with the measured offsets until a run keeps the deadline with its
    prediction confirmed, or ``max_rounds`` runs (module docstring). ``progress`` gets one
    event per round. Raises :class:`~solvers.model.InfeasibleError` when the deadline cannot
    be met (in round 1, or with the offsets a run measured)."""
    if max_rounds < 1:
        raise InputError(f"max_rounds must be >= 1, got {max_rounds!r}")
    file = os.fspath(workload_file)
    wl = load_workload(file, microbatches=microbatches)
    problem = wl.problem
    D = problem.deadline_s(deadline)
    problem.check_feasible(D)
    ref = WorkloadRef.of(file, microbatches=microbatches)
    gpus = open_run_devices(list(problem.index.devices), device, seed)
    rounds: list[TuneRound] = []
    t0 = time.perf_counter()
    try:
        table = workload_work_table(wl, gpus, file)
        proto = Protocol(target_rse=target_rse)
        cal = Calibration()
        for k in range(1, max_rounds + 1):
            plan = solve_at_confidence(problem, D, confidence, method=method, options=options,
                                       calibration=cal)
            run = run_plan(plan, problem, table, seed=seed, protocol=proto, devices=gpus)
            rounds.append(TuneRound(k, cal, plan.deadline_s, plan.energy_j, run))
            done = not run.problems()
            if progress is not None:
                progress(ProgressEvent(k, max_rounds, f"round {k}", time.perf_counter() - t0,
                                       operation="tune", status="kept" if done else "missed",
                                       message=f"round {k}: {run.deadline_line()}"))
            if done:
                break
            cal = offsets_of(run, cal)
            log.info("round %d: %s; re-planning with the measured makespan offset %+.3f ms",
                     k, "; ".join(run.problems()), cal.step.time_s * 1e3)
    finally:
        for g in gpus.values():
            g.close()
    result = TuneResult(plan, D, float(confidence), tuple(rounds), ref, device, int(seed))
    tuned = dataclasses.replace(plan, meta={**plan.meta, "tune": {
        "deadline_s": D, "confidence": float(confidence), "device": device, "seed": int(seed),
        "converged": result.converged, "rounds": [r.to_dict() for r in rounds]}})
    return dataclasses.replace(result, plan=tuned)


__all__ = ["DEFAULT_ROUNDS", "TuneRound", "TuneResult", "offsets_of", "round_result", "tune"]
