"""Study 4 — cross-hardware transfer: one kernel chain, one deadline factor, two cards.

What it shows (capability 3 of spec §13): moving a plan to new hardware needs only each
element's signatures measured there; the algebra and the planner are reused unchanged. The
same 10-kernel chain as study 3 (same launch counts, so the same work) is planned under 1.05×
each card's all-max-clock time on a V100 and an RTX 8000, each from its own NV-DVFS signatures
(``../shared/data/nv-dvfs/*.csv``, read in place). The study prints where the plans differ
(chosen clock per kernel with free clock changes, relative to each card's clock range; the
summary also has the plans with ``--switch-ms`` per change) and why, from the data: each
kernel's clock sensitivity (how much its time grows when the clock falls; memory-bound kernels
barely slow down) and each card's static/dynamic power split.

Run:

    python experiments/study_cross_hardware.py [--deadline 1.05] [--switch-ms 10]
        [--stage-ms 100] [--out experiments/results]

Writes ``study_cross_hardware.{md,json,png}`` under the output folder (atomically).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import (
    RESULTS_DIR,
    console_table,
    display_path,
    markdown_table,
    write_json,
    write_text_atomic,
)
from study_kernel_clocks import (
    CARDS,
    CHAIN,
    REFERENCE_CARD,
    Card,
    CardResult,
    launch_counts,
    load_card,
    plan_card,
    plan_clocks,
    saved,
    top_clock,
)

COMPARED = ("v100", "rtx8000")
MEMORY_BOUND_BELOW = 0.5   # clock sensitivity under this: time barely follows the clock
SENSITIVITY_LOW = 0.7      # sensitivity measured between 0.7× the top clock and the top clock


def clock_sensitivity(card: Card, kernel: str) -> float:
    """d log T / d log(1/f) over the upper part of the card's range (top clock vs the measured
    clock nearest ``SENSITIVITY_LOW`` × top, where deadline-constrained plans live): 1 when time
    scales with 1/clock (compute-bound), near 0 when it does not (memory- or latency-bound)."""
    sigs = card.kernels[kernel]
    hi = top_clock(sigs)
    target = SENSITIVITY_LOW * hi.omega.sm_clock_mhz
    lo = min(sigs, key=lambda s: abs(s.omega.sm_clock_mhz - target))
    return math.log(lo.time_s / hi.time_s) / math.log(hi.omega.sm_clock_mhz / lo.omega.sm_clock_mhz)


def static_share(card: Card, chain: Sequence[str]) -> float:
    """Mean fraction of board power that is static (s / average power) at the top clock."""
    return statistics.mean(card.static_power_w / (top_clock(card.kernels[k]).energy_j
                                                 / top_clock(card.kernels[k]).time_s) for k in chain)


def kernel_rows(results: dict[str, CardResult], chain: Sequence[str], sw: float) -> list[list[Any]]:
    """Per kernel: chosen clock and its place in each card's range, and the clock sensitivity."""
    rows = []
    clocks = {k: plan_clocks(r.plans[sw]) for k, r in results.items()}
    for i, kern in enumerate(chain):
        row: list[Any] = [kern]
        fr = []
        for key, res in results.items():
            c = clocks[key][i]
            f = res.card.clock_fraction(c)
            fr.append(f)
            row += [f"{c:g}", f"{c / max(res.card.clocks_mhz):.2f}", f"{f:.2f}",
                    f"{clock_sensitivity(res.card, kern):.2f}"]
        row.append("differs" if abs(fr[0] - fr[-1]) >= 0.25 else "")
        rows.append(row)
    return rows


def headers(results: dict[str, CardResult]) -> list[str]:
    """Column names of :func:`kernel_rows`."""
    h = ["kernel"]
    for res in results.values():
        n = res.card.name
        h += [f"{n} clock MHz", f"{n} f/fmax", f"{n} place in range", f"{n} clock sensitivity"]
    return h + ["plans differ (≥0.25 of range)"]


def summary_rows(results: dict[str, CardResult], sw: float) -> list[list[Any]]:
    """Per card: range, s, static share, deadline, energies and switches."""
    rows = []
    for res in results.values():
        p = res.plans[sw]
        rows.append([res.card.name, f"{sw * 1e3:g}", f"{min(res.card.clocks_mhz):g}–{max(res.card.clocks_mhz):g}",
                     f"{res.card.static_power_w:g}", f"{100 * static_share(res.card, res.launches):.0f}",
                     f"{res.deadline_s * 1e3:.1f}", f"{p.makespan_s * 1e3:.1f}", f"{p.energy_j:.2f}",
                     f"{res.baseline.energy_j:.2f}", f"{100 * saved(p, res.baseline):.1f}", p.n_switches])
    return rows


SUMMARY_HEADERS = ["card", "switch ms", "clocks MHz", "s W", "static share @top %", "deadline ms", "makespan ms",
                   "E plan J", "E all-max J", "saved %", "switches"]


def explain(results: dict[str, CardResult], chain: Sequence[str], sw: float) -> list[str]:
    """Why the plans differ, from the data (sensitivity groups and static shares)."""
    notes = []
    for res in results.values():
        clocks = plan_clocks(res.plans[sw])
        mem = [res.card.clock_fraction(c) for k, c in zip(chain, clocks)
               if clock_sensitivity(res.card, k) < MEMORY_BOUND_BELOW]
        cmp_ = [res.card.clock_fraction(c) for k, c in zip(chain, clocks)
                if clock_sensitivity(res.card, k) >= MEMORY_BOUND_BELOW]
        mem_s = f"{statistics.mean(mem):.2f} of the range ({len(mem)} kernels)" if mem else "none"
        cmp_s = f"{statistics.mean(cmp_):.2f} ({len(cmp_)} kernels)" if cmp_ else "none"
        notes.append(
            f"{res.card.name}: clock-insensitive kernels (sensitivity < {MEMORY_BOUND_BELOW:g}) run on average at "
            f"{mem_s}, clock-sensitive ones at {cmp_s}; s = {res.card.static_power_w:g} W is "
            f"{100 * static_share(res.card, chain):.0f} % of the power at the top clock; the plan saves "
            f"{100 * saved(res.plans[sw], res.baseline):.1f} % vs all-max-clock.")
    sens = {k: [clock_sensitivity(r.card, k) for r in results.values()] for k in chain}
    flips = [k for k, v in sens.items() if (v[0] < MEMORY_BOUND_BELOW) != (v[-1] < MEMORY_BOUND_BELOW)]
    names = [r.card.name for r in results.values()]
    if flips:
        notes.append(
            f"Kernels whose character changes between cards ({names[0]} → {names[-1]} sensitivity): "
            + ", ".join(f"{k} {sens[k][0]:.2f} → {sens[k][-1]:.2f}" for k in flips)
            + ". The same kernel is clock-bound on one card and not on the other (different memory "
              "systems: HBM2 at 877 MHz on the V100, GDDR6 at 6500 MHz on the RTX 8000, and different "
              "SM counts), so its signatures, and with them its planned clock, differ.")
    notes.append("Nothing in the algebra or the planner changed between the cards: only the signatures did.")
    return notes


def plot(results: dict[str, CardResult], chain: Sequence[str], sw: float, path: Path) -> None:
    """(a) chosen clock per kernel relative to each card's range; (b) that place against the
    kernel's clock sensitivity on each card."""
    from matplotlib.figure import Figure

    from frontier.plot import save_figure

    fig = Figure(figsize=(13, 4.8))
    ax_b, ax_s = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.5, 1]})
    width = 0.8 / len(results)
    colors = ("tab:blue", "tab:red", "tab:green")
    for j, (res, col) in enumerate(zip(results.values(), colors)):
        clocks = plan_clocks(res.plans[sw])
        frac = [res.card.clock_fraction(c) for c in clocks]
        xs = [i + (j - (len(results) - 1) / 2) * width for i in range(len(chain))]
        ax_b.bar(xs, frac, width, color=col, label=f"{res.card.name} ({min(res.card.clocks_mhz):g}–"
                 f"{max(res.card.clocks_mhz):g} MHz, −{100 * saved(res.plans[sw], res.baseline):.1f} % E)")
        for x, c in zip(xs, clocks):
            ax_b.text(x, 0.02, f"{c:g}", rotation=90, ha="center", va="bottom", fontsize=6.5, color="w")
        sens = [clock_sensitivity(res.card, k) for k in chain]
        ax_s.scatter(sens, frac, color=col, label=res.card.name, s=30)
        for sx, fy, k in zip(sens, frac, chain):
            ax_s.annotate(k, (sx, fy), fontsize=6, xytext=(3, 2), textcoords="offset points", color=col)
    ax_b.set_xticks(range(len(chain)))
    ax_b.set_xticklabels(chain, rotation=35, ha="right", fontsize=8)
    ax_b.set_ylabel("chosen clock, place in the card's range (0 = min, 1 = max)")
    first = next(iter(results.values()))
    ax_b.set_title(f"Same chain, same deadline factor ({first.deadline_s / first.baseline.makespan_s:.2f}× "
                   f"all-max), switch {sw * 1e3:g} ms: chosen clocks (NV-DVFS, real)", fontsize=10)
    ax_b.set_ylim(0, 1.22)
    ax_b.legend(fontsize=8, loc="upper center", ncol=2)
    ax_b.grid(True, axis="y", alpha=0.3)
    ax_s.axvline(MEMORY_BOUND_BELOW, color="0.6", ls=":", lw=0.8)
    ax_s.set_xlabel(f"clock sensitivity d log T / d log(1/f), {SENSITIVITY_LOW:g}×top…top  (1 = compute-bound)")
    ax_s.set_ylabel("chosen clock, place in range")
    ax_s.set_title("Where each kernel lands, by clock sensitivity", fontsize=10)
    ax_s.grid(True, alpha=0.3)
    ax_s.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def run_study(deadline_factor: float = 1.05, switch_ms: float = 10.0, stage_ms: float = 100.0,
              chain: Sequence[str] = CHAIN, out_dir: Path | None = RESULTS_DIR,
              quiet: bool = False) -> dict[str, Any] | None:
    """Run the study; returns the JSON-ready result (None when the data is absent).

    ``out_dir=None`` writes nothing (tests)."""
    cards = {k: load_card(k) for k in dict.fromkeys([REFERENCE_CARD, *COMPARED])}
    if any(c is None for c in cards.values()):
        print("NV-DVFS data not found under ../shared/data/nv-dvfs; nothing to do.")
        return None
    sw = switch_ms / 1e3
    launches = launch_counts(cards[REFERENCE_CARD], chain, stage_ms / 1e3)
    # Per-kernel comparison with free clock changes (each kernel's own best clock shows); the
    # switching-cost plan is summarised too (study 3 shows how it groups kernels).
    results = {k: plan_card(cards[k], chain, launches, deadline_factor, (0.0, sw)) for k in COMPARED}
    say = (lambda *a: None) if quiet else print
    say("Study 4 — cross-hardware transfer: one chain, one deadline factor, each card's own NV-DVFS signatures")
    for r in results.values():
        say(f"  data: {display_path(r.card.source)} ({r.card.name}); s = {r.card.static_power_w:g} W "
            f"(lowest average power in its table)")
    say(f"  chain: {', '.join(chain)}; launches per stage from the V100 (same work on both cards); "
        f"deadline {deadline_factor:g}× each card's all-max-clock time; per-kernel table with free clock "
        f"changes, summary also with {switch_ms:g} ms per change at static power\n")
    srows = summary_rows(results, 0.0) + (summary_rows(results, sw) if sw > 0 else [])
    krows = kernel_rows(results, chain, 0.0)
    khdr = headers(results)
    say(console_table(SUMMARY_HEADERS, srows))
    say("")
    say(console_table(khdr, krows))
    notes = explain(results, chain, 0.0)
    say("\n" + "\n".join(notes))
    out = {"study": "cross_hardware", "deadline_factor": deadline_factor, "switch_ms": switch_ms,
           "stage_ms": stage_ms, "chain": list(chain), "launches": launches,
           "data": {k: display_path(r.card.source) for k, r in results.items()},
           "cards": {k: {"name": r.card.name, "static_power_w": r.card.static_power_w,
                         "clocks_mhz": list(r.card.clocks_mhz), "deadline_s": r.deadline_s,
                         "clock_sensitivity": {kern: clock_sensitivity(r.card, kern) for kern in chain},
                         "static_share_top": static_share(r.card, chain),
                         "plans": {f"{c * 1e3:g}ms": {**p.to_dict(), "saved_vs_all_max": saved(p, r.baseline)}
                                   for c, p in r.plans.items()},
                         "all_max": r.baseline.to_dict()} for k, r in results.items()},
           "summary": {"headers": SUMMARY_HEADERS, "rows": srows},
           "kernels": {"headers": khdr, "rows": krows}, "notes": notes}
    if out_dir is not None:
        out_dir = Path(out_dir)
        md = ("# Study 4 — cross-hardware transfer (NV-DVFS V100 vs RTX 8000)\n\n"
              + "".join(f"Data: `{display_path(r.card.source)}`.\n" for r in results.values())
              + "\n" + markdown_table(SUMMARY_HEADERS, srows) + "\n" + markdown_table(khdr, krows)
              + "\n" + "\n\n".join(notes) + "\n")
        write_text_atomic(out_dir / "study_cross_hardware.md", md)
        write_json(out_dir / "study_cross_hardware.json", out)
        plot(results, chain, 0.0, out_dir / "study_cross_hardware.png")
        say(f"\nwrote {out_dir}/study_cross_hardware.{{md,json,png}}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deadline", type=float, default=1.05, help="deadline as a factor of the all-max-clock time")
    ap.add_argument("--switch-ms", type=float, default=10.0, help="time per clock change, ms")
    ap.add_argument("--stage-ms", type=float, default=100.0, help="target stage length at the V100 top clock, ms")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR)
    a = ap.parse_args(argv)
    assert set(COMPARED) <= set(CARDS)
    return 0 if run_study(a.deadline, a.switch_ms, a.stage_ms, out_dir=a.out) is not None else 1


if __name__ == "__main__":
    sys.exit(main())
