"""What each heuristic of the fast method is worth: switch one off at a time and compare.

Cases are those of ``experiments/bench_solvers.py`` (synthetic Perseus profiles, 60 clocks,
P2P power 75 W): the 4x8 and 8x32 frontiers without switch costs (``pareto``, mean energy of
the curve at 40 deadlines from 1.0x to 1.5x) and 16x64 with 1 ms switches at 1.05x and 1.2x
(``solve(method="fast")``: energy and bound). Every variant is
the shipped :class:`solvers.SolveOptions` with one field changed, so each row measures one
heuristic alone; ``d_energy_pct`` is the variant's energy against the shipped one's (> 0:
the heuristic saves that much), ``d_bound_pct`` the same for the bound (< 0: it raises it).
``with_portfolio`` adds the second search the fast method ran by default before it was
measured here (and rounding slacks and grid refinement, also dropped, are gone).

    python experiments/solver_ablation.py                 # all cases (about 15 min, 2 cores)
    python experiments/solver_ablation.py --cases 16x64sw --variants no_final_stages

Writes experiments/results/solver_ablation.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from _common import RESULTS_DIR, doc_body, markdown_table, write_text_atomic  # noqa: E402
from bench_solvers import P2P_W, idle_priced_switch, make_profile  # noqa: E402

from solvers import SolveOptions, load_perseus_profile, pareto, solve  # noqa: E402
from solvers.options import HoldOptions, SearchSettings  # noqa: E402

SHIPPED = SolveOptions()


def variants() -> dict[str, tuple[SolveOptions, tuple[str, ...]]]:
    """Name → (options with one heuristic off, the case kinds it can change)."""
    o = SHIPPED
    return {
        "shipped": (o, ("frontier", "switch")),
        "no_start_order": (replace(o, curve=replace(o.curve, densify_orders=("ratio",))), ("frontier",)),
        "no_final_stages": (replace(o, search=replace(o.search, final_stages=())), ("switch",)),
        "with_portfolio": (replace(o, portfolio=replace(o.portfolio, members=(SearchSettings((24, 96), 0, 1.3),))),
                           ("switch",)),
        "no_holds": (replace(o, hold=HoldOptions(windows=())), ("switch",)),          # hold starts and re-plans
        "no_held_replan": (replace(o, hold=replace(o.hold, replan_levels=0)), ("switch",)),
        "no_ascent": (replace(o, bound=replace(o.bound, ascent=replace(o.bound.ascent, iters=0))), ("switch",)),
        "no_switch_lp_or_surrogate": (replace(o, bound=replace(o.bound, switch_lp_max_columns=0,
                                                                surrogate_share=0.0)), ("switch",)),
    }


def frontier_metric(curve, p) -> tuple[float, float]:
    """(mean energy at 40 deadlines from 1.0x to 1.5x, max grid gap %)."""
    fm = p.fastest_makespan_s()
    ds = np.linspace(fm, 1.5 * fm, 40)
    return float(np.mean([curve.energy_at(float(d)) for d in ds])), 100 * max(pl.gap for pl in curve.plans)


def run_case(case: str, p, opts: SolveOptions, points: int) -> list[tuple[str, float, float, float]]:
    """[(deadline, energy J, bound J or gap, wall s)] of one case under ``opts``."""
    out = []
    if case.endswith("frontier"):
        t0 = time.perf_counter()
        c = pareto(p, n_points=points, method="fast", options=opts)
        e, gap = frontier_metric(c, p)
        out.append(("1.0-1.5x", e, gap, time.perf_counter() - t0))
    else:
        for d in ("1.05x", "1.2x"):
            pl = solve(p, d, method="fast", options=opts)
            out.append((d, pl.energy_j, pl.lower_bound_j, pl.wall_s))
    return out


HEADERS = ["case", "deadline", "variant", "energy_j", "bound_or_gap", "d_energy_pct", "d_bound_pct", "wall_s"]


def main(argv: list[str] | None = None) -> list[list]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="4x8frontier,8x32frontier,16x64sw")
    ap.add_argument("--variants", default=None, help="comma-separated (default: all)")
    ap.add_argument("--points", type=int, default=150, help="grid of the frontier curves")
    ap.add_argument("--out", default=str(RESULTS_DIR / "solver_ablation"))
    a = ap.parse_args(argv)
    every = variants()
    names = ["shipped"] + [v for v in (a.variants.split(",") if a.variants else every) if v != "shipped"]
    rows: list[list] = []
    with tempfile.TemporaryDirectory() as tmp:
        prof = {s: make_profile(s, Path(tmp)) for s in (4, 8, 16)}
        cases = {"4x8frontier": ("frontier", lambda: load_perseus_profile(prof[4], P2P_W, 8)),
                 "8x32frontier": ("frontier", lambda: load_perseus_profile(prof[8], P2P_W, 32)),
                 "16x64sw": ("switch", lambda: load_perseus_profile(prof[16], P2P_W, 64,
                                                                    transitions=idle_priced_switch(1e-3)))}
        for case in a.cases.split(","):
            kind, build = cases[case]
            p = build()
            base = None
            for name in names:
                opts, kinds = every[name]
                if kind not in kinds:
                    continue
                got = run_case(case, p, opts, a.points)
                base = base or got
                for (d, e, b, w), (_, e0, b0, _) in zip(got, base):
                    row = [case, d, name, round(e, 3), round(b, 3), round(100 * (e - e0) / e0, 4),
                           round(100 * (b - b0) / b0, 4) if kind != "frontier" else "", round(w, 1)]
                    rows.append(row)
                    print(dict(zip(HEADERS, row)), flush=True)
                out = Path(a.out).with_suffix(".md")
                write_text_atomic(out, f"# solver_ablation\n\n{doc_body(__doc__)}\n\n"
                                  + markdown_table(HEADERS, rows) + "\n")
    return rows


if __name__ == "__main__":
    main()
