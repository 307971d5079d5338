"""``ecal demo``: the whole job on the simulated H200, in one command — and held against execution.

1. **Characterize** the elements of a pipeline-parallel training step — per stage, the forward
   and backward compute and the P2P send that overlaps them — on the simulated H200 over
   SM clock × power limit × the SMs given to communication (compute gets the rest of the 132).
2. **Compose** each task option as compute ⊕ send on one GPU (static power paid once, SM
   allocations must fit), and build per-element frontiers.
3. **Plan 1**: the synchronous 1F1B step (4 stages × 8 microbatches, one GPU per stage) for a
   deadline 5 % above the fastest makespan, a flat cost per switch of ω_dev, bubbles charged
   at the top-clock ready power.
4. **Run plan 1** on one simulated H200 per stage (``execution.run.run_plan``) and hold it
   against Eq. 23; **localize** what deviates from the per-task windows (switch latencies paid
   against planned; each chosen co-run by the runtime-context test of spec §4.1; the ready
   power in the waits); **characterize** that: the switch latencies (a measured transition
   table), the bubble power, and the deviating compute ∥ send pairs jointly
   (``measure.joint``, an interaction table; every other option stays ⊕ at the null context).
5. **Plan 2** on what was measured, then **tune** it (:func:`execution.tune.tune_problem`): plan
   at confidence 0.95, run the plan on 5 seeds, calibrate the measured offsets (time and energy,
   per GPU), plan again, until the runs keep the deadline at that confidence and their energy
   is within σ; **run** the tuned plan with its baselines (all at max clock; the best single
   ω_dev, solved for the same calibrated deadline), and report measured savings with σ.

Everything is simulated (virtual time: the run takes seconds) and says so in every output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from execution.baselines import all_max_plan, baselines_to_dict
from execution.localize import (
    Round,
    characterize_jointly,
    localize,
    measure_ready_powers,
    planned_bubble_power,
)
from execution.pipeline import SM_TOTAL, compute_sms, pipeline_work, stage_kernels
from execution.run import run_plan
from execution.runnable import runnable_plan_dict
from execution.savings import run_with_baselines
from execution.schedule import stage_schedule
from execution.tune import tune_problem
from execution.work import work_table_to_dict
from frontier import OperatingPoint, Signature
from frontier.errors import InputError
from frontier.pareto import Frontier, pareto_frontier
from measure.progress import ProgressCallback, ProgressEvent
from measure.sim import SimKernel
from solvers.plan import Plan

N_STAGES = 4
N_MICROBATCHES = 8
#: Relative sizes of the stages: real pipelines are imbalanced (embedding / head stages).
STAGE_SIZES = (1.0, 1.12, 1.05, 1.22)
CLOCKS_MHZ = (1980, 1800, 1620, 1440, 1260, 1080)
POWER_LIMITS_W = (700, 450)
COMM_SMS = (8, 16, 32)
#: Switching ω_dev costs time (clock/limit change latency) and the static energy meanwhile.
TRANSITION_TIME_S = 0.002


SIMULATED = "SIMULATED H200 (physics model calibrated to a real H200; not a measurement)"


@dataclass(frozen=True)
class DemoConfig:
    """Knobs of the demo (defaults are what ``ecal demo`` runs)."""

    n_stages: int = N_STAGES
    n_microbatches: int = N_MICROBATCHES
    stage_sizes: tuple[float, ...] = STAGE_SIZES
    clocks_mhz: tuple[int, ...] = CLOCKS_MHZ
    power_limits_w: tuple[int, ...] = POWER_LIMITS_W
    comm_sms: tuple[int, ...] = COMM_SMS
    transition_time_s: float = TRANSITION_TIME_S
    deadline: str = "1.05x"
    seed: int = 0
    #: the solvers' wall-clock safety net (None: their default). Plans are budgeted by work,
    #: so the demo's plans are the same on any machine unless the net fires (then they say so)
    time_limit_s: float | None = None
    #: which compute ∥ send pairs the loop measures jointly: those whose co-run deviated in
    #: plan 1's execution ("flagged"), every pair ("all"), or none
    joint: str = "flagged"
    curve_points: int = 10
    #: the tune step: the deadline holds at this confidence, each round's plan runs this often
    confidence: float = 0.95
    tune_runs: int = 5
    tune_rounds: int = 4

    def __post_init__(self) -> None:
        if self.joint not in ("flagged", "all", "none"):
            raise InputError(f"DemoConfig.joint must be 'flagged', 'all' or 'none', got {self.joint!r}")


@dataclass(frozen=True)
class DemoResult:
    """What the demo computed (all values from the simulated H200)."""

    config: DemoConfig
    element_signatures: Mapping[str, tuple[Signature, ...]]
    element_frontiers: Mapping[str, Frontier]
    problem: Any
    plan: Any
    all_max: Any
    best_single: Any
    best_single_omega: OperatingPoint
    curve: Any
    meta: Mapping[str, Any] = field(default_factory=dict)
    #: the loop: plan 1 run and held against Eq. 23, what was localized, what characterized
    #: (measured switch latencies, interaction table, which options were measured jointly),
    #: plan 2 run with its baselines (``comparison``: measured savings)
    first: Any = None
    second: Any = None
    localization: Any = None
    transitions: Any = None
    interaction: Any = None
    record: Any = None
    comparison: Any = None
    best_single_problem: Any = None
    all_max_problem: Any = None
    work: Any = None
    ready_power_w: Mapping[Any, float] = field(default_factory=dict)
    #: the tune step (:class:`execution.tune.TuneResult`): plan 2 made to keep its deadline,
    #: measured; ``plan`` is its plan
    tuned: Any = None
    #: plan 2 as planned before the tune step (the model with what round 1 measured)
    untuned_plan: Any = None

    def saved_vs(self, other: Any) -> float:
        """Fraction of ``other``'s energy the plan saves."""
        return 1.0 - self.plan.energy_j / other.energy_j


def _stage_kernels(cfg: DemoConfig) -> dict[tuple[int, str], SimKernel]:
    """The demo's stage kernels (:func:`execution.pipeline.stage_kernels` of its stages)."""
    return stage_kernels(cfg.stage_sizes[: cfg.n_stages])


def _element_kernels(cfg: DemoConfig) -> dict[str, SimKernel]:
    """The stage kernels by element name (``s0_forward``, ...)."""
    return {f"s{s}_{i}": k for (s, i), k in _stage_kernels(cfg).items()}


def _grid(cfg: DemoConfig, sms: Sequence[int]) -> str:
    return (f"power_limit_w={','.join(str(p) for p in cfg.power_limits_w)},"
            f"sm_count={','.join(str(k) for k in sms)},"
            f"sm_clock_mhz={','.join(str(c) for c in cfg.clocks_mhz)}")


def characterize_step(cfg: DemoConfig, progress: ProgressCallback | None = None
                      ) -> dict[str, tuple[Signature, ...]]:
    """Signatures of every element of the step on one simulated H200 (compute on compute_sms(k) SMs,
    the P2P send at k SMs, over the clock × power-limit grid); ``progress`` gets one event
    (:func:`_stage`) per element."""
    import measure

    dev = measure.SimulatedGPU(seed=cfg.seed)
    works: dict[str, Any] = {f"s{s}_{i}": k for (s, i), k in _stage_kernels(cfg).items()}
    works["p2p_send"] = measure.PRESETS["p2p_send"]
    out = {}
    for name, work in works.items():
        sms = cfg.comm_sms if name == "p2p_send" else [compute_sms(k) for k in cfg.comm_sms]
        if progress:
            progress(_stage(f"characterizing {name} on the simulated H200 ..."))
        res = measure.characterize(work, device=dev, grid=_grid(cfg, sms), name=name, progress=None)
        out[name] = tuple(s.with_(meta={**s.meta, "sm_total": SM_TOTAL}) for s in res.signatures)
    return out


def task_composites(cfg: DemoConfig, sigs: Mapping[str, Sequence[Signature]],
                    table: Any = None) -> dict[tuple[int, str], list[Signature]]:
    """Per (stage, instruction): one composite per (ω_dev, k) of compute(compute_sms(k) SMs) ∥
    send(k SMs) — the interaction table's jointly measured co-run where it has one
    (``frontier.interaction.compose_pair``), else ⊕ of the elements characterized alone."""
    from frontier.interaction import InteractionTable, compose_pair

    table = InteractionTable() if table is None else table
    comm = {(s.omega.dev, s.omega.sm_count): s for s in sigs["p2p_send"]}
    send_of = {compute_sms(k): k for k in cfg.comm_sms}
    out: dict[tuple[int, str], list[Signature]] = {}
    for s in range(cfg.n_stages):
        for inst in ("forward", "backward"):
            row = []
            for c in sigs[f"s{s}_{inst}"]:
                send = comm[(c.omega.dev, send_of[c.omega.sm_count])]
                row.append(compose_pair(c, send, table, sm_total=SM_TOTAL, name=f"s{s}_{inst}+send")[0])
            out[(s, inst)] = row
    return out


def options_of(composites: Mapping[tuple[int, str], Sequence[Signature]]) -> dict[tuple[int, str], list[Any]]:
    """The solver options of :func:`task_composites` (ω_dev with the send's SM count k)."""
    from solvers.model import Option

    out: dict[tuple[int, str], list[Any]] = {}
    for key, row in composites.items():
        opts = []
        for c in row:
            k = _send_sms(c)
            opts.append(dataclasses.replace(Option.from_signature(c), omega=c.omega.dev.with_(sm_count=k),
                                            label=f"{c.omega.dev.label()} comm{k}SM"))
        out[key] = opts
    return out


def _send_sms(c: Signature) -> int:
    """SMs of the send side of a task composite (⊕ or a joint measurement)."""
    inter = c.meta.get("interaction") or {}
    key = inter.get("key") if isinstance(inter, Mapping) else None
    if key:
        for m in key["pair"]:
            if m["element"] == "p2p_send":
                return int(m["sm_count"])
    raise InputError(f"{c.name}: no pair record to read its SM split from")


def task_options(cfg: DemoConfig, sigs: Mapping[str, Sequence[Signature]], table: Any = None
                 ) -> dict[tuple[int, str], list[Any]]:
    """Per (stage, instruction): one option per (ω_dev, k) = compute(compute_sms(k) SMs) ∥ send(k SMs),
    composed ⊕ at the null context or, where ``table`` has the pair, measured jointly."""
    return options_of(task_composites(cfg, sigs, table))


def element_frontiers(sigs: Mapping[str, Sequence[Signature]]) -> dict[str, Frontier]:
    """(T, E) frontier of every characterized element."""
    return {n: pareto_frontier(list(v), "TE", name=n) for n, v in sigs.items()}


def _problem(cfg: DemoConfig, opts: Mapping[tuple[int, str], list[Any]], idle_w: float | Mapping[str, float],
             keep: Callable[[Any], bool] = lambda o: True, transitions: Any = None, name: str = ""):
    """The 1F1B problem over ``opts``; ``transitions`` None: the flat ``cfg.transition_time_s``."""
    from solvers.model import ConstantTransition
    from solvers.pipeline import one_f_one_b

    filtered = {k: [o for o in v if keep(o)] for k, v in opts.items()}
    trans = transitions
    if trans is None and cfg.transition_time_s > 0:
        trans = ConstantTransition(cfg.transition_time_s, 0.0)
    return one_f_one_b(cfg.n_stages, cfg.n_microbatches, filtered, idle_power_w=idle_w,
                       transitions=trans,
                       name=f"1F1B {cfg.n_stages}x{cfg.n_microbatches} (simulated H200){name}")


def _best_single(cfg: DemoConfig, opts: Mapping[tuple[int, str], list[Any]],
                 idle_w: Callable[[OperatingPoint], Any], transitions: Any, deadline_s: float
                 ) -> tuple[Any, Any, OperatingPoint]:
    """The best plan that keeps one ω_dev for the whole step: (plan, its sub-problem, ω);
    ``idle_w(ω)`` is the bubble power of a step held at ω."""
    from solvers.model import InfeasibleError
    from solvers.solve import solve

    best, best_sub, best_omega = None, None, OperatingPoint()
    for dev in sorted({o.omega.dev for v in opts.values() for o in v}):
        sub = _problem(cfg, opts, idle_w(dev), keep=lambda o, dev=dev: o.omega.dev == dev,
                       transitions=transitions, name=" best single ω")
        try:
            p = solve(sub, deadline_s)
        except InfeasibleError:
            continue
        if best is None or p.energy_j < best.energy_j:
            best, best_sub, best_omega = p, sub, dev
    return best, best_sub, best_omega


# -- closing the loop: run, localize, characterize, plan again ------------------------------

def joint_points(comps: Mapping[tuple[int, str], Sequence[Signature]], elements: Sequence[str],
                 chosen: Sequence[tuple[str, OperatingPoint, int]] = ()
                 ) -> dict[str, list[tuple[OperatingPoint, int]]]:
    """Per element to measure jointly: the (ω_dev, send SMs k) a plan can choose — the options
    on that task's composed (T, E) frontier (a dominated option only ever helps by saving a
    switch) and those plan 1 chose (``run_demo`` adds those plan 2 then chooses off the
    frontier). Measuring every option instead would double the demo's time."""
    out: dict[str, list[tuple[OperatingPoint, int]]] = {}
    for (s, inst), row in comps.items():
        e = f"s{s}_{inst}"
        if e not in elements:
            continue
        front = pareto_frontier(list(row), "TE", name=e)
        pts = {(c.omega.dev, _send_sms(c)) for c in front.points}
        pts |= {(o, k) for el, o, k in chosen if el == e}
        out[e] = sorted(pts, key=lambda p: (p[0], p[1]))
    return out


def _stage(msg: str) -> ProgressEvent:
    """A progress event of the demo: one stage, its line ``msg`` (the demo does not count its
    stages ahead: round 2 runs only when round 1 left something to fix)."""
    return ProgressEvent(0, None, msg, operation="demo", message=msg)


def run_demo(cfg: DemoConfig = DemoConfig(), progress: ProgressCallback | None = None) -> DemoResult:
    """Characterize, compose and plan (round 1); run the plan and hold it against Eq. 23;
    localize what deviates; characterize that (switch latencies, bubble power, the deviating
    compute ∥ send pairs jointly); plan again (round 2) and run it with its baselines.
    ``progress`` (default: none) gets a :class:`~measure.progress.ProgressEvent` as each stage
    starts (``operation="demo"``; its line says what the stage does)."""
    import measure
    from frontier.interaction import record_of
    from solvers import pareto, solve

    def say(msg: str) -> None:
        if progress:
            progress(_stage(msg))

    timings: dict[str, float] = {}
    clock = _Stopwatch(timings)
    sigs = characterize_step(cfg, progress)
    fronts = element_frontiers(sigs)
    opts1 = task_options(cfg, sigs)
    # Round 1 charges a GPU waiting in a pipeline bubble the ready power at the top clock (the
    # highest any option sees) and a flat switch cost: the assumptions the loop then tests.
    idle_w = max(o.s_w for v in opts1.values() for o in v)
    problem1 = _problem(cfg, opts1, idle_w, name=" round 1")
    deadline1 = problem1.deadline_s(cfg.deadline)
    clock.lap("characterize")
    say(f"round 1: planning {problem1.n_tasks} tasks for a deadline of {deadline1 * 1e3:.1f} ms ...")
    # The fast method: budgeted by work, so the plan is the same under any load (a MILP on
    # CBC, the default without the ``highs`` extra, needs a wall-clock cap here).
    plan1 = solve(problem1, deadline1, method="fast", time_limit_s=cfg.time_limit_s)
    clock.lap("plan 1")
    kernels, send = _stage_kernels(cfg), measure.PRESETS["p2p_send"]
    work = pipeline_work(problem1, kernels, send)
    say("round 1: running the plan on simulated H200s ...")
    first = Round("plan 1", problem1, plan1, run_plan(plan1, problem1, work, seed=cfg.seed))
    clock.lap("run 1")

    say("localizing and characterizing what deviates ...")
    omegas = sorted({o.omega.dev for v in opts1.values() for o in v})
    ready_w = measure_ready_powers(omegas, cfg.seed)
    loc = localize(first, sigs, ready_w)
    transitions = measure.measure_transitions(measure.SimulatedGPU(seed=cfg.seed), omegas, repeats=1)
    elements = {"flagged": loc.flagged_elements, "none": (),
                "all": tuple(sorted({f"s{s}_{i}" for s, i in kernels}))}[cfg.joint]
    chosen = [(f"{t.name.split('/')[0]}_{t.name.split('/')[1]}", o.omega.dev, int(o.omega.sm_count))
              for t, o in ((t, problem1.tasks[i].options[c]) for i, (t, c) in
                           enumerate(zip(problem1.tasks, _choice(plan1, problem1))))]
    # In context: each element's pairs pre-heated to the mean die temperature its tasks ended
    # at in plan 1's run (a backward runs hotter than its device's mean).
    task_temps = first.execution.meta.get("task_temperature_c", {})
    in_context = {}
    for s, i in kernels:
        temps = [v for t, v in task_temps.items() if t.startswith(f"s{s}/{i}/")]
        if temps:
            in_context[f"s{s}_{i}"] = sum(temps) / len(temps)
    table = characterize_jointly(_element_kernels(cfg),
                                 joint_points(task_composites(cfg, sigs), elements, chosen),
                                 seed=cfg.seed, context_temp_c=in_context)
    idle1 = {d: v[1] for d, v in loc.idle.items()}
    clock.lap("localize + characterize")

    def plan_round2(table: Any) -> tuple[Any, Any, dict[str, float], float, Any]:
        comps = task_composites(cfg, sigs, table)
        problem2 = _problem(cfg, options_of(comps), idle1, transitions=transitions, name=" round 2")
        deadline2 = problem2.deadline_s(cfg.deadline)
        say(f"round 2: planning again for a deadline of {deadline2 * 1e3:.1f} ms ...")
        plan2 = solve(problem2, deadline2, method="fast", time_limit_s=cfg.time_limit_s)
        # Plan 1's waits priced the bubbles; plan 2 waits at its own ω_dev. Charge those and
        # plan once more.
        idle2 = idle1
        own = planned_bubble_power(plan2, problem2, ready_w)
        if any(abs(own[d] - idle2[d]) > 0.005 * idle2[d] for d in idle2):
            idle2 = own
            problem2 = problem2.with_(idle_power_w=idle2)
            plan2 = solve(problem2, deadline2, method="fast", time_limit_s=cfg.time_limit_s)
        return comps, problem2, idle2, deadline2, plan2

    comps, problem2, idle2, deadline2, plan2 = plan_round2(table)
    # Plan 2 may pick an option of a deviating pair off its composed frontier (a dominated
    # option can save a switch), which rests on ⊕ of the elements alone: measure those co-runs
    # jointly too and plan again (twice at most), so no choice of a flagged element is composed.
    for _ in range(2):
        extra = {e: v for e, v in composed_choices(plan2, problem2, table).items() if e in elements}
        if not extra:
            break
        say(f"round 2: measuring {sum(len(v) for v in extra.values())} chosen co-run(s) jointly ...")
        table = table.merged(characterize_jointly(_element_kernels(cfg), extra, seed=cfg.seed,
                                                  context_temp_c=in_context))
        comps, problem2, idle2, deadline2, plan2 = plan_round2(table)
    record = record_of(comps)
    opts2 = options_of(comps)
    clock.lap("plan 2")
    say(f"round 3: tuning plan 2 at confidence {cfg.confidence:g} ({cfg.tune_runs} runs a round) ...")
    # What is left after round 2 (heat, co-runs composed ⊕) is measured, not modelled: the tune
    # loop runs the plan, calibrates the offsets and plans again until the runs keep the deadline.
    tuned = tune_problem(problem2, work, deadline2, confidence=cfg.confidence,
                         max_rounds=cfg.tune_rounds, runs_per_round=cfg.tune_runs, seed=cfg.seed,
                         method="fast", time_limit_s=cfg.time_limit_s)
    untuned, plan2 = plan2, tuned.plan
    clock.lap("tune")
    # A baseline held at one ω_dev waits at that ω_dev: its bubbles cost that ready power. The
    # best single ω_dev keeps the deadline the tuned plan was solved for (D less the measured
    # offset and margin), so both keep the deadline alike.
    top = max(omegas)
    max_problem = problem2.with_(idle_power_w={d: ready_w[top] for d in idle2},
                                 name=f"{problem2.name} all-max")
    all_max = all_max_plan(max_problem, deadline2)
    best, best_sub, best_omega = _best_single(cfg, opts2, lambda o: ready_w[o], transitions,
                                              plan2.deadline_s)
    clock.lap("baselines")
    say("running the tuned plan and its baselines on simulated H200s ...")
    base = {"all-max": (all_max, max_problem, work)}
    if best is not None:
        base["best single ω"] = (best, best_sub, pipeline_work(best_sub, kernels, send))
    comparison = run_with_baselines((plan2, problem2, work), base, seed=cfg.seed)
    second = Round("plan 2 tuned", problem2, plan2, comparison.plan)
    clock.lap("run 2 + baselines")
    say("sweeping the energy-vs-deadline frontier of the step ...")
    # With measured (pairwise) switch costs the MILP per deadline is slow on CBC; the fast
    # method shares one search over the curve and reports each point's gap.
    curve = pareto(problem2, n_points=cfg.curve_points, method="fast")
    clock.lap("frontier")
    return DemoResult(cfg, sigs, fronts, problem2, plan2, all_max, best, best_omega, curve,
                      {"idle_power_w": idle_w, "deadline_s": deadline2, "deadline_round1_s": deadline1,
                       "simulated": True, "timings_s": timings},
                      first=first, second=second, localization=loc, transitions=transitions,
                      interaction=table, record=record, comparison=comparison,
                      best_single_problem=best_sub, all_max_problem=max_problem, work=work,
                      ready_power_w=ready_w, tuned=tuned, untuned_plan=untuned)


def _choice(plan: Any, problem: Any) -> list[int]:
    """The plan's option index per task, in problem order."""
    by_name = {t.name: t.option for t in plan.tasks}
    return [int(by_name[t.name]) for t in problem.tasks]


class _Stopwatch:
    """Wall-clock laps of the demo's phases (reported, never asserted)."""

    def __init__(self, into: dict[str, float]) -> None:
        import time

        self._now = time.perf_counter
        self._t = self._now()
        self._into = into

    def lap(self, name: str) -> None:
        t = self._now()
        self._into[name] = t - self._t
        self._t = t


def composite_frontier(curve: Any, idle_w: float, n_devices: int) -> Frontier:
    """The step's energy-vs-deadline curve as a Frontier of composite points (for plotting)."""
    pts = [Signature.from_point(f"step @ {p.deadline_s * 1e3:.1f} ms", time_s=p.makespan_s,
                                energy_j=p.energy_j, s_w=min(idle_w * n_devices, p.energy_j / p.makespan_s),
                                sd_time_s=p.sd_makespan_s, sd_energy_j=p.sd_energy_j,
                                devices={f"stage{i}" for i in range(n_devices)},
                                kappa=f"{p.n_switches} switches", meta={"simulated": True})
           for p in curve.plans]
    return pareto_frontier(pts, "TE", name="1F1B step")


def _verdict(c: Any) -> str:
    dv = c.deviation
    if not dv.flagged:
        return f"not flagged (zT={dv.z_time:+.1f}, zE={dv.z_energy:+.1f}, c={dv.c_alpha:.2f})"
    what = "+".join(s for s, f in (("T", dv.flagged_time), ("E", dv.flagged_energy)) if f)
    return f"FLAGGED {what} (zT={dv.z_time:+.1f}, zE={dv.z_energy:+.1f}, c={dv.c_alpha:.2f})"


def _held(rnd: Round) -> list[str]:
    """Prediction against measurement of one round's step, and its devices."""
    ex = rnd.execution
    c = ex.step
    dv = c.deviation
    flagged = [f"{d.name} ({'+'.join(s for s, f in (('T', d.deviation.flagged_time), ('E', d.deviation.flagged_energy)) if f)})"
               for d in ex.devices if d.flagged]
    return [
        f"   predicted T {c.predicted_time_s * 1e3:.2f} ± {c.sd_predicted_time_s * 1e3:.2f} ms, "
        f"E {c.predicted_energy_j:.2f} ± {c.sd_predicted_energy_j:.2f} J",
        f"   measured  T {c.measured_time_s * 1e3:.2f} ± {c.sd_measured_time_s * 1e3:.2f} ms "
        f"({dv.error_time_pct:+.2f} %), E {c.measured_energy_j:.2f} ± {c.sd_measured_energy_j:.2f} J "
        f"({dv.error_energy_pct:+.2f} %), {ex.n_steps} steps, SIMULATED",
        f"   Eq. 23 on the step: {_verdict(c)}",
        f"   devices flagged (Bonferroni over {len(ex.devices)}): " + (", ".join(flagged) if flagged else "none"),
    ]


def composed_choices(plan: Any, problem: Any, table: Any) -> dict[str, list[tuple[OperatingPoint, int]]]:
    """Per element, the (ω_dev, send SMs k) ``plan`` chose whose co-run the interaction
    ``table`` has no joint measurement of (the option is composed ⊕ from elements alone)."""
    from frontier.interaction import PairKey

    opts = {t.name: t.options for t in problem.tasks}
    out: dict[str, set[tuple[OperatingPoint, int]]] = {}
    for t in plan.tasks:
        o = opts[t.name][t.option]
        kind = t.name.rsplit("/", 1)[0]
        e = kind.replace("/", "_")
        k = int(o.omega.sm_count)
        key = PairKey.of(e, compute_sms(k), "p2p_send", k, o.omega.dev)
        if table is None or table.lookup(key) is None:
            out.setdefault(e, set()).add((o.omega.dev, k))
    return {e: sorted(v, key=lambda p: (p[0], p[1])) for e, v in out.items()}


def _still_flagged(r: DemoResult) -> list[str]:
    """Where plan 2's remaining deviation comes from (said, not hidden)."""
    f2 = r.second
    dv = f2.execution.step.deviation
    a = f2.execution.attribution()["step"]
    what = "+".join(s for s, f in (("T", dv.flagged_time), ("E", dv.flagged_energy)) if f)
    charged = [f2.problem.index.power[d] for d in f2.problem.index.devices]
    own = list(planned_bubble_power(f2.plan, f2.problem, r.ready_power_w).values())
    chosen = {(t.name.rsplit("/", 1)[0], t.option) for t in f2.plan.tasks}
    n_composed = sum(len(v) for v in composed_choices(f2.plan, f2.problem, r.interaction).values())
    return [
        f"   still FLAGGED on {what}: tasks (simulator's per-task truth − planned) {a['tasks_j']:+.2f} J, "
        f"busy {a['busy_s'] * 1e3:+.2f} ms; idle/switch/counter {a['rest_j']:+.2f} J",
        f"   traced to: bubbles charged {min(charged):.1f}–{max(charged):.1f} W, plan 2's own waits "
        f"at {min(own):.1f}–{max(own):.1f} W; {n_composed} of {len(chosen)} chosen (task, option) "
        "composed ⊕ (measured alone, cool); heat: the joint pairs were pre-heated to the mean "
        "temperature their tasks ended at in plan 1's run, and a task runs hotter or cooler than "
        "that mean with what ran before it",
    ]


def deadline_verdict(tuned: Any) -> str:
    """``deadline met ... at confidence 0.95`` with the measured step, or what was not met."""
    c = tuned.rounds[-1].checks
    what = (f"measured step {c.mean_time_s * 1e3:.2f} ms (mean of {c.n_runs} runs, σ "
            f"{c.sd_time_s * 1e3:.2f} ms; next run <= {c.time_bound_s * 1e3:.2f} ms at "
            f"{c.confidence:g}) against {c.deadline_s * 1e3:.2f} ms; energy {c.energy.label()}")
    if tuned.converged:
        return f"deadline met at confidence {c.confidence:g}: {what} (SIMULATED)"
    return (f"deadline NOT kept at confidence {c.confidence:g} within {len(tuned.rounds)} "
            f"round(s): {what} (SIMULATED)")


def report(r: DemoResult) -> str:
    """The text report written to ``demo/report.txt`` (every number SIMULATED)."""
    cfg, p, m, b = r.config, r.plan, r.all_max, r.best_single
    lines = [
        f"energy-calculus demo — {SIMULATED}",
        f"workload: synchronous 1F1B step, {cfg.n_stages} stages x {cfg.n_microbatches} "
        f"microbatches, one GPU per stage, stage sizes {cfg.stage_sizes[: cfg.n_stages]}",
        f"elements: {len(r.element_signatures)} characterized alone over {len(cfg.clocks_mhz)} SM clocks x "
        f"{len(cfg.power_limits_w)} power limits x {len(cfg.comm_sms)} SM splits "
        f"({sum(len(v) for v in r.element_signatures.values())} signatures, SIMULATED)",
        f"deadline: {cfg.deadline} of the fastest makespan = {r.meta['deadline_round1_s'] * 1e3:.2f} ms "
        f"(round 1), {p.deadline_s * 1e3:.2f} ms (round 2)",
    ]
    if r.first is None or r.second is None or r.localization is None:
        return "\n".join(lines) + "\n"
    f1, loc = r.first, r.localization
    lines += [
        "",
        f"1. plan 1 — every task compute ⊕ send from elements characterized alone, a flat "
        f"{cfg.transition_time_s * 1e3:g} ms per switch, bubbles at the top-clock ready power "
        f"{r.meta['idle_power_w']:.1f} W — run on {len(f1.execution.devices)} simulated H200s:",
        *_held(f1),
        "",
        "2. localized (per-task windows of the SIMULATED run) and characterized:",
        f"   switches: {loc.n_switches} per step, settle time paid {loc.switch_paid_s * 1e3:.2f} ms "
        f"against {loc.switch_planned_s * 1e3:.2f} ms planned",
    ]
    bad = loc.flagged_tasks
    worst = sorted(bad, key=lambda t: -max(abs(t.deviation.z_time), abs(t.deviation.z_energy)))[:3]
    lines.append(f"   co-runs: {len(bad)} of {len(loc.tasks)} chosen (task, option) deviate beyond σ "
                 f"(runtime-context test: Eq. 23 band + Eq. 13 allowance, Bonferroni over {len(loc.tasks)})"
                 + (": largest " + "; ".join(
                     f"{t.kind} {t.label} T {t.deviation.error_time_pct:+.2f} % (z {t.deviation.z_time:+.1f}), "
                     f"E {t.deviation.error_energy_pct:+.2f} % (z {t.deviation.z_energy:+.1f})" for t in worst)
                    if worst else ""))
    bw = [v[1] for v in loc.idle.values()]
    lines.append(f"   bubbles: charged {r.meta['idle_power_w']:.1f} W; ready power at the ω_dev in force "
                 f"during the measured waits {min(bw):.1f}–{max(bw):.1f} W per GPU")
    taus = [c[0] for _k, c in r.transitions.pairs]
    joint = {m.element for k in r.interaction.keys() for m in k.members} - {"p2p_send"}
    tr = (f", τ {min(taus) * 1e3:.1f}–{max(taus) * 1e3:.1f} ms" if taus else "")
    lines.append(f"   characterized: switch latencies of {len(r.ready_power_w)} ω_dev measured "
                 f"({len(taus) or 'all'} ordered pairs{tr}); bubble power per GPU from those waits "
                 "(re-planned once at plan 2's own waits when they differ); "
                 f"{len(joint)} pair(s) compute ∥ send measured jointly ({len(r.interaction)} co-run "
                 "signatures: the options on each pair's frontier, those plan 1 chose and those plan 2 "
                 "chose off that frontier, pre-heated to "
                 "the temperature their tasks ran at in plan 1's run)")
    rec = r.record
    if rec is not None:
        lines.append(f"   options: {len(rec.measured)} from joint measurements, {len(rec.composed)} composed "
                     "⊕ at the null context" + (f" (Eq. 13 bias <= {rec.bias_bound_j:.3g} J each)"
                                                if rec.composed else ""))
    f2 = r.second
    lines += ["", "3. plan 2 — measured switch latencies, measured bubble power, joint pairs — "
              f"tuned to keep its deadline at confidence {r.config.confidence:g}:"]
    if r.tuned is not None:
        lines += [f"   {ln}" for ln in r.tuned.summary().splitlines()[1:]]
        lines.append(f"   {deadline_verdict(r.tuned)}")
    lines += [f"   the tuned plan run with its baselines on {len(f2.execution.devices)} simulated H200s "
              f"(seed {r.config.seed}):", *_held(f2)]
    dl = f2.execution.deadline_line()
    if dl:
        lines.append(f"   {dl}")
    c2 = f2.execution.step.deviation
    if c2.flagged:
        lines += _still_flagged(r)
    lines += ["", "4. energy saved, measured against the measured baselines (SIMULATED; σ from both sides):"]
    cmp_ = r.comparison
    runs = {"all-max": cmp_.baselines.get("all-max"), "best single ω": cmp_.baselines.get("best single ω")}
    lines.append(f"   {'':<32}{'T pred ms':>11}{'T meas ms':>18}{'E pred J':>11}{'E meas J':>18}")
    for name, ex in (("all GPUs at max clock/limit", runs["all-max"]),
                     (f"best single ω ({r.best_single_omega.label()})", runs["best single ω"]),
                     ("plan 2 tuned (per-task ω, SM)", f2.execution)):
        if ex is None:
            lines.append(f"   {name:<32} none meets the deadline")
            continue
        c = ex.step
        lines.append(f"   {name:<32}{c.predicted_time_s * 1e3:>11.2f}"
                     f"{c.measured_time_s * 1e3:>11.2f} ± {c.sd_measured_time_s * 1e3:<4.2f}"
                     f"{c.predicted_energy_j:>11.2f}{c.measured_energy_j:>11.2f} ± {c.sd_measured_energy_j:<4.2f}")
    for s in cmp_.savings:
        lines.append(f"   vs {s.baseline:<16} measured {s.measured:+.2%} ± {s.sd_measured:.2%} "
                     f"(predicted {s.predicted:+.2%} ± {s.sd_predicted:.2%})")
    lines += [
        "",
        f"plan 2 tuned: {p.energy_j:.2f} J from the model (before the measured offset), "
        f"{p.n_switches} switch(es); breakdown static busy {p.static_busy_j:.2f} J, idle {p.idle_j:.2f} J, "
        f"dynamic {p.dynamic_j:.2f} J, transitions {p.transition_j:.2f} J",
        f"method {p.method}, status {p.status}, lower bound {p.lower_bound_j:.2f} J, "
        f"proven gap {p.gap:.3%}, solver wall time {p.wall_s:.2f} s",
        f"energy-vs-deadline frontier (round 2 problem): {len(r.curve.plans)} points from "
        f"{r.curve.plans[0].makespan_s * 1e3:.2f} to {r.curve.plans[-1].makespan_s * 1e3:.2f} ms",
    ]
    if b is not None and m is not None:
        lines.append(f"predicted only (no measurement): plan 2 vs all-max {r.saved_vs(m):.1%}, "
                     f"vs best single ω {r.saved_vs(b):.1%}")
    return "\n".join(lines) + "\n"


#: The files :func:`write_demo` writes into the output folder (checked before any work).
OUTPUT_FILES = ("plan.json", "problem.json", "work.json", "plan_round1.json", "problem_round1.json",
                "baselines.json", "baseline_all_max.json", "problem_all_max.json", "baseline_best_single.json",
                "problem_best_single.json", "work_best_single.json", "execution.json",
                "execution_round1.json", "transitions.json", "interaction.json", "schedule.json",
                "pareto.json", "signatures.json", "report.txt", "frontiers.png", "timeline.png",
                "pareto.png")


def _runnable(plan: Plan, problem_file: str, work_file: str, **extra: str) -> dict[str, Any]:
    """A plan file ``ecal run`` can execute (:func:`execution.runnable.runnable_plan_dict`)."""
    return runnable_plan_dict(plan, problem_file, work_file, simulated=SIMULATED, **extra)


def demo_json(r: DemoResult) -> dict[str, Any]:
    """What ``ecal demo --json`` prints (besides the files written)."""
    cmp_ = r.comparison
    return {"simulated": SIMULATED, "plan": r.plan.to_dict(), "all_max_energy_j": r.all_max.energy_j,
            "best_single_energy_j": r.best_single.energy_j if r.best_single else None,
            "first_plan": r.first.plan.to_dict() if r.first else None,
            "first_execution": r.first.execution.step.to_dict() if r.first else None,
            "localization": r.localization.to_dict() if r.localization else None,
            "execution": r.second.execution.step.to_dict() if r.second else None,
            "baselines": {n: x.step.to_dict() for n, x in cmp_.baselines.items()} if cmp_ else {},
            "savings": [s.to_dict() for s in cmp_.savings] if cmp_ else [],
            "tune": r.tuned.plan.meta.get("tune") if r.tuned is not None else None,
            "timings_s": dict(r.meta.get("timings_s", {}))}


def write_demo(r: DemoResult, out_dir: str | Path) -> list[Path]:
    """Write the plans (runnable by ``ecal run``: each names its problem and work table), the
    executions, the measured transition and interaction tables, signatures, report and plots."""
    from frontier.interaction_io import save_interaction_table
    from frontier.io import save_signatures
    from frontier.plot import plot_compositions
    from solvers.io import problem_to_dict
    from solvers.plot import plot_pareto, plot_timeline

    from .output import Outputs

    d = Path(out_dir)
    out = Outputs()
    out.json(d / "plan.json", _runnable(r.plan, "problem.json", "work.json", baselines="baselines.json"))
    out.json(d / "problem.json", problem_to_dict(r.problem))
    out.json(d / "work.json", work_table_to_dict(r.work))
    if r.first is not None:
        out.json(d / "plan_round1.json", _runnable(r.first.plan, "problem_round1.json", "work.json"))
        out.json(d / "problem_round1.json", problem_to_dict(r.first.problem))
        # the localization of round 1's miss rides in meta: the file stays an ecal.execution/1
        first = r.first.execution.to_dict()
        first["meta"] = {**first.get("meta", {}), "localization": r.localization.to_dict()}
        out.json(d / "execution_round1.json", first)
    base = {"all-max": "baseline_all_max.json"}
    out.json(d / "baseline_all_max.json", _runnable(r.all_max, "problem_all_max.json", "work.json"))
    out.json(d / "problem_all_max.json", problem_to_dict(r.all_max_problem or r.problem))
    if r.best_single is not None:
        base["best single ω"] = "baseline_best_single.json"
        out.json(d / "baseline_best_single.json",
                 _runnable(r.best_single, "problem_best_single.json", "work_best_single.json"))
        out.json(d / "problem_best_single.json", problem_to_dict(r.best_single_problem))
        kernels = _stage_kernels(r.config)
        import measure

        out.json(d / "work_best_single.json",
                 work_table_to_dict(pipeline_work(r.best_single_problem, kernels, measure.PRESETS["p2p_send"])))
    out.json(d / "baselines.json", baselines_to_dict(base, simulated=SIMULATED))
    if r.comparison is not None:
        out.json(d / "execution.json", r.comparison.to_dict())
    if r.transitions is not None:
        out.json(d / "transitions.json", r.transitions.to_dict())
    if r.interaction is not None:
        out.custom(d / "interaction.json", lambda tmp: save_interaction_table(tmp, r.interaction))
    out.json(d / "schedule.json", stage_schedule(r.plan, r.problem, simulated=True))
    out.json(d / "pareto.json", {**r.curve.to_dict(), "simulated": SIMULATED})
    keyed = {f"{n}@{s.omega.label()}": s for n, v in r.element_signatures.items() for s in v}
    out.custom(d / "signatures.json", lambda tmp: save_signatures(tmp, keyed))
    out.text(d / "report.txt", report(r))
    comp = composite_frontier(r.curve, r.meta["idle_power_w"], r.config.n_stages)
    fr = [r.element_frontiers[n] for n in sorted(r.element_frontiers)]
    out.figure(d / "frontiers.png", plot_compositions(fr, comp, title="Element frontiers and the composed "
                                                      "1F1B step (simulated H200)"))
    out.custom(d / "timeline.png", lambda tmp: plot_timeline(r.plan, tmp, stamp="SIMULATED H200"))
    out.custom(d / "pareto.png", lambda tmp: plot_pareto(r.curve, tmp, stamp="SIMULATED H200"))
    return out.commit()
