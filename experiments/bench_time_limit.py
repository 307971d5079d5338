"""Does ``time_limit_s`` bound the call? The planner's safety net, measured (issue 32).

Each case solves a large 1F1B problem (synthetic Perseus profile, as ``bench_scaling.py``) with
a ``time_limit_s`` far below what the method needs, and records the wall time of the whole
call against the limit, whether the plan says ``time_capped``, and whether a solver child
process or a solver temp file (CBC's ``.mps``/``.sol``, HiGHS logs) outlived the call. The
margin above the limit is what the net cannot cut: building the LP in Python before the
first back-end call, and the plan's own evaluation after it.

    python experiments/bench_time_limit.py            # ~4 min on a 2-core machine
    python experiments/bench_time_limit.py --quick    # the two smaller cases

Writes experiments/results/bench_time_limit.md. Wall times depend on the machine and its
load; the ratio wall/limit and the flags are what carry over.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from bench_solvers import P2P_W, idle_priced_switch, make_profile  # noqa: E402

from frontier.files import write_text_atomic  # noqa: E402
from solvers import load_perseus_profile, solve  # noqa: E402

#: (stages, microbatches, switch time s or None, method, time_limit_s)
CASES = ((16, 64, None, "fast", 2.0), (16, 64, 1e-3, "fast", 5.0), (16, 64, None, "ilp", 10.0),
         (32, 128, None, "fast", 5.0), (32, 128, 1e-3, "fast", 10.0))
QUICK = CASES[:3]
SOLVER_TEMP = (".mps", ".sol", ".lp", ".mst", "highs.log")


def child_pids() -> list[int]:
    """PIDs of this process's live children (from /proc; empty where there is none)."""
    me, out = str(os.getpid()), []
    for d in Path("/proc").iterdir() if Path("/proc").exists() else ():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] not in ("Z", "X"):
            out.append(int(d.name))
    return out


def solver_temp_files(folder: Path) -> set[str]:
    """Names in ``folder`` that look like a MILP back end's temp files."""
    try:
        return {p.name for p in folder.iterdir() if p.name.endswith(SOLVER_TEMP)}
    except OSError:
        return set()


def run_case(profile: Path, stages: int, micro: int, tau_s: float | None, method: str,
             limit_s: float) -> dict:
    """One limited solve; wall time, flags and what it left behind."""
    trans = idle_priced_switch(tau_s) if tau_s else None
    p = load_perseus_profile(profile, P2P_W, micro, transitions=trans)
    tmp = Path(tempfile.gettempdir())
    before = solver_temp_files(tmp)
    t0 = time.perf_counter()
    plan = solve(p, "1.05x", method=method, time_limit_s=limit_s)
    wall = time.perf_counter() - t0
    time.sleep(0.5)                        # give a killed child time to be reaped
    return {"case": f"{stages}x{micro} {'1 ms switches' if tau_s else 'no switch cost'} {method}",
            "tasks": p.n_tasks, "limit_s": limit_s, "wall_s": wall, "ratio": wall / limit_s,
            "time_capped": plan.time_capped, "method": plan.method,
            "children_left": len(child_pids()),
            "temp_files_left": len(solver_temp_files(tmp) - before)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the smaller cases only")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "bench_time_limit.md"))
    a = ap.parse_args()
    cases = QUICK if a.quick else CASES
    tmp = Path(tempfile.mkdtemp(prefix="bench_time_limit_"))
    profiles = {s: make_profile(s, tmp) for s in sorted({c[0] for c in cases})}
    rows = []
    for stages, micro, tau, method, limit in cases:
        rows.append(run_case(profiles[stages], stages, micro, tau, method, limit))
        print(rows[-1], flush=True)
    cols = ["case", "tasks", "limit_s", "wall_s", "ratio", "time_capped", "method",
            "children_left", "temp_files_left"]
    lines = ["# bench_time_limit", "", __doc__.split("\n\n")[1].replace("\n", " "), "",
             f"Command: `python experiments/bench_time_limit.py{' --quick' if a.quick else ''}`",
             "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c])
                                       for c in cols) + " |")
    worst = max(r["wall_s"] - r["limit_s"] for r in rows)
    lines += ["", f"Largest overshoot: {worst:.2f} s beyond the limit "
              f"(largest ratio {max(r['ratio'] for r in rows):.2f})."]
    write_text_atomic(a.out, "\n".join(lines) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
