"""Constant switch costs with per-ω rows instead of the transport matrix: MILP speed and bound.

Where every switch costs the same, a consecutive same-device pair needs one continuous
z_ω ≥ X_u,ω − X_w,ω per operating point instead of the K×K transport matrix (solver-notes
§4). Both give the same LP relaxation, so the MILP keeps its bound with far fewer columns, and
the LP itself becomes small enough to solve for the fast method's bound.

Table 1 solves the same MILP both ways with CBC (time limit 120 s, one thread). Table 2
compares the fast method's bound (with the switch LP on problems up to
``SolveOptions.bound.switch_lp_max_columns`` columns, else the surrogate LP's duals, then the ascent of
``solvers.ascent``) with the Lagrangian bound from the switch LP's duals, solved here at any
size, and splits the plan's excess over that bound at those prices: ``clock_regret_j``, what
the plan's clock sequences cost above each device's cheapest, and ``priced_slack_j``, flow on
paths the plan leaves shorter than its makespan.

    python experiments/bench_switch_lp.py            # table 1, table 2 on 4x8 and 8x32
    python experiments/bench_switch_lp.py --large    # table 2 also on 16x64 (about 2 min an LP)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from _common import RESULTS_DIR, doc_body, markdown_table, write_text_atomic  # noqa: E402
from bench_solvers import P2P_W, idle_priced_switch, make_profile  # noqa: E402

from solvers import ConstantTransition, Problem, load_perseus_profile  # noqa: E402
from solvers.fast import solve_fast  # noqa: E402
from solvers.hull_lp import HullLP  # noqa: E402
from solvers.ilp import build_model, make_solver  # noqa: E402
from solvers.lagrangian import device_viterbi, flow_from_duals, lagrangian_bound  # noqa: E402
from solvers.switch_lp import switch_lp_duals  # noqa: E402


def layered_dag(seed: int, n: int = 40, k: int = 8, n_dev: int = 4) -> Problem:
    """A random layered DAG with ``k`` clocks per task and 0.2 s / 4 J switches."""
    rng = np.random.default_rng(seed)
    tasks = []
    for i in range(n):
        f = np.sort(rng.choice(np.linspace(0.4, 1.0, 13), k, replace=False))
        w = rng.uniform(0.5, 1.5)
        t = w * (0.3 + 0.7 / f)
        opts = [dict(time_s=float(ti), energy_j=float(ti * (5 + 12 * fi**3) + w), s_w=5.0,
                     sm_clock_mhz=float(round(fi * 1000))) for ti, fi in zip(t, f)]
        tasks.append((f"t{i}", f"g{i % n_dev}", opts))
    edges = [(f"t{i}", f"t{j}") for i in range(n) for j in range(i + 1, n) if rng.random() < 0.1]
    return Problem.build(tasks, edges, {f"g{j}": 3.0 for j in range(n_dev)}, ConstantTransition(0.2, 4.0))


def pipeline(stages: int, microbatches: int, tmp: Path, switch_s: float = 1e-3) -> Problem:
    """1F1B on the benchmark profile (60 clocks) with a constant switch latency."""
    return load_perseus_profile(make_profile(stages, tmp), P2P_W, microbatches,
                                transitions=idle_priced_switch(switch_s))


def milp_row(name: str, p: Problem, deadline_s: float, transport: bool, limit_s: float) -> dict:
    """One MILP solve (CBC) with either linearisation."""
    import pulp

    t0 = time.perf_counter()
    prob = build_model(p, deadline_s, transport=transport)[0]
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    prob.solve(make_solver("PULP_CBC_CMD", limit_s))
    solve_s = time.perf_counter() - t0
    return {"case": name, "linearisation": "transport" if transport else "per-ω",
            "variables": len(prob.variables()), "energy_j": round(pulp.value(prob.objective), 3),
            "proven_optimal": prob.sol_status == pulp.LpSolutionOptimal,
            "build_s": round(build_s, 2), "solve_s": round(solve_s, 1)}


def bound_row(name: str, p: Problem, deadline: str) -> dict:
    """The fast plan and bound against the switch LP's Lagrangian bound."""
    D = p.deadline_s(deadline)
    fr = solve_fast(p, D)
    lp = HullLP(p)
    t0 = time.perf_counter()
    mu = switch_lp_duals(p, lp.rows, D, max_columns=10**9)
    lp_s = time.perf_counter() - t0
    b = lagrangian_bound(p, lp, mu, D)[0]
    regret = clock_regret_j(p, lp, mu, D, fr.choice)
    return {"case": f"{name} @{deadline}", "plan_j": round(fr.energy_j, 2),
            "fast_bound_j": round(fr.lower_bound_j, 2),
            "fast_gap_pct": round(100 * (1 - fr.lower_bound_j / fr.energy_j), 3),
            "switch_lp_bound_j": round(float(b), 2), "gap_to_switch_lp_pct": round(100 * (1 - float(b) / fr.energy_j), 3),
            "clock_regret_j": round(regret, 1), "priced_slack_j": round(fr.energy_j - float(b) - regret, 1),
            "switch_lp_s": round(lp_s, 1)}


def clock_regret_j(p: Problem, lp: HullLP, mu: np.ndarray, deadline_s: float, choice) -> float:
    """What the plan's clock sequences cost above the cheapest ones, summed over devices, at
    the prices ``mu`` (the per-device Lagrangian terms of :func:`solvers.lagrangian.device_viterbi`
    at ``choice`` minus their minimum). The rest of plan − bound is the priced slack:
    flow on paths shorter than the makespan."""
    ix = p.index
    fl = flow_from_duals(p, lp, mu, deadline_s)
    at = 0.0
    for seq in ix.dev_seq.values():
        for pos, v in enumerate(seq):
            k = choice[v]
            at += float(ix.cost[v][k] + fl.f[v] * ix.time[v][k])
            if pos and ix.tau[v] is not None:
                j = choice[seq[pos - 1]]
                at += float(ix.extra[v][j, k] + fl.mu_dev[v] * ix.tau[v][j, k])
    return at - device_viterbi(p, fl.f, fl.mu_dev)[0]


def write_md(milp: list[dict], bounds: list[dict], out: str) -> None:
    """Both tables as far as they are measured (called after every row: a run that stops
    early keeps what it measured)."""
    doc = doc_body(__doc__)
    text = f"# bench_switch_lp\n\n{doc}\n"
    for title, rows in (("MILP: transport matrix vs per-ω rows", milp),
                        ("Bound: the fast method vs the switch LP", bounds)):
        if rows:
            text += f"\n## {title}\n\n" + markdown_table(list(rows[0]), [list(r.values()) for r in rows])
    write_text_atomic(out, text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--large", action="store_true", help="table 2 also on 16x64")
    ap.add_argument("--limit-s", type=float, default=120.0, help="MILP time limit")
    ap.add_argument("--out", default=str(RESULTS_DIR / "bench_switch_lp.md"))
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_switch_lp_"))
    milp: list[dict] = []
    bounds: list[dict] = []
    cases = [(f"1F1B {s}x{m}, 1 ms @1.05x", pipeline(s, m, tmp)) for s, m in ((2, 4), (3, 6))]
    cases += [(f"layered DAG 40x8 seed {seed} @1.2x", layered_dag(seed)) for seed in (1, 2)]
    for name, p in cases:
        D = p.deadline_s("1.2x" if "DAG" in name else "1.05x")
        for transport in (True, False):
            milp.append(milp_row(name, p, D, transport, a.limit_s))
            print(milp[-1], flush=True)
            write_md(milp, bounds, a.out)
    sizes = [(4, 8), (8, 32)] + ([(16, 64)] if a.large else [])
    for s, m in sizes:
        p = pipeline(s, m, tmp)
        for deadline in ("1.05x", "1.2x"):
            bounds.append(bound_row(f"1F1B {s}x{m}, 1 ms", p, deadline))
            print(bounds[-1], flush=True)
            write_md(milp, bounds, a.out)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
