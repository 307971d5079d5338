"""Fast method for large DAGs with a lower bound on every plan (solver-notes §3.2, §7).

1. **Convex-hull LP relaxation** (HiGHS through ``scipy.optimize.linprog``): each task's
   options are replaced by the lower convex hull of its (T, effective energy) points, so a task
   may take any time on the hull; precedence and same-device order are kept, switch costs
   dropped. Its optimum is a valid lower bound.
2. **Lagrangian bound with switches**: the LP's duals are an s–t flow μ on the precedence
   edges. For any such flow the problem separates per device into a chain with per-task weight
   ``cost + f_v·T`` plus switch costs ``extra + μ_e·τ``, solved exactly by a Viterbi pass.
   The resulting bound is ≥ the LP bound when switches cost something; conservation errors of
   the numerical duals are charged explicitly (S boxed in [0, D]), so the bound stays valid.
3. **Rounding and repair**: each task takes the cheapest option no slower than its LP time
   (the schedule then fits the LP makespan), the Lagrangian per-device choice is a second
   candidate; a greedy *crash* speeds up critical tasks with the least Δenergy/Δtime until the
   deadline holds (switch latencies included), and a *relax* pass gives each task the cheapest
   option its float allows.
4. **With switch costs**: starts that meet the deadline as built are improved by exact path
   re-planning and iterated kicks (:mod:`solvers.lns`), and the bound also tries the duals of
   the LP with constant switch costs where it is small (:mod:`solvers.switch_lp`), else of
   an LP that charges part of a switch on every device edge (:func:`switch_surrogate_duals`),
   and raises the best of them by supergradient ascent over conserving flows
   (:mod:`solvers.ascent`), to within about 1 J of the LP with switch costs on 16x64 1F1B.
   From ``PORTFOLIO_MIN_TASKS`` tasks a second search with other DP caps (``PORTFOLIO``)
   runs in a worker process (:mod:`solvers.workers`) meanwhile; the cheaper plan wins.
"""

from __future__ import annotations

import math
import os
import sys
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from .ascent import ASCENT_ITERS, flow_ascent_capped
from .feasibility import check_bound, latest_makespan_s, meets_deadline, plan_meets_deadline
from .hold import best_hold, held_problem, held_problem_values, replan_levels, wrap_polish
from .lns import Budget, iterated_polish, polish, windowed_rounding
from .model import Problem
from .switch_lp import switch_lp_duals
from .workers import GRACE_S, available_cpus, start


def _quiet_highs(highspy):
    """A ``highspy.Highs`` with logging off. Its constructor prints a banner on the C-level
    stdout before any option can be set, which would corrupt ``ecal ... --json`` output, so
    file descriptor 1 is pointed at /dev/null while it is built."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
            h = highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    h.setOptionValue("output_flag", False)
    return h


def lower_hull(t: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Indices of the lower-left convex hull of points (t, c), by increasing t (decreasing c)."""
    o = np.lexsort((c, t))
    hull: list[int] = []
    for i in o:
        if hull and c[i] >= c[hull[-1]]:
            continue                          # slower and not cheaper: dominated
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # keep b only if it lies strictly below the segment a–i
            cross = (t[b] - t[a]) * (c[i] - c[a]) - (c[b] - c[a]) * (t[i] - t[a])
            if cross <= 0:
                hull.pop()
            else:
                break
        hull.append(int(i))
    return np.array(hull, dtype=int)


@dataclass(frozen=True)
class LPResult:
    """The relaxation at one deadline: bound, per-task LP time, makespan and edge duals."""

    bound_j: float
    time_s: np.ndarray
    makespan_s: float
    duals: np.ndarray          # μ ≥ 0 per row of the precedence block (see HullLP.rows)
    slope_j_per_s: float = 0.0  # d bound / d deadline (≤ 0): the LP value is convex in D
    deadline_s: float = math.nan  # the deadline it was solved at


class HullLP:
    """The convex-hull LP of a problem, built once and re-solved for several deadlines.

    Each task's cost is the lower convex hull of its options, piecewise linear in its time.
    The LP is written in *incremental* form: a task starts at its slowest hull vertex and
    buys time on the hull's segments, δ_k ∈ [0, length_k] s at slope_k J/s (slopes rise
    toward the fast end, so the LP fills them in order without binaries). Columns: start
    times S_0..S_{n-1}, the makespan M (M ≤ D), then the δ's; rows: one per precedence pair,
    S_u + t_slow_u − Σ δ_u − S_w ≤ 0, and S_v + t_slow_v − Σ δ_v − M ≤ 0 for tasks without
    successors. Same optimum as the convex-combination form (a λ per hull vertex and one
    equality row per task), in fewer rows: measured 2.4× faster per solve on 8x32 1F1B."""

    def __init__(self, p: Problem):
        ix = p.index
        self.p = p
        n = ix.n
        self.hulls = [lower_hull(ix.time[i], ix.cost[i]) for i in range(n)]
        # Segments of task i, from its slowest vertex toward its fastest.
        self.t_slow = np.array([float(ix.time[i][h[-1]]) for i, h in enumerate(self.hulls)])
        self.c_slow = np.array([float(ix.cost[i][h[-1]]) for i, h in enumerate(self.hulls)])
        lengths, slopes, owner = [], [], []
        for i, h in enumerate(self.hulls):
            t, c = ix.time[i][h], ix.cost[i][h]
            seg_t = t[1:] - t[:-1]
            seg_c = c[:-1] - c[1:]
            lengths.append(seg_t[::-1])
            slopes.append((seg_c / seg_t)[::-1])
            owner.append(np.full(len(seg_t), i))
        self.seg_len_s = np.concatenate(lengths) if n else np.zeros(0)
        self.seg_slope_j_per_s = np.concatenate(slopes) if n else np.zeros(0)
        self.seg_owner = np.concatenate(owner).astype(int) if n else np.zeros(0, dtype=int)
        self.off = np.searchsorted(self.seg_owner, np.arange(n + 1))   # segments of i: off[i]:off[i+1]
        nd = len(self.seg_len_s)
        self.ncol = n + 1 + nd
        pairs = list(ix.edges) + [(ix.dev_prev[b], b) for b in range(n) if ix.dev_prev[b] >= 0]
        sinks = [v for v in range(n) if not ix.succs[v] and ix.dev_next[v] < 0]
        self.rows = pairs + [(v, -1) for v in sinks]
        r, cidx, val = [], [], []
        for k, (u, w) in enumerate(self.rows):
            cols = np.arange(self.off[u], self.off[u + 1]) + n + 1
            r.extend([k] * (len(cols) + 2))
            cidx.extend([u, w if w >= 0 else n, *cols.tolist()])
            val.extend([1.0, -1.0] + [-1.0] * len(cols))
        self.A_ub = coo_matrix((val, (r, cidx)), shape=(len(self.rows), self.ncol)).tocsr()
        self.row_owner = np.array([u for u, _ in self.rows], dtype=int)
        self.c = np.concatenate([np.zeros(n), [ix.p_total], self.seg_slope_j_per_s])

    def _rhs(self, row_latency_s: np.ndarray | None = None) -> np.ndarray:
        b = -self.t_slow[self.row_owner] if len(self.rows) else np.zeros(0)
        return b if row_latency_s is None else b - np.asarray(row_latency_s, dtype=float)

    def _upper(self, deadline_s: float) -> np.ndarray:
        n = self.p.index.n
        return np.r_[np.full(n, np.inf), float(deadline_s), self.seg_len_s]

    def _times(self, x: np.ndarray) -> np.ndarray:
        n = self.p.index.n
        bought = np.bincount(self.seg_owner, weights=x[n + 1:], minlength=n) if n else np.zeros(0)
        return self.t_slow - bought

    def _highs(self):
        """A warm HiGHS model (``highspy``, the optional ``highs`` extra) or None: re-solving
        after changing only M's upper bound starts from the previous basis (dual simplex),
        several times faster than a cold ``linprog`` per deadline on 1F1B curves."""
        if "_h" in self.__dict__:
            return self._h
        self._h = None
        try:
            import highspy
        except ImportError:
            return None
        n = self.p.index.n
        A = self.A_ub.tocsc()
        lp = highspy.HighsLp()
        lp.num_col_ = self.ncol
        lp.num_row_ = A.shape[0]
        lp.col_cost_ = self.c
        lp.col_lower_ = np.zeros(self.ncol)
        up = self._upper(0.0)
        up[:n] = highspy.kHighsInf
        lp.col_upper_ = up
        lp.row_lower_ = np.full(A.shape[0], -highspy.kHighsInf)
        lp.row_upper_ = self._rhs()
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = A.indptr
        lp.a_matrix_.index_ = A.indices
        lp.a_matrix_.value_ = A.data
        h = _quiet_highs(highspy)
        h.passModel(lp)
        self._h = (h, highspy)
        return self._h

    def set_single_options(self, values: dict[int, tuple[float, float]]) -> None:
        """Give tasks that have a single option a new (time s, effective energy J), in place and
        in the warm HiGHS model, so that the next :meth:`solve` starts from the last basis.
        Used to screen held levels (:func:`_replan_hold`): the held problems of different
        levels differ only there. The LP then describes the problem with those options."""
        h = self.__dict__.get("_h")
        for v, (t, c) in values.items():
            if self.off[v + 1] != self.off[v]:
                raise ValueError(f"task {v} has more than one hull vertex")
            self.t_slow[v] = t
            self.c_slow[v] = c
            if h is not None:
                for k in np.flatnonzero(self.row_owner == v):
                    h[0].changeRowBounds(int(k), -h[1].kHighsInf, float(-t))

    def linprog(self, deadline_s: float, row_latency_s: np.ndarray | None = None):
        """A cold ``scipy.optimize.linprog`` solve at ``deadline_s`` (M ≤ D), every precedence
        row optionally tightened by ``row_latency_s`` (S_u + T_u + latency ≤ S_w). Its ``fun``
        leaves out the constant Σ (slowest vertex's cost) (:meth:`solve` adds it)."""
        bounds = np.c_[np.zeros(self.ncol), self._upper(deadline_s)]
        return linprog(self.c, A_ub=self.A_ub, b_ub=self._rhs(row_latency_s), bounds=bounds,
                       method="highs")

    def solve(self, deadline_s: float) -> LPResult:
        """Solve at ``deadline_s`` (M ≤ D)."""
        n = self.p.index.n
        const = float(self.c_slow.sum())
        hs = self._highs()
        if hs is not None:
            h, highspy = hs
            h.changeColBounds(n, 0.0, float(deadline_s))
            h.run()
            if h.getModelStatus() == highspy.HighsModelStatus.kOptimal:
                sol = h.getSolution()
                x = np.asarray(sol.col_value)
                duals = -np.asarray(sol.row_dual)
                slope = float(np.asarray(sol.col_dual)[n])
                return LPResult(float(h.getInfo().objective_function_value) + const, self._times(x),
                                float(x[n]), np.maximum(duals, 0.0), min(slope, 0.0), float(deadline_s))
            self._h = None                      # fall back to a cold linprog solve
        res = self.linprog(deadline_s)
        if res.status != 0:
            raise RuntimeError(f"hull LP at D={deadline_s}: {res.message}")
        x = res.x
        duals = -np.asarray(res.ineqlin.marginals)
        slope = float(np.asarray(res.upper.marginals)[n])
        return LPResult(float(res.fun) + const, self._times(x), float(x[n]), np.maximum(duals, 0.0),
                        min(slope, 0.0), float(deadline_s))


def switch_surrogate_duals(p: Problem, lp: HullLP, deadline_s: float, share: float) -> np.ndarray | None:
    """Duals of the hull LP with ``share`` × (smallest switch latency) added to every device
    edge, or None when that LP is infeasible. That LP is no relaxation, but any duals μ ≥ 0
    give a valid Lagrangian bound (:func:`lagrangian_bound`), and these price device edges
    as if some switches were paid: measured on 16x64 1F1B with 1 ms switches, share 0.2 raises
    the bound by 0.05–0.08 % over the plain LP duals (8x32: 0.07 %, where the exact LP with
    switches is 0.125 % above them)."""
    ix = p.index
    lat = np.zeros(len(lp.rows))
    for k, (u, w) in enumerate(lp.rows):
        if w >= 0 and ix.dev_prev[w] == u and ix.tau[w] is not None:
            pos = ix.tau[w][ix.tau[w] > 0]
            lat[k] = share * float(pos.min()) if pos.size else 0.0
    if not lat.any():
        return None
    res = lp.linprog(deadline_s, lat)
    if res.status != 0:
        return None
    return np.maximum(-np.asarray(res.ineqlin.marginals), 0.0)


#: Latency share of :func:`switch_surrogate_duals` (0.1–0.3 measured equally good).
SURROGATE_SHARE = 0.2


@dataclass(frozen=True)
class Flow:
    """An s–t flow on the precedence rows (LP duals): per-task outflow f, μ on the device edge
    into each task, and the constant part of the Lagrangian (conservation errors charged)."""

    f: np.ndarray
    mu_dev: np.ndarray
    const_j: float


def flow_from_duals(p: Problem, lp: HullLP, duals: np.ndarray, deadline_s: float) -> Flow:
    """Per-task flows from the LP duals; S ∈ [0, D] and M ∈ [0, D] bound the residual terms."""
    ix = p.index
    n = ix.n
    D = deadline_s
    f = np.zeros(n)
    net = np.zeros(n)
    flow_sink = 0.0
    mu_dev = np.zeros(n)
    for k, (u, w) in enumerate(lp.rows):
        m = duals[k]
        f[u] += m
        net[u] += m
        if w >= 0:
            net[w] -= m
            if ix.dev_prev[w] == u:
                mu_dev[w] += m
        else:
            flow_sink += m
    # S_v appears with coefficient net_v, M with P − flow_sink.
    const = float(np.minimum(net, 0.0).sum() * D) + min(0.0, (ix.p_total - flow_sink) * D)
    return Flow(f, mu_dev, const)


def device_viterbi(p: Problem, f: np.ndarray, mu_dev: np.ndarray) -> tuple[float, np.ndarray]:
    """Per device, min Σ (cost + f·T) + Σ switches (extra + μ·τ) exactly; (value, choice)."""
    ix = p.index
    total = 0.0
    choice = np.zeros(ix.n, dtype=int)
    free = ix.switch_free_tasks
    if free.size:
        # no switch matrix on the device: every task's minimum is independent, in one pass
        off, tflat = ix.time_flat
        owner = ix.option_owner
        val = ix.cost_flat + np.asarray(f, dtype=float)[owner] * tflat
        mins = np.minimum.reduceat(val, off)
        pos = np.where(val <= mins[owner], np.arange(val.size), val.size)
        first = np.minimum.reduceat(pos, off) - off        # first minimiser, as np.argmin
        total += float(mins[free].sum())
        choice[free] = first[free]
    lock = _lockstep(ix)
    if lock is not None:
        return _viterbi_lockstep(ix, lock, np.asarray(f, dtype=float), mu_dev, choice, total), choice
    for d, seq in ix.dev_seq.items():
        if d in ix.switch_free_devices:
            continue
        val = None
        back = []
        for pos, v in enumerate(seq):
            own = ix.cost[v] + f[v] * ix.time[v]
            if pos == 0:
                val = own.copy()
                back.append(None)
                continue
            if ix.tau[v] is None:
                j = int(np.argmin(val))
                back.append(np.full(len(own), j))
                val = own + val[j]
            else:
                m = val[:, None] + ix.extra[v] + mu_dev[v] * ix.tau[v]
                arg = np.argmin(m, axis=0)
                back.append(arg)
                val = own + m[arg, np.arange(m.shape[1])]
        b = int(np.argmin(val))
        total += float(val[b])
        for pos in range(len(seq) - 1, -1, -1):
            choice[seq[pos]] = b
            if pos:
                b = int(back[pos][b])
    return total, choice


@dataclass(frozen=True)
class _Lockstep:
    """Devices with switch costs stepped through together by :func:`_viterbi_lockstep`:
    ``tasks[pos]`` the pos-th task of each, ``flat[pos]`` their options' indices in the
    flattened option arrays, ``switch_s``/``extra_j[pos]`` their constant switch latency and
    extra energy (position 0: unused)."""

    tasks: np.ndarray          # positions × devices
    flat: np.ndarray           # positions × devices × options
    switch_s: np.ndarray       # positions × devices
    extra_j: np.ndarray        # positions × devices


def _lockstep(ix) -> _Lockstep | None:
    """The :class:`_Lockstep` layout when every device with switch costs has as many tasks,
    each position has as many options on every device, and every switch costs one constant
    (latency, extra) except that staying on an option is free, as in 1F1B with one clock per
    option; else None. Cached on the index."""
    cache = ix.__dict__.setdefault("_lockstep", [])
    if cache:
        return cache[0]
    cache.append(_lockstep_layout(ix))
    return cache[0]


def _lockstep_layout(ix) -> _Lockstep | None:
    """:func:`_lockstep`'s layout, built (or refused) once per index."""
    seqs = [seq for d, seq in ix.dev_seq.items() if d not in ix.switch_free_devices]
    if not seqs or len({len(s) for s in seqs}) != 1:
        return None
    tasks = np.array(seqs).T
    ks = np.array(ix.k)[tasks]
    if (ks != ks[0, 0]).any():
        return None
    seen: dict[tuple[int, int], tuple[float, float] | None] = {}   # 1F1B shares its matrices
    consts = []
    for v in tasks[1:].ravel():
        key = (id(ix.tau[v]), id(ix.extra[v]))
        if key not in seen:
            seen[key] = _constant_stay_free(ix.tau[v], ix.extra[v])
        if seen[key] is None:
            return None
        consts.append(seen[key])
    flat = ix.time_flat[0][tasks][:, :, None] + np.arange(ks[0, 0])[None, None, :]
    sw = np.zeros(tasks.shape)
    ex = np.zeros(tasks.shape)
    if consts:
        sw[1:], ex[1:] = np.array(consts).T.reshape(2, *tasks[1:].shape)
    return _Lockstep(tasks, flat, sw, ex)


def _constant_stay_free(tau: np.ndarray | None, ext: np.ndarray | None) -> tuple[float, float] | None:
    """(latency, extra energy) of every switch when those are one constant off the diagonal
    and 0 on it (staying on an option is free, every change costs the same); else None."""
    if tau is None or tau.shape[0] != tau.shape[1] or tau.shape[0] < 2:
        return None
    off = ~np.eye(tau.shape[0], dtype=bool)
    t, e = tau[off], ext[off]
    if np.diag(tau).any() or np.diag(ext).any() or np.ptp(t) > 0 or np.ptp(e) > 0 or not (t[0] > 0 or e[0] > 0):
        return None
    return float(t[0]), float(e[0])


def _viterbi_lockstep(ix, lock: _Lockstep, f: np.ndarray, mu_dev: np.ndarray, choice: np.ndarray,
                      total: float) -> float:
    """:func:`device_viterbi` over the devices of ``lock`` at once, writing their tasks'
    options into ``choice``. Each step costs O(options) per
    device instead of O(options²): the cheapest way into option j is staying on j or the
    cheapest switch from another option, whose cost is one constant. Returns ``total`` plus
    their values, added device by device. The arithmetic, the tie-breaking (first minimiser)
    and the order of the sum are the per-device loop's, so values and choices agree bit for
    bit."""
    own_all = ix.cost_flat + f[ix.option_owner] * ix.time_flat[1]
    n_pos, g = lock.tasks.shape
    rows = np.arange(g)
    val = own_all[lock.flat[0]]
    K = val.shape[1]
    cols = np.arange(K)[None, :]
    back = []
    for pos in range(1, n_pos):
        v = lock.tasks[pos]
        w = (val + lock.extra_j[pos][:, None]) + (mu_dev[v] * lock.switch_s[pos])[:, None]
        a1 = np.argmin(w, axis=1)
        w2 = w.copy()
        w2[rows, a1] = np.inf
        a2 = np.argmin(w2, axis=1)
        sw = np.where(a1[:, None] == cols, a2[:, None], a1[:, None])       # first other minimiser
        sw_val = w[rows[:, None], sw]
        arg = np.where(val < sw_val, cols, np.where(sw_val < val, sw, np.minimum(cols, sw)))
        back.append(arg)
        val = own_all[lock.flat[pos]] + np.where(arg == cols, val, sw_val)
    b = np.argmin(val, axis=1)
    for d in range(g):
        total += float(val[d, b[d]])
    for pos in range(n_pos - 1, -1, -1):
        choice[lock.tasks[pos]] = b
        if pos:
            b = back[pos - 1][rows, b]
    return total


def lagrangian_bound(p: Problem, lp: HullLP, duals: np.ndarray, deadline_s: float):
    """Lagrangian bound from the LP duals with switch costs; returns (bound, per-task choice)."""
    fl = flow_from_duals(p, lp, duals, deadline_s)
    val, choice = device_viterbi(p, fl.f, fl.mu_dev)
    return fl.const_j + val, choice


def scaled_lagrangian_plan(p: Problem, fl: Flow, deadline_s: float, iters: int = 25) -> np.ndarray | None:
    """Smallest scaling θ of the flow whose per-device Viterbi plan meets the deadline
    (bisection; the plan speeds up as θ grows)."""
    lo, hi = 0.0, 1.0
    best = None
    for _ in range(40):
        _, ch = device_viterbi(p, hi * fl.f, hi * fl.mu_dev)
        if plan_meets_deadline(p, ch, deadline_s):
            best = ch
            break
        lo, hi = hi, hi * 2
    if best is None:
        return None
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        _, ch = device_viterbi(p, mid * fl.f, mid * fl.mu_dev)
        if plan_meets_deadline(p, ch, deadline_s):
            hi, best = mid, ch
        else:
            lo = mid
    return best


def round_lp(p: Problem, lp_times: np.ndarray, slack: float = 0.0) -> np.ndarray:
    """Cheapest option of each task no slower than its LP time (+ ``slack`` × that time:
    a positive slack rounds some tasks to a slower option, to be repaired by :func:`crash`)."""
    ix = p.index
    out = np.zeros(ix.n, dtype=int)
    limit = (np.asarray(lp_times, dtype=float) * (1 + 1e-9 + slack) + 1e-12).tolist()
    for i, (times, arg, _) in enumerate(ix.stairs):
        k = bisect_right(times, limit[i])
        # none fast enough: the cheapest of the fastest options
        out[i] = arg[k - 1] if k else arg[bisect_right(times, times[0]) - 1]
    return out


def _local_cost(ix, v: int, b: int, ch: np.ndarray) -> float:
    """Effective cost of task v at option b including the switches into and out of it."""
    c = float(ix.cost[v][b])
    u = ix.dev_prev[v]
    if u >= 0 and ix.extra[v] is not None:
        c += float(ix.extra[v][ch[u], b])
    w = ix.dev_next[v]
    if w >= 0 and ix.extra[w] is not None:
        c += float(ix.extra[w][b, ch[w]])
    return c


def round_lp_switch_aware(p: Problem, lp_times: np.ndarray) -> np.ndarray | None:
    """Per device, the cheapest option sequence (switch extras included) in which every task's
    switch-in latency plus duration fits in its LP time. The LP schedule then still holds with
    each task started after its switch, so the plan meets the LP makespan. None if a task has
    no fitting option."""
    ix = p.index
    choice = np.zeros(ix.n, dtype=int)
    for seq in ix.dev_seq.values():
        back = []
        val = None
        for pos, v in enumerate(seq):
            cap = lp_times[v] * (1 + 1e-9) + 1e-12
            own = np.where(ix.time[v] <= cap, ix.cost[v], np.inf)
            if pos == 0 or ix.tau[v] is None:
                j = int(np.argmin(val)) if val is not None else -1
                back.append(None if j < 0 else np.full(len(own), j))
                val = own + (val[j] if j >= 0 else 0.0)
            else:
                fits = ix.time[v][None, :] + ix.tau[v] <= cap
                m = np.where(fits, val[:, None] + ix.extra[v], np.inf)
                arg = np.argmin(m, axis=0)
                back.append(arg)
                val = ix.cost[v] + m[arg, np.arange(m.shape[1])]
            if not np.isfinite(val).any():
                return None
        b = int(np.argmin(val))
        for pos in range(len(seq) - 1, -1, -1):
            choice[seq[pos]] = b
            if pos and back[pos] is not None:
                b = int(back[pos][b])
    return choice


def uniform_per_device(p: Problem, deadline_s: float, sweeps: int = 6) -> np.ndarray | None:
    """Hold one ω_dev per device (no switches at all): coordinate descent over devices, each
    step trying every ω_dev all its tasks share, evaluated in one batch. None when some device
    has no common ω_dev or the fastest common setting misses the deadline."""
    ix = p.index
    devs = list(ix.dev_seq)
    # per device: common ω_dev → per-task option index (cheapest among options with that ω_dev)
    table = {}
    for d in devs:
        common = None
        maps = []
        for v in ix.dev_seq[d]:
            m: dict = {}
            for j, o in enumerate(p.tasks[v].options):
                w = o.omega.dev
                if w not in m or ix.cost[v][j] < ix.cost[v][m[w]]:
                    m[w] = j
            maps.append(m)
            common = set(m) if common is None else common & set(m)
        if not common:
            return None
        ws = sorted(common, key=lambda w: (sum(ix.time[v][mp[w]] for v, mp in zip(ix.dev_seq[d], maps)),
                                           w.label()))     # ties: not the set's hash order
        table[d] = (ws, np.array([[mp[w] for mp in maps] for w in ws]))
    cur = {d: 0 for d in devs}                       # fastest common setting per device
    ch = np.zeros(ix.n, dtype=int)
    for d in devs:
        ch[ix.dev_seq[d]] = table[d][1][0]

    def evaluate(plans: np.ndarray) -> np.ndarray:
        dur = np.empty(plans.shape)
        cost = np.zeros(len(plans))
        for v in range(ix.n):
            dur[:, v] = ix.time[v][plans[:, v]]
            cost += ix.cost[v][plans[:, v]]
        mk = ix.batch_makespan(dur)
        return np.where(mk <= latest_makespan_s(deadline_s), ix.p_total * mk + cost, np.inf)

    best = float(evaluate(ch[None, :])[0])
    if not np.isfinite(best):
        return None
    for _ in range(sweeps):
        improved = False
        for d in devs:
            ws, idx = table[d]
            plans = np.tile(ch, (len(ws), 1))
            plans[:, ix.dev_seq[d]] = idx
            e = evaluate(plans)
            k = int(np.argmin(e))
            if e[k] < best - 1e-9 * abs(best):
                best, cur[d], ch = float(e[k]), k, plans[k].copy()
                improved = True
        if not improved:
            break
    return ch


def _local_tau(ix, v: int, b: int, ch: np.ndarray) -> tuple[float, float]:
    """Switch latencies into and out of v at option b."""
    t_in = t_out = 0.0
    u = ix.dev_prev[v]
    if u >= 0 and ix.tau[v] is not None:
        t_in = float(ix.tau[v][ch[u], b])
    w = ix.dev_next[v]
    if w >= 0 and ix.tau[w] is not None:
        t_out = float(ix.tau[w][b, ch[w]])
    return t_in, t_out


def _local_vec(ix, v: int, ch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per option b of task v: (duration + switch latencies in/out, cost + switch extras)."""
    t = ix.time[v].copy()
    c = ix.cost[v].copy()
    u = ix.dev_prev[v]
    if u >= 0 and ix.tau[v] is not None:
        t += ix.tau[v][ch[u], :]
        c += ix.extra[v][ch[u], :]
    w = ix.dev_next[v]
    if w >= 0 and ix.tau[w] is not None:
        t += ix.tau[w][:, ch[w]]
        c += ix.extra[w][:, ch[w]]
    return t, c


def crash(p: Problem, choice: np.ndarray, deadline_s: float, max_iter: int = 20_000) -> np.ndarray | None:
    """Speed up critical tasks (least Δcost per second gained) until the makespan ≤ deadline."""
    ix = p.index
    ch = choice.copy()
    for _ in range(max_iter):
        start, end, mk = ix.schedule(ch)
        if meets_deadline(mk, deadline_s):
            return ch
        lf = ix.latest(ch, mk)
        tol = 1e-9 * mk
        best, arg = math.inf, None
        for v in np.flatnonzero(end >= lf - tol):
            t, c = _local_vec(ix, v, ch)
            gain = t[ch[v]] - t
            ok = gain > 1e-12 * mk
            if not ok.any():
                continue
            # Prefer the smallest useful step: rate over the options that gain time.
            rate = np.where(ok, (c - c[ch[v]]) / np.where(ok, gain, 1.0), np.inf)
            b = int(np.argmin(rate))
            if rate[b] < best:
                best, arg = float(rate[b]), (v, b)
        if arg is None:
            return None
        ch[arg[0]] = arg[1]
    return None


def relax(p: Problem, choice: np.ndarray, horizon_s: float) -> np.ndarray:
    """One topological pass: each task takes the cheapest option that still fits its float
    (finish by its latest finish given the current successors), keeping makespan ≤ horizon."""
    ix = p.index
    ch = choice.copy()
    dur = ix.durations(ch)
    lf = ix.latest(ch, horizon_s).tolist()
    end = [0.0] * ix.n
    tol = 1e-12 * horizon_s
    stairs = ix.stairs
    for v in ix.order:
        es = max((end[u] for u in ix.preds[v]), default=0.0)
        u = ix.dev_prev[v]
        w = ix.dev_next[v]
        if ix.tau[v] is None and (w < 0 or ix.tau[w] is None):
            # no switch on either side: the cheapest option within the float, by bisection
            if u >= 0 and end[u] > es:
                es = end[u]
            times, arg, best = stairs[v]
            k = bisect_right(times, lf[v] + tol - es)
            cur = int(ch[v])
            if k and best[k - 1] < ix.cost[v][cur] - 1e-12:
                cur = arg[k - 1]
                ch[v] = cur
            end[v] = es + float(ix.time[v][cur])
            dur[v] = ix.time[v][cur]
            continue
        t = ix.time[v]
        c = ix.cost[v]
        start = np.full(len(t), es)
        fin_lim = np.full(len(t), lf[v] + tol)
        if u >= 0:
            t_in = ix.tau[v][ch[u], :] if ix.tau[v] is not None else 0.0
            start = np.maximum(start, end[u] + t_in)
            if ix.extra[v] is not None:
                c = c + ix.extra[v][ch[u], :]
        if w >= 0 and ix.tau[w] is not None:
            fin_lim = np.minimum(fin_lim, lf[w] - dur[w] - ix.tau[w][:, ch[w]] + tol)
            c = c + ix.extra[w][:, ch[w]]
        fin = start + t
        ok = fin <= fin_lim
        ok[ch[v]] = True           # the current option always fits (see the docstring)
        b = int(np.argmin(np.where(ok, c, np.inf)))
        if c[b] >= c[ch[v]] - 1e-12:
            b = int(ch[v])
        ch[v] = b
        end[v] = fin[b]
        dur[v] = t[b]
    return ch


def relax_repeatedly(p: Problem, choice: np.ndarray, horizon_s: float, rounds: int = 3) -> np.ndarray:
    """:func:`relax` applied until the plan stops changing, at most ``rounds`` times (one pass
    can free float that the next uses)."""
    ch = choice
    for _ in range(rounds):
        nxt = relax(p, ch, horizon_s)
        if np.array_equal(nxt, ch):
            break
        ch = nxt
    return ch


#: Extra roundings tried without switch costs (LP time × (1 + slack), then crash): measured on
#: 1F1B profiles they find cheaper plans than rounding every task down to the faster hull vertex.
ROUNDING_SLACKS: tuple[float, ...] = (0.005,)


@dataclass(frozen=True)
class FastResult:
    """Plan choice, its energy, the best proven lower bound, and the LP's tangent
    (bound at D' ≥ ``lp_bound_j`` + ``slope_j_per_s``·(D' − D), by convexity in D)."""

    choice: np.ndarray
    energy_j: float
    lower_bound_j: float
    lp_bound_j: float = -math.inf
    slope_j_per_s: float = 0.0
    search: dict | None = None    # switch-cost search: work units spent, budget, time-capped
    time_capped: bool = False     # a wall-clock safety net fired (search or bound)


def interpolate(p: Problem, fast: np.ndarray, slow: np.ndarray,
                order: str = "ratio") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Plans between two plans, switch costs not counted (callers use it only without them):
    starting from ``slow``, switch the tasks that differ to their ``fast`` option in order of
    Δcost/Δtime (``order="ratio"``) or of their start in ``slow``'s schedule (``"start"``);
    returns (choices [k × n], makespans, energies) of every prefix, evaluated in one batch."""
    ix = p.index
    diff = np.flatnonzero(fast != slow)
    if diff.size == 0:
        return slow[None, :], np.array([ix.makespan(slow)]), np.array([ix.objective(slow)])
    if order == "start":
        key = ix.schedule(slow)[0][diff]
    elif order == "ratio":
        dt = np.array([ix.time[v][slow[v]] - ix.time[v][fast[v]] for v in diff])
        dc = np.array([ix.cost[v][fast[v]] - ix.cost[v][slow[v]] for v in diff])
        key = np.where(dt > 0, dc / np.where(dt > 0, dt, 1.0), np.inf)
    else:
        raise ValueError(f"unknown order {order!r}")
    diff = diff[np.argsort(key, kind="stable")]
    k = diff.size + 1
    later = np.arange(k)[:, None] > np.arange(diff.size)[None, :]     # row j: first j switched
    ch = np.tile(slow, (k, 1))
    ch[:, diff] = np.where(later, fast[diff], slow[diff])
    dur = np.tile(ix.durations(slow), (k, 1))
    dur[:, diff] = np.where(later, [ix.time[v][fast[v]] for v in diff], [ix.time[v][slow[v]] for v in diff])
    c_slow = np.array([ix.cost[v][slow[v]] for v in range(ix.n)])
    step = np.array([ix.cost[v][fast[v]] for v in diff]) - c_slow[diff]
    cost = float(c_slow.sum()) + np.r_[0.0, np.cumsum(step)]
    mk = ix.batch_makespan(dur)
    return ch, mk, ix.p_total * mk + cost


#: How much :func:`solve_fast` improves a plan with switch costs: path re-planning
#: (:func:`solvers.lns.polish`) from each start, then iterated kicks
#: (:func:`solvers.lns.iterated_polish`). The search stops after ``POLISH_WORK_PER_TASK`` ×
#: tasks work units (at most ``POLISH_WORK``; one unit ≈ 1,000 DP labels, see
#: :class:`solvers.lns.Budget`), and on work alone, so a plan does not depend on the
#: machine's speed or load; a wall-clock safety net (:func:`safety_net_s`, or the caller's
#: ``time_limit_s``) ends it only when something is badly wrong, and the plan then says so
#: (``time_capped``). Measured on this project's 2-core CI machine (1F1B, 1 ms switches, 1.05x), before
#: the DP sorted its labels per option (since 1.9× faster on 16x64 windows): 4x8 spent its
#: 8,000 units in 1.0 s of its 1.9 s cap (gap 0.37 %), 8x32 its 64,000 in 6–7 s of 15 s
#: (0.36 %), 16x64 (2,048 tasks) its 92,160 in 14–15 s of 25 s (the re-plan's LP solves
#: are not work units, and a 20 s cap left too little headroom). The final polishes
#: (:data:`FINAL_STAGES`) add 1.1 times those units; with them, the whole search of 16x64
#: now takes about 16 s of its 25 s. The bound (:func:`switch_bound`) comes on top: about
#: 3.5 s on 16x64, 1 s on 8x32.
POLISH_WORK = 92_160.0
POLISH_WORK_PER_TASK = 125.0
#: The default wall-clock safety net of one fast solve: ``SAFETY_NET_S_PER_TASK`` × tasks,
#: between ``SAFETY_NET_S_MIN`` and ``SAFETY_NET_S_MAX`` seconds. About 8 times what the
#: work takes on a quiet 2-core machine (4x8: 1 s of 60 s; 16x64: 20 s of 205 s), so that a
#: loaded machine still ends every search on work.
SAFETY_NET_S_MIN = 60.0
SAFETY_NET_S_MAX = 600.0
SAFETY_NET_S_PER_TASK = 0.1


def safety_net_s(n_tasks: int) -> float:
    """The default wall-clock safety net (s) of a fast solve of ``n_tasks`` tasks."""
    return min(SAFETY_NET_S_MAX, max(SAFETY_NET_S_MIN, SAFETY_NET_S_PER_TASK * n_tasks))


def polish_budget(n_tasks: int, seconds: float | None = None) -> tuple[float, float]:
    """(work units, wall-clock safety net in s) of the search for ``n_tasks`` tasks. The work
    depends on the size alone; ``seconds`` (a caller's ``time_limit_s``) replaces only the
    safety net (default :func:`safety_net_s`)."""
    work = min(POLISH_WORK, POLISH_WORK_PER_TASK * n_tasks)
    return work, (safety_net_s(n_tasks) if seconds is None else float(seconds))


def _repaired(p: Problem, ch: np.ndarray, deadline_s: float, horizons: list[float]) -> np.ndarray | None:
    """``ch`` made feasible (:func:`crash`) and relaxed; the cheapest over ``horizons``."""
    ix = p.index
    if not plan_meets_deadline(p, ch, deadline_s):
        ch = crash(p, ch, deadline_s)
        if ch is None:
            return None
    best, best_e = None, math.inf
    for horizon in sorted({min(max(h, ix.makespan(ch)), deadline_s) for h in horizons}):
        c2 = relax_repeatedly(p, ch, horizon)
        e = ix.objective(c2)
        if e < best_e:
            best, best_e = c2.copy(), e
    return best


def solve_fast(p: Problem, deadline_s: float, lp: HullLP | None = None,
               slacks: tuple[float, ...] | None = None, search_work: float | None = None,
               time_limit_s: float | None = None, surrogate_bound: bool = True,
               portfolio: bool = True, parallel: bool | None = None) -> FastResult:
    """LP/Lagrangian bound plus rounded-and-repaired plan at ``deadline_s``.

    Without switch costs the LP rounding and its ``slacks`` variants (default
    ``ROUNDING_SLACKS``) are crashed to the deadline and relaxed. With switch costs, feasible
    starts that need no crash (:func:`_switch_starts`) are re-planned path by path and the
    best is improved by iterated kicks (:mod:`solvers.lns`), then ``HOLD_SHARE`` of the budget
    goes on from it, from its hold start (:func:`solvers.hold.best_hold_start`) and from a
    re-plan of its ramps around a slower hold (:func:`_replan_hold`); last, each of
    :data:`FINAL_STAGES` re-plans the best plan with wider DP caps and its share more work
    (:func:`_final_polish`). All of it is budgeted by work: ``search_work`` units (default
    :func:`polish_budget`; 0 turns the search off), so the plan depends on the input alone.
    ``time_limit_s`` is only a wall-clock safety net (default :func:`safety_net_s`); when it
    fires, the result says so (``time_capped``). When searching and ``surrogate_bound``, the
    bound is :func:`switch_bound` (one more LP solve and ``ASCENT_ITERS`` steps of a
    supergradient ascent, about 3.5 s on 16x64: curves skip it).

    With ``portfolio`` and at least ``PORTFOLIO_MIN_TASKS`` tasks, every search of
    :data:`PORTFOLIO` runs too, each with its ``work_share`` of that budget, and the
    cheapest plan wins; they run in worker processes (:mod:`solvers.workers`) while this one
    computes the bound and the first search, when ``parallel`` (default: when this process
    may use two CPUs or more). Parallel or not, the plan is the same.

    The bound is reported raw (``lower_bound_j``, never clamped to the plan's energy); one
    above the plan's energy beyond :data:`solvers.feasibility.BOUND_REL_TOL` raises
    :class:`solvers.feasibility.CertificateError`."""
    ix = p.index
    lp = lp or HullLP(p)
    res = lp.solve(deadline_s)
    bound = res.bound_j
    fl = flow_from_duals(p, lp, res.duals, deadline_s)
    lag_val, _ = device_viterbi(p, fl.f, fl.mu_dev)
    bound = max(bound, fl.const_j + lag_val)
    work, net = polish_budget(ix.n, time_limit_s)
    if search_work is not None:
        work = float(search_work)
    if not ix.has_transitions:
        work = 0.0
    slacks = ROUNDING_SLACKS if slacks is None else slacks
    horizons = [res.makespan_s, deadline_s]
    if not ix.has_transitions:
        cands = [round_lp(p, res.time_s)] + [round_lp(p, res.time_s, x) for x in slacks]
        plans = [c for c in (_repaired(p, ch, deadline_s, horizons) for ch in cands)
                 if c is not None]
    else:
        plans = _switch_starts(p, fl, res, deadline_s, horizons)
    if not plans:
        plans = [ix.fastest_choice()]
    runs: list[MemberRun] = []
    bound_capped = False
    members: list[SearchSettings] = []
    pending: list = []
    if work > 0:
        members = portfolio_members(ix.n)[:None if portfolio else 1]
        if parallel is None:
            parallel = available_cpus() >= 2
        pending = [start(_run_member, p, plans, deadline_s, work, net, m, parallel=parallel,
                         timeout_s=net + GRACE_S) for m in members[1:]]
        try:
            if surrogate_bound:
                sb, bound_capped = switch_bound_capped(p, lp, res, deadline_s, seconds=net)
                bound = max(bound, sb)
            runs = [_run_member(p, plans, deadline_s, work, net, members[0])]
            runs += [job.result() for job in pending]
        finally:
            for job in pending:
                job.close()
        plans = [r.choice for r in runs] + plans
    # every candidate is re-checked: the cheapest plan that meets the deadline is returned
    energies = [_energy_if_meets(p, c, deadline_s) for c in plans]
    search = _search_record(work, net, members, runs, energies[:len(runs)], pending) if runs else None
    if not np.isfinite(min(energies)):
        fc = p.fastest_plan_choice()           # meets any deadline check_feasible accepted
        plans, energies = [fc], [ix.objective(fc)]
    if ix.steady_state:                        # the searches price no wrap switch: polish it
        ch = wrap_polish(p, plans[int(np.argmin(energies))], deadline_s)
        plans, energies = plans + [ch], energies + [_energy_if_meets(p, ch, deadline_s)]
    k = int(np.argmin(energies))
    best_ch, best_e = plans[k], energies[k]
    check_bound(bound, best_e, f"{p.name}: fast method")
    capped = bound_capped or any(r.capped_by_time for r in runs)
    return FastResult(best_ch, float(best_e), float(bound), res.bound_j, res.slope_j_per_s,
                      search, capped)


def _energy_if_meets(p: Problem, choice: np.ndarray, deadline_s: float) -> float:
    """The plan's energy in J, or inf when it misses the deadline."""
    return p.index.objective(choice) if plan_meets_deadline(p, choice, deadline_s) else math.inf


def _final_polish(p: Problem, plans: list[np.ndarray], deadline_s: float, budget: Budget,
                  caps: tuple[int, int] | None = None) -> np.ndarray:
    """The cheapest of ``plans`` that meets the deadline, re-planned path by path
    (:func:`solvers.lns.polish`) with DP caps ``caps`` (default: the first of
    :data:`FINAL_STAGES`) until ``budget`` is spent or a whole cycle finds nothing."""
    caps = caps or FINAL_STAGES[0][0]
    energies = [_energy_if_meets(p, c, deadline_s) for c in plans]
    best = plans[int(np.argmin(energies))]
    if not np.isfinite(min(energies)):
        return best
    return polish(p, best, deadline_s, cap=caps[0], gcap=caps[1], budget=budget)


def switch_bound(p: Problem, lp: HullLP, res: LPResult, deadline_s: float,
                 iters: int = ASCENT_ITERS) -> float:
    """:func:`switch_bound_capped` without a safety net: the bound after ``iters`` steps."""
    return switch_bound_capped(p, lp, res, deadline_s, iters)[0]


def switch_bound_capped(p: Problem, lp: HullLP, res: LPResult, deadline_s: float,
                        iters: int = ASCENT_ITERS, seconds: float | None = None) -> tuple[float, bool]:
    """The Lagrangian bound with switch costs from the best of the hull LP's duals (``res``)
    and one more LP's, raised by :func:`solvers.ascent.flow_ascent`. The other LP is the one
    with constant switch costs where it is small (:func:`solvers.switch_lp.switch_lp_duals`,
    the transport LP's value), else the surrogate LP (:func:`switch_surrogate_duals`), which
    needs no more columns than the hull LP. One more LP solve and the ascent: worth it for a
    single plan, not per point of a curve. Returns (bound J, whether the ``seconds`` safety
    net cut the ``iters`` steps short)."""

    def evaluate(m: np.ndarray) -> tuple[float, np.ndarray]:
        return lagrangian_bound(p, lp, m, deadline_s)

    cands = [res.duals]
    mu_sw = switch_lp_duals(p, lp.rows, deadline_s)
    if mu_sw is not None:
        cands.append(mu_sw)
    else:
        mu = switch_surrogate_duals(p, lp, deadline_s, SURROGATE_SHARE)
        if mu is not None:
            cands += [mu, 0.5 * (mu + res.duals)]
    start = max(cands, key=lambda m: evaluate(m)[0])
    value, _, capped = flow_ascent_capped(p, lp.rows, start, deadline_s, evaluate, iters, seconds)
    return value, capped


def round_to_deadline(p: Problem, lp_times: np.ndarray, deadline_s: float, iters: int = 25) -> np.ndarray | None:
    """:func:`round_lp` of the LP times scaled by the largest γ ≤ 1 whose plan meets the
    deadline (bisection; switch latencies included): a feasible start without a crash."""
    lo, hi, best = 0.0, 1.0, None
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        ch = round_lp(p, lp_times * mid)
        if plan_meets_deadline(p, ch, deadline_s):
            lo, best = mid, ch
        else:
            hi = mid
    return best


def _switch_starts(p: Problem, fl: Flow, res: LPResult, deadline_s: float,
                   horizons: list[float]) -> list[np.ndarray]:
    """Feasible starting plans with switch costs, none needing a crash: each device planned
    inside the LP schedule's windows (:func:`solvers.lns.windowed_rounding`), the LP rounding
    scaled to the deadline, the scaled Lagrangian plan, the switch-aware rounding, the
    cheapest of those relaxed, and one ω per device. The windowed start, measured on 1F1B
    with 1 ms switches, lowers the final gap by 0.02–0.1 points (16x64 at 1.05x: 0.776 % →
    0.749 %; 8x32: 0.804 % → 0.701 %). The first ones are not relaxed: measured on 16x64
    1F1B with 1 ms switches, path re-planning from the relaxed scaled plan ends 0.4 % higher
    (1.33 % vs 0.94 % gap after 6 s), the relax pass fills slack greedily and pins the
    schedule; the relaxed start wins on small pipelines (4x8). The slack roundings are not
    tried: their crash took 8.5 s on 16x64 and they were not the best start."""
    ix = p.index
    cands = [windowed_rounding(p, res.time_s, deadline_s), round_to_deadline(p, res.time_s, deadline_s),
             scaled_lagrangian_plan(p, fl, deadline_s), round_lp_switch_aware(p, res.time_s)]
    out = [ch for ch in cands if ch is not None and plan_meets_deadline(p, ch, deadline_s)]
    relaxed = [r for r in (_repaired(p, ch, deadline_s, horizons) for ch in out) if r is not None]
    if relaxed:
        out.append(min(relaxed, key=ix.objective))
    uni = uniform_per_device(p, deadline_s)
    if uni is not None:
        out.append(uni)
    return out


#: :func:`solvers.lns.chain_dp`'s label caps (per option, over all) in the search. Thinning
#: decides which moves a path's DP sees, so other caps end in another local optimum, but not
#: a better one on average: on 1F1B 8x32 and 16x64 with 1 ms switches at 1.05x and 1.2x,
#: kick seeds 0–3, final polish included (``experiments/search_spread.py``), 24/96 averaged
#: 0.441 % / 0.457 % / 0.515 % / 0.492 % against 16/64's 0.410 % / 0.466 % / 0.498 % / 0.504 %,
#: and single runs of either spread over up to 0.05 points.
SEARCH_CAPS = (16, 64)
#: The kicks' random seed (:func:`solvers.lns.iterated_polish`); fixed, so plans are
#: reproducible. ``experiments/search_spread.py`` measures how far plans move with it.
SEARCH_SEED = 0
#: The last steps of the search: the best plan re-planned path by path with wider DP caps
#: (closer-to-exact DPs per path), each stage on top of the search's work budget by its share
#: (the first also gets what the search left unspent). Each stage starts from the plan the
#: one before returned and keeps it unless it finds a cheaper one, so the second stage can
#: only lower the energy of the plan the first one gave.
#: Measured on 1F1B 16x64 with 1 ms switches: after the search has stalled on its kicks,
#: 20,000 more units (1.6 s) of 64/256 took 1.4–7.8 J (median 4.4 J) off each of 18 searched
#: plans (kick seeds 0–3, caps 16/64 to 48/160, 1.05x and 1.2x), where 92,160 more units of
#: the search itself had taken 1–3 J. From the four plans of the portfolio's two searches at
#: 1.05x and 1.2x (seed 0), 128/512 then took 0.9–3.2 J off with 40,000 units (about 2 s),
#: 1.4–4.2 J with 80,000 (4 s) and 1.7–4.8 J with 160,000 (7–9 s; about where it stops
#: finding anything): 0.85 of the 16x64 budget is 78,000 units.
FINAL_STAGES: tuple[tuple[tuple[int, int], float], ...] = (((64, 256), 0.25), ((128, 512), 0.85))


@dataclass(frozen=True)
class SearchSettings:
    """One search of the portfolio: :func:`solvers.lns.chain_dp`'s label caps (per option,
    over all), the kicks' random seed, and its work (and wall-time cap) as a multiple of the
    budget :func:`polish_budget` gives."""

    caps: tuple[int, int]
    seed: int
    work_share: float = 1.0


#: The searches after the first (``SEARCH_CAPS``, ``SEARCH_SEED``, the whole budget) that
#: :func:`solve_fast` runs on problems of ``PORTFOLIO_MIN_TASKS`` tasks or more, in worker
#: processes; the cheapest plan wins. Two searches with different caps end in different local
#: optima, and the better of the two is much steadier than either: on 1F1B 16x64 with 1 ms
#: switches at 1.05x and 1.2x (``experiments/search_spread.py``, kick seeds 0–3), 16/64 alone
#: proved 0.493–0.508 %, the better of 16/64 and 24/96 at the same seed and work
#: 0.489–0.500 %. Another seed at the same caps is not as good a partner: the better of seeds
#: 0 and 1 at 16/64 was no better than seed 0 at 1.2x. The worker computes no bound, so its
#: search gets that time as work: 1.3 times the budget kept both cores busy about equally
#: long on 16x64 when it was chosen (bound 5.5 s, one search 16 s; with the faster bound,
#: 3.5 s, and both final polishes the worker now ends about when this process does).
#: Measured there at 1.05x, 1.1x, 1.15x, 1.2x and 1.3x over seeds 0–3 with one final
#: polish, the pair proved ≤ 0.5 % in 13 of 20 runs with 24/96 at 1.0 and in 19 of 20 at
#: 1.3; with both final polishes in 20 of 20 (at most 0.493 %).
PORTFOLIO: tuple[SearchSettings, ...] = (SearchSettings((24, 96), 0, 1.3),)
#: Below this many tasks one search runs: its plan is quick to improve, and starting a
#: worker process (about 1 s) would cost more than the second search gains.
PORTFOLIO_MIN_TASKS = 500


def portfolio_members(n_tasks: int) -> list[SearchSettings]:
    """The searches :func:`solve_fast` runs for ``n_tasks`` tasks, the in-process one first
    (``SEARCH_CAPS``/``SEARCH_SEED``, read at call time), then :data:`PORTFOLIO` when
    ``n_tasks >= PORTFOLIO_MIN_TASKS``."""
    first = SearchSettings(tuple(SEARCH_CAPS), int(SEARCH_SEED))
    return [first] + (list(PORTFOLIO) if n_tasks >= PORTFOLIO_MIN_TASKS else [])


@dataclass(frozen=True)
class MemberRun:
    """What one search returned: its plan (``choice``), the work units it spent and whether
    its wall-time cap fired."""

    choice: np.ndarray
    work_units: float
    capped_by_time: bool


def _run_member(p: Problem, plans: list[np.ndarray], deadline_s: float, work: float, cap_s: float,
                settings: SearchSettings) -> MemberRun:
    """One search from the starts ``plans``: :func:`_search` with ``work`` units, then
    :func:`_final_polish` by each of :data:`FINAL_STAGES` with its share more, all times
    ``settings.work_share``; ``cap_s`` is the wall-clock safety net. Module level and
    deterministic under its work budget, so a worker process can run it
    (:mod:`solvers.workers`) and give the same plan."""
    work = work * settings.work_share
    budget = Budget.of(work * (1 + _final_shares()), cap_s)
    found = _search(p, plans, deadline_s, budget.part(work), settings)
    for i, (caps, _) in enumerate(FINAL_STAGES):
        later = work * _final_shares(i + 1)           # kept for the stages after this one
        best = _final_polish(p, found, deadline_s,
                             budget.part(budget.left - later), caps)
        found = [best]
    return MemberRun(best, budget.used, budget.capped)


def _final_shares(first: int = 0) -> float:
    """The work shares of :data:`FINAL_STAGES` from stage ``first`` on, summed."""
    return sum(share for _, share in FINAL_STAGES[first:])


def _search_record(work: float, cap_s: float, members: list[SearchSettings], runs: list[MemberRun],
                   energies: list[float], pending: list) -> dict:
    """The plan's ``search`` record: work spent and budgeted over all searches, the time cap
    (of a search with ``work_share`` 1), whether any cap fired, and per search its settings,
    plan energy (``energies``, inf when late) and where it ran."""
    where = ["here"] + ["worker" if job.in_worker and job.fallback is None else
                        f"here ({job.fallback})" if job.fallback else "here" for job in pending]
    return {
        "work_units": round(sum(r.work_units for r in runs), 1),
        "work_budget": round(sum(m.work_share for m in members) * work * (1 + _final_shares()), 1),
        "time_cap_s": round(cap_s, 3),
        "capped_by_time": any(r.capped_by_time for r in runs),
        "members": [{"caps": list(m.caps), "seed": m.seed, "work_share": m.work_share,
                     "energy_j": round(e, 3) if math.isfinite(e) else None,   # None: late
                     "work_units": round(r.work_units, 1), "capped_by_time": r.capped_by_time,
                     "ran": w} for m, r, e, w in zip(members, runs, energies, where)],
    }


#: Share of the polish time each of the first four starts gets before the best one goes on.
PROBE_SHARE = 0.1
#: Share of the search budget spent after :func:`solvers.hold.best_hold_start`.
HOLD_SHARE = 0.5
#: Share of that part spent re-planning around a slower hold (:func:`_replan_hold`).
REPLAN_SHARE = 0.5
#: The held window of a re-plan (fractions of the makespan), else the best hold start's.
#: Measured on 1F1B 8x32 and 16x64 with 1 ms switches at 1.05x and 1.2x, (0.2, 0.8) gave
#: the lowest gaps in three of four cases; (0.25, 0.8), (0.2, 0.75) and the hold start's own
#: window came within 0.04–0.07 points; (0.2, 0.85) and wider hold ramps too, and no level fits.
REPLAN_WINDOW = (0.2, 0.8)


def _search(p: Problem, plans: list[np.ndarray], deadline_s: float, budget: Budget,
            settings: SearchSettings) -> list[np.ndarray]:
    """:func:`_improve` the starts; where the first has a hold start (a steady middle, see
    :mod:`solvers.hold`), only with ``1 − HOLD_SHARE`` of the budget. Of the rest,
    ``REPLAN_SHARE`` re-plans around a slower hold (:func:`_replan_hold`, in
    ``REPLAN_WINDOW`` or else the best hold start's window), and the remainder goes on from
    the re-plan, the hold start (which moves every device's held clock at once; the
    path-by-path search cannot) and the plan. Short schedules with nothing to hold keep the
    whole budget for one search. ``settings``: the DP caps and kick seed. Returns the plans,
    best first."""
    if best_hold(p, plans[0], deadline_s) is None:
        return _improve(p, plans, deadline_s, budget, settings)
    plans = _improve(p, plans, deadline_s,
                     budget.part((1 - HOLD_SHARE) * budget.left),
                     settings)
    found = best_hold(p, plans[0], deadline_s)
    if found is None:
        return [iterated_polish(p, plans[0], deadline_s, seed=settings.seed, budget=budget,
                                caps=settings.caps)] + plans
    held, window = found
    part = budget.part(REPLAN_SHARE * budget.left)
    replanned = None
    for w in dict.fromkeys((REPLAN_WINDOW, window)):      # a window with nothing to re-plan spends nothing
        replanned = _replan_hold(p, plans[0], deadline_s, w, part, settings)
        if replanned is not None:
            break
    starts = ([replanned] if replanned is not None else []) + [held, plans[0]]
    return _improve(p, starts, deadline_s, budget, settings) + plans


def _replan_hold(p: Problem, choice: np.ndarray, deadline_s: float, window: tuple[float, float],
                 budget: Budget, settings: SearchSettings) -> np.ndarray | None:
    """Hold every device with switch costs at one level through ``window`` of ``choice``'s
    schedule, possibly slower than fits its ramps, and plan everything else again around it:
    the held tasks keep one option each, and the rest gets the hull LP, the feasible starts
    and the search (``budget``), as a problem of its own. The level is the one whose held
    problem has the smallest hull-LP value among :func:`solvers.hold.replan_levels`. A
    slower steady state costs makespan the ramps must win back, which the plan's own hold
    start cannot do (it keeps the ramps); measured on 1F1B 8x32 and 16x64 at 1.05x and 1.2x
    with 1 ms switches, the level picked ran 0.7–1.6 % slower than the slowest that fits the
    plan's own ramps. Returns the re-plan (a choice
    for ``p``), or None, spending nothing, when even the best held problem's LP (a lower bound
    on its plans) is no cheaper than ``choice``, or no level gives a plan that meets the
    deadline."""
    ix = p.index
    cores, levels = replan_levels(p, choice, deadline_s, window)
    if not levels:
        return None
    # one LP for every level: the held problems differ only in the held tasks' one option
    lp = HullLP(held_problem(p, cores, levels[0]).problem)
    now = 0                                     # the level lp describes

    def set_level(i: int) -> None:
        nonlocal now
        if i != now:
            lp.set_single_options({v: (ix.time[v][k], ix.cost[v][k])
                                   for v, k in held_problem_values(p, cores, levels[i]).items()})
            now = i

    best_v, pick = math.inf, -1
    for i in range(len(levels)):
        set_level(i)
        try:
            v = lp.solve(deadline_s).bound_j
        except RuntimeError:                    # infeasible: too slow, so are the slower ones
            break
        if v < best_v:
            best_v, pick = v, i
    if pick < 0 or best_v >= ix.objective(choice):
        return None                             # no held problem can beat the plan: its LP says so
    set_level(pick)
    best = held_problem(p, cores, levels[pick])
    q = best.problem                            # lp now describes q: same rows and columns
    res = lp.solve(deadline_s)
    fl = flow_from_duals(q, lp, res.duals, deadline_s)
    starts = _switch_starts(q, fl, res, deadline_s, [res.makespan_s, deadline_s])
    if not starts:
        return None
    out = [best.expand(c) for c in _improve(q, starts, deadline_s, budget, settings)]
    ok = [c for c in out if plan_meets_deadline(p, c, deadline_s)]
    return min(ok, key=ix.objective) if ok else None


def _improve(p: Problem, plans: list[np.ndarray], deadline_s: float, budget: Budget,
             settings: SearchSettings) -> list[np.ndarray]:
    """Re-plan the first four starts path by path (:func:`solvers.lns.polish`) with
    ``PROBE_SHARE`` of the budget each, go on with the better one until it settles or half
    of what is left is spent, then kick it (:func:`solvers.lns.iterated_polish`) with the
    rest; also try :func:`relax` on the result. Returns the improved plans (best first) and
    the other starts."""
    ix = p.index
    work = budget.left
    cap, gcap = settings.caps
    probes = [polish(p, ch, deadline_s, cap=cap, gcap=gcap,
                     budget=budget.part(PROBE_SHARE * work))
              for ch in plans[:4]]
    best = min(probes, key=ix.objective)
    best = polish(p, best, deadline_s, cap=cap, gcap=gcap,
                  budget=budget.part(budget.left / 2))
    if not budget.done():
        best = iterated_polish(p, best, deadline_s, seed=settings.seed, budget=budget, caps=settings.caps)
    relaxed = relax(p, best, deadline_s)
    return [best, relaxed] + probes + plans
