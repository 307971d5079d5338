"""What does holding discrete clocks cost in the steady state of a long 1F1B pipeline?

The hull LP gives every task a fractional clock, so every stage fits the pipeline's common
steady-state period exactly. A real plan with switch costs holds one clock for a stage's
forward and backward in a cycle (switching between them costs two latencies a cycle). This
script takes the LP at the deadline, keeps its per-cycle times (F + B of each stage's
steady-state cycle) and charges each cycle the cheapest integer pair that fits that time:
holding one clock, or two clocks with two switch latencies. The sum over all cycles, against
the LP's own cost of those tasks, is the *rounding loss*: what the LP does not see and no
LP-class bound can recover. It is an estimate, not a bound (a plan may pick other cycle
times), but it shows where the proven gap with switch costs comes from.

    python experiments/steady_state_rounding.py            # 16x64 and 8x32, 1 ms, 1.05x and 1.2x
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from _common import RESULTS_DIR, doc_body, markdown_table, write_text_atomic  # noqa: E402
from bench_solvers import P2P_W, idle_priced_switch, make_profile  # noqa: E402

from solvers import load_perseus_profile  # noqa: E402
from solvers.hull_lp import HullLP  # noqa: E402
from solvers.pipeline import task_name  # noqa: E402


def hull_cost(lp: HullLP, v: int, time_s: float) -> float:
    """The LP's effective energy of task ``v`` at (fractional) time ``time_s``."""
    ix = lp.p.index
    h = lp.hulls[v]
    o = np.argsort(ix.time[v][h])
    return float(np.interp(time_s, ix.time[v][h][o], ix.cost[v][h][o]))


def rounding_loss(stages: int, microbatches: int, switch_s: float, deadline: str, prof: Path) -> dict:
    """Steady-state rounding loss of one pipeline at one deadline (J and % of the LP bound)."""
    p = load_perseus_profile(prof, P2P_W, microbatches,
                             transitions=idle_priced_switch(switch_s))
    ix = p.index
    D = p.deadline_s(deadline)
    lp = HullLP(p)
    res = lp.solve(D)
    loss = 0.0
    cycles = 0
    periods = []
    for s in range(stages):
        warm = min(stages - s - 1, microbatches)
        for k in range(microbatches - warm):
            f = ix.pos[task_name(s, "forward", warm + k)]
            b = ix.pos[task_name(s, "backward", k)]
            period = res.time_s[f] + res.time_s[b]
            lp_cost = hull_cost(lp, f, res.time_s[f]) + hull_cost(lp, b, res.time_s[b])
            # rows: forward option, columns: backward option; two switches a cycle when they differ
            t = ix.time[f][:, None] + ix.time[b][None, :] + 2 * switch_s * (ix.tau[b] > 0)
            c = ix.cost[f][:, None] + ix.cost[b][None, :]
            fits = t <= period * (1 + 1e-12)
            loss += float(c[fits].min()) - lp_cost
            cycles += 1
            periods.append(period)
    return {"case": f"{stages}x{microbatches} @{deadline}", "lp_bound_j": round(res.bound_j, 1),
            "cycles": cycles, "median_period_ms": round(1e3 * float(np.median(periods)), 2),
            "loss_j": round(loss, 1), "loss_pct": round(100 * loss / res.bound_j, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--switch-ms", type=float, default=1.0)
    ap.add_argument("--out", default=str(RESULTS_DIR / "steady_state_rounding.md"))
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="steady_state_"))
    rows = []
    for stages, mb in ((8, 32), (16, 64)):
        prof = make_profile(stages, tmp)
        for deadline in ("1.05x", "1.2x"):
            r = rounding_loss(stages, mb, a.switch_ms * 1e-3, deadline, prof)
            print(r, flush=True)
            rows.append(r)
    head = list(rows[0])
    text = (f"# steady_state_rounding\n\n{doc_body(__doc__)}\n\n"
            f"Switch latency {a.switch_ms:g} ms (energy = idle power × latency), 60 clocks.\n\n"
            + markdown_table(head, [[r[h] for h in head] for r in rows]))
    write_text_atomic(a.out, text)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
