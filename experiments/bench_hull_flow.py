"""The hull LP against its dual min-cost flow: one solve at 1.05x on 1F1B, 2,048 to 131,072 tasks.

Each case is 16 stages x M microbatches of a synthetic Perseus profile (60 SM clocks, seed 0,
P2P power 75 W, no switch costs), ``HullLP(p, method=...)`` built and solved once at 1.05x the
fastest makespan, in a child process of its own so that its peak resident memory
(``ru_maxrss``) is its own. "lp" is the reference (``scipy.optimize.linprog``/HiGHS dual
simplex, or warm ``highspy`` when installed); "flow" is :mod:`solvers.hull_flow` (OR-Tools'
cost-scaling min-cost flow, then the residual distances). A method skips every size whose
time, extrapolated from its last two with their exponent, would pass ``--limit-s`` (300 s),
and the sizes after one that ran out of time. The exponent is the least-squares slope of
log(build + solve time) against log(tasks) over the sizes each method ran.

    python experiments/bench_hull_flow.py              # ~10 min on a 2-core machine
    python experiments/bench_hull_flow.py --quick      # 2,048 and 4,096 tasks
    python experiments/bench_hull_flow.py --chain      # also chains (one device), 2,048-8,192

Writes experiments/results/bench_hull_flow.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from frontier.files import write_json_atomic, write_text_atomic  # noqa: E402

STAGES = 16
MICROBATCHES = (64, 128, 256, 512, 1024, 2048, 4096)     # 2,048 ... 131,072 tasks
QUICK = (64, 128)
CHAIN = (2048, 4096, 8192)                               # --chain: one GPU, 60 options a task
METHODS = ("lp", "flow")

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/experiments")
from pathlib import Path
from bench_solvers import P2P_W, chain_problem
from solvers import load_perseus_profile
from solvers.hull_lp import HullLP
import solvers.hull_flow as hf
if sys.argv[5] == "chain":
    p = chain_problem(int(sys.argv[3]), 1e-3, Path(sys.argv[2]))
else:
    p = load_perseus_profile(sys.argv[2], P2P_W, int(sys.argv[3]))
D = p.deadline_s("1.05x")
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
lp = HullLP(p, method=sys.argv[4], process_min_tasks=10**9)
t1 = time.perf_counter()
sweeps = []
real = hf.solve_hull_flow
def counted(*a, **k):
    s = real(*a, **k); sweeps.append(s.sweeps); return s
hf.solve_hull_flow = counted
import solvers.hull_lp as hl
hl.solve_hull_flow = counted
r = lp.solve(D)
t2 = time.perf_counter()
print(json.dumps({"tasks": p.n_tasks, "build_s": t1 - t0, "solve_s": t2 - t1,
                  "bound_j": r.bound_j, "makespan_s": r.makespan_s, "deadline_s": D,
                  "slope_j_per_s": r.slope_j_per_s, "sweeps": sweeps[0] if sweeps else None,
                  "rss_load_mb": rss0 / 1024,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run_case(profile: Path, size: int, method: str, limit_s: float, shape: str) -> dict | None:
    """One child process: build and solve (``shape`` "1f1b": ``size`` microbatches; "chain":
    ``size`` tasks); None when it ran past ``limit_s``."""
    try:
        out = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), str(profile), str(size), method,
                              shape],
                             capture_output=True, text=True, timeout=limit_s + 60, check=True)
    except subprocess.TimeoutExpired:
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def exponent(tasks: list[int], wall_s: list[float]) -> float:
    """Slope of log(wall) against log(tasks) (least squares); nan under two points."""
    if len(tasks) < 2:
        return math.nan
    return float(np.polyfit(np.log(tasks), np.log(wall_s), 1)[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2,048 and 4,096 tasks only")
    ap.add_argument("--chain", action="store_true", help="also chains of 2,048 to 8,192 tasks")
    ap.add_argument("--limit-s", type=float, default=300.0, help="skip sizes predicted past this")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "bench_hull_flow"))
    a = ap.parse_args()
    from bench_solvers import make_profile
    tmp = Path(tempfile.mkdtemp(prefix="bench_hull_flow_"))
    profile = make_profile(STAGES, tmp)
    rows: list[dict] = []
    series = [("1f1b", m, 2 * STAGES * mb, mb) for m in METHODS
              for mb in (QUICK if a.quick else MICROBATCHES)]
    if a.chain:
        series += [("chain", m, n, n) for m in METHODS for n in CHAIN]
    for shape, method in dict.fromkeys((sh, m) for sh, m, _, _ in series):
        done: list[dict] = []
        stop = False
        for _, _, tasks, size in (c for c in series if c[:2] == (shape, method)):
            if len(done) >= 2:
                k = exponent([d["tasks"] for d in done[-2:]], [d["wall_s"] for d in done[-2:]])
                pred = done[-1]["wall_s"] * (tasks / done[-1]["tasks"]) ** max(k, 1.0)
                if pred > a.limit_s:
                    rows.append({"shape": shape, "method": method, "tasks": tasks,
                                 "skipped": f"predicted {pred:.0f} s"})
                    print(rows[-1], flush=True)
                    continue
            if stop:
                rows.append({"shape": shape, "method": method, "tasks": tasks,
                             "skipped": "a smaller size timed out"})
                continue
            r = run_case(profile, size, method, a.limit_s, shape)
            if r is None:
                row = {"shape": shape, "method": method, "tasks": tasks,
                       "skipped": f"over {a.limit_s + 60:.0f} s", "timed_out": True}
                stop = True
            else:
                row = {"shape": shape, "method": method, **r, "wall_s": r["build_s"] + r["solve_s"]}
                done.append(row)
            rows.append(row)
            print(row, flush=True)
    fits = {}
    for shape, method in dict.fromkeys((sh, m) for sh, m, _, _ in series):
        rs = [r for r in rows if (r["shape"], r["method"]) == (shape, method) and "wall_s" in r]
        fits[f"{shape} {method}"] = exponent([r["tasks"] for r in rs], [r["wall_s"] for r in rs])
    both: dict = {}
    for r in rows:
        if "wall_s" in r:
            both.setdefault((r["shape"], r["tasks"]), {})[r["method"]] = r
    agree = {t: abs(d["flow"]["bound_j"] - d["lp"]["bound_j"]) / abs(d["lp"]["bound_j"])
             for t, d in both.items() if len(d) == 2}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out.with_suffix(".json"), {"rows": rows, "exponent": fits,
                                                 "bound_rel_diff": {f"{k[0]} {k[1]}": v for k, v in agree.items()}})
    lines = ["# bench_hull_flow", "", __doc__.split("\n\n")[1].replace("\n", " "), "",
             "Fitted exponent (build + solve ∝ tasks^k): "
             + ", ".join(f"{m}: k = {v:.2f}" for m, v in fits.items()), "",
             "| shape | tasks | method | build s | solve s | flow/LP time | bound J | rel. diff to LP | "
             "makespan s | sweeps | peak RSS MB (after load) |", "|" + "---|" * 11]
    for r in rows:
        if "wall_s" not in r:
            lines.append(f"| {r['shape']} | {r['tasks']} | {r['method']} | skipped: {r['skipped']} | | | | | | | |")
            continue
        key = (r["shape"], r["tasks"])
        d = both[key]
        ratio = (f"{d['flow']['wall_s'] / d['lp']['wall_s']:.2f}" if len(d) == 2 and r["method"] == "flow"
                 else "")
        diff = f"{agree[key]:.1e}" if key in agree and r["method"] == "flow" else ""
        lines.append(f"| {r['shape']} | {r['tasks']} | {r['method']} | {r['build_s']:.2f} | {r['solve_s']:.2f} | {ratio} | "
                     f"{r['bound_j']:.10g} | {diff} | {r['makespan_s']:.6g} | {r['sweeps'] or ''} | "
                     f"{r['peak_rss_mb']:.0f} ({r['rss_load_mb']:.0f}) |")
    write_text_atomic(out.with_suffix(".md"), "\n".join(lines) + "\n")
    print(f"wrote {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
