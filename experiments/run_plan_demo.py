"""Run the demo's plan and its two baselines on simulated H200s and hold each against Eq. 23.

    python experiments/run_plan_demo.py [--small] [--seed 0] [--out experiments/results]

Builds the ``ecal demo`` problem (characterize on the simulated H200, compose every option as
compute ⊕ send, plan under the deadline), then executes the plan, the all-max baseline and the
best single-ω plan with :func:`execution.run.run_plan`: one simulated H200 per stage, each
task a co-run of compute (132 − k SMs) ∥ send (k SMs) at its planned ω. Prints the predicted
vs measured tables, where the deviation comes from, and the measured savings; then isolates
the co-run interaction itself (each distinct chosen option: co-run against the ⊕ of its
elements run alone at the same ω, null context). Writes ``run_plan_demo.json`` to ``--out``
(atomically) when given. Everything is SIMULATED.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ecal.demo import DemoConfig, run_demo
from execution.pipeline import pipeline_work, stage_kernels
from execution.savings import PlanComparison, run_with_baselines
from execution.work import TaskWork
from frontier.files import write_json_atomic
from measure.sim import PRESETS, SimulatedGPU, with_spec

QUIET = with_spec(cap_clock_dither=0.0, cap_clock_wander=0.0, time_jitter=0.0, power_noise=0.0)

SMALL = DemoConfig(n_stages=2, n_microbatches=2, clocks_mhz=(1980, 1440), power_limits_w=(700,),
                   comm_sms=(16,))


def _stage_kernels(cfg: DemoConfig) -> dict[tuple[int, str], Any]:
    """The demo's stage kernels (its stages' sizes)."""
    return stage_kernels(cfg.stage_sizes[: cfg.n_stages])


def compare_demo(r: Any, seed: int = 0) -> PlanComparison:
    """Run the demo result's plan, all-max and best-single-ω plans; measured savings."""
    kernels, send = _stage_kernels(r.config), PRESETS["p2p_send"]
    full = pipeline_work(r.problem, kernels, send)
    base = {"all-max": (r.all_max, r.all_max_problem,
                        pipeline_work(r.all_max_problem, kernels, send))}
    if r.best_single is not None:
        sub = r.best_single_problem
        base["best single ω"] = (r.best_single, sub, pipeline_work(sub, kernels, send))
    return run_with_baselines((r.plan, r.problem, full), base, seed=seed)


def corun_isolation(r: Any, seed: int = 0) -> list[dict[str, Any]]:
    """Each distinct chosen (task kind, option): the co-run against its elements run alone at
    the same ω from the null context (simulator truth; no counter): what ⊕ leaves out."""
    kernels, send = _stage_kernels(r.config), PRESETS["p2p_send"]
    work = pipeline_work(r.problem, kernels, send)
    seen: dict[tuple[str, int], Any] = {}
    for tp, t in zip(r.plan.tasks, r.problem.tasks):
        kind = tp.name.rsplit("/", 1)[0]
        seen.setdefault((kind, tp.option), (t.options[tp.option], work[t.name][tp.option]))
    rows = []
    for (kind, _), (opt, w) in sorted(seen.items()):
        rows.append({"task": kind, "option": opt.label, **_isolate(w, opt.omega.dev, seed)})
    return rows


def _isolate(w: TaskWork, op: Any, seed: int, n: int = 1) -> dict[str, float]:
    def mean_of(run) -> tuple[float, float, float]:
        # the simulator's model without its noise (dither, wander, jitter, power noise): the
        # difference is the co-run interaction itself, not a noise draw
        g = SimulatedGPU(seed=seed, spec=QUIET)
        g.set_operating_point(op)
        g.seed_point("isolate")
        s = g.static_power_w()
        t0, e0 = g.time_s(), g.true_energy_j()
        for _ in range(n):
            run(g)
        return (g.time_s() - t0) / n, (g.true_energy_j() - e0) / n, s

    alone = [mean_of(lambda g, k=k, sm=sm: g.run(k, 1, sm_count=sm)) for k, sm in w.streams]
    t_co, e_co, s = mean_of(lambda g: g.run_parallel(w.parallel_streams()))
    t_par = max(a[0] for a in alone)
    e_par = s * t_par + sum(e - sa * t for t, e, sa in alone)     # ⊕: static once, Σ d
    return {"time_alone_par_s": t_par, "time_corun_s": t_co, "time_excess_pct": 100 * (t_co / t_par - 1),
            "energy_alone_par_j": e_par, "energy_corun_j": e_co,
            "energy_excess_pct": 100 * (e_co / e_par - 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="2 stages x 2 microbatches, 2 clocks")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="folder for run_plan_demo.json")
    a = ap.parse_args(argv)
    cfg = SMALL if a.small else DemoConfig()
    t0 = time.perf_counter()
    r = run_demo(cfg)
    t1 = time.perf_counter()
    cmp = compare_demo(r, seed=a.seed)
    t2 = time.perf_counter()
    print(cmp.summary())
    print("\nwhere the deviation comes from (SIMULATED; J and ms per step):")
    for name, run in (("plan", cmp.plan), *cmp.baselines.items()):
        at = run.attribution()
        for d, v in at.items():
            print(f"  {name:<14} {d:<8} dE {v['error_j']:+8.2f} = tasks {v['tasks_j']:+7.2f} + "
                  f"idle/switch/counter {v['rest_j']:+7.2f}; dT {v['error_time_s'] * 1e3:+7.2f} ms "
                  f"(busy {v['busy_s'] * 1e3:+7.2f}, switches {v['switch_s'] * 1e3:+6.2f})")
    iso = corun_isolation(r, seed=a.seed)
    print("\nco-run vs ⊕ of the elements alone, each chosen option (SIMULATED, null context):")
    for row in iso:
        print(f"  {row['task']:<12} {row['option']:<24} T {row['time_excess_pct']:+6.2f} %   "
              f"E {row['energy_excess_pct']:+6.2f} %")
    print(f"\n(demo {t1 - t0:.1f} s, three runs {t2 - t1:.2f} s wall)")
    if a.out is not None:
        write_json_atomic(a.out / "run_plan_demo.json",
                          {"simulated": True, "config": dataclasses.asdict(cfg),
                           "comparison": cmp.to_dict(), "corun_isolation": iso})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
