"""``ecal demo``: the whole job on the simulated H200, in one command.

1. **Characterize** the elements of a pipeline-parallel training step — per stage, the forward
   and backward compute and the P2P send that overlaps them — on the simulated H200 over
   SM clock × power limit × the SMs given to communication (compute gets the rest of the 132).
2. **Compose** each task option as compute ⊕ send on one GPU (static power paid once, SM
   allocations must fit), and build per-element frontiers.
3. **Plan** the synchronous 1F1B step (4 stages × 8 microbatches, one GPU per stage) for a
   deadline 5 % above the fastest makespan, with a cost for switching ω_dev.
4. **Report** energy saved against every GPU at max clock and against the best single
   operating point for the whole step, with the plan's proven optimality gap.

Everything is simulated (virtual time: the run takes seconds) and says so in every output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frontier import OperatingPoint, Signature, par
from frontier.pareto import Frontier, pareto_frontier

SM_TOTAL = 132
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
    time_limit_s: float = 10.0


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

    def saved_vs(self, other: Any) -> float:
        """Fraction of ``other``'s energy the plan saves."""
        return 1.0 - self.plan.energy_j / other.energy_j


def _stage_kernels(cfg: DemoConfig) -> dict[tuple[int, str], Any]:
    from measure.sim import PRESETS

    out = {}
    for s, size in enumerate(cfg.stage_sizes[: cfg.n_stages]):
        for inst in ("forward", "backward"):
            base = PRESETS[f"stage_{inst}"]
            out[(s, inst)] = dataclasses.replace(base, name=f"s{s}_{inst}", flops=base.flops * size,
                                                 bytes=base.bytes * size)
    return out


def _grid(cfg: DemoConfig, sms: Sequence[int]) -> str:
    return (f"power_limit_w={','.join(str(p) for p in cfg.power_limits_w)},"
            f"sm_count={','.join(str(k) for k in sms)},"
            f"sm_clock_mhz={','.join(str(c) for c in cfg.clocks_mhz)}")


def characterize_step(cfg: DemoConfig, progress: Callable[[str], None] | None = None
                      ) -> dict[str, tuple[Signature, ...]]:
    """Signatures of every element of the step on one simulated H200 (compute at 132 − k SMs,
    the P2P send at k SMs, over the clock × power-limit grid)."""
    import measure

    dev = measure.SimulatedGPU(seed=cfg.seed)
    works: dict[str, Any] = {f"s{s}_{i}": k for (s, i), k in _stage_kernels(cfg).items()}
    works["p2p_send"] = measure.PRESETS["p2p_send"]
    out = {}
    for name, work in works.items():
        sms = cfg.comm_sms if name == "p2p_send" else [SM_TOTAL - k for k in cfg.comm_sms]
        if progress:
            progress(f"characterizing {name} on the simulated H200 ...")
        res = measure.characterize(work, device=dev, grid=_grid(cfg, sms), name=name, progress=None)
        out[name] = tuple(s.with_(meta={**s.meta, "sm_total": SM_TOTAL}) for s in res.signatures)
    return out


def task_options(cfg: DemoConfig, sigs: Mapping[str, Sequence[Signature]]
                 ) -> dict[tuple[int, str], list[Any]]:
    """Per (stage, instruction): one option per (ω_dev, k) = compute(132 − k SMs) ⊕ send(k SMs)."""
    from solvers.model import Option

    comm = {(s.omega.dev, s.omega.sm_count): s for s in sigs["p2p_send"]}
    out: dict[tuple[int, str], list[Any]] = {}
    for s in range(cfg.n_stages):
        for inst in ("forward", "backward"):
            opts = []
            for c in sigs[f"s{s}_{inst}"]:
                k = SM_TOTAL - c.omega.sm_count
                send = comm[(c.omega.dev, k)]
                composite = par(c, send, sm_total=SM_TOTAL, name=f"s{s}_{inst}+send")
                o = Option.from_signature(composite)
                opts.append(dataclasses.replace(
                    o, omega=c.omega.dev.with_(sm_count=k),
                    label=f"{c.omega.dev.label()} comm{k}SM"))
            out[(s, inst)] = opts
    return out


def element_frontiers(sigs: Mapping[str, Sequence[Signature]]) -> dict[str, Frontier]:
    """(T, E) frontier of every characterized element."""
    return {n: pareto_frontier(list(v), "TE", name=n) for n, v in sigs.items()}


def _problem(cfg: DemoConfig, opts: Mapping[tuple[int, str], list[Any]], idle_w: float,
             keep: Callable[[Any], bool] = lambda o: True):
    from solvers.model import ConstantTransition
    from solvers.pipeline import one_f_one_b

    filtered = {k: [o for o in v if keep(o)] for k, v in opts.items()}
    trans = ConstantTransition(cfg.transition_time_s, 0.0) if cfg.transition_time_s > 0 else None
    return one_f_one_b(cfg.n_stages, cfg.n_microbatches, filtered, idle_power_w=idle_w,
                       transitions=trans, name=f"1F1B {cfg.n_stages}x{cfg.n_microbatches} (simulated H200)")


def _all_max(problem: Any, deadline_s: float) -> Any:
    """Every task at the top clock and power limit, with its fastest SM split."""
    from solvers.plan import make_plan

    choice = []
    top = max(o.omega.dev for t in problem.tasks for o in t.options)
    for t in problem.tasks:
        cands = [j for j, o in enumerate(t.options) if o.omega.dev == top]
        choice.append(min(cands, key=lambda j: (t.options[j].time_s, t.options[j].energy_j)))
    return make_plan(problem, choice, deadline_s, method="baseline: all max clock", lower_bound_j=0.0,
                     wall_s=0.0)


def run_demo(cfg: DemoConfig = DemoConfig(), progress: Callable[[str], None] | None = None) -> DemoResult:
    """Characterize, compose, plan and compare; returns every intermediate result."""
    from solvers.model import InfeasibleError
    from solvers.solve import pareto, solve

    sigs = characterize_step(cfg, progress)
    fronts = element_frontiers(sigs)
    opts = task_options(cfg, sigs)
    # A GPU waiting in a pipeline bubble holds its clock at ready power; we charge the ready
    # power at the top clock (the highest any option sees), which never understates idle cost.
    idle_w = max(o.s_w for v in opts.values() for o in v)
    problem = _problem(cfg, opts, idle_w)
    deadline_s = problem.deadline_s(cfg.deadline)
    if progress:
        progress(f"planning {problem.n_tasks} tasks for a deadline of {deadline_s * 1e3:.1f} ms ...")
    # The MILP proves optimality within seconds on HiGHS; CBC (the default without the
    # ``highs`` extra) is slower, so the demo caps it and reports the gap it certified.
    plan = solve(problem, deadline_s, time_limit_s=cfg.time_limit_s)
    all_max = _all_max(problem, deadline_s)
    best, best_omega = None, OperatingPoint()
    for dev in sorted({o.omega.dev for v in opts.values() for o in v}):
        sub = _problem(cfg, opts, idle_w, keep=lambda o, dev=dev: o.omega.dev == dev)
        try:
            p = solve(sub, deadline_s)
        except InfeasibleError:
            continue
        if best is None or p.energy_j < best.energy_j:
            best, best_omega = p, dev
    if progress:
        progress("sweeping the energy-vs-deadline frontier of the step ...")
    curve = pareto(problem, n_points=10)
    return DemoResult(cfg, sigs, fronts, problem, plan, all_max, best, best_omega, curve,
                      {"idle_power_w": idle_w, "deadline_s": deadline_s, "simulated": True})


def composite_frontier(curve: Any, idle_w: float, n_devices: int) -> Frontier:
    """The step's energy-vs-deadline curve as a Frontier of composite points (for plotting)."""
    pts = [Signature.from_point(f"step @ {p.deadline_s * 1e3:.1f} ms", time_s=p.makespan_s,
                                energy_j=p.energy_j, s_w=min(idle_w * n_devices, p.energy_j / p.makespan_s),
                                sd_time_s=p.sd_makespan_s, sd_energy_j=p.sd_energy_j,
                                devices={f"stage{i}" for i in range(n_devices)},
                                kappa=f"{p.n_switches} switches", meta={"simulated": True})
           for p in curve.plans]
    return pareto_frontier(pts, "TE", name="1F1B step")


def report(r: DemoResult) -> str:
    """The short text report written to ``demo/report.txt``."""
    p, m, b = r.plan, r.all_max, r.best_single
    lines = [
        f"energy-calculus demo — {SIMULATED}",
        f"workload: synchronous 1F1B step, {r.config.n_stages} stages x {r.config.n_microbatches} "
        f"microbatches, one GPU per stage, stage sizes {r.config.stage_sizes[: r.config.n_stages]}",
        f"elements: {len(r.element_signatures)} characterized over {len(r.config.clocks_mhz)} SM clocks x "
        f"{len(r.config.power_limits_w)} power limits x {len(r.config.comm_sms)} SM splits "
        f"({sum(len(v) for v in r.element_signatures.values())} signatures)",
        f"switching omega_dev costs {r.config.transition_time_s * 1e3:g} ms at ready power; "
        f"idle (bubble) power {r.meta['idle_power_w']:.1f} W per GPU",
        f"deadline: {r.config.deadline} of the fastest makespan = {p.deadline_s * 1e3:.2f} ms",
        "",
        f"{'':<34}{'makespan (ms)':>14}{'energy (J)':>12}{'saved':>8}",
        f"{'all GPUs at max clock/limit':<34}{m.makespan_s * 1e3:>14.2f}{m.energy_j:>12.2f}{'':>8}",
        f"{'best single ω for the step':<34}{b.makespan_s * 1e3:>14.2f}{b.energy_j:>12.2f}"
        f"{1 - b.energy_j / m.energy_j:>8.1%}" if b is not None else "best single ω: none meets the deadline",
        f"{'planned (per-task ω, SM split)':<34}{p.makespan_s * 1e3:>14.2f}{p.energy_j:>12.2f}"
        f"{r.saved_vs(m):>8.1%}",
        "",
        f"best single ω: {r.best_single_omega.label()}",
        f"plan vs all-max: {r.saved_vs(m):.1%} less energy; vs best single ω: "
        + (f"{r.saved_vs(b):.1%} less energy" if b is not None else "n/a"),
        f"plan energy ± σ: {p.energy_j:.2f} ± {p.sd_energy_j:.2f} J (delta method over the measured signatures)",
        f"breakdown: static busy {p.static_busy_j:.2f} J, idle {p.idle_j:.2f} J, dynamic {p.dynamic_j:.2f} J, "
        f"transitions {p.transition_j:.2f} J; {p.n_switches} switch(es)",
        f"method {p.method}, status {p.status}, lower bound {p.lower_bound_j:.2f} J, "
        f"proven gap {p.gap:.3%}, solver wall time {p.wall_s:.2f} s",
        f"energy-vs-deadline frontier: {len(r.curve.plans)} points from "
        f"{r.curve.plans[0].makespan_s * 1e3:.2f} to {r.curve.plans[-1].makespan_s * 1e3:.2f} ms",
    ]
    return "\n".join(lines) + "\n"


#: The files :func:`write_demo` writes into the output folder (checked before any work).
OUTPUT_FILES = ("plan.json", "schedule.json", "pareto.json", "signatures.json", "report.txt",
                "frontiers.png", "timeline.png", "pareto.png")


def write_demo(r: DemoResult, out_dir: str | Path) -> list[Path]:
    """Write plan.json, schedule.json, signatures.json, report.txt and the three plots."""
    from frontier.io import save_signatures
    from frontier.plot import plot_compositions
    from solvers.plot import plot_pareto, plot_timeline

    from .output import Outputs
    from .schedule import stage_schedule

    d = Path(out_dir)
    out = Outputs()
    out.json(d / "plan.json", {**r.plan.to_dict(), "simulated": SIMULATED})
    out.json(d / "schedule.json", stage_schedule(r.plan, r.problem, simulated=True))
    out.json(d / "pareto.json", {**r.curve.to_dict(), "simulated": SIMULATED})
    keyed = {f"{n}@{s.omega.label()}": s for n, v in r.element_signatures.items() for s in v}
    out.custom(d / "signatures.json", lambda tmp: save_signatures(tmp, keyed))
    out.text(d / "report.txt", report(r))
    comp = composite_frontier(r.curve, r.meta["idle_power_w"], r.config.n_stages)
    fr = [r.element_frontiers[n] for n in sorted(r.element_frontiers)]
    out.figure(d / "frontiers.png", plot_compositions(fr, comp, title="Element frontiers and the composed "
                                                      "1F1B step (simulated H200)"))
    out.custom(d / "timeline.png", lambda tmp: plot_timeline(r.plan, tmp))
    out.custom(d / "pareto.png", lambda tmp: plot_pareto(r.curve, tmp))
    return out.commit()
