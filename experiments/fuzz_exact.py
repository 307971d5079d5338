"""Nightly-style brute-force fuzz of every method (issue 22): many more instances than the tests.

Runs the checks of ``tests/test_bruteforce_fuzz.py`` (its instance strategies, numpy oracle
and per-plan checks) with hypothesis, not derandomized, ``--per-check`` examples each: the
chain DP, the series–parallel DP, the fast method's bound and starts, the fast method with
its search and switch bound, the MILP (HiGHS where ``highspy`` is installed, else CBC), and
``solvers.brute``. On a failure hypothesis shrinks the instance and prints it; the run exits 1.

    python experiments/fuzz_exact.py                     # 2,000 per check (about 20 min)
    python experiments/fuzz_exact.py --per-check 300 --seed 7

Writes experiments/results/fuzz_exact.json (counts per check, wall time, solver back end).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_bruteforce_fuzz import BOUND_REL_TOL, check, instance, optimum  # noqa: E402

from frontier.files import write_json_atomic  # noqa: E402
from solvers import solve  # noqa: E402
from solvers.brute import brute_force  # noqa: E402
from solvers.fast import solve_fast  # noqa: E402
from solvers.ilp import available_solvers  # noqa: E402


def _dp(case):
    p, D, _ = case
    pl = solve(p, D, method="dp")
    check(pl.energy_j, pl.makespan_s, pl.lower_bound_j, optimum(p, D), D, pl.status == "optimal")
    assert pl.status == "optimal"


def _sp(case):
    p, D, _ = case
    pl = solve(p, D, method="sp")
    check(pl.energy_j, pl.makespan_s, pl.lower_bound_j, optimum(p, D), D, pl.status == "optimal")
    assert pl.method == "sp" and pl.status == "optimal"


def _fast_bound(case):
    p, D, _ = case
    r = solve_fast(p, D, search_work=0.0)
    check(r.energy_j, p.index.makespan(r.choice), r.lower_bound_j, optimum(p, D), D, False, BOUND_REL_TOL)


def _method(name):
    def run(case):
        p, D, _ = case
        pl = solve(p, D, method=name)
        check(pl.energy_j, pl.makespan_s, pl.lower_bound_j, optimum(p, D), D, pl.status == "optimal",
              BOUND_REL_TOL)
        assert not pl.time_capped
    return run


def _brute(case):
    p, D, _ = case
    _, e = brute_force(p, D)
    assert abs(e - optimum(p, D)) <= 1e-9 * max(abs(e), 1.0)


def _counting(body, count: list[int]):
    """``body`` that counts the instances it passed in ``count[0]`` (@given takes no defaults)."""
    def counted(case):
        body(case)
        count[0] += 1
    return counted


ANY = st.one_of(instance("dag"), instance("forkjoin"), instance("chain"))
CHECKS = {
    "chain dp": (_dp, instance("chain"), 1.0),
    "series-parallel dp": (_sp, instance("forkjoin", ("none",)), 1.0),
    "fast bound + starts": (_fast_bound, ANY, 1.0),
    "fast with search": (_method("fast"), ANY, 0.1),
    "milp": (_method("ilp"), st.one_of(instance("dag"), instance("forkjoin")), 0.1),
    "solvers.brute": (_brute, ANY, 0.5),
}


def main() -> int:
    """Run every check; print and write the counts."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-check", type=int, default=2000,
                    help="examples of the cheap checks (the search and MILP checks get a tenth)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "fuzz_exact.json"))
    a = ap.parse_args()
    rows, failed = [], False
    for name, (body, strategy, share) in CHECKS.items():
        count = [0]
        counted = _counting(body, count)
        n = max(1, int(a.per_check * share))
        test = seed(a.seed)(settings(max_examples=n, deadline=None, database=None,
                                     suppress_health_check=list(HealthCheck))(given(strategy)(counted)))
        t0 = time.perf_counter()
        ok = True
        try:
            test()
        except Exception:                 # hypothesis has printed the shrunk instance
            traceback.print_exc()
            ok, failed = False, True
        rows.append({"check": name, "instances": count[0], "passed": ok,
                     "wall_s": round(time.perf_counter() - t0, 1)})
        print(rows[-1], flush=True)
    total = sum(r["instances"] for r in rows)
    summary = {"instances": total, "all_passed": not failed, "milp_solver": (available_solvers() or [None])[0],
               "seed": a.seed, "checks": rows}
    print(f"{total} instances, {'all passed' if not failed else 'FAILURES'}")
    write_json_atomic(a.out, summary)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
