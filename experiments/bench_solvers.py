"""Benchmark the planners against lowtime 0.3.0 (Perseus' Phillips–Dessouky solver).

Both sides run in one process on the same synthetic Perseus-format profiles
(``shared/tools/make_perseus_profile.py``: 60 SM clocks from 1980 MHz down in 15 MHz steps,
imbalanced stages) with P2P-blocking power 75 W. lowtime's plan at each of its iterations is
evaluated on the measured options of the knobs it assigns under our accounting
(``S·75 W·makespan + Σ d``); the plan our curve hands out at that plan's makespan
(``ParetoCurve.plan_at``: a grid plan or one interpolated between two, rebuilt as a Plan) is
compared with it.

    python experiments/bench_solvers.py              # 4x8 both sides, 8x32 ours, 16x64, 32x128, chain
    python experiments/bench_solvers.py --lowtime-8x32   # adds lowtime on 8x32 (~6 min)

Writes experiments/results/bench_solvers.{md,json}.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from frontier.files import write_json_atomic, write_text_atomic  # noqa: E402
from solvers import ConstantTransition, load_perseus_profile, pareto, solve  # noqa: E402
from solvers.dp import chain_order  # noqa: E402
from solvers.feasibility import meets_deadline  # noqa: E402
from solvers.model import Problem  # noqa: E402
from solvers.perseus import read_perseus_profile  # noqa: E402

P2P_W = 75.0
UNIT_S = 1e-3


def shared_dir() -> Path:
    """``../shared`` next to the repo root, or ``$ECAL_SHARED_DATA``."""
    return Path(os.environ.get("ECAL_SHARED_DATA", ROOT.parent / "shared"))


def make_profile(stages: int, out_dir: Path, seed: int = 0) -> Path:
    """Generate a Perseus-format profile with the shared tool."""
    tool = shared_dir() / "tools" / "make_perseus_profile.py"
    path = out_dir / f"profile_{stages}.csv"
    with open(path, "w") as fh:
        subprocess.run([sys.executable, str(tool), "--stages", str(stages), "--freqs", "60",
                        "--seed", str(seed)], stdout=fh, check=True)
    return path


def run_lowtime(p: Problem, csv_path: Path):
    """lowtime's whole frontier; returns (wall_s, [(makespan_s, energy_j)]) evaluated by us."""
    import networkx as nx
    from lowtime.cost_model import ExponentialModel
    from lowtime.graph_utils import add_sink_node, add_source_node
    from lowtime.operation import (
        CandidateExecutionOptions,
        ExecutionOption,
        Operation,
        OperationSpec,
    )
    from lowtime.solver import PhillipsDessouky

    ix = p.index
    t0 = time.perf_counter()
    prof = read_perseus_profile(csv_path, P2P_W)
    specs = {}
    for key, opts in prof.items():
        eo = []
        for o in opts:
            q = int(round(o.time_s / UNIT_S))
            # Perseus: cost = energy − P2P-blocking power × quantised time.
            eo.append(ExecutionOption(real_time=o.time_s, unit_time=UNIT_S,
                                      cost=o.energy_j - P2P_W * q * UNIT_S, knob=o.omega.sm_clock_mhz))
        cand = CandidateExecutionOptions(options=eo)
        specs[key] = OperationSpec(options=cand, cost_model=ExponentialModel(cand))
    g = nx.DiGraph()
    for i, name in enumerate(ix.names):
        s, inst, _ = name.split("/")
        g.add_node(i, op=Operation(spec=specs[(int(s[1:]), inst)]))
    for a, b in ix.edges:
        g.add_edge(a, b)
    for b in range(ix.n):
        if ix.dev_prev[b] >= 0:
            g.add_edge(ix.dev_prev[b], b)
    add_source_node(g, -1)
    add_sink_node(g, -2)
    g.graph["source_node"], g.graph["sink_node"] = -1, -2
    knob_index = [{o.omega.sm_clock_mhz: j for j, o in enumerate(t.options)} for t in p.tasks]
    points = []
    eval_s = 0.0
    for _res in PhillipsDessouky(g).run():
        e0 = time.perf_counter()
        ch = [knob_index[i][g.nodes[i]["op"].assigned_knob] for i in range(ix.n)]
        mk = ix.makespan(ch)
        points.append((mk, ix.objective(ch, mk)))
        eval_s += time.perf_counter() - e0
    return time.perf_counter() - t0 - eval_s, points


def compare(curve, points) -> dict:
    """Our plan at each lowtime plan's makespan vs lowtime's energy there.

    Ours is the plan ``curve.plan_at`` hands a user at that deadline (a grid plan, or an
    interpolated one rebuilt from its choice as a Plan with its schedule), checked to meet the
    deadline at the energy the curve reports: only plans a user can get back and apply count.
    ``grid_only_worse_at`` repeats the count with the grid plans alone."""
    worse = 0
    rel = []
    got: dict[int, tuple[float, float]] = {}     # point -> (makespan, energy) of its Plan
    for mk, e_lt in points:
        i = curve.point_at(mk)
        if i is None:
            ours = float("inf")
        else:
            if i not in got:
                pl = curve.point_plan(i)
                got[i] = (pl.makespan_s, pl.energy_j)
            p_mk, ours = got[i]
            reported = curve.energy_at(mk)
            assert meets_deadline(p_mk, mk) and abs(ours - reported) <= 1e-9 * reported
        rel.append((ours - e_lt) / e_lt)
        if ours > e_lt * (1 + 1e-9):
            worse += 1
    grid = replace(curve, dense=(), dense_choices=None)
    grid_worse = sum(grid.energy_at(mk) > e_lt * (1 + 1e-9) for mk, e_lt in points)
    rel = np.array(rel)
    return {"matched": len(points), "ours_worse_at": worse, "plans_used": len(got),
            "grid_only_worse_at": int(grid_worse),
            "mean_saving_pct": float(-rel.mean() * 100) if len(rel) else None,
            "max_excess_pct": float(max(rel.max(), 0) * 100) if len(rel) else None}


def idle_priced_switch(tau_s: float) -> ConstantTransition:
    """The benchmarks' switch cost: ``tau_s`` seconds at the P2P-blocking power, so a switch
    costs nothing beyond the idle power the device draws anyway."""
    return ConstantTransition(tau_s, P2P_W * tau_s)


def chain_problem(n: int, tau_s: float, csv_path: Path) -> Problem:
    """A chain of n tasks alternating stage-0 forward/backward options on one GPU."""
    prof = read_perseus_profile(csv_path, P2P_W)
    tasks = [(f"t{i}", "gpu0", prof[(0, "forward" if i % 2 == 0 else "backward")]) for i in range(n)]
    return Problem.build(tasks, [(f"t{i}", f"t{i + 1}") for i in range(n - 1)], {"gpu0": P2P_W},
                         idle_priced_switch(tau_s), name=f"chain-{n}x60")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lowtime-8x32", action="store_true", help="also run lowtime on 8x32 (minutes)")
    ap.add_argument("--points", type=int, default=100, help="deadline grid of our curves (plans between grid points are interpolated)")
    ap.add_argument("--switch-ms", type=float, default=1.0, help="switch latency for the transition cases")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "bench_solvers"))
    a = ap.parse_args()
    try:
        import lowtime  # noqa: F401
        have_lt = True
    except ImportError:
        have_lt = False
        print("lowtime is not installed (pip install 'energy-calculus[bench]'): running our side only")
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="bench_solvers_"))
    prof = {s: make_profile(s, tmp) for s in (4, 8, 16)}
    tau = a.switch_ms * 1e-3
    for S, N, with_lt in ((4, 8, have_lt), (8, 32, have_lt and a.lowtime_8x32)):
        p = load_perseus_profile(prof[S], P2P_W, N)
        curve = pareto(p, n_points=a.points, method="fast")
        row = {"case": f"{S}x{N} frontier", "method": curve.method, "wall_s": curve.wall_s,
               "points": len(curve.plans), "points_reported": curve.n_points, "max_gap_pct": 100 * max(pl.gap for pl in curve.plans),
               "time_capped": curve.time_capped,
               "energy_at_1.05x_j": curve.energy_at(p.deadline_s("1.05x"))}
        if with_lt:
            lt_s, pts = run_lowtime(p, prof[S])
            cmp_ = compare(curve, pts)
            row.update({"lowtime_wall_s": lt_s, "lowtime_points": len(pts), **cmp_,
                        "speedup": lt_s / curve.wall_s,
                        "_lowtime_curve": [[m, e] for m, e in pts],
                        "_our_curve": [[pl.makespan_s, pl.energy_j, pl.lower_bound_j] for pl in curve.plans]
                        + [list(x) for x in curve.dense]})
            lt_e = min((e for mk, e in pts if mk <= p.deadline_s("1.05x")), default=float("nan"))
            row["lowtime_energy_at_1.05x_j"] = lt_e
        rows.append(row)
        print({k: v for k, v in row.items() if not k.startswith("_")}, flush=True)
    for trans in (None, idle_priced_switch(tau)):
        p = load_perseus_profile(prof[16], P2P_W, 64, transitions=trans)
        what = "no switch cost" if trans is None else f"switches {a.switch_ms:g} ms"
        for fac in ("1.05x", "1.2x"):
            pl = solve(p, fac, method="fast")
            rows.append({"case": f"16x64 {what} @{fac}", "method": pl.method,
                         "wall_s": pl.wall_s, "points": 1, "max_gap_pct": 100 * pl.gap,
                         "energy_j": pl.energy_j, "switches": pl.n_switches,
                         "time_capped": pl.time_capped})
            print(rows[-1], flush=True)
    # the largest pipeline: 32 x 128 1F1B, 8,192 tasks (bench_scaling.py: the sizes between)
    p = load_perseus_profile(make_profile(32, tmp), P2P_W, 128, transitions=idle_priced_switch(tau))
    pl = solve(p, "1.05x", method="fast")
    rows.append({"case": f"32x128 switches {a.switch_ms:g} ms @1.05x", "method": pl.method,
                 "wall_s": pl.wall_s, "points": 1, "max_gap_pct": 100 * pl.gap,
                 "energy_j": pl.energy_j, "switches": pl.n_switches, "time_capped": pl.time_capped})
    print(rows[-1], flush=True)
    cp = chain_problem(2000, tau, prof[4])
    assert chain_order(cp) is not None
    pl = solve(cp, "1.05x")
    rows.append({"case": f"chain 2000x60 + switches {a.switch_ms:g} ms @1.05x", "method": pl.method,
                 "wall_s": pl.wall_s, "points": 1, "max_gap_pct": 100 * pl.gap, "energy_j": pl.energy_j,
                 "exact": pl.status == "optimal", "switches": pl.n_switches})
    print(rows[-1], flush=True)
    write_results(rows, Path(a.out), have_lt)


NOTES = """Profiles: shared/tools/make_perseus_profile.py (60 SM clocks, 1980 MHz down by 15 MHz,
seed 0), P2P-blocking power 75 W = each stage's idle power and every option's static power.
Energy of a plan = 75 W x stages x makespan + sum of d (same accounting for both sides).
lowtime: unit time 1 ms, exponential cost fit per (stage, instruction), cost = E - 75 W x
quantised time (as Perseus); each iteration's assigned knobs are evaluated on the measured
options. `ours_worse_at`: lowtime plans whose makespan our curve cannot match with less energy,
ours being the Plan `ParetoCurve.plan_at` gives a user there (`points_reported`: grid plans +
plans interpolated between them, each a Plan on demand; `plans_used`: the distinct ones that
answered lowtime's deadlines; `grid_only_worse_at`: the count with grid plans alone);
`max_gap_pct`: grid plans vs their LP/Lagrangian bound. Switch cases: constant switch latency, energy = idle power x latency.
The chain DP row is exact only when its gap is 0. Plan time against size (512 to 8,192
tasks, and a 10,000-task chain): `python experiments/bench_scaling.py`, results/bench_scaling.md
and its figure bench_scaling.png."""


def write_results(rows: list[dict], out: Path, have_lt: bool) -> None:
    """Markdown table + JSON, atomically."""
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out.with_suffix(".json"), {"rows": rows, "lowtime": have_lt})
    cols = ["case", "method", "wall_s", "points", "points_reported", "max_gap_pct", "lowtime_wall_s",
            "lowtime_points", "speedup", "ours_worse_at", "grid_only_worse_at", "mean_saving_pct",
            "max_excess_pct", "switches"]
    lines = ["# bench_solvers", "", "lowtime " + ("0.3.0 ran in the same process" if have_lt else "not installed"),
             "", NOTES, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c, "")
            cells.append(f"{v:.4g}" if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    write_text_atomic(out.with_suffix(".md"), text)
    print(text)


if __name__ == "__main__":
    main()
