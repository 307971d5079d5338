"""How far is the fast method from the optimum when clock switches cost time?

For 1F1B pipelines with 1 ms switches (Perseus-format profiles, by default every 3rd of the 60
clocks so that a MILP is tractable) this compares, at given factors of the fastest makespan:

* the fast method (``solve(..., method="fast")``): plan energy and proven lower bound;
* the LP relaxation of the exact MILP with the transportation linearisation of switches
  (solver-notes §4), the strongest bound an LP/Lagrangian method can reach here;
* HiGHS's MILP (``scipy.optimize.milp``) on the same model after ``--milp-s`` seconds: its
  incumbent and its proven bound, and whether it proved the incumbent optimal.

Where HiGHS proves optimality, ``optimum_over_transport_lp_pct`` is how far the true optimum
lies above the strongest LP bound: a proven gap can never be smaller than that with an
LP-class bound, however good the plan.

It answers whether the remaining gap of the fast method lies in its plan or in LP-class
bounds. With ``--radius R`` it runs instead HiGHS on the options within R clock steps of the
fast plan's (:func:`neighbourhood_case`): is there a cheaper plan next to ours? Takes about
(cases × deadlines × milp-s) seconds.

    python experiments/switch_gap_study.py --milp-s 120
    python experiments/switch_gap_study.py --cases 2x4,4x4,3x6 --deadlines 1.05x,1.2x --milp-s 240
    python experiments/switch_gap_study.py --cases 4x8 --clock-step 1 --radius 4 --milp-s 150
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from _common import markdown_table  # noqa: E402
from bench_solvers import P2P_W, idle_priced_switch, make_profile  # noqa: E402

from frontier.files import write_json_atomic, write_text_atomic  # noqa: E402
from solvers import load_perseus_profile, solve  # noqa: E402
from solvers.model import Problem  # noqa: E402


def thinned_profile(stages: int, step: int, out_dir: Path) -> Path:
    """The shared generator's profile keeping every ``step``-th clock from 1980 MHz down."""
    src = make_profile(stages, out_dir)
    with open(src, newline="") as fh:
        rows = list(csv.reader(fh))
    keep = [r for r in rows[1:] if ((1980 - int(r[2])) // 15) % step == 0]
    dst = out_dir / f"profile_{stages}_every{step}.csv"
    with open(dst, "w", newline="") as fh:
        csv.writer(fh).writerows([rows[0]] + keep)
    return dst


def exact_model(p: Problem, deadline_s: float, allowed: list[np.ndarray] | None = None):
    """The compact MILP (options x, starts S, makespan M, transport y per device edge) as
    (c, A, row_lo, row_hi, upper bounds, integrality, option-column offsets), over each task's
    ``allowed`` option indices (default: all)."""
    ix = p.index
    n = ix.n
    al = [np.arange(k) for k in ix.k] if allowed is None else [np.asarray(a) for a in allowed]
    col = n + 1
    xo = []
    for v in range(n):
        xo.append(col)
        col += al[v].size
    yo = {}
    for w in range(n):
        u = ix.dev_prev[w]
        if u >= 0 and ix.tau[w] is not None:
            yo[w] = col
            col += al[u].size * al[w].size
    c = np.zeros(col)
    c[n] = ix.p_total
    integ = np.zeros(col)
    ub = np.ones(col)
    ub[:n + 1] = deadline_s
    for v in range(n):
        c[xo[v]:xo[v] + al[v].size] = ix.cost[v][al[v]]
        integ[xo[v]:xo[v] + al[v].size] = 1
    for w, o in yo.items():
        sub = np.ix_(al[ix.dev_prev[w]], al[w])
        c[o:o + sub[0].size * sub[1].size] = ix.extra[w][sub].ravel()
    R, C, V, lo, hi = [], [], [], [], []

    def row(cols, vals, a, b):
        R.extend([len(lo)] * len(cols))
        C.extend(cols)
        V.extend(vals)
        lo.append(a)
        hi.append(b)

    def dur(v):
        return list(range(xo[v], xo[v] + al[v].size)), [-float(t) for t in ix.time[v][al[v]]]

    for v in range(n):
        row(list(range(xo[v], xo[v] + al[v].size)), [1.0] * al[v].size, 1, 1)
    for u, w in ix.edges:
        dc, dv = dur(u)
        row([w, u] + dc, [1, -1] + dv, 0, np.inf)
    for w in range(n):
        u = ix.dev_prev[w]
        if u < 0:
            continue
        dc, dv = dur(u)
        cols, vals = [w, u] + dc, [1, -1] + dv
        if w in yo:
            ku, kw, o = al[u].size, al[w].size, yo[w]
            t = ix.tau[w][np.ix_(al[u], al[w])].ravel()
            nz = np.flatnonzero(t)
            cols += list(o + nz)
            vals += list(-t[nz])
            for a in range(ku):
                row(list(o + a * kw + np.arange(kw)) + [xo[u] + a], [1.0] * kw + [-1.0], 0, 0)
            for b in range(kw):
                row(list(o + np.arange(ku) * kw + b) + [xo[w] + b], [1.0] * ku + [-1.0], 0, 0)
        row(cols, vals, 0, np.inf)
    for v in range(n):
        if not ix.succs[v] and ix.dev_next[v] < 0:
            dc, dv = dur(v)
            row([n, v] + dc, [1, -1] + dv, 0, np.inf)
    A = coo_matrix((V, (R, C)), shape=(len(lo), col)).tocsr()
    return c, A, np.array(lo), np.array(hi), ub, integ, xo


def decode(x: np.ndarray, xo: list[int], allowed: list[np.ndarray]) -> list[int]:
    """Option index per task from an :func:`exact_model` solution."""
    return [int(a[np.argmax(x[o:o + a.size])]) for o, a in zip(xo, allowed)]


def run_case(p: Problem, milp_s: float, deadline: str = "1.05x") -> dict:
    """Fast method, transport LP and time-limited MILP at ``deadline`` on one problem."""
    D = p.deadline_s(deadline)
    ix = p.index
    fast = solve(p, D, method="fast")
    c, A, lo, hi, ub, integ, xo = exact_model(p, D)
    cons = LinearConstraint(A, lo, hi)
    t0 = time.perf_counter()
    lp = milp(c, constraints=cons, integrality=np.zeros_like(integ), bounds=Bounds(np.zeros_like(ub), ub))
    lp_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    mi = milp(c, constraints=cons, integrality=integ, bounds=Bounds(np.zeros_like(ub), ub),
              options={"time_limit": milp_s, "disp": False})
    mi_s = time.perf_counter() - t0
    inc = None
    if mi.x is not None:
        ch = decode(mi.x, xo, [np.arange(k) for k in ix.k])
        inc = ix.objective(ch) if ix.makespan(ch) <= D * (1 + 1e-9) else None
    bound = getattr(mi, "mip_dual_bound", None)
    best = min(x for x in (fast.energy_j, inc) if x is not None)
    optimal = mi.status == 0 and inc is not None
    return {"case": p.name.split(":")[-1], "deadline": deadline, "tasks": ix.n, "options": ix.k[0],
            "fast_energy_j": fast.energy_j, "fast_bound_j": fast.lower_bound_j,
            "fast_gap_pct": 100 * fast.gap, "fast_wall_s": fast.wall_s,
            "transport_lp_j": float(lp.fun), "transport_lp_s": lp_s,
            "milp_incumbent_j": inc, "milp_bound_j": bound, "milp_s": mi_s, "milp_optimal": optimal,
            "optimum_over_transport_lp_pct": 100 * (inc / lp.fun - 1) if optimal else None,
            "fast_vs_milp_incumbent_pct": 100 * (fast.energy_j / inc - 1) if inc else None,
            "best_plan_over_transport_lp_pct": 100 * (best / lp.fun - 1),
            "fast_bound_below_transport_lp_pct": 100 * (1 - fast.lower_bound_j / lp.fun)}


def neighbourhood_case(p: Problem, milp_s: float, deadline: str, radius: int) -> dict:
    """HiGHS's MILP restricted to the options within ``radius`` clock steps of the fast plan's
    (it may move every task at once, which the fast method's one-path moves cannot): how much
    cheaper a plan lies next to ours. Its bound holds for that neighbourhood only, and a run
    that ends on the time limit depends on the machine's speed."""
    D = p.deadline_s(deadline)
    ix = p.index
    fast = solve(p, D, method="fast")
    ch = [t.option for t in fast.tasks]
    allowed = [np.arange(max(0, c - radius), min(k, c + radius + 1)) for c, k in zip(ch, ix.k)]
    c, A, lo, hi, ub, integ, xo = exact_model(p, D, allowed)
    t0 = time.perf_counter()
    mi = milp(c, constraints=LinearConstraint(A, lo, hi), integrality=integ,
              bounds=Bounds(np.zeros_like(ub), ub), options={"time_limit": milp_s, "disp": False})
    mi_s = time.perf_counter() - t0
    inc = None
    if mi.x is not None:
        new = decode(mi.x, xo, allowed)
        inc = ix.objective(new) if ix.makespan(new) <= D * (1 + 1e-9) else None
    best = min(fast.energy_j, inc if inc is not None else np.inf)
    return {"case": p.name.split(":")[-1], "deadline": deadline, "tasks": ix.n, "options": ix.k[0],
            "radius": radius, "fast_energy_j": fast.energy_j, "fast_gap_pct": 100 * fast.gap,
            "fast_wall_s": fast.wall_s, "neighbourhood_energy_j": inc, "milp_s": round(mi_s, 1),
            "milp_optimal": bool(mi.status == 0),
            "milp_plan_vs_fast_pct": 100 * (inc / fast.energy_j - 1) if inc is not None else None,
            "best_vs_fast_pct": 100 * (best / fast.energy_j - 1),
            "gap_with_best_pct": 100 * (1 - fast.lower_bound_j / best)}       # as Plan.gap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--milp-s", type=float, default=120.0, help="MILP time limit per case")
    ap.add_argument("--cases", default="4x8,8x8,16x16,8x32", help="stages x microbatches, comma-separated")
    ap.add_argument("--deadlines", default="1.05x", help="deadline factors, comma-separated")
    ap.add_argument("--clock-step", type=int, default=3, help="keep every k-th of the 60 clocks")
    ap.add_argument("--radius", type=int, default=None,
                    help="instead: HiGHS on the options within this many clock steps of the fast plan")
    ap.add_argument("--out", default=None, help="output stem (default results/switch_gap_study, "
                    "or results/switch_gap_neighbourhood with --radius)")
    a = ap.parse_args()
    if a.clock_step < 1 or (a.radius is not None and a.radius < 0):
        ap.error("--clock-step must be >= 1 and --radius >= 0")
    stem = "switch_gap_study" if a.radius is None else "switch_gap_neighbourhood"
    out = Path(a.out or ROOT / "experiments" / "results" / stem)
    tmp = Path(tempfile.mkdtemp(prefix="switch_gap_"))
    rows = []
    for case in a.cases.split(","):
        S, N = (int(x) for x in case.split("x"))
        prof = thinned_profile(S, a.clock_step, tmp)
        p = load_perseus_profile(prof, P2P_W, N, transitions=idle_priced_switch(1e-3))
        for deadline in a.deadlines.split(","):
            rows.append(run_case(p, a.milp_s, deadline) if a.radius is None
                        else neighbourhood_case(p, a.milp_s, deadline, a.radius))
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
            # after every case (each may take minutes): an interrupted run keeps what it measured
            write_json_atomic(out.with_suffix(".json"), {"milp_s": a.milp_s, "rows": rows})
            write_md(rows, a.milp_s, out.with_suffix(".md"), neighbourhood=a.radius is not None)
    print(f"wrote {out.with_suffix('.md')}")


NOTES = """Columns: `fast_gap_pct` = the fast method's proven gap (plan vs its own bound);
`fast_vs_milp_incumbent_pct` = its plan vs HiGHS's best plan after `milp_s` (negative: ours
is better); `best_plan_over_transport_lp_pct` = the better of the two plans above the LP
relaxation of the exact model; `milp_bound_over_transport_lp_pct` = how far HiGHS's branch
and bound lifted the bound above that LP; `fast_bound_below_transport_lp_pct` = how far our
bound is below it. With a bound no stronger than that LP, no proven gap can be smaller than
`best_plan_over_transport_lp_pct` unless some method finds a better plan. `milp_optimal`:
HiGHS proved its plan optimal within `milp_s` (to its default relative gap, 0.01 %); then
`optimum_over_transport_lp_pct` is the optimum's excess over that LP, the smallest gap any
plan can prove with an LP-class bound."""


NEIGHBOURHOOD_NOTES = """HiGHS's MILP over the options within `radius` clock steps of the fast plan's, every task
free at once, started cold. `milp_plan_vs_fast_pct` = HiGHS's best plan after `milp_s`
against the fast plan; `best_vs_fast_pct` = the better of the two against the fast plan
(negative: a cheaper plan lies next to ours); `gap_with_best_pct` = the gap the fast method's
own bound would prove for it. The neighbourhood MILP's bound holds for the neighbourhood
only, and a run that ends on the time limit depends on the machine."""


def write_md(rows: list[dict], milp_s: float, path: Path, neighbourhood: bool = False) -> None:
    """The markdown table of :func:`run_case` (or :func:`neighbourhood_case`) rows."""
    if neighbourhood:
        cols = ["case", "deadline", "tasks", "options", "radius", "fast_gap_pct", "milp_s",
                "milp_optimal", "milp_plan_vs_fast_pct", "best_vs_fast_pct", "gap_with_best_pct"]
        notes = NEIGHBOURHOOD_NOTES
    else:
        rows = [dict(r, milp_bound_over_transport_lp_pct=None if r.get("milp_bound_j") is None
                     else 100 * (r["milp_bound_j"] / r["transport_lp_j"] - 1)) for r in rows]
        cols = ["case", "deadline", "tasks", "options", "fast_gap_pct", "fast_wall_s",
                "fast_vs_milp_incumbent_pct", "best_plan_over_transport_lp_pct",
                "milp_bound_over_transport_lp_pct", "fast_bound_below_transport_lp_pct", "milp_optimal",
                "optimum_over_transport_lp_pct"]
        notes = NOTES
    # round first so that a rounding error of -1e-14 prints as 0.000, not -0.000
    fmt = lambda v: "" if v is None else (f"{round(v, 3) + 0.0:.3f}" if isinstance(v, float) else str(v))  # noqa: E731
    lines = ["# " + path.stem, "", __doc__.split("\n\n")[1].strip() + "\n" + __doc__.split("\n\n")[2].strip(),
             "", f"MILP: HiGHS via scipy.optimize.milp, {milp_s:g} s per case.", "", notes, ""]
    table = markdown_table(cols, [[fmt(r.get(c)) for c in cols] for r in rows])
    write_text_atomic(path, "\n".join(lines) + "\n" + table)


if __name__ == "__main__":
    main()
