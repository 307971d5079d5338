"""How loose the fast method's bound is on small DAGs, where ``auto`` uses an exact method.

Two families. Tiny (``--tiny N``, default 300): the brute-force test's instances
(``tests/test_bruteforce_fuzz.py``: DAGs, fork-joins and chains of 2-6 tasks, 1-4 clocks per
task, switch costs of five kinds, deadlines 1.0-1.5x; hypothesis, derandomized), each solved by
the fast method (its plan and bound, the search on) against the exact optimum by enumeration.
Small: random 40-task DAGs on 4 GPUs (the generator of ``tests/test_solver_limits.py``: 6 clocks per
task, cross-device edges, a 10 ms / 2 J switch), seeds ``0..--seeds-1``, at 1.1x and 1.3x of
the fastest makespan. Each is solved by the fast method (its plan and its bound) and by the
MILP (``method="ilp"``; only cases it proves optimal are counted). Reported per case: the fast
plan's excess over the optimum and the fast bound's shortfall below it, both in % of the
optimum.

    python experiments/fast_bound_small_dags.py            # ~15 min on 2 cores (the MILPs)
    python experiments/fast_bound_small_dags.py --seeds 0  # the tiny family alone, ~1 min

Writes experiments/results/fast_bound_small_dags.{md,json}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "experiments"))

from _common import rows_table  # noqa: E402
from test_solver_limits import dag40  # noqa: E402

from frontier.files import write_json_atomic, write_text_atomic  # noqa: E402
from solvers import solve  # noqa: E402


def tiny_family(n: int) -> list[dict[str, float]]:
    """The fast method against enumeration on ``n`` tiny instances (module docstring)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from test_bruteforce_fuzz import instance, optimum

    out: list[dict[str, float]] = []

    @settings(max_examples=n, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.one_of(instance("dag"), instance("forkjoin"), instance("chain")))
    def one(case):
        p, D, _ = case
        opt = optimum(p, D)
        fast = solve(p, D, method="fast")
        out.append({"tasks": p.n_tasks, "fast_excess_pct": 100 * (fast.energy_j - opt) / opt,
                    "bound_short_pct": 100 * (opt - fast.lower_bound_j) / opt,
                    "fast_gap_pct": 100 * float(fast.gap)})

    one()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--tiny", type=int, default=300, help="tiny instances (0: none)")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "fast_bound_small_dags"))
    a = ap.parse_args()
    tiny = tiny_family(a.tiny) if a.tiny else []
    rows = []
    for seed in range(a.seeds):
        p = dag40(seed)
        for d in ("1.1x", "1.3x"):
            fast = solve(p, d, method="fast")
            exact = solve(p, d, method="ilp")
            if exact.status != "optimal":
                print(f"seed {seed} {d}: MILP not proven ({exact.status}); left out", flush=True)
                continue
            opt = exact.energy_j
            rows.append({"seed": seed, "deadline": d, "optimum_j": opt, "milp": exact.method,
                         "fast_excess_pct": 100 * (fast.energy_j - opt) / opt,
                         "bound_short_pct": 100 * (opt - fast.lower_bound_j) / opt,
                         "fast_gap_pct": 100 * float(fast.gap)})
            print(rows[-1], flush=True)
    keys = ("fast_excess_pct", "bound_short_pct", "fast_gap_pct")
    summary = {k: max((r[k] for r in rows), default=0.0) for k in keys}
    tiny_max = {k: max((r[k] for r in tiny), default=0.0) for k in keys}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out.with_suffix(".json"), {"rows": rows, "max": summary, "tiny": tiny,
                                                 "tiny_max": tiny_max})
    cols = ["seed", "deadline", "optimum_j", "milp", "fast_excess_pct", "bound_short_pct", "fast_gap_pct"]
    lines = ["# fast_bound_small_dags", "", __doc__.split("\n\n")[1].replace("\n", " "), "",
             f"Tiny: {len(tiny)} instances against enumeration. Largest: fast plan "
             f"+{tiny_max['fast_excess_pct']:.2f} % over the optimum; fast bound "
             f"{tiny_max['bound_short_pct']:.2f} % below it; gap the fast method reports "
             f"{tiny_max['fast_gap_pct']:.2f} %; the bound more than 1 % below the optimum in "
             f"{sum(r['bound_short_pct'] > 1 for r in tiny)} of them.", "",
             f"Small: {len(rows)} cases proven optimal by the MILP. Largest: fast plan "
             f"+{summary['fast_excess_pct']:.2f} % over the optimum; fast bound "
             f"{summary['bound_short_pct']:.2f} % below it; gap the fast method reports "
             f"{summary['fast_gap_pct']:.2f} %.", ""]
    write_text_atomic(out.with_suffix(".md"), "\n".join(lines) + "\n" + rows_table(rows, cols, 4))
    print(f"wrote {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
