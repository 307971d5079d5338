"""The hull LP solved through its dual, a minimum-cost flow, in about linear time.

The hull LP (:class:`solvers.hull_lp.HullLP`) is a minimum-cost *tension* problem: start
times are node potentials, each task's duration T_v has a convex piecewise-linear cost (its
lower hull), precedence tensions are ≥ 0 and the makespan M ≤ D costs P J/s (the devices'
idle power). Its LP dual is a minimum-cost flow (Fulkerson 1961, Kelley 1961). In the LP's
incremental form, with μ_r ≥ 0 on the precedence rows (u, w), β_k ≥ 0 on δ_k ≤ len_k and
γ ≥ 0 on M ≤ D, the dual reads

    max  Σ_v g_v(f_v) − D·max(0, F − P),
    g_v(f) = t_slow_v·f − Σ_{k of v} len_k·max(0, f − s_k)      (concave, slopes = hull times)

over flows that leave each task v with throughput f_v = Σ_{rows out of v} μ_r, enter it along
its precedence rows or from a source O (S_v ≥ 0), and reach a sink Z (M ≥ finish) with total
F; β_k = max(0, f_v − s_k), γ = max(0, F − P). So: split each task into v_in → v_out with one
arc per hull vertex j (unit cost −t_j, capacity the gap between consecutive segment slopes
s_{j−1} < s_j, the fastest one uncapped), precedence arcs u_out → w_in and sinks v_out → Z of
cost 0, sources O → v_in, and two return arcs Z → O: capacity P at cost 0 and the rest at cost
D. A minimum-cost circulation there is the dual; the flows on the precedence arcs are the LP's
row duals μ (what :mod:`solvers.lagrangian` prices with), the flow on the cost-D return arc
is γ = −d bound / d D, and the shortest-path distances d of its residual network give the
primal: S_v = −d(v_in), T_v = d(v_in) − d(v_out), M = −d(Z).

:func:`solve_hull_flow` solves it with OR-Tools' cost-scaling min-cost flow, which needs
integers: times become multiples of ``q_t`` = max(D, slowest task) / 2^b (b = 44, fewer on
large networks so that costs × nodes fit int64), rounded *up* (task vertex times) and *down*
(D), and powers multiples of ``q_p`` (the largest that keeps every node's total capacity within
int64). Rounding times up keeps the schedule read back from the integer potentials feasible
for the real data: each task gets its vertex's real time where its flow pins it to one, else
its integer tension, never more than its rounded-up time, and the start times are recomputed
as the earliest ones, so the makespan is at most floor(D/q_t)·q_t ≤ D (checked). The bound is
the real-data dual value of the flow found (a flow that conserves exactly is dual-feasible
whatever the rounding), so it is a valid lower bound. Their difference, the duality gap left
by the rounding, is checked: above :data:`GAP_REL_TOL` of the objective's scale the solve
raises :class:`FlowInexact` and :class:`~solvers.hull_lp.HullLP` falls back to the LP.

Measured (``experiments/bench_hull_flow.py``, one solve at 1.05x, 2-core machine): the bound
agrees with the LP's to 1e-12 relative or better; on 1F1B (16 stages, 4,096 to 16,384 tasks)
build + solve takes 0.35-0.5x the LP's time with less memory, but both grow superlinearly
(tasks^1.67 for the flow, ^1.95 for the LP), and on a one-device chain the flow is 2-9x
slower than the LP (tasks^2.16): OR-Tools' cost scaling moves flow one arc per step through
a DAG as deep as its microbatches. So the LP stays :class:`~solvers.hull_lp.HullLP`'s default.

The residual distances come from label-correcting sweeps over the DAG's depth levels
(forward arcs in rising level order, the reversed flow-carrying arcs in falling order) until
nothing changes: each sweep is one numpy pass per level, and a few sweeps suffice on pipeline
schedules (the count is returned).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from frontier.errors import InputError

log = logging.getLogger(__name__)

#: Largest duality gap (primal at the read-back times minus the flow's dual value), relative
#: to the objective's scale, that a flow solve may leave; past it the LP solves instead.
GAP_REL_TOL = 1e-9
#: Most bits of resolution of the integer times (relative to max(D, slowest task)); fewer
#: when OR-Tools' cost scaling (costs × nodes within int64) needs it.
TIME_BITS = 44
CAP_BITS = 60
_BIG = np.int64(1) << np.int64(62)      # "no path yet" distance, far from any real one


class FlowInexact(RuntimeError):
    """The flow solve could not reach the LP's optimum to :data:`GAP_REL_TOL` (rounding or an
    OR-Tools status other than optimal); the caller solves the LP instead."""


def flow_available() -> bool:
    """Whether OR-Tools' min-cost flow can be imported (the runtime dependency ``ortools``)."""
    try:
        from ortools.graph.python import min_cost_flow  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class FlowNet:
    """The hull LP's precedence structure as a network, built once per problem: the rows
    (u, w) (w = −1: u's finish ≤ M), each task's hull segments ``off[v]:off[v+1]`` (slow end
    first), each task's depth level (longest chain of rows before it) and one row per task
    (its t_slow is −rhs there)."""

    n: int
    row_u: np.ndarray
    row_w: np.ndarray
    off: np.ndarray
    level: np.ndarray
    owner_row: np.ndarray


def flow_net(n: int, rows: list[tuple[int, int]], off: np.ndarray) -> FlowNet:
    """The :class:`FlowNet` of ``n`` tasks with precedence ``rows`` (HullLP.rows) and segment
    offsets ``off``; InputError when the rows have a cycle."""
    ru = np.array([u for u, _ in rows], dtype=np.int64)
    rw = np.array([w for _, w in rows], dtype=np.int64)
    inner = rw >= 0
    level = np.zeros(n, dtype=np.int64)
    indeg = np.bincount(rw[inner], minlength=n) if n else np.zeros(0, dtype=np.int64)
    order = np.argsort(ru[inner], kind="stable")
    tails, heads = ru[inner][order], rw[inner][order]
    start = np.searchsorted(tails, np.arange(n + 1))
    frontier = np.flatnonzero(indeg == 0)
    seen, depth = 0, 0
    # Kahn's algorithm one level at a time: each level is a handful of numpy calls.
    while frontier.size:
        level[frontier] = depth
        seen += frontier.size
        lo, hi = start[frontier], start[frontier + 1]
        cnt = hi - lo
        if not cnt.sum():
            break
        idx = np.repeat(lo - np.cumsum(cnt) + cnt, cnt) + np.arange(cnt.sum())
        hs = heads[idx]
        np.subtract.at(indeg, hs, 1)
        hs = np.unique(hs)
        frontier = hs[indeg[hs] == 0]
        depth += 1
    if seen != n:
        raise InputError("the precedence rows have a cycle: no schedule exists")
    owner_row = np.zeros(n, dtype=np.int64)
    owner_row[ru[::-1]] = np.arange(len(ru))[::-1]        # first row of each task
    return FlowNet(n, ru, rw, np.asarray(off, dtype=np.int64), level, owner_row)


@dataclass(frozen=True)
class FlowSolution:
    """One flow solve at a deadline: the flow's dual value (a valid lower bound, without the
    constant Σ slowest-vertex cost), the primal read back (LP columns S, M, δ) and its value,
    the precedence rows' duals μ, d bound / d D, and how many label-correcting sweeps the
    distances took."""

    value_j: float
    primal_j: float
    x: np.ndarray
    duals: np.ndarray
    slope_j_per_s: float
    sweeps: int


class _Levels:
    """Arcs (tail, head, cost) grouped for one level-ordered relaxation sweep."""

    def __init__(self, tail: np.ndarray, head: np.ndarray, cost: np.ndarray, key: np.ndarray,
                 descending: bool):
        o = np.argsort(-key if descending else key, kind="stable")
        self.tail, self.head, self.cost = tail[o], head[o], cost[o]
        k = key[o]
        cut = np.flatnonzero(k[1:] != k[:-1]) + 1
        self.bounds = np.r_[0, cut, len(k)].astype(np.int64)

    def sweep(self, d: np.ndarray) -> None:
        """Relax every arc once, group by group, in place (Gauss–Seidel across groups)."""
        b = self.bounds
        for i in range(len(b) - 1):
            s, e = b[i], b[i + 1]
            np.minimum.at(d, self.head[s:e], d[self.tail[s:e]] + self.cost[s:e])


def _node_levels(net: FlowNet) -> np.ndarray:
    """Level of every node: O = 0, v_in = 2L+1, v_out = 2L+2, Z above all (ids: O 0, Z 1,
    v_in 2+2v, v_out 3+2v)."""
    top = 2 * (int(net.level.max()) + 1) + 1 if net.n else 1
    lv = np.empty(2 + 2 * net.n, dtype=np.int64)
    lv[0], lv[1] = 0, top
    lv[2::2] = 2 * net.level + 1
    lv[3::2] = 2 * net.level + 2
    return lv


Arcs = tuple[np.ndarray, np.ndarray, np.ndarray]      # (tails, heads, costs)


def _distances(nl: np.ndarray, fwd: Arcs, bwd: Arcs, max_sweeps: int) -> tuple[np.ndarray, int]:
    """Shortest distances from O (node 0) over forward arcs ``fwd`` (level rises) and backward
    arcs ``bwd`` (level falls), by alternating level-ordered sweeps; FlowInexact past
    ``max_sweeps`` (a negative cycle: the flow was not optimal)."""
    F = _Levels(fwd[0], fwd[1], fwd[2], nl[fwd[1]], descending=False)
    B = _Levels(bwd[0], bwd[1], bwd[2], nl[bwd[1]], descending=True) if len(bwd[0]) else None
    d = np.full(len(nl), _BIG, dtype=np.int64)
    d[0] = 0
    sweeps = 0
    while True:
        before = d.copy()
        F.sweep(d)
        sweeps += 1
        if B is None:
            break
        B.sweep(d)
        sweeps += 1
        if np.array_equal(before, d):
            break
        if sweeps > max_sweeps:
            raise FlowInexact("residual distances do not settle: the flow is not optimal")
    return d, sweeps


def _earliest(net: FlowNet, dur: np.ndarray) -> np.ndarray:
    """Node distances −(earliest time) with task durations ``dur`` (floats or integers), by one
    forward sweep: −d[2+2v] is v's earliest start, −d[1] the makespan."""
    n = net.n
    nl = _node_levels(net)
    v = np.arange(n, dtype=np.int64)
    inner = net.row_w >= 0
    srcs = np.setdiff1d(v, net.row_w[inner])
    tail = np.r_[np.zeros(len(srcs), dtype=np.int64), 2 + 2 * v, 3 + 2 * net.row_u]
    head = np.r_[2 + 2 * srcs, 3 + 2 * v, np.where(inner, 2 + 2 * net.row_w, 1)]
    dur = np.asarray(dur)
    zero = np.zeros(1, dtype=dur.dtype)
    cost = np.r_[np.repeat(zero, len(srcs)), -dur, np.repeat(zero, len(net.row_u))]
    d = np.full(len(nl), np.inf) if dur.dtype.kind == "f" else np.full(len(nl), _BIG, dtype=np.int64)
    d[0] = 0
    _Levels(tail, head, cost, nl[head], descending=False).sweep(d)
    return d


def solve_hull_flow(net: FlowNet, t_slow_s: np.ndarray, seg_len_s: np.ndarray,
                    seg_slope_j_per_s: np.ndarray, p_total_w: float,
                    deadline_s: float) -> FlowSolution:
    """The hull LP at ``deadline_s`` through its dual min-cost flow (see the module's text).
    RuntimeError when the deadline is below the fastest makespan (as the LP's solve);
    :class:`FlowInexact` when the integer flow cannot certify the LP optimum to
    :data:`GAP_REL_TOL`."""
    from ortools.graph.python import min_cost_flow

    n = net.n
    D = float(deadline_s)
    t_slow = np.asarray(t_slow_s, dtype=float)
    seg_len = np.asarray(seg_len_s, dtype=float)
    slope = np.asarray(seg_slope_j_per_s, dtype=float)
    off = net.off
    nseg_v = np.diff(off)
    seg_owner = np.repeat(np.arange(n, dtype=np.int64), nseg_v)
    # cumulative time bought up to and including each segment, per task
    csum = np.cumsum(seg_len)
    base = np.r_[0.0, csum][off[:-1]]
    cum = csum - base[seg_owner] if len(seg_len) else np.zeros(0)
    bought_all = np.bincount(seg_owner, weights=seg_len, minlength=n) if len(seg_len) else np.zeros(n)
    t_fast = t_slow - bought_all
    if -_earliest(net, t_fast)[1] > D * (1 + 1e-12) + 1e-12:
        raise RuntimeError(f"hull LP at D={D}: infeasible (the fastest options take longer)")

    # ---- integer data ----
    n_nodes = 2 + 2 * n
    node_bits = int(np.ceil(np.log2(n_nodes + 2)))
    q_t = max(D, float(t_slow.max()) if n else 0.0, 1e-300) / 2.0 ** min(TIME_BITS, 60 - node_bits)
    D_int = int(np.floor(D / q_t))
    last = off[1:] - 1                                   # last segment of each task (if any)
    s_last = np.where(nseg_v > 0, slope[np.maximum(last, 0)] if len(slope) else 0.0, 0.0)
    P = float(p_total_w)
    U = P + float(s_last.sum()) + 1.0                    # ≥ any optimal total flow
    cap_bits = min(CAP_BITS, 61 - node_bits)
    q_p = U / 2.0 ** cap_bits
    U_int = int(np.ceil(U / q_p))
    s_int = np.rint(slope / q_p).astype(np.int64)

    # task arcs, contiguous per task: vertex 0 (t_slow), then one per segment (its fast end)
    m = n + len(seg_len)
    first = off[:-1] + np.arange(n)                      # position of task v's vertex-0 arc
    is_first = np.zeros(m, dtype=bool)
    is_first[first] = True
    arc_owner = np.repeat(np.arange(n, dtype=np.int64), nseg_v + 1)
    vt = np.empty(m)                                     # vertex time of each arc
    vt[first] = t_slow
    vt[~is_first] = t_slow[seg_owner] - cum
    # capacity: the slope gap to the next segment; the fastest vertex is uncapped
    brk_hi = np.full(m, U_int, dtype=np.int64)           # breakpoint at the arc's fast side
    brk_lo = np.zeros(m, dtype=np.int64)
    seg_pos = np.flatnonzero(~is_first)                  # arc of segment k (its fast vertex)
    has_next = np.ones(len(seg_len), dtype=bool)
    if len(seg_len):
        has_next[last[nseg_v > 0]] = False
    # arc at vertex j (j ≥ 0) spans slopes [s_{j-1}, s_j): s_j is segment j's slope
    seg_first_arcs = first[nseg_v > 0]
    brk_hi[seg_first_arcs] = s_int[off[:-1][nseg_v > 0]]
    brk_lo[seg_pos] = s_int
    nxt = np.flatnonzero(has_next)
    brk_hi[seg_pos[nxt]] = s_int[nxt + 1]
    task_cap = np.maximum(brk_hi - brk_lo, 0)
    t_int = np.ceil(vt / q_t).astype(np.int64)
    task_cost = -t_int

    fast_int = t_int[np.r_[first[1:] - 1, m - 1]] if n else np.zeros(0, dtype=np.int64)
    # Near the fastest makespan the rounded-up times may not fit floor(D/q_t): give the
    # integer problem that much room; the read-back below checks the real makespan.
    D_int = max(D_int, int(-_earliest(net, fast_int)[1]))

    inner = net.row_w >= 0
    srcs = np.setdiff1d(np.arange(n, dtype=np.int64), net.row_w[inner])
    nr, ns = len(net.row_u), len(srcs)
    row_tail = 3 + 2 * net.row_u
    row_head = np.where(inner, 2 + 2 * net.row_w, 1)
    tails = np.r_[row_tail, np.zeros(ns, dtype=np.int64), 2 + 2 * arc_owner, [1, 1]]
    heads = np.r_[row_head, 2 + 2 * srcs, 3 + 2 * arc_owner, [0, 0]]
    P_int = int(np.rint(P / q_p))
    caps = np.r_[np.full(nr + ns, U_int, dtype=np.int64), task_cap, [P_int, U_int - P_int]]
    costs = np.r_[np.zeros(nr + ns, dtype=np.int64), task_cost, [0, D_int]]
    mcf = min_cost_flow.SimpleMinCostFlow()
    arcs = mcf.add_arcs_with_capacity_and_unit_cost(tails, heads, caps, costs)
    status = mcf.solve()
    if status != mcf.OPTIMAL:
        raise FlowInexact(f"OR-Tools min-cost flow: status {status}")
    flow = np.asarray(mcf.flows(arcs), dtype=np.int64)
    del mcf
    row_f, task_f = flow[:nr], flow[nr + ns:nr + ns + m]
    fP, fD = int(flow[-2]), int(flow[-1])

    # ---- residual distances (integer costs): the primal ----
    unsat = task_f < task_cap
    starts = np.r_[first, m][:-1]
    fwd_c = np.minimum.reduceat(np.where(unsat, task_cost, _BIG), starts) if n else task_cost
    bwd_c = np.minimum.reduceat(np.where(task_f > 0, -task_cost, _BIG), starts) if n else task_cost
    v = np.arange(n, dtype=np.int64)
    hf = fwd_c < _BIG
    hb = bwd_c < _BIG
    fr = row_f > 0
    o2z = [(-D_int)] if fD > 0 else ([0] if fP > 0 else [])
    fwd = (np.r_[np.zeros(ns, dtype=np.int64), 2 + 2 * v[hf], row_tail, np.zeros(len(o2z), dtype=np.int64)],
           np.r_[2 + 2 * srcs, 3 + 2 * v[hf], row_head, np.ones(len(o2z), dtype=np.int64)],
           np.r_[np.zeros(ns, dtype=np.int64), fwd_c[hf], np.zeros(nr, dtype=np.int64),
                 np.array(o2z, dtype=np.int64)])
    bwd = (np.r_[3 + 2 * v[hb], row_head[fr]], np.r_[2 + 2 * v[hb], row_tail[fr]],
           np.r_[bwd_c[hb], np.zeros(int(fr.sum()), dtype=np.int64)])
    nl = _node_levels(net)
    d, sweeps = _distances(nl, fwd, bwd, max_sweeps=4 * n_nodes + 8)
    if (d[2:] >= _BIG).any():
        raise FlowInexact("a task is not reachable in the residual network")
    # Durations: a task pinned to a hull vertex by its flow gets that vertex's real time,
    # others their integer tension; each is at most its rounded-up integer one, so the real
    # earliest schedule is no longer than the integer one.
    T_int = d[2::2] - d[3::2]
    T = T_int.astype(float) * q_t
    lo_arc = np.minimum.reduceat(np.where(unsat, np.arange(m), m), starts) if n else v
    hi_arc = np.maximum.reduceat(np.where(task_f > 0, np.arange(m), -1), starts) if n else v
    at_lo = hf & (T_int == -fwd_c)
    T[at_lo] = vt[lo_arc[at_lo]]
    at_hi = hb & (T_int == bwd_c)
    T[at_hi] = vt[hi_arc[at_hi]]
    T = np.clip(T, t_fast, t_slow)
    de = _earliest(net, T)
    S, finish = -de[2::2], float(-de[1])
    if finish > D * (1 + 1e-12) + 1e-12:
        raise FlowInexact(f"the read-back schedule takes {finish} s > D = {D} s")
    M = D if fD > 0 else finish
    bought = t_slow - T
    delta = (np.clip(bought[seg_owner] - (cum - seg_len), 0.0, seg_len)
             if len(seg_len) else np.zeros(0))
    x = np.r_[S, M, delta]
    primal = float(slope @ delta + P * M)

    # ---- the flow's dual value on the real data: a valid lower bound ----
    fv = np.bincount(arc_owner, weights=task_f.astype(float), minlength=n) * q_p
    over = np.maximum(fv[seg_owner] - slope, 0.0) if len(seg_len) else np.zeros(0)
    F = (fP + fD) * q_p
    value = float(t_slow @ fv - seg_len @ over - D * max(0.0, F - P))
    scale = abs(primal) + abs(value) + float(np.abs(slope * seg_len).sum()) + P * D
    gap = primal - value
    if gap > GAP_REL_TOL * scale:
        raise FlowInexact(f"duality gap {gap:.3g} J left by rounding (scale {scale:.3g} J)")
    duals = row_f.astype(float) * q_p
    return FlowSolution(value, primal, x, duals, -fD * q_p, sweeps)
