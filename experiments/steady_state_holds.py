"""Does holding one clock per stage through the steady state beat the search's plan?

The natural structured plan for a long 1F1B pipeline with switch costs: keep the search's
warm-up and cool-down, and let every stage hold one clock (forward and backward alike) through
its steady-state cycles, so no switch is paid there. Holding one clock means every stage's
cycle fits the slowest stage's, and with 60 discrete clocks most stages then run a little fast.
A pipeline can also run a slower common period for its first k cycles and a faster one after
(one switch per stage), which reaches periods between the hold levels.

The fast method builds a generic form of these starts itself (``solvers/hold.py``: a common
time window and busy-time ratio instead of cycles). This script checks whether the
pipeline-specific form still finds more: at the deadline it compares the fast method's plan
with the best feasible plan of each kind over every common period in ±3 % of the plan's own
steady cycle (each stage holds its cheapest clock whose forward + backward fits it), every pair
of such periods with the largest k that meets the deadline, and a few choices of how many
cycles at each end keep the search's clocks. It is a measurement, not a bound: it shows
whether the plan leaves an easy structured improvement on the table (on 16×64 a proven gap
of 0.5 % is within 0.01–0.02 % of the plan's energy, and which side it lands moves with the
search's seed: ``experiments/search_spread.py``).
Then the fast method's search runs once more with its default budget, from the plan itself
(``searched_again``) and from the best two-level hold plan (``two_level_searched``), so the
two differ only in where the search starts; gaps are against the fast method's bound.

    python experiments/steady_state_holds.py        # 8x32 and 16x64, 1 ms, 1.05x and 1.2x
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

from solvers import load_perseus_profile  # noqa: E402
from solvers.fast import polish_budget, solve_fast  # noqa: E402
from solvers.feasibility import plan_meets_deadline as meets_deadline  # noqa: E402
from solvers.lns import Budget  # noqa: E402
from solvers.options import SolveOptions  # noqa: E402
from solvers.pipeline import task_name  # noqa: E402
from solvers.search import improve  # noqa: E402


class Holds:
    """The steady-state cycles of a 1F1B problem and plans that hold clocks through them."""

    def __init__(self, p, stages: int, microbatches: int, base: np.ndarray, deadline_s: float):
        self.ix, self.base, self.D = p.index, np.asarray(base), deadline_s
        ix = self.ix
        # cycle j of stage s: F(s, warm + j) then B(s, j), warm = S − s − 1
        self.cycles = [[(ix.pos[task_name(s, "forward", stages - s - 1 + j)],
                         ix.pos[task_name(s, "backward", j)])
                        for j in range(microbatches - (stages - s - 1))] for s in range(stages)]
        f, b = zip(*(c[len(c) // 2] for c in self.cycles))
        # holding "option i" through F and B needs option i to be the same ω for both
        if any(ix.tau[v] is None or np.diag(ix.tau[v]).any() for v in b):
            raise ValueError("hold plans need switch costs and the same clock list for F and B")
        self.hold_s = [ix.time[u] + ix.time[v] for u, v in zip(f, b)]
        self.hold_j = [ix.cost[u] + ix.cost[v] for u, v in zip(f, b)]
        mid = np.median([h[base[v]] for h, v in zip(self.hold_s, b)])
        periods = sorted({float(t) for h in self.hold_s for t in h if 0.97 * mid <= t <= 1.03 * mid})
        self.levels: list[tuple[float, tuple[int, ...]]] = []
        for per in periods:
            h = self.clocks_at(per)
            if h is not None and (not self.levels or self.levels[-1][1] != h):
                self.levels.append((per, h))

    def clocks_at(self, period_s: float) -> tuple[int, ...] | None:
        """Each stage's cheapest hold whose cycle fits ``period_s`` (None if one does not fit)."""
        out = []
        for t, c in zip(self.hold_s, self.hold_j):
            ok = np.flatnonzero(t <= period_s * (1 + 1e-12))
            if not ok.size:
                return None
            out.append(int(ok[np.argmin(c[ok])]))
        return tuple(out)

    def plan(self, slow, fast, k: int, skip_first: int, skip_last: int) -> np.ndarray:
        """``slow`` clocks for cycles < k, ``fast`` after; the first ``skip_first`` and last
        ``skip_last`` cycles of each stage keep the base plan's clocks."""
        ch = self.base.copy()
        for s, cyc in enumerate(self.cycles):
            for j, pair in enumerate(cyc[skip_first:len(cyc) - skip_last], start=skip_first):
                ch[list(pair)] = slow[s] if j < k else fast[s]
        return ch

    def feasible(self, ch: np.ndarray) -> bool:
        """Whether ``ch`` meets the deadline."""
        return self.ix.makespan(ch) <= self.D * (1 + 1e-9)

    def best(self, skip_first: int, skip_last: int, pair_span: int = 30) -> tuple[tuple, tuple]:
        """The best one-level and two-level hold plans as (energy J, choice); (inf, None) when
        none meets the deadline. The slow level of a pair is one of the ``pair_span`` next
        slower levels."""
        ix = self.ix
        one: tuple = (np.inf, None)
        two: tuple = (np.inf, None)
        n_cyc = max(len(c) for c in self.cycles)
        for a, (_, fast) in enumerate(self.levels):
            ch = self.plan(fast, fast, 0, skip_first, skip_last)
            if not self.feasible(ch):
                continue
            one = min(one, (ix.objective(ch), ch), key=lambda t: t[0])
            for _, slow in self.levels[a + 1:a + 1 + pair_span]:
                lo, hi = 0, n_cyc + 1        # largest k that meets the deadline
                while hi - lo > 1:
                    m = (lo + hi) // 2
                    if self.feasible(self.plan(slow, fast, m, skip_first, skip_last)):
                        lo = m
                    else:
                        hi = m
                if lo:
                    ch = self.plan(slow, fast, lo, skip_first, skip_last)
                    two = min(two, (ix.objective(ch), ch), key=lambda t: t[0])
        return one, two


def searched(p, start: np.ndarray, deadline_s: float) -> float:
    """Energy (J) after the fast method's first search (its caps and seed) runs from
    ``start`` with its default budget."""
    ix = p.index
    work, cap = polish_budget(ix.n, None)
    out = improve(p, [start], deadline_s, Budget.of(work, cap), SolveOptions().search.settings)
    return min(ix.objective(c) for c in out if meets_deadline(p, c, deadline_s))


def compare(stages: int, microbatches: int, switch_s: float, deadline: str, prof: Path) -> dict:
    """The fast plan against the best one- and two-level hold plans at one deadline."""
    p = load_perseus_profile(prof, P2P_W, microbatches, transitions=idle_priced_switch(switch_s))
    D = p.deadline_s(deadline)
    fr = solve_fast(p, D)
    t0 = time.perf_counter()
    h = Holds(p, stages, microbatches, fr.choice, D)
    one: tuple = (np.inf, None)
    two: tuple = (np.inf, None)
    for first in (0, stages // 2, stages):
        for last in (0, stages // 2):
            o, t = h.best(first, last)
            one, two = min(one, o, key=lambda r: r[0]), min(two, t, key=lambda r: r[0])
    sweep_s = time.perf_counter() - t0

    def over(e: float) -> float | str:
        return round(100 * float(e / fr.energy_j - 1), 3) if np.isfinite(e) else "none fits"

    def gap(e: float) -> float:
        return round(100 * float(1 - fr.lower_bound_j / e), 3)

    # the same extra search budget from the plan itself and from the best two-level hold
    again = searched(p, fr.choice, D)
    from_hold = searched(p, two[1], D) if two[1] is not None else np.inf
    return {"case": f"{stages}x{microbatches} @{deadline}", "plan_j": round(fr.energy_j, 1),
            "plan_gap_pct": gap(fr.energy_j), "hold_levels": len(h.levels),
            "one_level_over_plan_pct": over(one[0]), "two_level_over_plan_pct": over(two[0]),
            "sweep_s": round(sweep_s, 1),
            "searched_again_gap_pct": gap(again),
            "two_level_searched_gap_pct": gap(from_hold) if np.isfinite(from_hold) else "",
            "two_level_searched_j": round(float(from_hold), 1) if np.isfinite(from_hold) else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--switch-ms", type=float, default=1.0)
    ap.add_argument("--out", default=str(RESULTS_DIR / "steady_state_holds.md"))
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="steady_holds_"))
    rows = []
    for stages, mb in ((8, 32), (16, 64)):
        prof = make_profile(stages, tmp)
        for deadline in ("1.05x", "1.2x"):
            rows.append(compare(stages, mb, a.switch_ms * 1e-3, deadline, prof))
            print(rows[-1], flush=True)
            head = list(rows[0])
            text = (f"# steady_state_holds\n\n{doc_body(__doc__)}\n\n"
                    f"Switch latency {a.switch_ms:g} ms (energy = idle power × latency), 60 clocks; "
                    "`*_over_plan_pct`: how much more the best such plan spends than the fast "
                    "method's plan (positive: the plan is better).\n\n"
                    + markdown_table(head, [[r[h] for h in head] for r in rows]))
            write_text_atomic(a.out, text)          # after every row: a stopped run keeps them
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
