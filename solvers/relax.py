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
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from .model import Problem


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


class HullLP:
    """The convex-hull LP of a problem, built once and re-solved for several deadlines."""

    def __init__(self, p: Problem):
        ix = p.index
        self.p = p
        n = ix.n
        self.hulls = [lower_hull(ix.time[i], ix.cost[i]) for i in range(n)]
        # Columns: S_0..S_{n-1}, M, then λ per task per hull point.
        self.off = np.zeros(n + 1, dtype=int)
        for i, h in enumerate(self.hulls):
            self.off[i + 1] = self.off[i] + len(h)
        nl = int(self.off[-1])
        self.ncol = n + 1 + nl
        lam0 = n + 1
        tcol = np.concatenate([ix.time[i][h] for i, h in enumerate(self.hulls)])
        ccol = np.concatenate([ix.cost[i][h] for i, h in enumerate(self.hulls)])
        self.tcol = tcol
        # Precedence rows: S_u + Σ λ_u t_u − S_w ≤ 0 (cross and device edges), and
        # S_v + Σ λ_v t_v − M ≤ 0 for tasks without successors.
        pairs = list(ix.edges) + [(ix.dev_prev[b], b) for b in range(n) if ix.dev_prev[b] >= 0]
        sinks = [v for v in range(n) if not ix.succs[v] and ix.dev_next[v] < 0]
        self.rows = pairs + [(v, -1) for v in sinks]
        r, cidx, val = [], [], []
        for k, (u, w) in enumerate(self.rows):
            r.append(k)
            cidx.append(u)
            val.append(1.0)
            sl = slice(self.off[u], self.off[u + 1])
            cols = np.arange(sl.start, sl.stop) + lam0
            r.extend([k] * len(cols))
            cidx.extend(cols.tolist())
            val.extend(tcol[sl].tolist())
            r.append(k)
            cidx.append(w if w >= 0 else n)
            val.append(-1.0)
        self.A_ub = coo_matrix((val, (r, cidx)), shape=(len(self.rows), self.ncol)).tocsr()
        er, ec = [], []
        for i in range(n):
            for j in range(self.off[i], self.off[i + 1]):
                er.append(i)
                ec.append(lam0 + j)
        self.A_eq = coo_matrix((np.ones(len(er)), (er, ec)), shape=(n, self.ncol)).tocsr()
        self.c = np.concatenate([np.zeros(n), [ix.p_total], ccol])

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
        from scipy.sparse import vstack

        n = self.p.index.n
        A = vstack([self.A_ub, self.A_eq]).tocsc()
        lp = highspy.HighsLp()
        lp.num_col_ = self.ncol
        lp.num_row_ = A.shape[0]
        lp.col_cost_ = self.c
        lp.col_lower_ = np.zeros(self.ncol)
        up = np.ones(self.ncol)
        up[:n + 1] = highspy.kHighsInf
        lp.col_upper_ = up
        m_ub = self.A_ub.shape[0]
        lp.row_lower_ = np.r_[np.full(m_ub, -highspy.kHighsInf), np.ones(n)]
        lp.row_upper_ = np.r_[np.zeros(m_ub), np.ones(n)]
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = A.indptr
        lp.a_matrix_.index_ = A.indices
        lp.a_matrix_.value_ = A.data
        h = _quiet_highs(highspy)
        h.passModel(lp)
        self._h = (h, highspy)
        return self._h

    def solve(self, deadline_s: float) -> LPResult:
        """Solve at ``deadline_s`` (M ≤ D)."""
        n = self.p.index.n
        hs = self._highs()
        if hs is not None:
            h, highspy = hs
            h.changeColBounds(n, 0.0, float(deadline_s))
            h.run()
            if h.getModelStatus() == highspy.HighsModelStatus.kOptimal:
                sol = h.getSolution()
                x = np.asarray(sol.col_value)
                lam = x[n + 1:]
                times = np.add.reduceat(lam * self.tcol, self.off[:-1])
                m_ub = self.A_ub.shape[0]
                duals = -np.asarray(sol.row_dual)[:m_ub]
                slope = float(np.asarray(sol.col_dual)[n])
                return LPResult(float(h.getInfo().objective_function_value), times, float(x[n]),
                                np.maximum(duals, 0.0), min(slope, 0.0))
            self._h = None                      # fall back to a cold linprog solve
        bounds = [(0, None)] * n + [(0, deadline_s)] + [(0, 1)] * (self.ncol - n - 1)
        res = linprog(self.c, A_ub=self.A_ub, b_ub=np.zeros(self.A_ub.shape[0]), A_eq=self.A_eq,
                      b_eq=np.ones(n), bounds=bounds, method="highs")
        if res.status != 0:
            raise RuntimeError(f"hull LP at D={deadline_s}: {res.message}")
        x = res.x
        lam = x[n + 1:]
        times = np.add.reduceat(lam * self.tcol, self.off[:-1]) if n else np.zeros(0)
        duals = -np.asarray(res.ineqlin.marginals)
        slope = float(np.asarray(res.upper.marginals)[n])
        return LPResult(float(res.fun), times, float(x[n]), np.maximum(duals, 0.0), min(slope, 0.0))


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
    for seq in ix.dev_seq.values():
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


def lagrangian_bound(p: Problem, lp: HullLP, duals: np.ndarray, deadline_s: float):
    """Lagrangian bound from the LP duals with switch costs; returns (bound, per-task choice)."""
    fl = flow_from_duals(p, lp, duals, deadline_s)
    val, choice = device_viterbi(p, fl.f, fl.mu_dev)
    return fl.const_j + val, choice


def scaled_lagrangian_plan(p: Problem, fl: Flow, deadline_s: float, iters: int = 25) -> np.ndarray | None:
    """Smallest scaling θ of the flow whose per-device Viterbi plan meets the deadline
    (bisection; the plan speeds up as θ grows)."""
    ix = p.index
    lo, hi = 0.0, 1.0
    best = None
    for _ in range(40):
        _, ch = device_viterbi(p, hi * fl.f, hi * fl.mu_dev)
        if ix.makespan(ch) <= deadline_s * (1 + 1e-12):
            best = ch
            break
        lo, hi = hi, hi * 2
    if best is None:
        return None
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        _, ch = device_viterbi(p, mid * fl.f, mid * fl.mu_dev)
        if ix.makespan(ch) <= deadline_s * (1 + 1e-12):
            hi, best = mid, ch
        else:
            lo = mid
    return best


def round_lp(p: Problem, lp_times: np.ndarray, slack: float = 0.0) -> np.ndarray:
    """Cheapest option of each task no slower than its LP time (+ ``slack`` × that time:
    a positive slack rounds some tasks to a slower option, to be repaired by :func:`crash`)."""
    ix = p.index
    out = np.zeros(ix.n, dtype=int)
    for i in range(ix.n):
        ok = ix.time[i] <= lp_times[i] * (1 + 1e-9 + slack) + 1e-12
        if not ok.any():
            ok = ix.time[i] <= ix.time[i].min()
        c = np.where(ok, ix.cost[i], np.inf)
        out[i] = int(np.argmin(c))
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
        ws = sorted(common, key=lambda w: sum(ix.time[v][mp[w]] for v, mp in zip(ix.dev_seq[d], maps)))
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
        return np.where(mk <= deadline_s * (1 + 1e-12), ix.p_total * mk + cost, np.inf)

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
        if mk <= deadline_s * (1 + 1e-12):
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
    lf = ix.latest(ch, horizon_s)
    end = np.zeros(ix.n)
    tol = 1e-12 * horizon_s
    for v in ix.order:
        es = max((end[u] for u in ix.preds[v]), default=0.0)
        u = ix.dev_prev[v]
        w = ix.dev_next[v]
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


def _pareto_thin(f: np.ndarray, c: np.ndarray, cap: int) -> np.ndarray:
    """Indices of the (min f, min c) Pareto set of the points, by increasing f, thinned to at
    most ``cap`` evenly spread points (the fastest and the cheapest always kept)."""
    o = np.lexsort((c, f))
    cs = c[o]
    cm = np.minimum.accumulate(cs)
    keep = np.ones(len(o), dtype=bool)
    keep[1:] = cs[1:] < cm[:-1] - 1e-12
    idx = o[keep]
    if len(idx) > cap:
        idx = idx[np.unique(np.linspace(0, len(idx) - 1, cap).round().astype(int))]
    return idx


def device_dp(p: Problem, seq: list[int], release: np.ndarray, due: np.ndarray,
              cap: int = 48, gcap: int = 160) -> np.ndarray | None:
    """Cheapest option sequence (effective energy + switch extras) for the chain of one device's
    tasks ``seq`` when task ``seq[i]`` may start no earlier than ``release[i]`` and must finish by
    ``due[i]`` (everything else held fixed). Labels (finish time, cost) per option, Pareto-pruned
    and thinned to ``cap`` per option (``gcap`` across options as predecessors of a switch), so
    the result is a good feasible sequence, not always the optimum; None if none fits."""
    ix = p.index
    layers = []
    pf = pc = po = None
    for pos, v in enumerate(seq):
        T = ix.time[v]
        C = ix.cost[v]
        K = len(T)
        if pos == 0:
            f = release[0] + T
            c = C.copy()
            o = np.arange(K)
            b = np.full(K, -1)
        else:
            G = _pareto_thin(pf, pc, gcap)
            gf, gc, go = pf[G], pc[G], po[G]
            tau, ext = ix.tau[v], ix.extra[v]
            if tau is None:
                st = np.broadcast_to(np.maximum(release[pos], gf)[:, None], (len(G), K))
                cc = gc[:, None] + C[None, :]
            else:
                st = np.maximum(release[pos], gf[:, None] + tau[go, :])
                cc = gc[:, None] + C[None, :] + ext[go, :]
            ff = st + T[None, :]
            fl = [ff.ravel()]
            cl = [cc.ravel()]
            ol = [np.broadcast_to(np.arange(K)[None, :], ff.shape).ravel()]
            bl = [np.broadcast_to(G[:, None], ff.shape).ravel()]
            if tau is not None:
                # keeping the option (no switch) from any label, even one dominated overall
                idx = np.flatnonzero((tau[po, po] == 0) & (ext[po, po] == 0))
                fl.append(np.maximum(release[pos], pf[idx]) + T[po[idx]])
                cl.append(pc[idx] + C[po[idx]])
                ol.append(po[idx])
                bl.append(idx)
            f, c, o, b = (np.concatenate(x) for x in (fl, cl, ol, bl))
        ok = f <= due[pos]
        f, c, o, b = f[ok], c[ok], o[ok], b[ok]
        if f.size == 0:
            return None
        # Pareto per option: sort by (option, finish, cost), segmented running minimum.
        srt = np.lexsort((c, f, o))
        f, c, o, b = f[srt], c[srt], o[srt], b[srt]
        key = c - o * (4.0 * (c.max() - c.min()) + 1.0)
        cm = np.minimum.accumulate(key)
        keep = np.ones(len(f), dtype=bool)
        keep[1:] = (key[1:] < cm[:-1] - 1e-12) | (o[1:] != o[:-1])
        f, c, o, b = f[keep], c[keep], o[keep], b[keep]
        s0 = np.flatnonzero(np.r_[True, o[1:] != o[:-1]])
        s1 = np.r_[s0[1:], len(o)]
        if np.any(s1 - s0 > cap):
            sel = np.concatenate([a + np.unique(np.linspace(0, z - a - 1, cap).round().astype(int))
                                  if z - a > cap else np.arange(a, z) for a, z in zip(s0, s1)])
            f, c, o, b = f[sel], c[sel], o[sel], b[sel]
        layers.append((o, b))
        pf, pc, po = f, c, o
    j = int(np.argmin(pc))
    out = np.zeros(len(seq), dtype=int)
    for pos in range(len(seq) - 1, -1, -1):
        o, b = layers[pos]
        out[pos] = o[j]
        j = int(b[j])
    return out


#: Where the other tasks are held while one device is re-planned: α·ASAP + (1 − α)·ALAP start
#: (a convex combination of two feasible schedules is feasible), cycled per sweep.
POLISH_ALPHAS: tuple[float, ...] = (0.5, 0.0, 1.0)


def polish_devices(p: Problem, choice: np.ndarray, deadline_s: float, budget_s: float = 8.0,
                   alphas: tuple[float, ...] = POLISH_ALPHAS) -> np.ndarray:
    """Large-neighbourhood search: one device at a time, hold every other task at a feasible
    start time and re-plan that device's chain with :func:`device_dp` (switches included);
    keep the new plan when it meets the deadline and costs less. Sweeps over the devices,
    cycling ``alphas``, until a whole cycle finds nothing or ``budget_s`` is spent."""
    ix = p.index
    t_end = time.perf_counter() + budget_s
    ch = choice.copy()
    best = ix.objective(ch)
    D = deadline_s
    idle = 0
    k = 0
    devs = [(d, seq, set(seq)) for d, seq in ix.dev_seq.items() if len(seq) > 1]
    while idle < len(alphas) and devs:
        a = alphas[k % len(alphas)]
        k += 1
        improved = False
        for _, seq, on in devs:
            if time.perf_counter() > t_end:
                return ch
            start, end, _ = ix.schedule(ch)
            dur = end - start
            S = a * start + (1 - a) * (ix.latest(ch, D) - dur)
            rel = np.zeros(len(seq))
            due = np.full(len(seq), D)
            for i, v in enumerate(seq):
                for u in ix.preds[v]:
                    if u not in on:
                        rel[i] = max(rel[i], S[u] + dur[u])
                for w in ix.succs[v]:
                    if w not in on:
                        due[i] = min(due[i], S[w])
            sub = device_dp(p, seq, rel, due + 1e-13 * D)
            if sub is None or np.array_equal(sub, ch[seq]):
                continue
            new = ch.copy()
            new[seq] = sub
            if ix.makespan(new) > D * (1 + 1e-12):
                continue
            e = ix.objective(new)
            if e < best - 1e-9 * abs(best):
                best, ch, improved = e, new, True
        idle = 0 if improved else idle + 1
    return ch


#: Extra roundings tried (LP time × (1 + slack), then crash): measured on 1F1B profiles they
#: find cheaper plans than rounding every task down to the faster hull vertex.
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


def interpolate(p: Problem, fast: np.ndarray, slow: np.ndarray,
                order: str = "ratio") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Plans between two plans (no switch latencies): starting from ``slow``, switch the tasks
    that differ to their ``fast`` option in order of Δcost/Δtime (``order="ratio"``) or of
    their start in ``slow``'s schedule (``"start"``); returns (choices [k × n], makespans,
    energies) of every prefix, evaluated in one batch."""
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


#: Seconds :func:`solve_fast` spends polishing a plan with switch costs (:func:`polish_devices`).
POLISH_S = 8.0


def solve_fast(p: Problem, deadline_s: float, lp: HullLP | None = None,
               slacks: tuple[float, ...] | None = None, polish_s: float | None = None) -> FastResult:
    """LP/Lagrangian bound plus rounded-and-repaired plan at ``deadline_s``; with switch costs
    the plan is then polished device by device for up to ``polish_s`` seconds (default
    ``POLISH_S``; 0 turns it off)."""
    ix = p.index
    lp = lp or HullLP(p)
    res = lp.solve(deadline_s)
    bound = res.bound_j
    fl = flow_from_duals(p, lp, res.duals, deadline_s)
    lag_val, lag_choice = device_viterbi(p, fl.f, fl.mu_dev)
    bound = max(bound, fl.const_j + lag_val)
    slacks = ROUNDING_SLACKS if slacks is None else slacks
    cands = [round_lp(p, res.time_s, x) for x in slacks]
    if not ix.has_transitions or not slacks:
        # With switch latencies the plain rounding needs a long crash and was measured no
        # better than the slack rounding (16x64 1F1B), so it is only tried without them.
        cands.insert(0, round_lp(p, res.time_s))
    # The scaled Lagrangian plan only helps when switches cost something (measured: identical
    # plans on 8x32 1F1B without switches), so it is skipped otherwise.
    scaled = scaled_lagrangian_plan(p, fl, deadline_s) if ix.has_transitions else None
    if scaled is not None:
        cands.append(scaled)
    if ix.has_transitions:
        aware = round_lp_switch_aware(p, res.time_s)
        if aware is not None:
            cands.insert(0, aware)
        uni = uniform_per_device(p, deadline_s)
        if uni is not None:
            cands.insert(0, uni)
    best_ch, best_e = None, math.inf
    for ch in cands:
        if ix.makespan(ch) > deadline_s * (1 + 1e-12):
            ch = crash(p, ch, deadline_s)
            if ch is None:
                continue
        for horizon in sorted({min(max(res.makespan_s, ix.makespan(ch)), deadline_s), deadline_s}):
            c2 = ch
            for _ in range(3):
                c3 = relax(p, c2, horizon)
                if np.array_equal(c3, c2):
                    break
                c2 = c3
            e = ix.objective(c2)
            if e < best_e:
                best_ch, best_e = c2.copy(), e
    if best_ch is None:
        fc = ix.fastest_choice()
        best_ch, best_e = fc, ix.objective(fc)
    polish_s = (POLISH_S if ix.has_transitions else 0.0) if polish_s is None else polish_s
    if polish_s > 0:
        best_ch = polish_devices(p, best_ch, deadline_s, polish_s)
        best_e = ix.objective(best_ch)
    return FastResult(best_ch, float(best_e), float(min(bound, best_e)), res.bound_j, res.slope_j_per_s)
