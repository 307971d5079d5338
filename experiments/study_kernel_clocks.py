"""Study 3 — clock frontiers from real kernels, and a kernel chain planned under a deadline.

What it shows: real NV-DVFS measurements (20 CUDA kernels × 10 SM clocks on a V100 and an
RTX 8000; read in place from ``../shared/data/nv-dvfs``, never copied) become per-kernel clock
frontiers; a chain of 10 kernels is then planned with the exact chain DP under a deadline of
1.05× the all-max-clock time, once with free clock changes and once with a realistic switching
cost (10 ms per change, paying the card's static power during it). The plan saves energy
against running everything at the top clock, and the switching cost makes it change clock less
often: neighbouring kernels share one clock for longer.

Run:

    python experiments/study_kernel_clocks.py [--cards v100,rtx8000] [--deadline 1.05]
        [--switch-ms 10] [--stage-ms 100] [--out experiments/results]

Writes ``study_kernel_clocks.{md,json,png}`` under the output folder (atomically).

Each chain stage is one kernel launched back to back enough times to take about ``--stage-ms``
at the V100's top clock (the same launch counts on every card, so the work is identical): a
single sub-millisecond launch could never pay for a 10 ms clock change.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import (
    RESULTS_DIR,
    console_table,
    display_path,
    markdown_table,
    shared_file,
    write_json,
    write_text_atomic,
)

from frontier.pareto import Frontier, pareto_frontier
from frontier.signature import Signature
from measure.replay import load_nvdvfs
from solvers.dp import chain_order, solve_chain
from solvers.model import ConstantTransition, InfeasibleError, Problem
from solvers.plan import Plan, make_plan
from solvers.solve import solve

#: NV-DVFS files (relative to the shared data folder) and display names.
CARDS: dict[str, tuple[str, str]] = {
    "v100": ("nv-dvfs/v100-dvfs-real.csv", "V100"),
    "rtx8000": ("nv-dvfs/rtx8000-dvfs-real.csv", "RTX 8000"),
}

#: The chain: a mix of compute-bound (matrixMul, BlackScholes, sortingNetworks, mergeSort),
#: memory-bound (vectorAdd, transpose, scalarProd, reduction) and mixed kernels.
CHAIN: tuple[str, ...] = (
    "matrixMul", "convolutionSeparable", "histogram", "mergeSort", "reduction",
    "scalarProd", "transpose", "vectorAdd", "BlackScholes", "sortingNetworks",
)
REFERENCE_CARD = "v100"   # sets the launch counts, so every card does the same work
SWITCH_SWEEP_MS = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0)


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Card:
    """One card's kernel signatures (one per SM clock) and the static power assumed."""

    key: str
    name: str
    source: Path
    static_power_w: float
    clocks_mhz: tuple[float, ...]
    kernels: dict[str, list[Signature]]   # benchmark name → signatures sorted by clock

    def clock_fraction(self, clock_mhz: float) -> float:
        """Where ``clock_mhz`` sits in this card's measured range (0 = lowest, 1 = highest)."""
        lo, hi = min(self.clocks_mhz), max(self.clocks_mhz)
        return (clock_mhz - lo) / (hi - lo)


def min_average_power_w(path: Path) -> float:
    """The lowest average power any kernel drew at any clock on this card, W."""
    sigs = load_nvdvfs(path)   # s = 0: E is all counted as d here
    return min(s.energy_j / s.time_s for pts in sigs.values() for s in pts)


def load_card(key: str) -> Card | None:
    """A card's NV-DVFS signatures, or None when ``../shared/data`` lacks the file.

    Static power: the table has no idle reading, so s is taken as the lowest average power seen
    on the card in any run (rounded down to a watt). Every run draws at least the ready power,
    so this is an upper bound on it, and it keeps d = E − s·T ≥ 0 for every point. s does not
    change which clock is cheapest for one kernel (E is measured whole); it prices the time
    spent switching clocks.
    """
    rel, name = CARDS[key]
    path = shared_file(rel)
    if path is None:
        return None
    s_w = float(math.floor(min_average_power_w(path)))
    by_name = load_nvdvfs(path, static_power_w=s_w)
    kernels = {k.split("/")[0]: sorted(v, key=lambda s: s.omega.sm_clock_mhz) for k, v in by_name.items()}
    clocks = sorted({s.omega.sm_clock_mhz for v in kernels.values() for s in v})
    return Card(key, name, path, s_w, tuple(clocks), kernels)


def top_clock(sigs: Sequence[Signature]) -> Signature:
    """The signature at the highest SM clock."""
    return max(sigs, key=lambda s: s.omega.sm_clock_mhz)


def launch_counts(reference: Card, chain: Sequence[str], stage_s: float) -> dict[str, int]:
    """Launches per stage so each stage takes about ``stage_s`` at the reference card's top clock."""
    return {k: max(1, round(stage_s / top_clock(reference.kernels[k]).time_s)) for k in chain}


def stage_signature(sig: Signature, launches: int) -> Signature:
    """``launches`` back-to-back runs of one kernel at one clock (T and d scale; s is the card's)."""
    return sig.with_(time_s=sig.time_s * launches, d_j=sig.d_j * launches,
                     meta={**sig.meta, "launches": launches})


# ---------------------------------------------------------------------------------------------
# Frontiers and plans
# ---------------------------------------------------------------------------------------------

def kernel_frontier(card: Card, kernel: str, launches: int) -> Frontier:
    """(T, E) clock frontier of one chain stage (safe for ⊗, which is all a chain uses)."""
    stages = [stage_signature(s, launches) for s in card.kernels[kernel]]
    return pareto_frontier(stages, "TE", name=f"{card.name} {kernel}")


def chain_problem(card: Card, chain: Sequence[str], launches: dict[str, int],
                  switch_s: float) -> Problem:
    """The chain as a planning problem on one GPU; every measured clock is an option.

    All options are offered (not only frontier points): with switching costs a dominated clock
    can be worth taking to avoid a change. A switch costs ``switch_s`` of time during which the
    card draws its static power (the rule's energy is that, the model's floor anyway).
    """
    tasks = [(f"{i:02d}-{k}", "gpu0", [stage_signature(s, launches[k]) for s in card.kernels[k]])
             for i, k in enumerate(chain)]
    rule = ConstantTransition(switch_s, card.static_power_w * switch_s) if switch_s > 0 else None
    return Problem.build(tasks, idle_power_w={"gpu0": card.static_power_w}, transitions=rule,
                         name=f"{card.name} chain, switch {switch_s * 1e3:g} ms")


def all_max_choice(problem: Problem) -> list[int]:
    """Option index of the top clock for every task (what runs by default)."""
    return [max(range(len(t.options)), key=lambda i: t.options[i].omega.sm_clock_mhz or 0.0)
            for t in problem.tasks]


def baseline_plan(problem: Problem, deadline_s: float) -> Plan:
    """Every kernel at the top clock, evaluated by the same accounting as the plans."""
    return make_plan(problem, all_max_choice(problem), deadline_s, method="all-max-clock",
                     lower_bound_j=0.0, wall_s=0.0)


def clock_runs(clocks: Sequence[float]) -> list[int]:
    """Lengths of the maximal runs of one clock along the chain."""
    runs: list[int] = []
    for i, c in enumerate(clocks):
        if i and c == clocks[i - 1]:
            runs[-1] += 1
        else:
            runs.append(1)
    return runs


def plan_clocks(plan: Plan) -> list[float]:
    """Chosen SM clock per task, in chain order."""
    return [float(t.sm_clock_mhz) for t in sorted(plan.tasks, key=lambda t: t.name)]


def plan_chain(problem: Problem, deadline_s: float) -> Plan:
    """``solvers.solve`` (exact chain DP), or the chain DP directly when ``solve`` refuses.

    Why the fallback: ``Problem.check_feasible`` compares the deadline with the makespan of the
    all-fastest-option plan *including its switches*. When the fastest clock of some kernel is
    not the top clock (e.g. vectorAdd on the V100, flat above 1 GHz), that plan switches, and
    with large switching costs it is slower than the all-top-clock plan, so a deadline the
    all-top-clock plan meets is rejected as infeasible. The chain DP itself handles it exactly.
    """
    try:
        return solve(problem, deadline_s)
    except InfeasibleError:
        order = chain_order(problem)
        r = solve_chain(problem, deadline_s, order)
        return make_plan(problem, r.choice, deadline_s, method="dp (direct)",
                         lower_bound_j=r.lower_bound_j, wall_s=0.0, proven=r.exact)


@dataclass(frozen=True)
class CardResult:
    """Everything one card contributes to the study."""

    card: Card
    launches: dict[str, int]
    frontiers: dict[str, Frontier]
    deadline_s: float
    baseline: Plan
    plans: dict[float, Plan]   # switch cost (s) → plan


def plan_card(card: Card, chain: Sequence[str], launches: dict[str, int], deadline_factor: float,
              switch_costs_s: Sequence[float]) -> CardResult:
    """Frontiers, the all-max baseline and one plan per switching cost for one card.

    The deadline is ``deadline_factor`` × the all-max-clock chain time — the same deadline for
    every switching cost, so the plans are comparable.
    """
    frontiers = {k: kernel_frontier(card, k, launches[k]) for k in chain}
    free = chain_problem(card, chain, launches, 0.0)
    deadline_s = deadline_factor * baseline_plan(free, math.inf).makespan_s
    base = baseline_plan(free, deadline_s)
    plans = {sw: plan_chain(chain_problem(card, chain, launches, sw), deadline_s) for sw in switch_costs_s}
    return CardResult(card, launches, frontiers, deadline_s, base, plans)


# ---------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------

def saved(plan: Plan, base: Plan) -> float:
    """Energy saved by ``plan`` relative to ``base`` (fraction)."""
    return 1.0 - plan.energy_j / base.energy_j


def frontier_rows(res: CardResult) -> list[list[Any]]:
    """Per-kernel frontier summary rows."""
    rows = []
    for k, fr in res.frontiers.items():
        top = stage_signature(top_clock(res.card.kernels[k]), res.launches[k])
        cheap = fr.cheapest
        clocks = sorted(p.omega.sm_clock_mhz for p in fr.points)
        rows.append([res.card.name, k, res.launches[k], f"{top.time_s * 1e3:.1f}", f"{top.energy_j:.2f}",
                     len(fr), f"{clocks[0]:g}–{clocks[-1]:g}", f"{cheap.omega.sm_clock_mhz:g}",
                     f"{cheap.time_s / top.time_s:.2f}", f"{100 * (1 - cheap.energy_j / top.energy_j):.1f}"])
    return rows


FRONTIER_HEADERS = ["card", "kernel", "launches", "T@top ms", "E@top J", "frontier pts",
                    "frontier clocks MHz", "min-E clock", "T/T@top", "E saved at min-E %"]
PLAN_HEADERS = ["card", "switch ms", "deadline ms", "makespan ms", "E plan J", "E all-max J",
                "saved %", "switches", "clock runs", "method", "gap %"]


def plan_rows(res: CardResult) -> list[list[Any]]:
    """One row per switching cost (and the all-max baseline)."""
    b = res.baseline
    rows = [[res.card.name, "—", f"{res.deadline_s * 1e3:.1f}", f"{b.makespan_s * 1e3:.1f}",
             f"{b.energy_j:.2f}", f"{b.energy_j:.2f}", "0.0", 0, "1 (all top clock)", "baseline", "—"]]
    for sw, p in res.plans.items():
        rows.append([res.card.name, f"{sw * 1e3:g}", f"{res.deadline_s * 1e3:.1f}",
                     f"{p.makespan_s * 1e3:.1f}", f"{p.energy_j:.2f}", f"{b.energy_j:.2f}",
                     f"{100 * saved(p, b):.1f}", p.n_switches, len(clock_runs(plan_clocks(p))),
                     f"{p.method} ({p.status})", f"{100 * p.gap:.2g}"])
    return rows


def clock_rows(res: CardResult, shown: Sequence[float]) -> list[list[Any]]:
    """Per-kernel chosen clocks under each shown switching cost."""
    cols = {sw: plan_clocks(res.plans[sw]) for sw in shown}
    return [[res.card.name, k, res.launches[k]] + [f"{cols[sw][i]:g}" for sw in shown]
            for i, k in enumerate(res.frontiers)]


def explain(res: CardResult, free_sw: float, costly_sw: float) -> str:
    """A few sentences on what switching costs did to the plan (numbers from the plans)."""
    a, b = res.plans[free_sw], res.plans[costly_sw]
    ra, rb = clock_runs(plan_clocks(a)), clock_runs(plan_clocks(b))
    card = res.card
    return (
        f"{card.name}: with free clock changes the plan switches {a.n_switches} times "
        f"({len(ra)} runs of one clock, longest {max(ra)} kernels) and saves "
        f"{100 * saved(a, res.baseline):.1f} % vs all-max-clock; with {costly_sw * 1e3:g} ms per "
        f"change (at s = {card.static_power_w:g} W, {card.static_power_w * costly_sw:.2f} J each) it "
        f"switches {b.n_switches} times ({len(rb)} runs, longest {max(rb)} kernels) and saves "
        f"{100 * saved(b, res.baseline):.1f} %. Each change eats {costly_sw * 1e3:g} ms of the "
        f"{(res.deadline_s - res.baseline.makespan_s) * 1e3:.0f} ms slack, so the DP keeps "
        f"neighbouring kernels on one clock unless the saving pays for the lost slack."
    )


def plot(results: Sequence[CardResult], free_sw: float, costly_sw: float, path: Path) -> None:
    """Per-kernel frontiers (normalised) and the clock timelines of the plans, per card."""
    from matplotlib.figure import Figure

    from frontier.plot import save_figure

    fig = Figure(figsize=(12, 4.6 * len(results)))
    axes = fig.subplots(len(results), 2, squeeze=False)
    for row, res in zip(axes, results):
        ax = row[0]
        for k, fr in res.frontiers.items():
            top = stage_signature(top_clock(res.card.kernels[k]), res.launches[k])
            ax.plot([p.time_s / top.time_s for p in fr.points], [p.energy_j / top.energy_j for p in fr.points],
                    marker="o", ms=3.5, lw=1.2, label=k)
        ax.axhline(1.0, color="0.6", lw=0.8, ls=":")
        ax.set_xlabel("stage time / time at top clock")
        ax.set_ylabel("stage energy / energy at top clock")
        ax.set_title(f"{res.card.name}: per-kernel clock frontiers (NV-DVFS, real)", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        ax = row[1]
        for label, plan, style in (("all top clock", res.baseline, dict(color="0.5", ls=":")),
                                   (f"plan, free switches ({plan_n(res, free_sw)})", res.plans[free_sw],
                                    dict(color="tab:blue")),
                                   (f"plan, {costly_sw * 1e3:g} ms switches ({plan_n(res, costly_sw)})",
                                    res.plans[costly_sw], dict(color="tab:red", ls="--"))):
            _timeline(ax, plan, label, style)
        ax.axvline(res.deadline_s * 1e3, color="k", lw=0.8)
        ax.text(res.deadline_s * 1e3, ax.get_ylim()[0], " deadline", fontsize=8, va="bottom")
        ax.set_xlabel("time in chain (ms)")
        ax.set_ylabel("SM clock (MHz)")
        ax.set_title(f"{res.card.name}: chosen clock along the chain "
                     f"(deadline {res.deadline_s / res.baseline.makespan_s:.2f}× all-max)", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    save_figure(fig, path)


def plan_n(res: CardResult, sw: float) -> str:
    """``'N switches, −x %'`` for a legend."""
    p = res.plans[sw]
    return f"{p.n_switches} switches, −{100 * saved(p, res.baseline):.1f} % E"


def _timeline(ax: Any, plan: Plan, label: str, style: dict) -> None:
    xs, ys = [], []
    for t in sorted(plan.tasks, key=lambda t: t.start_s):
        xs += [t.start_s * 1e3, t.end_s * 1e3]
        ys += [t.sm_clock_mhz, t.sm_clock_mhz]
    ax.plot(xs, ys, label=label, lw=1.6, **style)


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

def run_study(cards: Sequence[str] = ("v100", "rtx8000"), deadline_factor: float = 1.05,
              switch_ms: float = 10.0, stage_ms: float = 100.0, chain: Sequence[str] = CHAIN,
              out_dir: Path | None = RESULTS_DIR, sweep_ms: Sequence[float] = SWITCH_SWEEP_MS,
              quiet: bool = False) -> dict[str, Any] | None:
    """Run the study; returns the JSON-ready result (None when the data is absent).

    ``out_dir=None`` writes nothing (tests)."""
    loaded = {k: load_card(k) for k in dict.fromkeys([REFERENCE_CARD, *cards])}
    if any(c is None for c in loaded.values()):
        missing = [CARDS[k][0] for k, c in loaded.items() if c is None]
        print(f"NV-DVFS data not found ({', '.join(missing)} under ../shared/data); nothing to do.")
        return None
    launches = launch_counts(loaded[REFERENCE_CARD], chain, stage_ms / 1e3)
    costs = sorted({0.0, switch_ms / 1e3, *(m / 1e3 for m in sweep_ms)})
    results = [plan_card(loaded[k], chain, launches, deadline_factor, costs) for k in cards]
    free_sw, costly_sw = 0.0, switch_ms / 1e3

    say = (lambda *a: None) if quiet else print
    say("Study 3 — clock frontiers from real kernels (NV-DVFS), chain planned with the exact chain DP")
    for res in results:
        say(f"  data: {display_path(res.card.source)} ({res.card.name}, {len(res.card.clocks_mhz)} SM clocks "
            f"{min(res.card.clocks_mhz):g}–{max(res.card.clocks_mhz):g} MHz); static power assumed "
            f"s = {res.card.static_power_w:g} W (lowest average power of any run on the card: the table "
            f"has no idle reading)")
    say(f"  chain: {len(chain)} kernels, each launched back to back ~{stage_ms:g} ms at the V100 top clock; "
        f"deadline {deadline_factor:g}× the all-max-clock chain time; switch cost: time at static power\n")
    fr_rows = [r for res in results for r in frontier_rows(res)]
    pl_rows = [r for res in results for r in plan_rows(res) if r[1] in ("—", f"{free_sw * 1e3:g}",
                                                                       f"{costly_sw * 1e3:g}")]
    sweep_rows = [r for res in results for r in plan_rows(res)[1:]]
    ck_rows = [r for res in results for r in clock_rows(res, (free_sw, costly_sw))]
    ck_headers = ["card", "kernel", "launches", "clock, free switches",
                  f"clock, {costly_sw * 1e3:g} ms switches"]
    say("Per-kernel clock frontiers (one stage = the launches shown):")
    say(console_table(FRONTIER_HEADERS, fr_rows))
    say("\nChain plans:")
    say(console_table(PLAN_HEADERS, pl_rows))
    say("\nChosen clocks (MHz) per kernel:")
    say(console_table(ck_headers, ck_rows))
    say("\nSwitching-cost sweep:")
    say(console_table(PLAN_HEADERS, sweep_rows))
    notes = [explain(res, free_sw, costly_sw) for res in results]
    say("\n" + "\n".join(notes))

    out = {
        "study": "kernel_clocks", "data": {r.card.key: display_path(r.card.source) for r in results},
        "deadline_factor": deadline_factor, "stage_ms": stage_ms, "switch_ms": switch_ms,
        "chain": list(chain), "launches": launches,
        "cards": {res.card.key: card_json(res) for res in results}, "notes": notes,
    }
    if out_dir is not None:
        md = ("# Study 3 — clock frontiers from real kernels (NV-DVFS)\n\n"
              + "".join(f"Data: `{display_path(r.card.source)}`, static power s = {r.card.static_power_w:g} W "
                        f"(lowest average power in the table).\n\n" for r in results)
              + "## Per-kernel frontiers\n\n" + markdown_table(FRONTIER_HEADERS, fr_rows)
              + "\n## Chain plans\n\n" + markdown_table(PLAN_HEADERS, pl_rows)
              + "\n## Chosen clocks\n\n" + markdown_table(ck_headers, ck_rows)
              + "\n## Switching-cost sweep\n\n" + markdown_table(PLAN_HEADERS, sweep_rows)
              + "\n" + "\n\n".join(notes) + "\n")
        out_dir = Path(out_dir)
        write_text_atomic(out_dir / "study_kernel_clocks.md", md)
        write_json(out_dir / "study_kernel_clocks.json", out)
        plot(results, free_sw, costly_sw, out_dir / "study_kernel_clocks.png")
        say(f"\nwrote {out_dir}/study_kernel_clocks.{{md,json,png}}")
    return out


def card_json(res: CardResult) -> dict[str, Any]:
    """JSON-ready per-card result."""
    return {
        "name": res.card.name, "source": display_path(res.card.source),
        "static_power_w": res.card.static_power_w, "clocks_mhz": list(res.card.clocks_mhz),
        "deadline_s": res.deadline_s, "all_max": res.baseline.to_dict(),
        "frontiers": {k: [{"sm_clock_mhz": p.omega.sm_clock_mhz, "time_s": p.time_s, "energy_j": p.energy_j}
                          for p in fr.points] for k, fr in res.frontiers.items()},
        "plans": {f"{sw * 1e3:g}ms": {**p.to_dict(), "saved_vs_all_max": saved(p, res.baseline),
                                      "clocks_mhz": plan_clocks(p)} for sw, p in res.plans.items()},
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cards", default="v100,rtx8000", help="comma-separated: v100, rtx8000")
    ap.add_argument("--deadline", type=float, default=1.05, help="deadline as a factor of the all-max-clock time")
    ap.add_argument("--switch-ms", type=float, default=10.0, help="time per clock change, ms")
    ap.add_argument("--stage-ms", type=float, default=100.0, help="target stage length at the V100 top clock, ms")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR)
    a = ap.parse_args(argv)
    cards = [c.strip() for c in a.cards.split(",") if c.strip()]
    bad = [c for c in cards if c not in CARDS]
    if bad:
        ap.error(f"unknown card(s) {bad}; known: {sorted(CARDS)}")
    return 0 if run_study(cards, a.deadline, a.switch_ms, a.stage_ms, out_dir=a.out) is not None else 1


if __name__ == "__main__":
    sys.exit(main())
