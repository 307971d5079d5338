"""Snapshot of what the planners return on a fixed set of instances, for refactoring checks.

Plans the 4x8 1F1B example (``ecal/examples/pipeline_4x8.csv``) without and with 1 ms
switches at 1.05x and 1.2x by ``fast``, ``ilp`` and ``auto``; random small chains by ``dp``,
``brute`` and ``fast``; small random DAGs by ``ilp`` and ``fast``; a series–parallel
fork–join by ``sp`` and ``auto``; the steady-state workload ``ecal/examples/workload_1f1b.json``
(its ``auto`` is the MILP, solved to optimality); and 8-point curves of 4x8 and of the steady
state (fast). The MILP on 4x8 stops at its wall-clock safety net (given 3 s here), so its
plan depends on the machine: for it only the method, the status and whether it is at most
the fast plan's energy are recorded. Every plan's method, status, choice, energy, bound and makespan (floats as
``repr``, so equal output means bit-identical plans) and the fast search's work record (wall
times left out) go to one JSON file. Refactor, run it before and after, and diff::

    python experiments/solver_snapshot.py -o /tmp/before.json
    python experiments/solver_snapshot.py -o /tmp/after.json
    cmp /tmp/before.json /tmp/after.json

About a minute on a loaded 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from solvers import ConstantTransition, Problem, load_problem, pareto, solve  # noqa: E402

EXAMPLES = ROOT / "ecal" / "examples"
SWITCH = ConstantTransition(0.001, 0.0)


def _f(x: float) -> str:
    """A float as its shortest round-trip text (equal text: equal bits)."""
    return repr(float(x))


def _search(meta) -> dict | None:
    """The fast search's record without its wall-clock fields."""
    s = dict(meta or {}).get("search")
    if not s:
        return None
    out = {k: v for k, v in s.items() if k not in ("time_cap_s",)}
    return json.loads(json.dumps(out))


def plan_record(plan) -> dict:
    """What must not change: method, status, choice, energy, bound, makespan, search work."""
    return {
        "method": plan.method, "status": plan.status,
        "choice": [t.option for t in plan.tasks],
        "energy_j": _f(plan.energy_j), "lower_bound_j": _f(plan.lower_bound_j),
        "makespan_s": _f(plan.makespan_s), "time_capped": plan.time_capped,
        "search": _search(plan.meta),
        "meta": {k: v for k, v in dict(plan.meta).items() if k in ("labels", "milp_status", "carried_from_s")},
    }


def curve_record(curve) -> dict:
    """Every grid plan, every interpolated point and its choice."""
    dense = [[_f(m), _f(e), _f(b)] for m, e, b in curve.dense]
    choices = [] if curve.dense_choices is None else np.asarray(curve.dense_choices).tolist()
    return {"method": curve.method, "plans": [plan_record(p) for p in curve.plans],
            "dense": dense, "dense_choices": choices}


def _options(rng, k: int, w: float = 1.0) -> list[dict]:
    f = np.sort(rng.choice(np.linspace(0.4, 1.0, 9), k, replace=False))
    t = w * (0.3 + 0.7 / f)
    return [dict(time_s=float(ti), energy_j=float(ti * (5 + 12 * fi**3) + w), s_w=5.0,
                 sm_clock_mhz=float(round(fi * 1000))) for ti, fi in zip(t, f)]


def chain(rng, n: int, k: int, tr=None) -> Problem:
    """A random chain of ``n`` tasks with ``k`` options each on one device."""
    tasks = [(f"t{i}", "g0", _options(rng, k, rng.uniform(0.5, 1.5))) for i in range(n)]
    return Problem.build(tasks, [(f"t{i}", f"t{i + 1}") for i in range(n - 1)], {"g0": 3.0}, tr)


def fork_join(rng, k: int) -> Problem:
    """((a ; (b ‖ c)) ; d) ‖ (e ; f) on three devices: series–parallel."""
    tasks = [(x, f"g{i // 2}", _options(rng, k)) for i, x in enumerate("abcdef")]
    return Problem.build(tasks, [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")],
                         {"g0": 3.0, "g1": 3.0, "g2": 2.0})


def random_dag(rng, n: int, k: int, tr=None) -> Problem:
    """A random DAG of ``n`` tasks with ``k`` options each on two devices."""
    tasks = [(f"t{i}", f"g{i % 2}", _options(rng, k, rng.uniform(0.5, 1.5))) for i in range(n)]
    edges = [(f"t{i}", f"t{j}") for i in range(n) for j in range(i + 1, n) if rng.random() < 0.35]
    return Problem.build(tasks, edges, {"g0": 3.0, "g1": 3.0}, tr)


def timed_ilp_record(plan, fast) -> dict:
    """The machine-independent part of a MILP plan cut short by its safety net."""
    return {"method": plan.method, "status": plan.status,
            "not_above_fast": bool(plan.energy_j <= fast.energy_j)}


def snapshot() -> dict:
    """Every case's record, keyed by case name."""
    out: dict[str, dict] = {}
    csv = EXAMPLES / "pipeline_4x8.csv"
    for sw_name, tr in (("free", None), ("1ms", SWITCH)):
        p = load_problem(csv, p2p_power_w=75.0, n_microbatches=8, transitions=tr)
        for d in ("1.05x", "1.2x"):
            for m in ("fast", "auto"):
                out[f"4x8/{sw_name}/{d}/{m}"] = plan_record(solve(p, d, method=m))
            fast = solve(p, d, method="fast")
            out[f"4x8/{sw_name}/{d}/ilp"] = timed_ilp_record(solve(p, d, method="ilp", time_limit_s=3.0), fast)
        out[f"4x8/{sw_name}/pareto8"] = curve_record(pareto(p, n_points=8, method="fast"))
    rng = np.random.default_rng(7)
    for i in range(4):
        tr = None if i % 2 == 0 else ConstantTransition(0.2, 4.0)
        p = chain(rng, 6, 3, tr)
        D = p.fastest_makespan_s() * (1.1 + 0.1 * i)
        for m in ("dp", "brute", "fast"):
            out[f"chain{i}/{m}"] = plan_record(solve(p, D, method=m))
    rng = np.random.default_rng(11)
    for i in range(3):
        tr = None if i == 0 else ConstantTransition(0.1 * i, 2.0)
        p = random_dag(rng, 7, 3, tr)
        D = p.fastest_makespan_s() * 1.15
        for m in ("ilp", "fast"):
            out[f"dag{i}/{m}"] = plan_record(solve(p, D, method=m))
    p = fork_join(np.random.default_rng(3), 3)
    for m in ("sp", "auto", "fast"):
        out[f"sp/{m}"] = plan_record(solve(p, p.fastest_makespan_s() * 1.15, method=m))
    from execution.workload import load_workload

    wl = load_workload(EXAMPLES / "workload_1f1b.json")
    for d in ("1.05x", "1.2x"):
        for m in ("fast", "auto"):
            out[f"steady/{d}/{m}"] = plan_record(solve(wl.problem, d, method=m))
    out["steady/pareto8"] = curve_record(pareto(wl.problem, n_points=8, method="fast"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--output", default="-", help="JSON file (default: stdout)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    text = json.dumps(snapshot(), indent=1, sort_keys=True) + "\n"
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
    print(f"snapshot in {time.perf_counter() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
