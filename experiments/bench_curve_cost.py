"""What a curve costs against one plan: ``solvers.pareto`` (20 deadlines, the CLI's default) vs
one ``solvers.solve`` at 1.05x, on 1F1B pipelines with and without 1 ms switches.

Same profiles as ``bench_scaling.py`` (``shared/tools/make_perseus_profile.py``, 60 SM clocks,
seed 0, P2P-blocking power 75 W); fast method on both sides; each timed ``--repeats`` times in
this process (median). The ratio is the figure docs/solver.md states ("a curve costs about N
plans").

    python experiments/bench_curve_cost.py           # 8x32 and 16x64, ~3 min on a 2-core machine

Writes experiments/results/bench_curve_cost.{md,json}.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from _common import rows_table  # noqa: E402
from bench_scaling import timed  # noqa: E402
from bench_solvers import P2P_W, idle_priced_switch, make_profile  # noqa: E402

from frontier.files import write_json_atomic, write_text_atomic  # noqa: E402
from solvers import load_perseus_profile, pareto, solve  # noqa: E402

SIZES = ((8, 32), (16, 64))      # stages x microbatches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--points", type=int, default=20, help="curve deadlines (default: the CLI's 20)")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "bench_curve_cost"))
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_curve_cost_"))
    rows = []
    for label, trans in (("no switch cost", None), ("switches 1 ms", idle_priced_switch(1e-3))):
        for S, N in SIZES:
            p = load_perseus_profile(make_profile(S, tmp), P2P_W, N, transitions=trans)
            plan_s, _ = timed(lambda p=p: solve(p, "1.05x", method="fast"), a.repeats)
            curve_s, c = timed(lambda p=p: pareto(p, n_points=a.points, method="fast"), a.repeats)
            rows.append({"case": f"{S}x{N} {label}", "tasks": p.n_tasks, "plan_s": plan_s,
                         "curve_s": curve_s, "points": len(c.plans), "ratio": curve_s / plan_s,
                         "time_capped": c.time_capped})
            print(rows[-1], flush=True)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out.with_suffix(".json"), {"rows": rows})
    cols = ["case", "tasks", "plan_s", "curve_s", "points", "ratio", "time_capped"]
    lines = ["# bench_curve_cost", "", __doc__.split("\n\n")[1].replace("\n", " "), ""]
    write_text_atomic(out.with_suffix(".md"), "\n".join(lines) + "\n" + rows_table(rows, cols, 3))
    print(f"wrote {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
