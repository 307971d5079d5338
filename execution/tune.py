"""``ecal tune``: plan, run, calibrate, plan again until the runs keep the deadline (issue 29).

A plan keeps its deadline in prediction; run, it can miss it by what the prediction leaves
out (switch settle times, the power of bubbles, each task's thermal entry context: on the
simulator 0.5–1.3 % at 1.05x). Measurement is authoritative, so :func:`tune` closes the loop
on it:

1. plan the workload at the deadline D and confidence P (round 1: the model alone);
2. run the plan ``runs_per_round`` times (k; default 5), each run step after step to the target
   relative standard error. Run i of the loop (counted over all rounds from 0) uses seed
   ``seed + i·SEED_STRIDE``: on the simulator every run has its own noise, and none of them
   shares a seed with 1..SEED_STRIDE-1 (held out for checks); on a real GPU k repetitions;
3. stop when the round passes both checks (:class:`RoundChecks`):

   * **deadline at confidence P, measured**: over the k runs' measured steps (mean t̄), the
     bound on the next run t̄ + t_{P,df}·s·sqrt(1 + 1/k) ≤ D, where s is the run-to-run σ of
     the step: the runs' spread about their own plan's mean, pooled over this round and the
     earlier ones (the noise is the device's, not the plan's; df = N − R for N runs in R
     rounds), and t_{P,df} Student's one-sided quantile (2.13 for df 4, 1.70 for df 28 at
     0.95; with one run a round, df 0: the run's own σ of its mean step and z_P);
   * **energy within σ**: the k runs' mean measured step energy Ē against the calibrated
     prediction E + b_E: |Ē − (E + b_E)| ≤ z·sqrt(σ_E² + σ_bE² + s_E²/k), where σ_E is the
     plan's propagated energy σ, σ_bE the calibration's σ of the energy offset, s_E the
     runs' sample σ (k = 1: the run's own σ) and z = z_{(1+P)/2} two-sided at the same
     confidence (1.96 at 0.95: Eq. 23's c_α on the step at α = 1 − P);

4. else measure the offsets between what the model predicted and what each run measured, for
   the step and each device, time and energy alike (:func:`calibration_of`): the offset b is
   the latest plan's mean (the offset moves with the plan: a plan solved against a tighter
   deadline runs more tasks near the power cap, and the planner favours what the model is
   optimistic about), its σ_b the run-to-run σ widened by sqrt(1 + 1/k) plus the spread of
   the rounds' mean offsets, and plan again: the calibrated makespan
   T + b_T + z_P·sqrt(σ_T² + σ_b²) must meet D. The next round is the held-out check of that
   calibration (measured on earlier plans, tested on another).

At most ``max_rounds`` rounds; the result says whether it converged, with every round's
prediction, measurement and both checks. The plan it returns records its workload and its
calibration: ``ecal run plan.json`` runs it again (any seed) and judges it with the same
calibration. Each round's Eq. 23 flags are reported, not part of the stop rule (with k runs
one of them may flag by chance at α = 0.05).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from frontier.errors import InputError
from measure.progress import ProgressEvent
from measure.protocol import Protocol
from solvers.calibration import Calibration, Offset
from solvers.confidence import DEFAULT_CONFIDENCE, recalibrated, solve_at_confidence, z_of
from solvers.model import Problem
from solvers.plan import Plan

from .results import Comparison, ExecutionResult
from .run import run_plan
from .runnable import WorkloadRef, open_run_devices, plan_with_workload, workload_work_table
from .work import WorkTable
from .workload import load_workload

log = logging.getLogger(__name__)

#: Rounds of ``ecal tune`` by default: the first plan, and up to five calibrated ones.
DEFAULT_ROUNDS = 6
#: Runs of each round's plan by default (each on its own seed on the simulator).
DEFAULT_RUNS_PER_ROUND = 5
#: Run i of the loop uses seed ``seed + i*SEED_STRIDE``: seeds 1..1008 stay held out.
SEED_STRIDE = 1009

#: Runs one plan once on the device: ``(plan, seed) -> ExecutionResult``.
RunOnce = Callable[[Plan, int], ExecutionResult]


def two_sided_z(confidence: float) -> float:
    """z_{(1+P)/2}: the two-sided critical value at confidence P (1.96 at 0.95)."""
    return z_of(0.5 + 0.5 * float(confidence))


@dataclass(frozen=True)
class EnergyCheck:
    """Measured step energy against its calibrated prediction: ``error_j`` = measured −
    predicted, ``sd_j`` the σ it is judged by (prediction's and measurement's combined),
    ``limit_z`` the two-sided z at the stated confidence."""

    predicted_j: float
    measured_j: float
    sd_j: float
    limit_z: float

    @property
    def error_j(self) -> float:
        """Measured − predicted (J)."""
        return self.measured_j - self.predicted_j

    @property
    def z(self) -> float:
        """The error in σ (0 when σ is 0 and the error too)."""
        if self.sd_j > 0:
            return self.error_j / self.sd_j
        return 0.0 if self.error_j == 0 else math.copysign(math.inf, self.error_j)

    @property
    def within(self) -> bool:
        """|error| ≤ limit_z·σ."""
        return abs(self.error_j) <= self.limit_z * self.sd_j + 1e-12

    def label(self) -> str:
        """``within (z +0.8 ≤ 1.96)`` or ``OFF (z +2.4 > 1.96)``."""
        return (f"within (z {self.z:+.1f} ≤ {self.limit_z:.2f})" if self.within
                else f"OFF (z {self.z:+.1f} > {self.limit_z:.2f})")


def energy_check(run: ExecutionResult, confidence: float = DEFAULT_CONFIDENCE) -> EnergyCheck:
    """One run's measured step energy against its (calibrated) prediction at confidence P:
    σ = sqrt(σ_E² + σ_bE² + σ_meas²) (the run's ``sd_predicted_energy_j`` already holds the
    plan's σ and the calibration's), limit z_{(1+P)/2}."""
    s = run.step
    return EnergyCheck(s.predicted_energy_j, s.measured_energy_j,
                       math.hypot(s.sd_predicted_energy_j, s.sd_measured_energy_j),
                       two_sided_z(confidence))


def _within(groups: Sequence[Sequence[float]]) -> tuple[float, int]:
    """Pooled within-group sample σ of ``groups`` (each group: one plan's runs) and its degrees
    of freedom N − R (0: no group has two values)."""
    df = sum(len(g) - 1 for g in groups if g)
    if df == 0:
        return 0.0, 0
    ss = sum((x - statistics.fmean(g)) ** 2 for g in groups if g for x in g)
    return math.sqrt(ss / df), df


def quantile(confidence: float, df: int) -> float:
    """The one-sided quantile at ``confidence``: Student's t with ``df`` degrees of freedom
    (the σ it multiplies is estimated from the runs), the normal z_P when ``df`` is 0."""
    if df <= 0:
        return z_of(confidence)
    from scipy.stats import t as student_t

    return float(student_t.ppf(float(confidence), df))


@dataclass(frozen=True)
class RoundChecks:
    """The stop rule on one round's k runs (module docstring, step 3)."""

    deadline_s: float
    confidence: float
    n_runs: int
    mean_time_s: float
    sd_time_s: float
    df: int
    energy: EnergyCheck
    runs_met: int

    @property
    def z(self) -> float:
        """The one-sided quantile the bound uses: t_{P,df}, or z_P when df is 0."""
        return quantile(self.confidence, self.df)

    @property
    def time_bound_s(self) -> float:
        """t̄ + t_{P,df}·s·sqrt(1 + 1/k): where the next run's step falls with probability P."""
        return self.mean_time_s + self.z * self.sd_time_s * math.sqrt(1.0 + 1.0 / self.n_runs)

    @property
    def deadline_kept(self) -> bool:
        """The measured bound meets the deadline."""
        return self.time_bound_s <= self.deadline_s * (1.0 + 1e-9)

    @property
    def passed(self) -> bool:
        """Both checks: the loop stops."""
        return self.deadline_kept and self.energy.within

    def deadline_label(self) -> str:
        """``kept (bound -0.06%, 5/5 runs met)`` or ``MISSED (bound +0.27%, 3/5 runs met)``."""
        b, D = self.time_bound_s, self.deadline_s
        runs = f"{self.runs_met}/{self.n_runs} runs met"
        return (f"kept (bound {b / D - 1:+.2%}, {runs})" if self.deadline_kept
                else f"MISSED (bound {b / D - 1:+.2%}, {runs})")


def round_checks(runs: Sequence[ExecutionResult], deadline_s: float,
                 confidence: float = DEFAULT_CONFIDENCE,
                 earlier: Sequence[Sequence[ExecutionResult]] = ()) -> RoundChecks:
    """Both checks of the stop rule on the k runs of one plan (module docstring, step 3);
    ``earlier``: the earlier rounds' runs, whose spread about their own plan's mean pools into
    the σ of the step (the run-to-run noise is the device's, not the plan's)."""
    if not runs:
        raise InputError("round_checks needs at least one run")
    k = len(runs)
    times = [r.step.measured_time_s for r in runs]
    sd_t, df = _within([times, *([r.step.measured_time_s for r in g] for g in earlier)])
    if df == 0:                       # one run in every round: its own σ of its mean step
        sd_t = runs[0].step.sd_measured_time_s
    energies = [r.step.measured_energy_j for r in runs]
    e = statistics.fmean(energies)
    sd_mean_e = (statistics.stdev(energies) / math.sqrt(k) if k > 1
                 else runs[0].step.sd_measured_energy_j)
    s = runs[0].step
    check = EnergyCheck(s.predicted_energy_j, e, math.hypot(s.sd_predicted_energy_j, sd_mean_e),
                        two_sided_z(confidence))
    met = sum(t <= deadline_s * (1.0 + 1e-9) for t in times)
    return RoundChecks(float(deadline_s), float(confidence), k, statistics.fmean(times), sd_t, df,
                       check, met)


@dataclass(frozen=True)
class TuneRound:
    """One round: the plan's deadline as solved, its (calibrated) prediction, its k runs and
    both checks of the stop rule."""

    round: int
    calibration: Calibration
    plan: Plan
    runs: tuple[ExecutionResult, ...]
    checks: RoundChecks

    @property
    def solved_deadline_s(self) -> float:
        """The deadline the planner solved for (D less the calibrated offset and margin)."""
        return self.plan.deadline_s

    @property
    def plan_energy_j(self) -> float:
        """The plan's predicted energy (model alone, before the calibration's offset)."""
        return self.plan.energy_j

    @property
    def run(self) -> ExecutionResult:
        """The round's first run (its predictions are every run's)."""
        return self.runs[0]

    @property
    def passed(self) -> bool:
        """Deadline kept at the confidence and energy within σ: the loop stops here."""
        return self.checks.passed

    @property
    def problems(self) -> list[str]:
        """Why the loop did not stop here (empty: both checks passed)."""
        c = self.checks
        out = []
        if not c.deadline_kept:
            out.append(f"deadline not kept at confidence {c.confidence:g}: measured bound "
                       f"{c.time_bound_s * 1e3:.2f} ms > {c.deadline_s * 1e3:.2f} ms "
                       f"({c.runs_met}/{c.n_runs} runs met)")
        if not c.energy.within:
            e = c.energy
            out.append(f"energy off: measured {e.measured_j:.2f} J against {e.predicted_j:.2f} ± "
                       f"{e.sd_j:.2f} J (z {e.z:+.1f}, limit {e.limit_z:.2f})")
        return out

    def flags(self) -> int:
        """Runs of this round whose Eq. 23 test flags the step or a device (reported only)."""
        return sum(1 for r in self.runs if any(c.flagged for c in (r.step, *r.devices)))

    def to_dict(self) -> dict[str, Any]:
        """One row of the plan's ``meta["tune"]["rounds"]``."""
        s, c, e = self.run.step, self.checks, self.checks.energy
        return {"round": self.round, "offset_time_s": self.calibration.step.time_s,
                "sd_offset_time_s": self.calibration.step.sd_time_s,
                "offset_energy_j": self.calibration.step.energy_j,
                "sd_offset_energy_j": self.calibration.step.sd_energy_j,
                "solved_deadline_s": self.solved_deadline_s,
                "predicted_time_s": s.predicted_time_s, "sd_predicted_time_s": s.sd_predicted_time_s,
                "predicted_energy_j": s.predicted_energy_j,
                "sd_predicted_energy_j": s.sd_predicted_energy_j,
                "runs": c.n_runs, "seeds": [r.seed for r in self.runs],
                "measured_time_s": c.mean_time_s, "sd_measured_time_s": c.sd_time_s,
                "time_bound_s": c.time_bound_s, "runs_met": c.runs_met,
                "deadline_kept": c.deadline_kept,
                "measured_energy_j": e.measured_j, "sd_energy_check_j": e.sd_j,
                "energy_z": e.z, "energy_limit_z": e.limit_z, "energy_within": e.within,
                "eq23_flagged_runs": self.flags(), "problems": self.problems}


def _model_offset(c: Comparison, used: Offset) -> tuple[float, float, float, float]:
    """Measured minus the model's own prediction (the run's prediction less the calibration
    its plan was made with): (time, its σ, energy, its σ), σ the measurement's."""
    return (c.measured_time_s - (c.predicted_time_s - used.time_s), c.sd_measured_time_s,
            c.measured_energy_j - (c.predicted_energy_j - used.energy_j), c.sd_measured_energy_j)


def _pooled(groups: Sequence[Sequence[tuple[float, float]]]) -> tuple[float, float]:
    """The offset for the next plan from ``groups`` (per round, oldest first: each run's
    offset and its measurement σ): the latest plan's mean offset (the next plan is planned
    against it, and the offset moves with the plan), and the σ of the next run's offset:
    the run-to-run σ (pooled within rounds; no repeats: the runs' own σ) times
    sqrt(1 + 1/k) for the latest mean's own error, plus the spread of the rounds' means (how
    far the offset moved between plans), in quadrature."""
    xs = [[x for x, _ in g] for g in groups if g]
    sw, df = _within(xs)
    own = statistics.fmean(sd * sd for g in groups for _, sd in g)
    var_w = max(sw * sw, own) if df else own
    means = [statistics.fmean(g) for g in xs]
    between = statistics.pvariance(means) if len(means) > 1 else 0.0
    return means[-1], math.sqrt(var_w * (1.0 + 1.0 / len(xs[-1])) + between)


def calibration_of(rounds: Sequence[tuple[Sequence[ExecutionResult], Calibration]]) -> Calibration:
    """The calibration from every round so far (oldest first), each given as its runs and the
    calibration its plan was made with: per the step and each device, the offsets (measured −
    model) combined by :func:`_pooled`, time and energy alike."""
    rounds = [(runs, c) for runs, c in rounds if runs]
    if not rounds:
        return Calibration()

    def pool(rows: list[list[tuple[float, float, float, float]]]) -> Offset:
        t, sd_t = _pooled([[(r[0], r[1]) for r in g] for g in rows])
        e, sd_e = _pooled([[(r[2], r[3]) for r in g] for g in rows])
        return Offset(t, sd_t, e, sd_e)

    step = pool([[_model_offset(r.step, c.step) for r in runs] for runs, c in rounds])
    names = list(dict.fromkeys(d.name for runs, _ in rounds for r in runs for d in r.devices))
    devices = {n: pool([[_model_offset(d, c.device(n)) for r in runs for d in r.devices
                         if d.name == n] for runs, c in rounds]) for n in names}
    return Calibration(step, devices, sum(len(runs) for runs, _ in rounds))


def loop_seed(seed: int, i: int) -> int:
    """The seed of the loop's run ``i`` (0-based over all rounds)."""
    return int(seed) + i * SEED_STRIDE


def tune_plan(problem: Problem, run_once: RunOnce, deadline_s: float, *,
              confidence: float = DEFAULT_CONFIDENCE, max_rounds: int = DEFAULT_ROUNDS,
              runs_per_round: int = DEFAULT_RUNS_PER_ROUND, seed: int = 0, method: str = "auto",
              time_limit_s: float | None = None, options: Any = None,
              progress: Callable[[ProgressEvent], None] | None = None, context: Any = None
              ) -> tuple[Plan, tuple[TuneRound, ...]]:
    """The loop of the module docstring on ``problem``: ``run_once(plan, seed)`` runs a plan
    once. Returns the last round's plan (with its calibration in ``meta``) and every round.
    Raises :class:`~solvers.model.InfeasibleError` when no plan keeps ``deadline_s`` (in round
    1, or with the offsets the runs measured)."""
    if max_rounds < 1:
        raise InputError(f"max_rounds must be >= 1, got {max_rounds!r}")
    if runs_per_round < 1:
        raise InputError(f"runs_per_round must be >= 1, got {runs_per_round!r}")
    rounds: list[TuneRound] = []
    cal = Calibration()
    n_runs = 0
    t0 = time.perf_counter()
    for k in range(1, max_rounds + 1):
        plan = solve_at_confidence(problem, deadline_s, confidence, method=method,
                                   time_limit_s=time_limit_s, options=options, calibration=cal,
                                   context=context)
        runs = tuple(run_once(plan, loop_seed(seed, n_runs + j)) for j in range(runs_per_round))
        n_runs += len(runs)
        rnd = TuneRound(k, cal, plan, runs, round_checks(runs, deadline_s, confidence,
                                                         [r.runs for r in rounds]))
        rounds.append(rnd)
        if progress is not None:
            progress(ProgressEvent(k, max_rounds, f"round {k}", time.perf_counter() - t0,
                                   operation="tune", status="kept" if rnd.passed else "missed",
                                   message=f"round {k}: deadline {rnd.checks.deadline_label()}, "
                                           f"energy {rnd.checks.energy.label()}"))
        if rnd.passed:
            break
        cal = calibration_of([(r.runs, r.calibration) for r in rounds])
        log.info("round %d: %s; re-planning with the makespan offset %+.3f ± %.3f ms from %d run(s)",
                 k, "; ".join(rnd.problems), cal.step.time_s * 1e3, cal.step.sd_time_s * 1e3, cal.runs)
    # The plan kept records the offsets measured on its own runs too (the latest plan's mean,
    # σ widened by the rounds' spread): the offset moves with the plan, so the calibration it
    # was solved with (measured on the plans before it) predicts its next run's energy worse
    # (on a 2x4 GPipe step: +0.66 % biased, 13 of 20 held-out runs within σ)
    own = calibration_of([(r.runs, r.calibration) for r in rounds])
    plan = recalibrated(plan, own, f"round {len(rounds)}'s {len(rounds[-1].runs)} run(s) of this "
                                   f"plan and {own.runs - len(rounds[-1].runs)} earlier")
    return plan, tuple(rounds)


@dataclass(frozen=True)
class TuneResult:
    """What :func:`tune` did: the plan to keep (the last round's), every round, and whether
    the last round passed both checks (``converged``)."""

    plan: Plan
    deadline_s: float
    confidence: float
    rounds: tuple[TuneRound, ...]
    workload: WorkloadRef | None
    device: str
    seed: int

    @property
    def converged(self) -> bool:
        """The last round kept the deadline at the confidence with its energy within σ."""
        return bool(self.rounds) and self.rounds[-1].passed

    @property
    def last_run(self) -> ExecutionResult:
        """The last round's first run."""
        return self.rounds[-1].run

    def plan_dict(self) -> dict[str, Any]:
        """The plan file ``ecal tune -o`` writes: runnable by ``ecal run`` (it records its
        workload), its calibration in ``meta["calibration"]`` and the rounds in ``meta["tune"]``."""
        if self.workload is None:
            raise InputError("this tuned plan was made from a problem, not a workload file: "
                             "write it with its problem and work table")
        return plan_with_workload(self.plan, self.workload)

    def summary(self) -> str:
        """Every round in a table with both checks, then the verdict."""
        D, P = self.deadline_s, self.confidence
        k = self.rounds[0].checks.n_runs if self.rounds else 0
        lines = [f"tune {self.plan.problem}: deadline {D * 1e3:.3f} ms at confidence {P:g}, "
                 f"{len(self.rounds)} round(s) of {k} run(s) on {self.device} (seeds from {self.seed})",
                 f"  stop rule: mean step + t_P·s·sqrt(1+1/k) <= deadline (s: the runs' σ about "
                 f"their plan's mean, pooled over the rounds; t_P Student's at {P:g}), and |mean E − predicted E| <= {two_sided_z(P):.2f}·σ (σ: plan's energy σ, "
                 "the calibration's energy-offset σ and the runs' σ of their mean, combined)",
                 f"  {'round':>5} {'offset ms':>14} {'T pred ms':>16} {'T meas ms':>16} "
                 f"{'E pred J':>16} {'E meas J':>10}  deadline; energy"]
        for r in self.rounds:
            s, c, ch = r.run.step, r.calibration.step, r.checks
            lines.append(f"  {r.round:>5} {c.time_s * 1e3:>+8.3f}±{c.sd_time_s * 1e3:<5.3f} "
                         f"{s.predicted_time_s * 1e3:>9.2f}±{s.sd_predicted_time_s * 1e3:<6.2f} "
                         f"{ch.mean_time_s * 1e3:>9.2f}±{ch.sd_time_s * 1e3:<6.2f} "
                         f"{s.predicted_energy_j:>9.2f}±{s.sd_predicted_energy_j:<6.2f} "
                         f"{ch.energy.measured_j:>10.2f}  {ch.deadline_label()}; "
                         f"{ch.energy.label()}")
        last = self.rounds[-1] if self.rounds else None
        if last is not None:
            ch = last.checks
            lines.append(f"  last round: mean step {ch.mean_time_s * 1e3:.2f} ms over {ch.n_runs} "
                         f"run(s), bound {ch.time_bound_s * 1e3:.2f} ms against {D * 1e3:.2f} ms")
        lines.append(f"converged: deadline met at confidence {P:g} (measured), energy within σ"
                     if self.converged else
                     f"NOT converged after {len(self.rounds)} round(s): "
                     f"{'; '.join(self.rounds[-1].problems) if self.rounds else 'no round'}")
        return "\n".join(lines)

    def tuned_plan(self) -> Plan:
        """The plan with the rounds in ``meta["tune"]``."""
        return dataclasses.replace(self.plan, meta={**self.plan.meta, "tune": {
            "deadline_s": self.deadline_s, "confidence": self.confidence, "device": self.device,
            "seed": self.seed, "seed_stride": SEED_STRIDE, "converged": self.converged,
            "rounds": [r.to_dict() for r in self.rounds]}})


def tune_problem(problem: Problem, work: WorkTable, deadline: float | str, *,
                 confidence: float = DEFAULT_CONFIDENCE, max_rounds: int = DEFAULT_ROUNDS,
                 runs_per_round: int = DEFAULT_RUNS_PER_ROUND, seed: int = 0,
                 target_rse: float = 0.01, method: str = "auto", time_limit_s: float | None = None,
                 options: Any = None, progress: Callable[[ProgressEvent], None] | None = None
                 ) -> TuneResult:
    """:func:`tune` on a problem and its work table (``execution.run.run_plan``'s), run on
    simulated H200s (fresh ones for each run, seeded as the module docstring says): what
    ``ecal demo`` tunes. The result records no workload file."""
    D = problem.deadline_s(deadline)
    problem.check_feasible(D)
    proto = Protocol(target_rse=target_rse)

    def run_once(plan: Plan, s: int) -> ExecutionResult:
        return run_plan(plan, problem, work, seed=s, protocol=proto)

    plan, rounds = tune_plan(problem, run_once, D, confidence=confidence, max_rounds=max_rounds,
                             runs_per_round=runs_per_round, seed=seed, method=method,
                             time_limit_s=time_limit_s, options=options, progress=progress)
    res = TuneResult(plan, D, float(confidence), rounds, None, "sim", int(seed))
    return dataclasses.replace(res, plan=res.tuned_plan())


def tune(workload_file: str | os.PathLike, deadline: float | str, *,
         confidence: float = DEFAULT_CONFIDENCE, max_rounds: int = DEFAULT_ROUNDS,
         runs_per_round: int = DEFAULT_RUNS_PER_ROUND, device: str = "sim", seed: int = 0,
         target_rse: float = 0.01, method: str = "auto", microbatches: int | None = None,
         options: Any = None, progress: Callable[[ProgressEvent], None] | None = None,
         contexts: str | os.PathLike | None = None, context_entry: str | float = "periodic",
         warmup_steps: int = 1) -> TuneResult:
    """Plan ``workload_file`` at ``deadline`` (seconds or ``"1.05x"``), run it on ``device``
    (``"sim"``: one simulated H200 per plan device, fresh for each run; ``"nvml:N"``: a real
    GPU, single-device workloads, kept open across the runs) and re-plan with the measured
    offsets until a round passes both checks, or ``max_rounds`` rounds (module docstring).
    ``progress`` gets one event per round. ``contexts``: an ``ecal.contexts/1`` file; every
    plan is then composed with its entry context (:mod:`solvers.context`, first entry
    ``context_entry``) and the offsets are measured against that. ``warmup_steps``: unmeasured
    steps before each run's measured ones (more: calibrated at a long job's thermal steady
    state, see ``ecal run --warmup-steps``). Raises
    :class:`~solvers.model.InfeasibleError` when the deadline cannot be met (in round 1, or
    with the offsets the runs measured)."""
    if max_rounds < 1:
        raise InputError(f"max_rounds must be >= 1, got {max_rounds!r}")
    file = os.fspath(workload_file)
    wl = load_workload(file, microbatches=microbatches)
    problem = wl.problem
    context = None
    if contexts is not None:
        from .context_plan import plan_context

        context = plan_context(wl, contexts, context_entry)
    D = problem.deadline_s(deadline)
    problem.check_feasible(D)
    ref = WorkloadRef.of(file, microbatches=microbatches)
    names = list(problem.index.devices)
    proto = Protocol(target_rse=target_rse)
    held = {} if device == "sim" else open_run_devices(names, device, seed)

    def run_on(gpus: Mapping[str, Any], plan: Plan, s: int) -> ExecutionResult:
        table = workload_work_table(wl, gpus, file)
        return run_plan(plan, problem, table, seed=s, protocol=proto, devices=gpus,
                        warmup_steps=warmup_steps)

    def run_once(plan: Plan, s: int) -> ExecutionResult:
        if held:
            return run_on(held, plan, s)
        gpus = open_run_devices(names, "sim", s)
        try:
            return run_on(gpus, plan, s)
        finally:
            for g in gpus.values():
                g.close()

    try:
        plan, rounds = tune_plan(problem, run_once, D, confidence=confidence, max_rounds=max_rounds,
                                 runs_per_round=runs_per_round, seed=seed, method=method,
                                 options=options, progress=progress, context=context)
    finally:
        for g in held.values():
            g.close()
    res = TuneResult(plan, D, float(confidence), rounds, ref, device, int(seed))
    return dataclasses.replace(res, plan=res.tuned_plan())


__all__ = ["DEFAULT_ROUNDS", "DEFAULT_RUNS_PER_ROUND", "SEED_STRIDE", "EnergyCheck", "RoundChecks",
           "TuneRound", "TuneResult", "calibration_of", "energy_check", "loop_seed", "round_checks",
           "quantile", "tune", "tune_plan", "tune_problem", "two_sided_z"]
