"""Adaptive characterization against the full grid: GPU-seconds spent and plan quality.

For every element, the full clock (× power-limit) grid is measured once (the reference, with
the same protocol and target relative standard error), and
:func:`measure.adaptive.characterize_adaptive` is run on a fresh device from a coarse grid. On
the simulated H200 both measure the same points bit for bit (points are seeded by key), and on
the NV-DVFS tables (real V100 and RTX 8000 clock sweeps, replayed by
:class:`measure.replay.ReplayDevice`; read in place from ``../shared/data/nv-dvfs``, never
copied) the whole grid is known, so everything adaptive skipped can be checked:

* **GPU-seconds**: device time of the adaptive run / of the full sweep (warm-up, ready-power
  calibration, windows and switches included);
* **plans**: over 40 deadlines from the fastest operating point (top clock of a row) to the
  cheapest, the min-energy point meeting each deadline on the adaptive frontier (measured
  points only, as ``AdaptiveResult.frontier()`` hands planning), against the same choice on
  the full grid (gap = extra energy; a miss = the time exceeds the deadline). The headline
  judges both picks by the simulator's **expected** (noise-free) values at their settings;
  beside it, by the full grid's measured values, with the per-point σ: a 0.3 % target under
  per-point noise of that order is, on measured values, a test of the noise (a full-grid pick
  that is a lucky run is counted separately), and the full grid's own plan is itself up to a
  few % from the best setting on average;
* **chains**: the elements of each device in one chain ``Problem`` solved by
  ``solvers.solve`` at several deadlines, from adaptive and from full frontiers, the adaptive
  plan evaluated with the full grid's values;
* **skips checked**: a ``dominated`` point whose true value is not dominated within k·σ by a
  measured point, or a ``predicted`` point whose true value is outside its bound by more than
  k·σ, is counted as a wrong skip.

Run: ``python experiments/adaptive_characterization.py [--quick] [--plan-tol 0.003]`` (a few
minutes; the simulator runs in virtual time). Writes ``experiments/results/adaptive_characterization.{md,json,png}``.
Target (issue 21): plans within 0.3 % of the full grid's at ≤ 25 % of its GPU-seconds.
The H200 results are SIMULATED; the V100 / RTX 8000 results replay real measurements.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS_DIR, markdown_table, shared_file, write_json, write_text_atomic  # noqa: E402

from frontier.operating_point import OperatingPoint  # noqa: E402
from frontier.pareto import pareto_frontier  # noqa: E402
from frontier.signature import Signature  # noqa: E402
from measure.adaptive import (  # noqa: E402
    COORDS,
    AdaptiveOptions,
    AdaptiveResult,
    characterize_adaptive,
    fastest_points,
)
from measure.device import Device  # noqa: E402
from measure.protocol import Protocol  # noqa: E402
from measure.replay import ReplayDevice, load_nvdvfs  # noqa: E402
from measure.sim import SimulatedGPU, preset  # noqa: E402
from measure.sweep import sweep  # noqa: E402

SIM_ELEMENTS = ("gemm_bf16_8192", "copy_2GiB", "attention_flash", "stage_forward", "stage_backward",
                "p2p_send")
SIM_GRID = {"sm_clock_mhz": [float(f) for f in range(1980, 344, -15)],
            "power_limit_w": [700.0, 550.0, 400.0, 300.0]}
CARDS = {"V100": "nv-dvfs/v100-dvfs-real.csv", "RTX 8000": "nv-dvfs/rtx8000-dvfs-real.csv"}
TARGET_GAP = 0.003
#: Time within which a deadline is not told apart from a point's time by the oracle count
#: (k·σ of time at its floor, as adaptive's own rule: k = 2, σ ≥ MIN_RSE_TIME).
ORACLE_TIME_SLACK = 0.001
TARGET_GPU_S = 0.25
CHAIN_DEADLINES = (1.0, 1.02, 1.05, 1.1, 1.2, 1.35, 1.5)


@dataclass
class ElementRun:
    """One element: its full grid, the adaptive result and the comparisons."""

    device: str
    element: str
    full: dict[OperatingPoint, Signature]
    full_gpu_s: float
    adaptive: AdaptiveResult
    truth: dict[OperatingPoint, Signature] | None = None
    plan_gaps: list[float] = field(default_factory=list)
    plan_gaps_indep: list[float] = field(default_factory=list)
    plan_misses: list[float] = field(default_factory=list)
    wrong_skips: list[str] = field(default_factory=list)
    wrong_skips_noise: list[str] = field(default_factory=list)
    expected: dict[OperatingPoint, tuple[float, float]] | None = None
    plan_gaps_expected: list[float] = field(default_factory=list)
    wrong_skips_expected: list[str] = field(default_factory=list)
    #: per deadline where the expected gap exceeds the target: the gap by measured values
    #: (at most the target: the two picks are within it by what was measured, and which is
    #: better on average is decided by their noise)
    over_expected: list[tuple[float, float, str]] = field(default_factory=list)
    #: deadlines where the measured gap exceeds the target but the full grid's pick is a lucky
    #: run (it meets the deadline only in its run, or it is within the target on average)
    lucky_full: int = 0
    #: the full grid's own plan against the best setting on average (both on expected
    #: values): how far per-point noise alone puts the reference from the best plan
    full_vs_best: list[float] = field(default_factory=list)

    def fastest_s(self) -> float:
        """The fastest time of the element's fastest operating points (the top clock of every
        power-limit row, which adaptive always measures: bit-identical to the full grid's on
        the simulator). The full grid's minimum over *all* points is lower where a capped
        point's clock wandered high in its run: a lucky draw, not a faster setting."""
        return min(self.full[o].time_s for o in fastest_points(list(self.full)))

    def options(self, adaptive: bool) -> list[Signature]:
        """Frontier points as planning options (adaptive: measured points only, the frontier
        adaptive hands to planning)."""
        pts = (list(self.adaptive.frontier(criterion="TE"))
               if adaptive else list(pareto_frontier(list(self.full.values()), "TE")))
        return pts


def full_sweep(device: Device, work: Any, element: str, grid: Mapping, protocol: Protocol
               ) -> tuple[dict[OperatingPoint, Signature], float]:
    """Every grid point, measured; (signature per ω, device seconds)."""
    t0 = device.time_s()
    res = sweep(device, {None: work}, element, grid=grid, protocol=protocol, progress=None)
    return {s.omega: s for s in res.signatures}, device.time_s() - t0


def _capped(s: Signature) -> bool:
    return "SwPowerCap" in (s.meta.get("throttle_reasons") or [])


def remeasured_noise(run: ElementRun) -> dict[bool, float]:
    """Relative run-to-run noise of a point, from the independent re-measurement: the median
    of |E₀ − E₁| / (√2 E) over the grid, for capped and uncapped points separately (a capped
    clock wanders between runs more than one run's windows show)."""
    out = {}
    for capped in (True, False):
        d = [abs(s.energy_j - run.truth[o].energy_j) / (math.sqrt(2) * s.energy_j)  # type: ignore[index]
             for o, s in run.full.items() if _capped(s) == capped]
        out[capped] = float(np.median(d)) if d else 0.0
    return out


def check(run: ElementRun, k_sigma: float, floor: float = 1e-3, n_deadlines: int = 40) -> None:
    """Plan gaps over deadlines and wrong skips, with the full grid as the truth (σ of a
    truth point: its own standard error, at least ``floor`` relative; a second count also
    allows the run-to-run noise seen on re-measurement)."""
    full = run.full
    ad = run.options(adaptive=True)
    fastest = run.fastest_s()
    cheapest = min(full.values(), key=lambda s: s.energy_j)
    for d in np.geomspace(fastest, max(fastest, cheapest.time_s * 1.02), n_deadlines):
        ok_full = [s for s in full.values() if s.time_s <= d * (1 + 1e-12)]
        best = min(ok_full, key=lambda s: s.energy_j)
        ok_ad = [s for s in ad if s.time_s <= d * (1 + 1e-12)]
        if not ok_ad:
            run.plan_misses.append(math.inf)
            continue
        pick = full[min(ok_ad, key=lambda s: s.energy_j).omega]
        gap = pick.energy_j / best.energy_j - 1.0
        run.plan_gaps.append(gap)
        ex = run.expected
        if ex is not None:
            fair = ex[best.omega][0] <= d * 1.001
            g_ex = ex[pick.omega][1] / ex[best.omega][1] - 1.0 if fair else None
            if gap > TARGET_GAP and (g_ex is None or g_ex <= TARGET_GAP):
                run.lucky_full += 1
            on_avg = [e for t, e in ex.values() if t <= d * (1 + 1e-9)]
            if fair and on_avg:
                run.full_vs_best.append(ex[best.omega][1] / min(on_avg) - 1.0)
        if ex is not None and g_ex is not None:
            # both choices judged by the simulator's noise-free values at their settings, where
            # the full grid's choice meets the deadline on average too (it may be a capped
            # point whose clock wandered high in its one run: a lucky draw, not a setting)
            run.plan_gaps_expected.append(g_ex)
            if g_ex > TARGET_GAP:
                run.over_expected.append((g_ex, gap, f"{d * 1e3:.4g} ms: {best.omega.label()} "
                                          f"(full) vs {pick.omega.label()} (adaptive)"))
        if run.truth is not None and run.truth[best.omega].time_s <= d * 1.001:
            # both choices judged by an independent re-measurement (where the full grid's own
            # choice still meets the deadline there: it may have been picked for a lucky T)
            run.plan_gaps_indep.append(run.truth[pick.omega].energy_j
                                       / run.truth[best.omega].energy_j - 1.0)
        if pick.time_s > d * (1 + 1e-9):
            run.plan_misses.append(pick.time_s / d - 1.0)
    coords = COORDS[run.adaptive.criterion]
    measured = np.array([[getattr(s, c) for c in coords] for s in run.adaptive.signatures])
    noise = remeasured_noise(run) if run.truth is not None else {True: 0.0, False: 0.0}
    for sk in run.adaptive.skipped:
        truth = full[sk.omega]
        sd = {"time_s": truth.sd_time_s, "energy_j": truth.sd_energy_j, "d_j": truth.sd_energy_j,
              "s_w": 0.005 * truth.s_w}
        v = np.array([getattr(truth, c) for c in coords])
        for extra, out in ((0.0, run.wrong_skips), (noise[_capped(truth)], run.wrong_skips_noise)):
            tol = np.array([k_sigma * max(sd[c], (floor + extra) * abs(getattr(truth, c)))
                            for c in coords])
            if sk.reason == "dominated":
                if not np.any(np.all(measured <= v + tol, axis=1)):
                    out.append(f"{sk.omega.label()} dominated, but not in the full grid")
            elif sk.reason == "predicted":
                for c, t in zip(coords, tol):
                    lo, hi = sk.bounds[c]
                    if not lo - t <= getattr(truth, c) <= hi + t:
                        out.append(f"{sk.omega.label()} {c}={getattr(truth, c):.5g} outside "
                                   f"[{lo:.5g}, {hi:.5g}]")
    if run.expected is not None and coords == ("time_s", "energy_j"):
        # judged by the noise-free values: a capped point's one run is a draw around its
        # setting's value, which is what its bound (the row's plateau) is about
        ex = run.expected
        mexp = np.array([ex[s.omega][:2] for s in run.adaptive.signatures])
        # the rule's own σ: the median relative standard error of the element's points (what
        # the planner uses), at least ``floor``
        rel = np.array([max(floor, float(np.median([s.sd_time_s / s.time_s for s in full.values()]))),
                        max(floor, float(np.median([s.sd_energy_j / s.energy_j
                                                    for s in full.values()])))])
        for sk in run.adaptive.skipped:
            v = np.array(ex[sk.omega][:2])
            tol = k_sigma * rel * np.abs(v)
            if sk.reason == "dominated" and not np.any(np.all(mexp <= v + tol, axis=1)):
                run.wrong_skips_expected.append(f"{sk.omega.label()} dominated, but not on average")
            elif sk.reason == "predicted":
                for c, x, t in zip(coords, v, tol):
                    lo, hi = sk.bounds[c]
                    if not lo - t <= x <= hi + t:
                        run.wrong_skips_expected.append(
                            f"{sk.omega.label()} expected {c}={x:.5g} outside [{lo:.5g}, {hi:.5g}]")


def chain(runs: Sequence[ElementRun], name: str, stage_s: float = 0.1) -> list[dict[str, Any]]:
    """The elements in one chain (each launched n times to take ~``stage_s`` at its fastest),
    solved with ``solvers.solve`` from adaptive and full frontiers at several deadlines."""
    from solvers import InfeasibleError, Problem, solve

    def problem(adaptive: bool) -> tuple[Any, list[list[Signature]], list[int]]:
        tasks, opts, ns = [], [], []
        for r in runs:
            fast = min(r.full.values(), key=lambda s: s.time_s)
            n = max(1, round(stage_s / fast.time_s))
            o = r.options(adaptive)
            tasks.append((f"{r.element}", "gpu0", [(s.time_s * n, s.energy_j * n) for s in o]))
            opts.append(o)
            ns.append(n)
        return Problem.build(tasks, name=name), opts, ns

    p_full, o_full, ns = problem(False)
    p_ad, o_ad, _ = problem(True)
    out = []
    # 1x: every element at its fastest operating point (top clock of a power-limit row); the
    # full grid's own fastest makespan is lower only by lucky capped draws (see fastest_s)
    fastest = sum(r.fastest_s() * n for r, n in zip(runs, ns))
    lucky = p_full.fastest_makespan_s()
    exp = all(r.expected is not None for r in runs)

    def expected_j(opts: list[list[Signature]], plan: Any, what: int = 1) -> float:
        return sum(r.expected[opts[i][t.option].omega][what] * ns[i]  # type: ignore[index]
                   for i, (r, t) in enumerate(zip(runs, plan.tasks)))


    for f in CHAIN_DEADLINES:
        d = fastest * f
        plan_f = solve(p_full, d)
        truth_f = sum(r.full[o_full[i][t.option].omega].energy_j * ns[i]
                      for i, (r, t) in enumerate(zip(runs, plan_f.tasks)))
        indep = all(r.truth is not None for r in runs)
        indep_f = (sum(r.truth[o_full[i][t.option].omega].energy_j * ns[i]  # type: ignore[index]
                       for i, (r, t) in enumerate(zip(runs, plan_f.tasks))) if indep else None)
        try:
            plan_a = solve(p_ad, d)
        except InfeasibleError:
            out.append({"deadline_x": f, "full_j": truth_f, "adaptive_j": None, "gap": None,
                        "time_over": None, "gap_indep": None, "gap_expected": None,
                        "fastest_s": fastest, "fastest_any_point_s": lucky})
            continue
        e_a = t_a = 0.0
        for i, (r, t) in enumerate(zip(runs, plan_a.tasks)):
            s = r.full[o_ad[i][t.option].omega]
            e_a += s.energy_j * ns[i]
            t_a += s.time_s * ns[i]
        indep_a = (sum(r.truth[o_ad[i][t.option].omega].energy_j * ns[i]  # type: ignore[index]
                       for i, (r, t) in enumerate(zip(runs, plan_a.tasks))) if indep else None)
        out.append({"deadline_x": f, "full_j": truth_f, "adaptive_j": e_a,
                    "gap": e_a / truth_f - 1.0, "time_over": max(0.0, t_a / d - 1.0),
                    "gap_indep": indep_a / indep_f - 1.0 if indep else None,  # type: ignore[operator]
                    # on expected values only where the full grid's plan meets the deadline on
                    # average too (as per element): else it is compared with a plan that is
                    # feasible only by its lucky runs
                    "gap_expected": (expected_j(o_ad, plan_a) / expected_j(o_full, plan_f) - 1.0
                                     if exp and expected_j(o_full, plan_f, 0) <= d * 1.001
                                     else None),
                    "gap_expected_any": (expected_j(o_ad, plan_a) / expected_j(o_full, plan_f)
                                         - 1.0 if exp else None),
                    # the full grid's plan on average: at 1x it leans on capped runs that were
                    # faster in their run than their setting is, so on average it is late
                    "full_time_over_expected": (max(0.0, expected_j(o_full, plan_f, 0) / d - 1.0)
                                                if exp else None),
                    "adaptive_time_over_expected": (
                        max(0.0, expected_j(o_ad, plan_a, 0) / d - 1.0) if exp else None),
                    "fastest_s": fastest, "fastest_any_point_s": lucky,
                    "method": plan_a.method})
    return out


def expected_values(element: str, full: Mapping[OperatingPoint, Signature]
                    ) -> dict[OperatingPoint, tuple[float, float]]:
    """The simulator's noise-free (T, E) per invocation at every grid point (its steady
    kernel state: the capped clock without dither or wander, one fixed temperature): what a
    setting gives on average, to judge plans without the luck of any one run."""
    gpu, k = SimulatedGPU(seed=0), preset(element)
    out = {}
    for op in full:
        st = gpu.kernel_state(k, op)  # type: ignore[arg-type]
        out[op] = (st.time_s, st.time_s * st.power_w)
    return out


def run_sim(elements: Sequence[str], protocol: Protocol, k_sigma: float, rel_tol: float | None,
            grid: Mapping = SIM_GRID, criterion: str = "TE",
            plan_tol: float | None = TARGET_GAP) -> list[ElementRun]:
    """Simulated H200: full grid and adaptive per element (fresh devices, seed 0)."""
    runs = []
    for el in elements:
        full, full_s = full_sweep(SimulatedGPU(seed=0), preset(el), el, grid, protocol)
        truth, _ = full_sweep(SimulatedGPU(seed=1), preset(el), el, grid, protocol)
        opts = AdaptiveOptions(grid=grid, criterion=criterion,  # type: ignore[arg-type]
                               target_rse=protocol.target_rse, protocol=protocol,
                               k_sigma=k_sigma, rel_tol=rel_tol, plan_tol=plan_tol)
        ad = characterize_adaptive(preset(el), SimulatedGPU(seed=0), opts, name=el)
        r = ElementRun("H200 (simulated)", el, full, full_s, ad, truth,
                       expected=expected_values(el, full))
        check(r, k_sigma)
        runs.append(r)
    return runs


#: Relative σ assumed for the single-run NV-DVFS points (the table has no repeats; timings of
#: such kernels spread by about this much run to run).
NVDVFS_RSE = 0.005


def run_card(card: str, protocol: Protocol, k_sigma: float, rel_tol: float | None,
             limit: int | None = None, rse_floor: float = NVDVFS_RSE,
             plan_tol: float | None = TARGET_GAP) -> list[ElementRun]:
    """A replayed NV-DVFS card: every kernel's 10-clock sweep, full and adaptive."""
    path = shared_file(CARDS[card])
    if path is None:
        return []
    sigs = load_nvdvfs(path)
    runs = []
    for name in sorted(sigs)[:limit]:
        one = {name: sigs[name]}
        grid = {"sm_clock_mhz": sorted({s.omega.sm_clock_mhz for s in sigs[name]}, reverse=True)}
        full, full_s = full_sweep(ReplayDevice(one, name=card), name, name, grid, protocol)
        opts = AdaptiveOptions(grid=grid, target_rse=protocol.target_rse, protocol=protocol,
                               k_sigma=k_sigma, rel_tol=rel_tol, rse_floor=rse_floor,
                               plan_tol=plan_tol)
        ad = characterize_adaptive(name, ReplayDevice(one, name=card), opts, name=name)
        r = ElementRun(f"{card} (NV-DVFS, replayed)", name.split("/")[0], full, full_s, ad)
        check(r, k_sigma, floor=rse_floor)
        runs.append(r)
    return runs


def summarize(runs: Sequence[ElementRun]) -> dict[str, Any]:
    """Totals over a group of elements."""
    gaps = [g for r in runs for g in r.plan_gaps]
    gi = [g for r in runs for g in r.plan_gaps_indep]
    ge = [g for r in runs for g in r.plan_gaps_expected]
    misses = [m for r in runs for m in r.plan_misses]
    pts = sum(len(r.adaptive.grid) for r in runs)
    meas = sum(len(r.adaptive.signatures) for r in runs)
    return {"elements": len(runs), "grid_points": pts, "measured": meas,
            "gpu_s_adaptive": sum(r.adaptive.gpu_s for r in runs),
            "gpu_s_full": sum(r.full_gpu_s for r in runs),
            "gpu_s_fraction": sum(r.adaptive.gpu_s for r in runs) / sum(r.full_gpu_s for r in runs),
            "max_plan_gap": max(gaps) if gaps else None,
            "mean_plan_gap": float(np.mean(gaps)) if gaps else None,
            "within_target": float(np.mean([g <= TARGET_GAP for g in gaps])) if gaps else None,
            "max_plan_gap_indep": max(gi) if gi else None,
            "mean_plan_gap_indep": float(np.mean(gi)) if gi else None,
            "max_plan_gap_expected": max(ge) if ge else None,
            "mean_plan_gap_expected": float(np.mean(ge)) if ge else None,
            "within_target_expected": float(np.mean([g <= TARGET_GAP for g in ge])) if ge else None,
            "deadline_misses": len(misses), "max_time_over": max(misses) if misses else 0.0,
            "wrong_skips": sum(len(r.wrong_skips) for r in runs),
            "wrong_skips_beyond_remeasured_noise": sum(len(r.wrong_skips_noise) for r in runs),
            "wrong_skips_expected": (sum(len(r.wrong_skips_expected) for r in runs)
                                     if all(r.expected is not None for r in runs) else None),
            "coarse_fraction": sum(len(r.adaptive.meta.get("coarse_points") or ())
                                   for r in runs) / max(1, pts),
            "violations": sum(len(r.adaptive.violations) for r in runs),
            "over_target_expected": sum(len(r.over_expected) for r in runs),
            "over_target_expected_within_target_measured": sum(
                sum(gm <= TARGET_GAP for _, gm, _ in r.over_expected) for r in runs),
            "over_target_measured": sum(sum(g > TARGET_GAP for g in r.plan_gaps) for r in runs),
            "over_target_measured_lucky_full": sum(r.lucky_full for r in runs),
            "max_full_vs_best_expected": max(fb) if (fb := [g for r in runs
                                                             for g in r.full_vs_best]) else None,
            "point_sigma": point_sigma(runs)}


def point_sigma(runs: Sequence[ElementRun]) -> dict[str, float | None]:
    """Per-point noise of E: the median relative standard error the points report (their
    windows), and, where a re-measurement exists, the median run-to-run spread, for uncapped
    and capped points (a capped clock wanders between runs more than its windows show)."""
    out: dict[str, float | None] = {}
    for capped, tag in ((False, "uncapped"), (True, "capped")):
        se = [s.sd_energy_j / s.energy_j for r in runs for s in r.full.values()
              if _capped(s) == capped and s.energy_j > 0]
        out[f"se_{tag}"] = float(np.median(se)) if se else None
        rr = [remeasured_noise(r)[capped] for r in runs if r.truth is not None]
        out[f"run_to_run_{tag}"] = float(np.median(rr)) if rr else None
    return out


def element_rows(runs: Sequence[ElementRun]) -> list[list[str]]:
    """One table row per element (columns :data:`HEAD`)."""
    rows = []
    for r in runs:
        a = r.adaptive
        by = a.skipped_by_reason()
        cover = (f"{min_cover(r.expected, TARGET_GAP)} / "
                 f"{min_cover(r.expected, TARGET_GAP, ORACLE_TIME_SLACK)}"
                 if r.expected is not None else "-")
        verdict, why = meets_target(r)
        rows.append([r.device, r.element, f"{len(a.signatures)}/{len(a.grid)}",
                     f"{a.gpu_s:.0f} / {r.full_gpu_s:.0f}", f"{100 * a.gpu_s / r.full_gpu_s:.1f} %",
                     cover,
                     str(by.get("dominated", 0)), str(by.get("predicted", 0)),
                     f"{100 * max(r.plan_gaps_expected):.2f} %" if r.plan_gaps_expected else "-",
                     f"{100 * max(r.plan_gaps):.2f} %" if r.plan_gaps else "-",
                     f"{100 * float(np.mean(r.plan_gaps)):.3f} %" if r.plan_gaps else "-",
                     str(len(r.plan_misses)) + (f" (≤ {100 * max(r.plan_misses):.2f} %)"
                                                if r.plan_misses else ""),
                     f"{len(r.wrong_skips)} / {len(r.wrong_skips_noise)}"
                     + (f" / {len(r.wrong_skips_expected)}" if r.expected is not None else ""),
                     str(len(a.violations)), verdict, why])
    return rows


def min_cover(expected: Mapping[OperatingPoint, tuple[float, float]], tol: float,
              time_slack: float = 0.0) -> int:
    """The fewest settings any plan from measured points needs to be within ``tol`` of the
    best setting at every deadline, on the simulator's noise-free values (an oracle that knows
    the frontier and measures only it): each frontier setting p needs a measured one with
    T ≤ (1 + ``time_slack``)·T(p) and E ≤ (1 + tol)·E(p). Each candidate covers a contiguous
    run of the frontier, so the greedy interval cover is optimal."""
    front: list[tuple[float, float]] = []
    for t, e in sorted(set(expected.values())):
        if not front or e < front[-1][1]:
            front.append((t, e))
    n, span = len(front), []
    for i, (t, e) in enumerate(front):
        lo = hi = i
        while lo > 0 and t <= (1 + time_slack) * front[lo - 1][0]:
            lo -= 1
        while hi + 1 < n and e <= (1 + tol) * front[hi + 1][1]:
            hi += 1
        span.append((lo, hi))
    count = i = 0
    while i < n:              # the leftmost uncovered setting: the candidate reaching furthest
        count += 1
        i = max(hi for lo, hi in span if lo <= i) + 1
    return count


def meets_target(r: ElementRun) -> tuple[str, str]:
    """Whether an element meets issue 21's target (≤ 25 % of the GPU-seconds, every plan
    within 0.3 % judged by the noise-free values where the simulator gives them, no deadline
    missed), and if not, why; "n/a" on a grid too small for the GPU-seconds target to be
    reachable (the coarse start alone is more)."""
    frac = r.adaptive.gpu_s / r.full_gpu_s
    gaps = r.plan_gaps_expected or r.plan_gaps
    coarse = len(r.adaptive.meta.get("coarse_points") or ()) / max(1, len(r.adaptive.grid))
    if coarse > TARGET_GPU_S:
        return "n/a (coarse start > 25 %)", ""
    why = []
    if frac > TARGET_GPU_S:
        n = len(r.adaptive.grid)
        cover = min_cover(r.expected, TARGET_GAP) if r.expected is not None else None
        loose = (min_cover(r.expected, TARGET_GAP, ORACLE_TIME_SLACK)
                 if r.expected is not None else None)
        why.append(f"GPU-s {100 * frac:.0f} % > 25 %" + (
            f": plans within 0.3 % from measured points need, even from an oracle that knows "
            f"the frontier, {cover} measured settings ({100 * cover / n:.0f} % of the grid; "
            f"{loose}, {100 * loose / n:.0f} %, allowing deadlines within 0.1 % of a point's "
            "time); adaptive has to find the frontier through its bounds"
            if cover is not None and loose is not None else ""))
    real = [x for x in r.over_expected if x[1] > TARGET_GAP]
    noise = [x for x in r.over_expected if x[1] <= TARGET_GAP]
    if real:
        why.append(f"{len(real)} deadline(s) over 0.3 % by expected and measured values "
                   f"(max {100 * max(x[0] for x in real):.2f} % at {max(real)[2]})")
    if noise:
        worst = max(noise)
        why.append(f"{len(noise)} deadline(s) over 0.3 % on expected values only, max "
                   f"{100 * worst[0]:.2f} % at {worst[2]}: by measured values the two picks are "
                   f"within {100 * worst[1]:.2f} %, so which is better on average is decided by "
                   "their noise")
    if not gaps:
        why.append("no plan compared")
    if r.plan_misses:
        why.append(f"{len(r.plan_misses)} deadline(s) missed")
    if not why:
        return "yes", ""
    if all(w.startswith(tuple("0123456789")) and "expected values only" in w for w in why):
        return "yes, but for noise", "; ".join(why)
    return "no", "; ".join(why)


HEAD = ["device", "element", "measured/grid", "GPU-s adaptive / full", "GPU-s %",
        "oracle: fewest settings for 0.3 % (strict / 0.1 % time slack)", "dominated", "predicted", "max gap, expected",
        "max gap, measured", "mean gap, measured", "deadline misses (time over)",
        "wrong skips (own σ / re-measured noise / expected)", "violations", "meets target",
        "why not"]


def plot(groups: Mapping[str, Sequence[ElementRun]], path: Path) -> None:
    """Per group, one element: the full grid, what adaptive measured, estimated and skipped."""
    from matplotlib.figure import Figure

    from frontier.plot import save_figure

    picks = []
    for g, runs in groups.items():
        if runs:
            want = {"H200": ("attention_flash", "gemm_bf16_8192")}.get(g.split()[0], ())
            chosen = [r for r in runs if r.element in want] or [max(
                runs, key=lambda r: len(r.adaptive.skipped))]
            picks += chosen[:2]
    n = len(picks)
    cols = 2
    fig = Figure(figsize=(11, 4.2 * math.ceil(n / cols)))
    axes = fig.subplots(math.ceil(n / cols), cols, squeeze=False).ravel()
    for ax, r in zip(axes, picks):
        fs = list(r.full.values())
        ax.scatter([s.time_s * 1e3 for s in fs], [s.energy_j for s in fs], s=10, c="0.8",
                   label=f"full grid ({len(fs)})")
        ff = pareto_frontier(fs, "TE")
        ax.plot([s.time_s * 1e3 for s in ff], [s.energy_j for s in ff], c="0.4", lw=1,
                label="full-grid frontier")
        m = r.adaptive.signatures
        ax.scatter([s.time_s * 1e3 for s in m], [s.energy_j for s in m], s=22, c="tab:blue",
                   label=f"measured ({len(m)})", zorder=3)
        est = r.adaptive.estimates
        ax.scatter([s.time_s * 1e3 for s in est], [s.energy_j for s in est], s=14,
                   facecolors="none", edgecolors="tab:orange", label=f"predicted ({len(est)})",
                   zorder=2)
        af = r.adaptive.frontier(criterion="TE")
        ax.plot([s.time_s * 1e3 for s in af], [s.energy_j for s in af], c="tab:blue", lw=1,
                ls="--", label="adaptive frontier")
        ax.set_xlabel("T (ms)")
        ax.set_ylabel("E (J)")
        ax.set_title(f"{r.device}: {r.element}\n{100 * r.adaptive.gpu_s / r.full_gpu_s:.0f} % "
                     f"of full-grid GPU-s, max plan gap {100 * max(r.plan_gaps):.2f} % measured"
                     + (f", {100 * max(r.plan_gaps_expected):.2f} % expected"
                        if r.plan_gaps_expected else ""), fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[n:]:
        ax.set_visible(False)
    fig.tight_layout()
    save_figure(fig, path)


def run(quick: bool = False, k_sigma: float = 2.0, rel_tol: float | None = None,
        target_rse: float = 0.01, out: Path | None = RESULTS_DIR,
        plan_tol: float = TARGET_GAP,
        tradeoff: Sequence[float] = (0.002, 0.003, 0.005, 0.01)) -> dict[str, Any]:
    """All groups, the chains, the plan_tol trade-off on the simulator; writes md/json/png."""
    proto = Protocol(target_rse=target_rse)
    sim_el = SIM_ELEMENTS[:2] if quick else SIM_ELEMENTS
    groups: dict[str, list[ElementRun]] = {"H200 (simulated)": run_sim(
        sim_el, proto, k_sigma, rel_tol, plan_tol=plan_tol)}
    for card in CARDS:
        runs = run_card(card, proto, k_sigma, rel_tol, limit=4 if quick else None,
                        plan_tol=plan_tol)
        if runs:
            groups[f"{card} (NV-DVFS, replayed)"] = runs
    res: dict[str, Any] = {"target_plan_gap": TARGET_GAP, "target_gpu_s_fraction": TARGET_GPU_S,
                           "k_sigma": k_sigma, "rel_tol": rel_tol if rel_tol is not None else target_rse,
                           "plan_tol": plan_tol,
                           "target_rse": target_rse, "groups": {}, "chains": {}, "tradeoff": []}
    for g, runs in groups.items():
        res["groups"][g] = {"summary": summarize(runs),
                            "elements": [dict(zip(HEAD, row)) for row in element_rows(runs)],
                            "wrong_skips": {r.element: r.wrong_skips for r in runs if r.wrong_skips},
                            "wrong_skips_beyond_remeasured_noise": {
                                r.element: r.wrong_skips_noise for r in runs if r.wrong_skips_noise},
                            "wrong_skips_expected": {
                                r.element: r.wrong_skips_expected for r in runs
                                if r.wrong_skips_expected},
                            "violations": {r.element: [v.to_dict() for v in r.adaptive.violations]
                                           for r in runs if r.adaptive.violations},
                            "over_target_expected": {
                                r.element: [{"gap_expected": ge, "gap_measured": gm, "where": w}
                                            for ge, gm, w in r.over_expected]
                                for r in runs if r.over_expected}}
        res["chains"][g] = chain(runs, g)
    if not quick:
        for pt in tradeoff:
            opts = AdaptiveOptions(grid=SIM_GRID, protocol=proto, target_rse=target_rse,
                                   k_sigma=k_sigma, rel_tol=rel_tol, plan_tol=pt)
            runs = [ElementRun(r.device, r.element, r.full, r.full_gpu_s, characterize_adaptive(
                preset(r.element), SimulatedGPU(seed=0), opts, name=r.element), r.truth,
                expected=r.expected)
                for r in groups["H200 (simulated)"]]
            for r in runs:
                check(r, k_sigma)
            s = summarize(runs)
            res["tradeoff"].append({"plan_tol": pt, **s})
    text = table(res)
    if out is not None:
        out = Path(out)
        write_json(out / "adaptive_characterization.json", res)
        write_text_atomic(out / "adaptive_characterization.md", text)
        plot(groups, out / "adaptive_characterization.png")
    res["text"] = text
    return res


def _pct(x: float | None, d: int = 2) -> str:
    return "-" if x is None else f"{100 * x:.{d}f} %"


def table(res: Mapping[str, Any]) -> str:
    """The results page (markdown)."""
    out = ["# Adaptive characterization vs the full grid", "",
           f"Target: plans within {100 * TARGET_GAP:.1f} % of the full grid's at ≤ "
           f"{100 * TARGET_GPU_S:.0f} % of its GPU-seconds. k = {res['k_sigma']:g} σ, "
           f"rel_tol = {res['rel_tol']:g}, plan_tol = {res['plan_tol']:g}, target rse "
           f"{res['target_rse']:g} per point. "
           "H200 rows are SIMULATED; V100 / RTX 8000 rows replay real NV-DVFS sweeps.", "",
           "## Per group", ""]
    rows = []
    for g, d in res["groups"].items():
        s = d["summary"]
        ps = s.get("point_sigma") or {}
        sig = ("-" if ps.get("se_uncapped") is None else "single runs (σ assumed)"
               if (ps.get("se_uncapped") or 0.0) < 1e-5 else
               f"{_pct(ps.get('se_uncapped'))} / {_pct(ps.get('se_capped'))}"
               + (f" (run to run {_pct(ps.get('run_to_run_uncapped'))} / "
                  f"{_pct(ps.get('run_to_run_capped'))})"
                  if ps.get("run_to_run_uncapped") is not None else ""))
        rows.append([g, s["elements"], f"{s['measured']}/{s['grid_points']}",
                     f"{s['gpu_s_adaptive']:.0f} / {s['gpu_s_full']:.0f}",
                     _pct(s["gpu_s_fraction"], 1),
                     _pct(s.get("max_plan_gap_expected")), _pct(s.get("mean_plan_gap_expected"), 3),
                     _pct(s.get("within_target_expected"), 1),
                     "-" if s.get("max_plan_gap_expected") is None else
                     f"{s['over_target_expected']} ({s['over_target_expected_within_target_measured']})",
                     _pct(s.get("max_full_vs_best_expected")),
                     _pct(s["max_plan_gap"]), _pct(s["mean_plan_gap"], 3),
                     _pct(s["within_target"], 0),
                     f"{s['over_target_measured']} ({s['over_target_measured_lucky_full']})"
                     if s.get("max_plan_gap_expected") is not None else str(s["over_target_measured"]),
                     sig, _pct(s["max_plan_gap_indep"]),
                     s["deadline_misses"],
                     f"{s['wrong_skips']} / {s['wrong_skips_beyond_remeasured_noise']}"
                     + (f" / {s['wrong_skips_expected']}" if s.get("wrong_skips_expected") is not None
                        else ""),
                     s["violations"]])
    out.append(markdown_table(["group", "elements", "measured/grid", "GPU-s adaptive / full",
                               "GPU-s %", "max gap, expected", "mean gap, expected",
                               "deadlines within 0.3 %, expected",
                               "deadlines over 0.3 %, expected (of which within 0.3 % measured)",
                               "full grid's own plan vs best on average, max",
                               "max gap, measured", "mean gap, measured",
                               "deadlines within 0.3 %, measured",
                               "deadlines over 0.3 %, measured (of which a lucky full-grid run)",
                               "per-point σ of E: uncapped / capped", "max gap, re-measured",
                               "deadline misses",
                               "wrong skips (own σ / re-measured noise / expected)", "violations"],
                              rows))
    out += notes(res)
    out += ["## Chains (solvers.solve; adaptive plan evaluated with the full grid's values)", "",
            "*gap, expected* is in brackets where the full grid's chain plan meets the deadline "
            "only by its measured times, not on average: given measured values, the solver leans "
            "on capped runs that were faster in their run than their setting is on average (at "
            "1× only such runs are faster than an element's fastest operating point, and the "
            "full grid holds every capped run of a row, adaptive only those it measured), and "
            "spends the time they save where a little more time saves much energy (copy_2GiB: 0.1 % more time "
            "per 15 MHz step, 1.4 % less energy). Both plans are then compared on expected "
            "energy while neither is feasible on average.", ""]
    crow = []
    for g, rows_c in res["chains"].items():
        for c in rows_c:
            crow.append([g, f"{c['deadline_x']:g}×", f"{c['full_j']:.4g}",
                         "infeasible" if c["adaptive_j"] is None else f"{c['adaptive_j']:.4g}",
                         (_pct(c.get("gap_expected"), 3) if c.get("gap_expected") is not None
                          or c.get("gap_expected_any") is None else
                          f"({_pct(c.get('gap_expected_any'), 3)}: full plan late on average)"),
                         _pct(c["gap"], 3), _pct(c["time_over"], 3),
                         _pct(c.get("gap_indep"), 3), _pct(c.get("full_time_over_expected"), 2),
                         _pct(c.get("adaptive_time_over_expected"), 2)])
    out.append(markdown_table(["group", "deadline (× fastest)", "E full (J)", "E adaptive (J)",
                               "gap, expected", "gap, measured", "time over deadline",
                               "gap, re-measured", "full plan late on average by",
                               "adaptive plan late on average by"],
                              crow))
    if res["tradeoff"]:
        out += ["## plan_tol trade-off (simulated H200)", ""]
        out.append(markdown_table(["plan_tol", "measured/grid", "GPU-s %",
                                   "max gap, expected", "mean gap, expected",
                                   "deadlines within 0.3 %, expected", "max gap, measured",
                                   "mean gap, measured", "deadlines within 0.3 %, measured",
                                   "max gap, re-measured", "deadline misses",
                                   "wrong skips (own σ / re-measured noise / expected)"],
                                  [[t["plan_tol"], f"{t['measured']}/{t['grid_points']}",
                                    _pct(t["gpu_s_fraction"], 1),
                                    _pct(t.get("max_plan_gap_expected")),
                                    _pct(t.get("mean_plan_gap_expected"), 3),
                                    _pct(t.get("within_target_expected"), 1),
                                    _pct(t["max_plan_gap"]), _pct(t["mean_plan_gap"], 3),
                                    _pct(t["within_target"], 0), _pct(t["max_plan_gap_indep"]),
                                    t["deadline_misses"],
                                    f"{t['wrong_skips']} / {t['wrong_skips_beyond_remeasured_noise']}"
                                    f" / {t.get('wrong_skips_expected')}"]
                                   for t in res["tradeoff"]]))
    out += ["## Per element", ""]
    allrows = [list(e.values()) for d in res["groups"].values() for e in d["elements"]]
    out.append(markdown_table(HEAD, allrows))
    return "\n".join(out) + "\n"


def notes(res: Mapping[str, Any]) -> list[str]:
    """What the columns mean, the headline metric, and where the target can and cannot be
    judged."""
    out = ["Plans use measured points only (`AdaptiveResult.frontier()`): every operating point "
           "an adaptive plan picks was measured, and on the simulator it is bit-identical to the "
           "same point of the full sweep (points are seeded by key), so no deadline is missed "
           "by the measured times. A point is skipped only where a measured point at least as "
           "fast is within `plan_tol` of its best-case energy (or dominates it within k·σ, "
           "capped at `plan_tol`).", "",
           "**Headline: gaps on expected values.** *gap, expected*: extra energy of the "
           "adaptive plan over the full grid's at the same deadline, both judged by the "
           "simulator's noise-free values at the settings they picked (per element: only "
           "deadlines the full grid's pick meets on average too). That is what a plan costs on "
           "average; per-point noise does not decide it. *gap, measured*: both judged by the "
           "full grid's measured values (the number of the issue's wording). Beside them, the "
           "per-point σ: the standard error a point's windows report, and the run-to-run spread "
           "seen on an independent re-measurement (seed 1; a capped clock wanders between runs). "
           "The full grid's plan is itself a pick among noisy values: *full grid's own plan vs "
           "best on average* is how far that noise alone puts the reference from the best "
           "setting on average. A 0.3 % target on measured values, with points measured to "
           "about 1 % (window σ of a few 0.1 %, capped runs ~1 % apart), is a test of that "
           "noise: the largest measured gaps are full-grid picks that are lucky runs (a capped "
           "run faster or cheaper in its run than its setting is on average), counted in "
           "brackets.", "",
           "Deadlines start at 1× the element's fastest operating point (the top clock of each "
           "power-limit row; always measured by adaptive).", ""]
    sim = [e for g, d in res["groups"].items() if g.startswith("H200") for e in d["elements"]]
    if sim:
        met = [e["element"] for e in sim if e["meets target"] == "yes"]
        noise = [e["element"] for e in sim if e["meets target"] == "yes, but for noise"]
        miss = [f"{e['element']} ({e['why not']})" for e in sim
                if e["meets target"] not in ("yes", "yes, but for noise")]
        out += [f"**Where the target is meaningful** (the simulated H200's 110-clock × 4-limit "
                f"grid, 440 points per element, plan_tol = {res.get('plan_tol', TARGET_GAP):g}): "
                f"{len(met)} of {len(sim)} elements meet it outright (≤ 25 % GPU-s, every plan "
                f"within 0.3 % on expected values, no deadline missed): {', '.join(met) or 'none'}. "
                f"Within it but for deadlines where the two picks are within 0.3 % by measured "
                f"values and their noise decides which is better on average: "
                f"{', '.join(noise) or 'none'}. Not met: {'; '.join(miss) or 'none'}.", ""]
    cards = [g for g in res["groups"] if "NV-DVFS" in g]
    if cards:
        frac = max(res["groups"][g]["summary"]["coarse_fraction"] for g in cards)
        out += ["**NV-DVFS rows: the GPU-seconds target cannot be met there, by construction.** "
                "Those sweeps have 10 clocks per kernel, and the coarse start alone is "
                f"{100 * frac:.0f} % of each grid (3 clocks: both ends and the middle, the fewest "
                "a convexity bound needs) before any refinement, so ≤ 25 % of the GPU-seconds "
                "is out of reach whatever adaptive skips. These rows check what was skipped "
                "against real measurements (plan gaps, wrong skips, violations), not the "
                "saving; the saving is judged on the simulator's 110-clock grid above.", ""]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run, print the table, write the files."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 simulated elements, 4 kernels per card")
    ap.add_argument("--k-sigma", type=float, default=2.0)
    ap.add_argument("--rel-tol", type=float, default=None)
    ap.add_argument("--plan-tol", type=float, default=TARGET_GAP,
                    help="energy a plan from measured points may lose to a skipped point")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR)
    a = ap.parse_args(argv)
    res = run(quick=a.quick, k_sigma=a.k_sigma, rel_tol=a.rel_tol, out=a.out,
              plan_tol=a.plan_tol)
    print(res["text"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
