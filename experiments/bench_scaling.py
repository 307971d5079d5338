"""Plan time against problem size: 1F1B pipelines from 512 to 131,072 tasks, and the chain DP.

Each case is one ``solvers.solve(..., method="fast")`` at 1.05x the fastest makespan on a
synthetic Perseus profile (``shared/tools/make_perseus_profile.py``, 60 SM clocks, seed 0,
P2P-blocking power 75 W), without switch costs and with 1 ms switches (energy = idle power x
latency), each timed ``--repeats`` times in a child process of its own (median; building the problem is not
timed). The exponent is the slope of log(wall time) against log(tasks), fitted over the sizes
from 2,048 tasks on. Peak RSS is that child's peak: the problem, the solve and the plan (the
LP's own child processes, a few tens of MB, are not counted). The chain row is the exact DP (``method="dp"``) on a 10,000-task chain
with 60 options per task and 1 ms switches.

    python experiments/bench_scaling.py            # ~20 min on a 2-core machine
    python experiments/bench_scaling.py --quick    # 512 and 2,048 tasks only
    python experiments/bench_scaling.py --switch-max-tasks 131072   # switches to 131,072 too

Writes experiments/results/bench_scaling.{md,json,png}.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from bench_solvers import chain_problem, make_profile  # noqa: E402

from frontier.files import write_json_atomic, write_text_atomic  # noqa: E402
from solvers import solve  # noqa: E402

SIZES = ((8, 32), (16, 32), (16, 64), (32, 64), (32, 128), (32, 256), (32, 512), (32, 1024),
         (32, 2048))                                              # stages x microbatches
QUICK = ((8, 32), (16, 64))
FIT_FROM = 2048          # the range: the exponent is fitted from this many tasks on


def timed(fn, repeats: int):
    """(median wall s, last result) of ``repeats`` calls."""
    walls, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls), out


def peak_rss_mb() -> float:
    """This process's peak resident memory so far (MB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


CHILD = r"""
import json, resource, statistics, sys, time
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/experiments"]
from bench_solvers import P2P_W, idle_priced_switch
from solvers import load_perseus_profile, solve
from solvers.options import LimitOptions, SolveOptions
ms = float(sys.argv[4])
p = load_perseus_profile(sys.argv[2], P2P_W, int(sys.argv[3]), max_tasks=None,
                         transitions=idle_priced_switch(ms / 1000) if ms else None)
opts = SolveOptions(limits=LimitOptions(max_tasks=None))
walls = []
for _ in range(int(sys.argv[5])):
    t0 = time.perf_counter()
    pl = solve(p, "1.05x", method="fast", options=opts)
    walls.append(time.perf_counter() - t0)
print(json.dumps({"tasks": p.n_tasks, "wall_s": statistics.median(walls), "gap_pct": 100 * float(pl.gap),
                  "status": pl.status, "time_capped": bool(pl.time_capped), "energy_j": float(pl.energy_j),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run_case(profile: Path, microbatches: int, switch_ms: float, repeats: int) -> dict:
    """One case in a child process of its own (so its peak RSS is its own: the problem, the
    solve and what it keeps; the LP's child processes are not counted)."""
    out = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), str(profile), str(microbatches),
                          str(switch_ms), str(repeats)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def exponent(tasks: list[int], wall_s: list[float]) -> float:
    """Slope of log(wall) against log(tasks) (least squares)."""
    return float(np.polyfit(np.log(tasks), np.log(wall_s), 1)[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="two sizes only")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--max-tasks", type=int, default=131072, help="largest case without switch costs")
    ap.add_argument("--switch-max-tasks", type=int, default=32768, help="largest case with switches")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "bench_scaling"))
    a = ap.parse_args()
    sizes = QUICK if a.quick else SIZES
    tmp = Path(tempfile.mkdtemp(prefix="bench_scaling_"))
    profiles = {s: make_profile(s, tmp) for s in sorted({s for s, _ in sizes})}
    rows = []
    for label, switch_ms, most in (("no switch cost", 0.0, a.max_tasks),
                                   ("switches 1 ms", 1.0, a.switch_max_tasks)):
        for S, N in sizes:
            if 2 * S * N > most:
                continue
            row = run_case(profiles[S], N, switch_ms, a.repeats)
            rows.append({"case": f"{S}x{N} {label}", "series": label, **row})
            print(rows[-1], flush=True)
    n_chain = 2_000 if a.quick else 10_000
    cp = chain_problem(n_chain, 1e-3, profiles[min(profiles)])
    wall, pl = timed(lambda: solve(cp, "1.05x", method="dp"), a.repeats)
    chain_row = {"case": f"chain {n_chain}x60 switches 1 ms", "series": "chain dp", "tasks": n_chain,
                 "wall_s": wall, "gap_pct": 100 * pl.gap, "status": pl.status,
                 "time_capped": pl.time_capped, "energy_j": pl.energy_j, "peak_rss_mb": peak_rss_mb()}
    rows.append(chain_row)
    print(chain_row, flush=True)
    fits = {}
    for label in ("no switch cost", "switches 1 ms"):
        rs = [r for r in rows if r["series"] == label and r["tasks"] >= FIT_FROM]
        if len(rs) >= 2:
            fits[label] = exponent([r["tasks"] for r in rs], [r["wall_s"] for r in rs])
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out.with_suffix(".json"), {"rows": rows, "exponent": fits})
    cols = ["case", "tasks", "wall_s", "gap_pct", "status", "time_capped", "peak_rss_mb"]
    lines = ["# bench_scaling", "", __doc__.split("\n\n")[1].replace("\n", " "), "",
             f"Fitted exponent (wall ∝ tasks^k, {FIT_FROM:,} tasks on): "
             + ", ".join(f"{k}: k = {v:.2f}" for k, v in fits.items()), "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c])
                                       for c in cols) + " |")
    write_text_atomic(out.with_suffix(".md"), "\n".join(lines) + "\n")
    plot(rows, fits, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.md')}")


def plot(rows: list[dict], fits: dict[str, float], path: Path) -> None:
    """Log-log plan time against tasks, one line per series, with the fitted exponent."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for label, marker in (("no switch cost", "o"), ("switches 1 ms", "s")):
        rs = [r for r in rows if r["series"] == label]
        ax.loglog([r["tasks"] for r in rs], [r["wall_s"] for r in rs], marker=marker,
                  label=f"fast, {label}" + (f" (k = {fits[label]:.2f})" if label in fits else ""))
    ch = [r for r in rows if r["series"] == "chain dp"]
    ax.loglog([r["tasks"] for r in ch], [r["wall_s"] for r in ch], "k^", label="chain DP, 60 options, 1 ms switches")
    ax.set_xlabel("tasks")
    ax.set_ylabel("plan time (s)")
    ax.set_title("Plan time vs size (1F1B, 1.05x deadline)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
